"""The repository's size, and the fold that keeps run notes inside it.

The repository travels to every GPU call beside the compiler bundle, 64 MiB in all: that cap is
what the first test holds (the tracked files' bytes plus the bundle's, with 1 MiB to spare).
Issue 52's budget, 4.5 MB tracked counted in whole 4 KB blocks (a 300-byte README costs 4 KB),
is the second: 4,500,000 bytes of blocks. The repository is over it: 5,628 KiB in blocks
(5,763,072 bytes) on 2026-11-28 at 80b2b03, after the data no claim, figure, table or test reads
left the tree. The code alone (wavefront/, tests/, experiments/, scripts/) takes 3,172 KiB of
it; with the other top-level files (92), the main paper (draft, fits.json, figures, the
prediction tables: 444) and the data the main paper and the timed model read (768, the model
cache included) make 4,476 KiB, 4,583,424 bytes: still over the budget were every appendix
and all 948 KiB of the data only appendices read gone (their experiments' code kept). The
test is marked as an expected failure, strict, so that the day the repository fits, it fails
until the mark goes; each run prints where the blocks are."""
import gzip
import subprocess
from pathlib import Path

import pytest

from wavefront.results.fold import FoldError, fold_notes

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 4096
BUDGET_BYTES = 4_500_000  # 4.5 MB, counted in whole 4 KB blocks


