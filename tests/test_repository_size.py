"""The repository's size budget, and the fold that keeps run notes inside it.

The repository travels to every GPU call beside the compiler bundle (64 MiB in all), so what
git tracks stays within 4.5 MB, counted as a file system stores it: each file in whole 4 KB
blocks (a 300-byte README costs 4 KB). The units are the ones "4 KB blocks" uses: a KB is 1024
bytes and 4.5 MB is 4,500 of them, 4,608,000 bytes (the project's budget has been counted so:
4,935,680 bytes in blocks was "4.82 MB")."""
import gzip
import subprocess
from pathlib import Path

import pytest

from wavefront.results.fold import FoldError, fold_notes

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 4096
BUDGET_BYTES = 4_500 * 1024  # 4.5 MB of 1000 KB of 1024 bytes


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


def test_the_tracked_files_fit_the_budget_in_4k_blocks():
    probe = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-inside-work-tree"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("not a git checkout")
    total, sizes = tracked_bytes(ROOT)
    largest = ", ".join(f"{name} {size // 1024} KB" for size, name in sizes[:8])
    assert total <= BUDGET_BYTES, (
        f"tracked files take {total:,} bytes in 4 KB blocks, over the {BUDGET_BYTES:,} budget; "
        f"largest: {largest} (pack run notes with `wavefront fold DIR --notes`, records with "
        "`wavefront fold` and `wavefront compress`)")


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