def tracked_bytes(root: Path) -> tuple[int, list[tuple[int, str]]]:
    """(the tracked files' size in whole 4 KB blocks, [(blocks in bytes, path)] largest
    first); a tracked file deleted in the working tree counts nothing."""
    names = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    sizes = []
    for name in filter(None, names):
        path = root / name
        if path.is_file() and not path.is_symlink():
            sizes.append((-(-path.stat().st_size // BLOCK) * BLOCK, name))
    sizes.sort(reverse=True)
    return sum(s for s, _ in sizes), sizes


# The bundle `scripts/build_gpu_bundle.sh` builds (cuda-tile wheel, tileiras/ptxas/libnvvm
# 13.4 tarball, TileGym, Dask's wheels), as built on 2026-11-27, where no bundle is at hand.
BUNDLE_BYTES_BUILT = 58_786_880
CARRY_CAP = 64 << 20
SPARE = 1 << 20


def test_the_repository_and_the_bundle_fit_one_gpu_call():
    probe = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-inside-work-tree"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("not a git checkout")
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    tracked = sum((ROOT / n).stat().st_size for n in filter(None, names)
                  if (ROOT / n).is_file() and not (ROOT / n).is_symlink())
    bundle_dir = ROOT / "bundle"
    bundle = (sum(f.stat().st_size for f in bundle_dir.rglob("*") if f.is_file())
              if bundle_dir.is_dir() else BUNDLE_BYTES_BUILT)
    blocks, sizes = tracked_bytes(ROOT)
    largest = ", ".join(f"{name} {size // 1024} KB" for size, name in sizes[:8])
    print(f"tracked: {tracked:,} bytes, {blocks:,} in 4 KB blocks (budget {BUDGET_BYTES:,}); "
          f"bundle {bundle:,}; largest: {largest}")
    assert tracked + bundle <= CARRY_CAP - SPARE, (
        f"tracked files ({tracked:,} bytes) and the bundle ({bundle:,}) leave less than "
        f"{SPARE:,} bytes under the {CARRY_CAP:,}-byte cap of a GPU call; largest: {largest} "
        "(pack run notes with `wavefront fold DIR --notes`, records with `wavefront fold` "
        "and `wavefront compress`)")


# The repository's layers, as a breakdown names them: a path's first folder (data/ and paper/
# one level further down), else "other" (README, pyproject, .ci, ...).
LAYERS = ("wavefront", "tests", "experiments", "scripts", "examples", "docs", "data", "paper")


def breakdown(sizes: list[tuple[int, str]]) -> dict[str, int]:
    """{layer: bytes in whole blocks} of [(blocks in bytes, path)], largest first."""
    out: dict[str, int] = {}
    for size, name in sizes:
        top = name.split("/")[0]
        out[top if top in LAYERS else "other"] = out.get(top if top in LAYERS else "other",
                                                         0) + size
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _report(sizes: list[tuple[int, str]]) -> str:
    layers = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in breakdown(sizes).items())
    data: dict[str, int] = {}
    for size, name in sizes:
        if name.startswith(("data/", "paper/")):
            parts = name.split("/")
            key = "/".join(parts[:2]) if len(parts) > 2 else name
            data[key] = data.get(key, 0) + size
    largest = ", ".join(f"{k} {v // 1024} KB" for k, v in
                        sorted(data.items(), key=lambda kv: -kv[1])[:12])
    return f"by layer: {layers}; largest data and paper folders: {largest}"


@pytest.mark.xfail(strict=True, reason=(
    "issue 52's 4.5 MB in 4 KB blocks is not met: 5,628 KiB on 2026-11-28, of which the code "
    "(wavefront/, tests/, experiments/, scripts/) is 3,172 KiB; what is left to cut is data "
    "that claims read (their sections would go with it) or code, the lead's decision"))
def test_the_repository_stays_within_its_budget_in_blocks():
    probe = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-inside-work-tree"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("not a git checkout")
    blocks, sizes = tracked_bytes(ROOT)
    report = _report(sizes)
    print(f"tracked in 4 KB blocks: {blocks:,} bytes (budget {BUDGET_BYTES:,}); {report}")
    assert blocks <= BUDGET_BYTES, (
        f"the tracked files take {blocks:,} bytes in 4 KB blocks, {blocks - BUDGET_BYTES:,} "
        f"over the {BUDGET_BYTES:,} of issue 52; {report}")


def test_the_breakdown_counts_each_file_once_under_its_layer():
    sizes = [(8192, "wavefront/a.py"), (4096, "data/knee/results.csv.gz"), (4096, "README.md"),
             (4096, "data/knee/manifest.json.gz")]
    assert breakdown(sizes) == {"wavefront": 8192, "data": 8192, "other": 4096}
    assert sum(breakdown(sizes).values()) == sum(s for s, _ in sizes)
    assert "data/knee 8 KB" in _report(sizes)


def test_tracked_bytes_count_whole_blocks(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "small").write_text("x" * 10)
    (tmp_path / "exact").write_bytes(b"y" * BLOCK)
    (tmp_path / "over").write_bytes(b"z" * (BLOCK + 1))
    (tmp_path / "untracked").write_text("not counted")
    subprocess.run(["git", "-C", str(tmp_path), "add", "small", "exact", "over"], check=True)
    total, _ = tracked_bytes(tmp_path)
    assert total == BLOCK + BLOCK + 2 * BLOCK


def _run_folder(d: Path, name: str, readme: str, other: bool = False) -> None:
    (d / name).mkdir(parents=True)
    (d / name / "README.md").write_text(readme)
    if other:
        (d / name / "data.txt").write_text("kept")


def test_fold_notes_gathers_each_folders_readme_under_its_name(tmp_path):
    d = tmp_path / "set"
    _run_folder(d, "b2", "# Second run\n\n```\n# a shell comment\n```\n## Table\n")
    _run_folder(d, "a1", "# First run\ntext\n", other=True)
    (d / "RUNS.md").write_text("# Runs\n\n## old\n\nkept as it was\n")
    assert fold_notes(d) == 2
    text = gzip.decompress((d / "RUNS.md.gz").read_bytes()).decode()
    assert text.startswith("# Runs\n\n## old\n\nkept as it was\n")
    assert text.index("## a1\n\n### First run\ntext") < text.index("## b2\n\n### Second run")
    assert "```\n# a shell comment\n```\n#### Table" in text  # fenced code keeps its lines
    assert not (d / "RUNS.md").exists() and not (d / "b2").exists()
    assert (d / "a1" / "data.txt").read_text() == "kept" and not (d / "a1" / "README.md").exists()
    # a later run folder joins the packed notes
    _run_folder(d, "c3", "# Third\n")
    assert fold_notes(d) == 1
    again = gzip.decompress((d / "RUNS.md.gz").read_bytes()).decode()
    assert again.startswith(text.rstrip("\n")) and again.endswith("## c3\n\n### Third\n")


def test_fold_notes_refuses_a_folder_already_in_the_notes_and_writes_nothing(tmp_path):
    d = tmp_path / "set"
    _run_folder(d, "a1", "# First\n")
    assert fold_notes(d) == 1
    before = (d / "RUNS.md.gz").read_bytes()
    _run_folder(d, "a1", "# First, measured again\n")
    with pytest.raises(FoldError, match="a1"):
        fold_notes(d)
    assert (d / "RUNS.md.gz").read_bytes() == before and (d / "a1" / "README.md").exists()


def test_fold_notes_with_nothing_to_gather_writes_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    assert fold_notes(tmp_path) == 0
    assert not (tmp_path / "RUNS.md.gz").exists()


def test_repack_smallest_keeps_the_text_and_any_gzip_reader_reads_it(tmp_path):
    pytest.importorskip("zopfli")
    from wavefront.files import pack, read_packed, repack_smallest
    text = "".join(f'{{"round": {i}, "ms": {1.5 + (i * 7919 % 97) / 1000:.4f}}}\n'
                   for i in range(3000)).encode()
    path = tmp_path / "rounds.jsonl.gz"
    path.write_bytes(pack(text[:5000]) + pack(text[5000:]))  # two members, as appends leave
    before, after = repack_smallest(path)
    assert after < before == len(pack(text[:5000]) + pack(text[5000:]))
    assert gzip.decompress(path.read_bytes()) == text == read_packed(path)
    assert repack_smallest(path) == (after, after)  # smallest already: left as it is


def test_repack_smallest_without_zopfli_names_it_and_writes_nothing(tmp_path, monkeypatch):
    import sys

    from wavefront.files import FileRefused, pack, repack_smallest
    monkeypatch.setitem(sys.modules, "zopfli", None)
    monkeypatch.setitem(sys.modules, "zopfli.gzip", None)
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(pack(b"{}\n"))
    with pytest.raises(FileRefused, match="zopfli"):
        repack_smallest(path)
    assert gzip.decompress(path.read_bytes()) == b"{}\n"
    with pytest.raises(FileRefused, match="not a packed"):
        repack_smallest(tmp_path / "plain.txt")
