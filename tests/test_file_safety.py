"""Nothing the tools write can lose data (issue 55): the one writer, the one reader, and every
tool that writes or loads through them, tried as an unfriendly user would.

Two parts. The damage cases the issue names, each a test that failed on the code before the
change (a file replaced, emptied, followed through a link, or deleted; a hang; a silent read).
Then the new unfriendly cases, parametrized: every one ends in one of three outcome classes,
and every one is checked for 0 tracebacks (only the documented error types), 0 hangs (an alarm),
bounded memory (bounds lowered where a case would allocate) and 0 damage (the files on disk
compared byte for byte before and after):

- "refused": an error naming the file (or flag) and what is wrong; nothing changed on disk;
- "recovered": a torn final append left out with a warning naming the file, the rows before it
  read;
- "accepted": a valid input (the control beside the damaged ones), read or written as asked.

`python tests/test_file_safety.py` prints the case table (count per outcome class).
"""
from __future__ import annotations

import builtins
import errno
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from wavefront import files
from wavefront.cli import main
from wavefront.results.records import BENCH_ONCE_RECORDS, TUNE_RECORDS
from wavefront.results.store import (SchemaError, load_results, read_manifest,
                                     read_results_bytes)

ROOT = Path(__file__).resolve().parent.parent
KNEE = ROOT / "data" / "knee"
FOUNDATION = ROOT / "data" / "foundation_bench" / "bench_h100.jsonl.gz"
HANG_S = 30


@pytest.fixture(autouse=True)
def no_hang():
    """Every case ends within HANG_S seconds, or fails as a hang (an open() blocked on a FIFO
    is interrupted by the alarm)."""
    def hang(signum, frame):
        raise TimeoutError(f"hung: no answer within {HANG_S} s")
    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(HANG_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def snapshot(root: Path) -> dict:
    """Every file under `root` (links as their target text, not followed): what 'no damage'
    compares."""
    out = {}
    for dirpath, dirnames, names in os.walk(root):
        for name in dirnames + names:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_file():
                out[rel] = p.read_bytes()
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = "special"
    return out


def _fold_module():
    from wavefront.results import fold  # `wavefront fold`
    return fold


@pytest.fixture
def disk_full(monkeypatch):
    """-> what fills the disk: from then on every write to a file fails with ENOSPC after its
    open (which truncates, as on a real full disk), os.write and Python's file objects
    alike."""
    real_open, real_write = builtins.open, os.write

    def write(fd, data):
        if fd > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    class Full(io.RawIOBase):
        def __init__(self, f):
            self._f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def writable(self):
            return True

        def close(self):
            self._f.close()
            super().close()

    def opener(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wax+") and not isinstance(file, int):
            return Full(f)
        return f

    def fill():
        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(builtins, "open", opener)
        monkeypatch.setattr(io, "open", opener)
    return fill


def _knee_copy(tmp_path) -> Path:
    d = tmp_path / "knee"
    shutil.copytree(KNEE, d)
    return d


def _tuned_entry(**over) -> dict:
    return {"schedule": "dynamic+linear", "tiles": "128x128", "occupancy": 1,
            "worker_warps": 8, "cluster": 1, "kv_latency": 0, "rescale_threshold": 0,
            "exp2_poly": 0, "qk_ahead": 0, "tflops": 600.0, "x_cudnn": 1.05,
            "measured": "2026-11-25T00:00:00+00:00",
            "shape": "B=1 H=32 KV=32 S=8192 bfloat16", **over}


Q = (1, 32, 8192, 128)


# ============================================================================================
# The damage cases of issue 55 (each failed on the code before this change)
# ============================================================================================

def test_compress_does_not_replace_packed_results_with_a_plain_file_beside_them(tmp_path):
    """A plain results.csv (6 rows) beside results.csv.gz (433 rows): compress replaced the
    packed table and exited 0."""
    d = _knee_copy(tmp_path)
    text = read_results_bytes(d / "results.csv.gz").decode().splitlines()
    (d / "results.csv").write_text("\n".join(text[:7]) + "\n")
    before = snapshot(d)
    res = CliRunner().invoke(main, ["compress", str(d)])
    assert res.exit_code == 1 and "both exist and differ" in res.output, res.output
    assert "Traceback" not in res.output
    after = snapshot(d)
    assert after["results.csv.gz"] == before["results.csv.gz"]
    assert after["results.csv"] == before["results.csv"]


@pytest.mark.parametrize("name,damage", [
    ("results.csv.gz", "truncate"), ("results.csv.gz", "plain"),
    ("bench.jsonl.gz", "truncate"), ("bench.jsonl.gz", "plain")])
def test_significant_digits_refuses_a_truncated_or_foreign_packed_file(tmp_path, name, damage):
    """--significant-digits on a truncated or non-gzip file rewrote it as an empty gzip."""
    d = _knee_copy(tmp_path)
    target = d / name
    if name == "bench.jsonl.gz":
        shutil.copy(FOUNDATION, target)
    data = target.read_bytes()
    target.write_bytes(data[:len(data) // 2] if damage == "truncate"
                       else gzip.decompress(data))
    before = snapshot(d)
    res = CliRunner().invoke(main, ["compress", str(d), "--significant-digits", "7"])
    assert res.exit_code == 1, res.output
    assert str(target) in res.output and ("truncated" in res.output
                                          or "not gzip" in res.output), res.output
    assert snapshot(d) == before


def test_compress_does_not_replace_packed_records_with_a_plain_file_beside_them(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(FOUNDATION, d / "bench.jsonl.gz")
    (d / "bench.jsonl").write_text(gzip.decompress(FOUNDATION.read_bytes()).decode()
                                   .splitlines()[0] + "\n")
    before = snapshot(d)
    res = CliRunner().invoke(main, ["compress", str(d)])
    assert res.exit_code == 1 and "both exist and differ" in res.output, res.output
    assert snapshot(d) == before


def test_a_truncated_packed_record_file_is_an_error_not_an_empty_file(tmp_path):
    """Half of data/foundation_bench/bench_h100.jsonl.gz cut off read as no rows (the paper
    lost 20 H100 rows and moved a claim)."""
    cut = tmp_path / "bench_h100.jsonl.gz"
    data = FOUNDATION.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    assert len(BENCH_ONCE_RECORDS.read(FOUNDATION)) == 20
    with pytest.raises(SchemaError, match=f"{cut}.*truncated"):
        BENCH_ONCE_RECORDS.read(cut)


def test_a_truncated_packed_results_table_says_truncated(tmp_path):
    """It failed as 'header does not match the schema' (misleading) or read fewer rows."""
    d = _knee_copy(tmp_path)
    data = (d / "results.csv.gz").read_bytes()
    (d / "results.csv.gz").write_bytes(data[:len(data) * 3 // 4])
    with pytest.raises(SchemaError, match="results table is truncated: its only gzip member ends early") as err:
        load_results(d / "results.csv.gz")
    assert "header does not match" not in str(err.value)


def test_tune_write_on_a_full_disk_leaves_the_table_as_it_was(tmp_path, disk_full):
    """The table was truncated, then cut JSON written: every later attention call failed."""
    from wavefront.kernel.tuning import load_table, write_entry
    path = tmp_path / "tuned.json"
    table = {"GPU A": {"d128_full": _tuned_entry()}}
    path.write_bytes(json.dumps(table).encode())
    before = path.read_bytes()
    disk_full()
    with pytest.raises(OSError) as err:
        write_entry("GPU A", 128, True, _tuned_entry(), path)
    assert err.value.errno == errno.ENOSPC
    assert path.read_bytes() == before and load_table(path) == table
    assert sorted(os.listdir(tmp_path)) == ["tuned.json"]  # no temporary left


def test_tune_write_refuses_a_linked_table(tmp_path):
    from wavefront.kernel.tuning import write_entry
    victim = tmp_path / "elsewhere.json"
    victim.write_text(json.dumps({"GPU A": {"d128_full": _tuned_entry()}}))
    link = tmp_path / "tuned.json"
    link.symlink_to(victim)
    before = snapshot(tmp_path)
    with pytest.raises(files.UnsafePath, match="symbolic link"):
        write_entry("GPU A", 128, True, _tuned_entry(), link)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("recorded", [float("nan"), "600", 1e308, float("inf")])
def test_the_slowed_gpu_guard_names_a_recorded_speed_that_is_no_measurement(recorded):
    """NaN passed, a string was a TypeError, 1e308 refused every winner as a 'slowed GPU'."""
    from wavefront.measure.tune import slowed_gpu
    why = slowed_gpu({"tflops": 600.0}, {"tflops": recorded})
    assert why and "not a measured speed" in why and "slowed GPU" not in why, why


def test_fold_deletes_no_manifest_when_the_merge_fails(tmp_path):
    """A duplicate run id: the first folder's manifest was already deleted."""
    from wavefront.results.store import manifest_text
    d = tmp_path / "tune"
    entry = {"schema_version": 5, "date": "2026-11-27", "gpu": "H100", "git_commit": "abc",
             "command": "wavefront tune"}
    for folder, runs in (("a", ["r1"]), ("b", ["r2", "r0"])):
        (d / folder).mkdir(parents=True)
        (d / folder / "manifest.json").write_text(manifest_text({r: entry for r in runs}))
    (d / "manifest.json").write_text(manifest_text({"r0": entry}))
    before = snapshot(d)
    with pytest.raises(ValueError, match="r0"):
        _fold_module().merge_manifests(d)
    assert snapshot(d) == before


def test_fold_on_a_full_disk_leaves_every_file(tmp_path, disk_full):
    d = tmp_path / "public_call"
    (d / "c1").mkdir(parents=True)
    (d / "c1" / "bench.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    before = snapshot(d)
    disk_full()
    with pytest.raises(OSError):
        _fold_module().fold(d)
    assert snapshot(d) == before


@pytest.mark.parametrize("content,expected", [
    (b'{"a": 1, "source": "c0/bench"}\nnot json\n', "not a JSON line"),
    (gzip.compress("".join(json.dumps({"source": f"c{i}/b", "x": i * 7919 % 10007}) + "\n"
                           for i in range(2000)).encode())[:200], "truncated"),
    (b'{"a": 1}\n', "without its 'source'"),
])
def test_fold_names_a_broken_folded_file_instead_of_a_traceback(tmp_path, content, expected):
    d = tmp_path / "public_call"
    (d / "c1").mkdir(parents=True)
    (d / "c1" / "bench.jsonl").write_text('{"b": 1}\n')
    folded = d / ("bench_runs.jsonl.gz" if content.startswith(b"\x1f\x8b")
                  else "bench_runs.jsonl")
    folded.write_bytes(content)
    before = snapshot(d)
    with pytest.raises(ValueError, match=expected):
        _fold_module().fold(d)
    assert snapshot(d) == before


def _simulate(out_option, out_dir, *extra):
    return CliRunner().invoke(main, ["simulate", "--gpu", "h100", "--seqlen", "1024",
                                     "--head-dim", "64", "--schedule", "persistent+linear",
                                     *extra, out_option, str(out_dir)])


@pytest.mark.parametrize("option,extra", [("--timeline-out", ()), ("--trace-out", ("--no-clock",))])
def test_simulate_outputs_do_not_follow_a_planted_link(tmp_path, option, extra):
    out = tmp_path / "out"
    res = _simulate(option, out, *extra)
    assert res.exit_code == 0, res.output
    (name,) = os.listdir(out)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / name).unlink()
    (out / name).symlink_to(victim)
    before = snapshot(tmp_path)
    res = _simulate(option, out, *extra)
    assert res.exit_code == 2 and "symbolic link" in res.output and option in res.output, \
        res.output
    assert "Traceback" not in res.output
    assert snapshot(tmp_path) == before


def test_paper_out_refuses_a_link(tmp_path):
    """`paper --out LINK` replaced the link with a directory and left its target stale."""
    from wavefront.report import paper
    target = tmp_path / "real_paper"
    target.mkdir()
    (target / "draft.md").write_text("the paper\n")
    link = tmp_path / "paper"
    link.symlink_to(target)
    before = snapshot(tmp_path)
    with pytest.raises(files.UnsafePath, match="symbolic link"):
        paper.build(tmp_path / "no-data", link, tmp_path / "no-experiments", log=lambda m: None)
    assert snapshot(tmp_path) == before


def test_paper_refuses_a_link_inside_the_paper(tmp_path):
    from wavefront.report import paper
    out = tmp_path / "paper"
    out.mkdir()
    victim = tmp_path / "victim.md"
    victim.write_text("precious\n")
    (out / "draft.md").symlink_to(victim)
    before = snapshot(tmp_path)
    with pytest.raises(files.UnsafePath, match="draft.md"):
        paper.build(tmp_path / "no-data", out, tmp_path / "no-experiments", log=lambda m: None)
    assert snapshot(tmp_path) == before


def test_an_interrupted_paper_build_leaves_no_building_copy(tmp_path):
    """SIGTERM (what `timeout` sends) left the full .building copy behind."""
    out = tmp_path / "paper"
    out.mkdir()
    (out / "draft.md").write_text("the paper\n")
    script = (
        "import time, sys\n"
        "from wavefront.report import paper\n"
        "paper._build_into = lambda *a: time.sleep(60)\n"
        f"paper.build('x', {str(out)!r}, 'y', log=print)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not list(tmp_path.glob(".paper.building-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp_path.glob(".paper.building-*")), "the build never started"
        proc.terminate()
        proc.wait(timeout=20)
    finally:
        proc.kill()
    assert not list(tmp_path.glob(".paper.*")), list(tmp_path.iterdir())
    assert (out / "draft.md").read_text() == "the paper\n"


def test_a_killed_builds_copy_is_removed_by_the_next(tmp_path):
    from wavefront.report import paper
    out = tmp_path / "paper"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".paper.building-{dead.pid}"
    (stale / "figures").mkdir(parents=True)
    alive = tmp_path / f".paper.building-{os.getppid()}"  # a live process's: kept
    alive.mkdir()
    with pytest.raises(Exception):
        paper.build(tmp_path / "no-data", out, tmp_path / "no-experiments", log=lambda m: None)
    assert not stale.exists() and alive.exists()


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory"])
@pytest.mark.parametrize("loader", ["tuned table", "carry-over", "results", "manifest",
                                    "records"])
def test_non_regular_files_are_refused_before_reading(tmp_path, monkeypatch, kind, loader):
    """A FIFO hung, /dev/zero read 5 GB."""
    names = {"tuned table": "tuned.json", "carry-over": "choices.json",
             "results": "results.csv", "manifest": "manifest.json", "records": "bench.jsonl"}
    path = tmp_path / names[loader]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    with pytest.raises((ValueError, SchemaError)) as err:
        if loader == "tuned table":
            from wavefront.kernel.tuning import tuned_config
            tuned_config("GPU", Q, Q, False, path)
        elif loader == "carry-over":
            from wavefront.kernel.carry_over import stored_choice
            stored_choice(path, "GPU", Q, Q, False, "x", [])
        elif loader == "results":
            load_results(path, require_manifest=False)
        elif loader == "manifest":
            read_manifest(tmp_path)
        else:
            TUNE_RECORDS.read(path)
    assert "regular file" in str(err.value) and str(path) in str(err.value), err.value


def test_a_gzip_bomb_is_refused_within_the_bound(tmp_path, monkeypatch):
    """A bomb reached 3.3 GB. Bound lowered to 4 MiB here; the 64 MiB bomb is refused after
    at most the bound (and one chunk) is unpacked."""
    monkeypatch.setattr(files, "MAX_UNPACKED_BYTES", 4 << 20)
    bomb = tmp_path / "tune.jsonl.gz"
    bomb.write_bytes(gzip.compress(b"\n" * (64 << 20), compresslevel=9))
    with pytest.raises(SchemaError, match="decompression bomb"):
        TUNE_RECORDS.read(bomb)


def test_a_gzip_bomb_at_the_default_bound_costs_bounded_memory(tmp_path):
    """In a process of its own: a 768 MiB bomb (under 1 MB on disk) refused with the peak
    memory near the default bound, not the bomb's size."""
    bomb = tmp_path / "results.csv.gz"
    with gzip.open(bomb, "wb", compresslevel=6) as f:
        chunk = b"\0" * (64 << 20)
        for _ in range(12):  # 768 MiB, past the 512 MiB bound
            f.write(chunk)
    # The peak is read with the project's peak_rss_mib (VmHWM): getrusage's ru_maxrss is
    # carried across exec on Linux and reported the pytest worker's own peak on CI (1251 MiB).
    code = ("from wavefront.results.progress import peak_rss_mib\n"
            "from wavefront.results.store import SchemaError, load_results\n"
            "try:\n"
            f"    load_results({str(bomb)!r}, require_manifest=False)\n"
            "except SchemaError as e:\n"
            "    print('refused', 'decompression bomb' in str(e))\n"
            "print(int(peak_rss_mib()))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    lines = out.stdout.split()
    assert lines[:2] == ["refused", "True"], out.stdout + out.stderr
    # Unpacking the whole bomb would cost its 768 MiB at least; the bound, about 512.
    assert int(lines[-1]) < (files.MAX_UNPACKED_BYTES >> 20) + 200, lines  # MiB


def test_manifests_are_written_readable_by_all(tmp_path):
    """Manifests were written mode 0600 (mkstemp's)."""
    from wavefront.results.store import write_manifest
    entry = {"schema_version": 5, "date": "d", "gpu": "H100", "git_commit": "c",
             "command": "x"}
    path = write_manifest(tmp_path, "r1", entry)
    assert path.stat().st_mode & 0o777 == 0o644


# ============================================================================================
# The new unfriendly cases
# ============================================================================================

CASES: list[tuple[str, str, str]] = []  # (family, case, outcome class)


def _cases(family, rows):
    for row in rows:
        CASES.append((family, row[0], row[-1]))
    return pytest.mark.parametrize("case", rows, ids=[r[0] for r in rows])


def _member(text: bytes) -> bytes:
    return gzip.compress(text, mtime=0)


_JSONL = b"".join(json.dumps({"gpu": "G", "shape": {"seqlen": i}}).encode() + b"\n"
                  for i in range(50))
_ONE = _member(_JSONL)
_TWO = _member(_JSONL) + _member(b'{"gpu": "G", "shape": {}}\n')

# (case, bytes of a packed *.jsonl.gz, outcome class)
PACKED = [
    ("empty file", b"", "refused"),
    ("one byte of the magic", b"\x1f", "refused"),
    ("magic only", b"\x1f\x8b", "refused"),
    ("header only", _ONE[:10], "refused"),
    ("one member cut at 10%", _ONE[:len(_ONE) // 10], "refused"),
    ("one member cut at 50%", _ONE[:len(_ONE) // 2], "refused"),
    ("one member cut at 90%", _ONE[:len(_ONE) * 9 // 10], "refused"),
    ("one member without its last byte", _ONE[:-1], "refused"),
    ("one member without its trailer", _ONE[:-8], "refused"),
    ("plain text named .gz", _JSONL, "refused"),
    ("plain JSON object named .gz", b'{"gpu": "G"}', "refused"),
    ("bzip2 data", b"BZh91AY&SY" + b"\0" * 40, "refused"),
    ("xz data", b"\xfd7zXZ\0" + b"\0" * 40, "refused"),
    ("a zip archive", b"PK\x03\x04" + b"\0" * 40, "refused"),
    ("garbage after the member", _ONE + b"garbage", "refused"),
    ("zero padding after the member", _ONE + b"\0" * 512, "refused"),
    ("plain lines appended to a packed file", _ONE + _JSONL, "refused"),
    ("a corrupt CRC", _ONE[:-8] + bytes(8 * [0x55]), "refused"),
    ("a byte flipped inside the data", _ONE[:30] + bytes([_ONE[30] ^ 0xFF]) + _ONE[31:],
     "refused"),
    ("a corrupt second member (a reserved block type)", _ONE + _member(b"x\n")[:10]
     + b"\xff" * 30, "refused"),
    ("a torn final append (half a member)", _TWO[:len(_ONE) + 15], "recovered"),
    ("a torn final append (one header byte)", _ONE + b"\x1f", "recovered"),
    ("a torn final append (header only)", _ONE + _member(b"{}\n")[:10], "recovered"),
    ("a torn final append (no trailer)", _TWO[:-8], "recovered"),
    ("two complete members", _TWO, "accepted"),
    ("one complete member", _ONE, "accepted"),
    ("an empty member then rows", _member(b"") + _ONE, "accepted"),
]


def _read_packed_as(loader: str, path: Path):
    if loader == "records":
        return TUNE_RECORDS.read(path)
    if loader == "reader":
        return files.read_packed(path, "a test file")
    if loader == "fold":
        fold = _fold_module()
        return fold._records(path)
    raise AssertionError(loader)


_LOADERS = ["records", "reader", "fold"]
for _loader in _LOADERS:
    for _row in PACKED:
        CASES.append((f"packed file via {_loader}", _row[0], _row[-1]))


@pytest.mark.parametrize("loader", _LOADERS)
@pytest.mark.parametrize("case", PACKED, ids=[r[0] for r in PACKED])
def test_packed_files_read_or_refuse_by_name(tmp_path, loader, case):
    name, data, outcome = case
    path = tmp_path / "tune.jsonl.gz"
    path.write_bytes(data)
    before = snapshot(tmp_path)
    errors = (SchemaError, files.FileRefused, ValueError)
    if outcome == "refused":
        with pytest.raises(errors) as err:
            _read_packed_as(loader, path)
        assert str(path) in str(err.value), err.value
    elif outcome == "recovered":
        with pytest.warns(files.TornAppend, match=str(path)):
            got = _read_packed_as(loader, path)
        assert len(got if loader != "reader" else got.splitlines()) == 50
    else:
        got = _read_packed_as(loader, path)
        assert len(got if loader != "reader" else got.splitlines()) >= 50
    assert snapshot(tmp_path) == before


# The same damage to a results table and a manifest (their loaders add the schema's checks).
_TABLE_DAMAGE = [
    ("results cut at 25%", lambda b: b[:len(b) // 4], "refused"),
    ("results cut at 75%", lambda b: b[:len(b) * 3 // 4], "refused"),
    ("results without its trailer", lambda b: b[:-8], "refused"),
    ("results unpacked but named .gz", gzip.decompress, "refused"),
    ("results with garbage appended", lambda b: b + b"garbage!", "refused"),
    ("results with a torn appended row", lambda b: b + _member(b"x,y\n")[:15], "recovered"),
    ("results as they are", lambda b: b, "accepted"),
]


@_cases("packed results table", _TABLE_DAMAGE)
def test_a_packed_results_table_reads_or_refuses_by_name(tmp_path, case):
    name, damage, outcome = case
    d = _knee_copy(tmp_path)
    path = d / "results.csv.gz"
    path.write_bytes(damage(path.read_bytes()))
    before = snapshot(d)
    if outcome == "refused":
        with pytest.raises(SchemaError, match=str(path)):
            load_results(path)
    elif outcome == "recovered":
        with pytest.warns(files.TornAppend):
            assert len(load_results(path)) == len(load_results(KNEE / "results.csv.gz"))
    else:
        assert len(load_results(path)) > 400
    assert snapshot(d) == before


_MANIFEST_DAMAGE = [
    ("manifest cut at 50%", lambda b: b[:len(b) // 2], "refused"),
    ("manifest without its last byte", lambda b: b[:-1], "refused"),
    ("manifest unpacked but named .gz", gzip.decompress, "refused"),
    ("manifest emptied", lambda b: b"", "refused"),
    ("manifest packed twice", lambda b: _member(b), "refused"),
    ("manifest as it is", lambda b: b, "accepted"),
]


@_cases("packed manifest", _MANIFEST_DAMAGE)
def test_a_packed_manifest_reads_or_refuses_by_name(tmp_path, case):
    name, damage, outcome = case
    d = _knee_copy(tmp_path)
    path = d / "manifest.json.gz"
    path.write_bytes(damage(path.read_bytes()))
    before = snapshot(d)
    if outcome == "refused":
        with pytest.raises(SchemaError, match=str(path)):
            read_manifest(d)
    else:
        assert read_manifest(d)
    assert snapshot(d) == before


# --------------------------------------------------------------------------------------------
# The tuned table
# --------------------------------------------------------------------------------------------

def _table(entry=None, key="d128_full", gpu="GPU"):
    return json.dumps({gpu: {key: _tuned_entry() if entry is None else entry}})


TUNED = [
    ("not JSON", "not json", "refused"),
    ("cut JSON", _table()[:40], "refused"),
    ("empty file", "", "refused"),
    ("a list", "[]", "refused"),
    ("a number", "5", "refused"),
    ("null", "null", "refused"),
    ("GPU entries a list", '{"GPU": []}', "refused"),
    ("GPU entries a string", '{"GPU": "fast"}', "refused"),
    ("an entry a list", _table([]), "refused"),
    ("an entry null", '{"GPU": {"d128_full": null}}', "refused"),
    ("entry lacks schedule", _table({k: v for k, v in _tuned_entry().items()
                                     if k != "schedule"}), "refused"),
    ("entry lacks tiles", _table({k: v for k, v in _tuned_entry().items()
                                  if k != "tiles"}), "refused"),
    ("entry lacks occupancy", _table({k: v for k, v in _tuned_entry().items()
                                      if k != "occupancy"}), "refused"),
    ("schedule unknown", _table(_tuned_entry(schedule="zigzag+linear")), "refused"),
    ("schedule a number", _table(_tuned_entry(schedule=3)), "refused"),
    ("schedule empty", _table(_tuned_entry(schedule="")), "refused"),
    ("tiles 96x64", _table(_tuned_entry(tiles="96x64")), "refused"),
    ("tiles a number", _table(_tuned_entry(tiles=128)), "refused"),
    ("tiles garbage", _table(_tuned_entry(tiles="big")), "refused"),
    ("occupancy 0", _table(_tuned_entry(occupancy=0)), "refused"),
    ("occupancy 33", _table(_tuned_entry(occupancy=33)), "refused"),
    ("occupancy true", _table(_tuned_entry(occupancy=True)), "refused"),
    ("occupancy a string", _table(_tuned_entry(occupancy="2")), "refused"),
    ("occupancy 1.5", _table(_tuned_entry(occupancy=1.5)), "refused"),
    ("worker_warps 5", _table(_tuned_entry(worker_warps=5)), "refused"),
    ("cluster 3", _table(_tuned_entry(cluster=3)), "refused"),
    ("kv_latency -1", _table(_tuned_entry(kv_latency=-1)), "refused"),
    ("exp2_poly a string", _table(_tuned_entry(exp2_poly="2")), "refused"),
    ("tflops NaN", _table().replace("600.0", "NaN"), "refused"),
    ("tflops Infinity", _table().replace("600.0", "Infinity"), "refused"),
    ("tflops -Infinity", _table().replace("600.0", "-Infinity"), "refused"),
    ("tflops negative", _table(_tuned_entry(tflops=-600.0)), "refused"),
    ("tflops zero", _table(_tuned_entry(tflops=0)), "refused"),
    ("tflops 1e308", _table(_tuned_entry(tflops=1e308)), "refused"),
    ("tflops a string", _table(_tuned_entry(tflops="600")), "refused"),
    ("tflops true", _table(_tuned_entry(tflops=True)), "refused"),
    ("x_cudnn negative", _table(_tuned_entry(x_cudnn=-1.0)), "refused"),
    ("x_cudnn NaN", _table().replace("1.05", "NaN"), "refused"),
    ("shape missing", _table({k: v for k, v in _tuned_entry().items()
                              if k != "shape"}), "refused"),
    ("shape garbage", _table(_tuned_entry(shape="big")), "refused"),
    ("shape with zero heads", _table(_tuned_entry(shape="B=1 H=0 KV=0 S=8192 bfloat16")),
     "refused"),
    ("shape heads not a multiple of kv", _table(_tuned_entry(shape="B=1 H=32 KV=5 S=8192")),
     "refused"),
    ("key of an unknown head dim", _table(key="d96_full"), "refused"),
    ("key garbage", _table(key="fastest"), "refused"),
    ("measured a number", _table(_tuned_entry(measured=5)), "refused"),
    ("duplicated entry key", '{"GPU": {"d128_full": %s, "d128_full": %s}}'
     % (json.dumps(_tuned_entry()), json.dumps(_tuned_entry())), "refused"),
    ("duplicated GPU", '{"GPU": {}, "GPU": {}}', "refused"),
    ("nested 100000 deep", "[" * 100000 + "]" * 100000, "refused"),
    ("binary garbage", "\udcff\udcfe", "refused"),
    ("a valid table", _table(), "accepted"),
    ("a valid table without tflops", _table({k: v for k, v in _tuned_entry().items()
                                             if k != "tflops"}), "accepted"),
    ("a valid table, x_cudnn null", _table(_tuned_entry(x_cudnn=None)), "accepted"),
]


@_cases("tuned table", TUNED)
def test_a_tuned_table_loads_or_is_refused_naming_file_and_field(tmp_path, case):
    from wavefront.kernel.tuning import tuned_config
    name, text, outcome = case
    path = tmp_path / "tuned.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    before = snapshot(tmp_path)
    if outcome == "refused":
        with pytest.raises(ValueError) as err:
            tuned_config("GPU", Q, Q, False, path)
        assert str(path) in str(err.value), err.value
    else:
        assert tuned_config("GPU", Q, Q, False, path)["schedule"] == "dynamic+linear"
    assert snapshot(tmp_path) == before


def test_a_tuned_table_past_the_size_bound_is_refused_unread(tmp_path, monkeypatch):
    from wavefront.kernel.tuning import tuned_config
    CASES.append(("tuned table", "past the size bound", "refused"))
    monkeypatch.setattr(files, "MAX_TABLE_BYTES", 1000)
    path = tmp_path / "tuned.json"
    path.write_text(_table() + " " * 2000)
    with pytest.raises(ValueError, match="more than the 1000"):
        tuned_config("GPU", Q, Q, False, path)


SLOWED = [
    ("recorded -inf", {"tflops": float("-inf")}, 600.0, "refused"),
    ("recorded 0", {"tflops": 0}, 600.0, "refused"),
    ("recorded negative", {"tflops": -5}, 600.0, "refused"),
    ("recorded true", {"tflops": True}, 600.0, "refused"),
    ("recorded a list", {"tflops": [600]}, 600.0, "refused"),
    ("recorded a dict", {"tflops": {}}, 600.0, "refused"),
    ("winner NaN", {"tflops": 600.0}, float("nan"), "refused"),
    ("winner inf", {"tflops": 600.0}, float("inf"), "refused"),
    ("winner a string", {"tflops": 600.0}, "fast", "refused"),
    ("winner under half the recorded", {"tflops": 600.0}, 250.0, "refused"),
    ("winner above the recorded", {"tflops": 600.0}, 650.0, "accepted"),
    ("no entry yet", None, 650.0, "accepted"),
    ("an entry without tflops", {"schedule": "grid+linear"}, 650.0, "accepted"),
]


@_cases("slowed-GPU guard", SLOWED)
def test_the_slowed_gpu_guard_answers_in_words(case):
    from wavefront.measure.tune import slowed_gpu
    name, previous, winner, outcome = case
    why = slowed_gpu({"tflops": winner}, previous)
    assert (why is not None) == (outcome == "refused"), why
    assert why is None or "not written" in why


WRITE_ENTRY = [
    ("an entry with an unknown schedule", _tuned_entry(schedule="zigzag+linear"), "refused"),
    ("an entry with tflops NaN", _tuned_entry(tflops=float("nan")), "refused"),
    ("an entry with tiles 96x64", _tuned_entry(tiles="96x64"), "refused"),
    ("an entry with a bad shape", _tuned_entry(shape="B=1 H=32"), "refused"),
    ("an entry with occupancy 0", _tuned_entry(occupancy=0), "refused"),
    ("a valid entry", _tuned_entry(), "accepted"),
]


@_cases("tune --write entry", WRITE_ENTRY)
def test_write_entry_refuses_what_the_table_would_not_load(tmp_path, case):
    from wavefront.kernel.tuning import load_table, write_entry
    name, entry, outcome = case
    path = tmp_path / "tuned.json"
    path.write_text(_table())
    before = snapshot(tmp_path)
    if outcome == "refused":
        with pytest.raises(ValueError):
            write_entry("GPU", 128, True, entry, path)
        assert snapshot(tmp_path) == before
    else:
        write_entry("GPU", 128, True, entry, path)
        assert len(load_table(path)["GPU"]) == 2
        assert path.stat().st_mode & 0o777 == 0o644


# --------------------------------------------------------------------------------------------
# Carry-over choices files
# --------------------------------------------------------------------------------------------

_CONFIG = {k: _tuned_entry()[k] for k in ("schedule", "tiles", "occupancy", "worker_warps",
                                          "cluster", "kv_latency", "rescale_threshold",
                                          "exp2_poly", "qk_ahead")}


def _choice(**over):
    return {"config": _CONFIG, "timed": [{"config": _CONFIG, "ms": 1.5,
                                          "range_ms": [1.4, 1.7]}],
            "left_out": [], "seconds": 2.0, **over}


def _choices(choice=None):
    from wavefront.kernel.carry_over import _file_key
    return json.dumps({_file_key("GPU", Q, Q, False, "t"): _choice() if choice is None
                       else choice})


CHOICES = [
    ("not JSON", "{", "refused"),
    ("a list", "[]", "refused"),
    ("a choice a string", _choices("fast"), "refused"),
    ("config missing", _choices({k: v for k, v in _choice().items() if k != "config"}),
     "refused"),
    ("config a list", _choices(_choice(config=[])), "refused"),
    ("config with an unknown schedule", _choices(_choice(config={**_CONFIG,
                                                                 "schedule": "x+y"})),
     "refused"),
    ("config with tiles 7x7", _choices(_choice(config={**_CONFIG, "tiles": "7x7"})),
     "refused"),
    ("timed missing", _choices({k: v for k, v in _choice().items() if k != "timed"}),
     "refused"),
    ("timed empty", _choices(_choice(timed=[])), "refused"),
    ("timed a dict", _choices(_choice(timed={})), "refused"),
    ("timed ms NaN", _choices().replace("1.5", "NaN"), "refused"),
    ("timed ms negative", _choices(_choice(timed=[{"config": _CONFIG, "ms": -1,
                                                    "range_ms": [1, 2]}])), "refused"),
    ("timed ms a string", _choices(_choice(timed=[{"config": _CONFIG, "ms": "1",
                                                    "range_ms": [1, 2]}])), "refused"),
    ("range_ms of three", _choices(_choice(timed=[{"config": _CONFIG, "ms": 1,
                                                    "range_ms": [1, 2, 3]}])), "refused"),
    ("range_ms Infinity", _choices().replace("1.7", "Infinity"), "refused"),
    ("chosen config not timed", _choices(_choice(config={**_CONFIG, "occupancy": 2})),
     "refused"),
    ("left_out a string", _choices(_choice(left_out="none")), "refused"),
    ("left_out without why", _choices(_choice(left_out=[{"config": _CONFIG}])), "refused"),
    ("seconds negative", _choices(_choice(seconds=-1)), "refused"),
    ("seconds a string", _choices(_choice(seconds="2")), "refused"),
    ("duplicated keys", '{"a": %s, "a": %s}' % (json.dumps(_choice()), json.dumps(_choice())),
     "refused"),
    ("a valid file", _choices(), "accepted"),
    ("an empty object", "{}", "accepted"),
]


@_cases("carry-over file", CHOICES)
def test_a_choices_file_loads_or_is_refused_naming_file_and_field(tmp_path, case):
    from wavefront.kernel.carry_over import stored_choice
    name, text, outcome = case
    path = tmp_path / "choices.json"
    path.write_text(text)
    before = snapshot(tmp_path)
    if outcome == "refused":
        with pytest.raises(ValueError) as err:
            stored_choice(path, "GPU", Q, Q, False, "t", [_CONFIG])
        assert str(path) in str(err.value), err.value
    else:
        got = stored_choice(path, "GPU", Q, Q, False, "t", [_CONFIG])
        assert got is None or got.config == _CONFIG
    assert snapshot(tmp_path) == before


STORE_CHOICE = [
    ("the file is a link", "link", "refused"),
    ("the disk is full", "full", "refused"),
    ("the file is a FIFO", "fifo", "refused"),
    ("a new file", "new", "accepted"),
]


@_cases("carry-over store", STORE_CHOICE)
def test_storing_a_choice_is_atomic_and_refuses_links(tmp_path, monkeypatch, case):
    from wavefront.kernel.carry_over import CarryOverChoice, store_choice
    name, how, outcome = case
    path = tmp_path / "choices.json"
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    if how == "link":
        path.symlink_to(victim)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "full":
        path.write_text(_choices())
        monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(
            OSError(errno.ENOSPC, "No space left on device")))
    choice = CarryOverChoice.from_dict(_choice())
    before = snapshot(tmp_path)
    if outcome == "refused":
        with pytest.raises((ValueError, OSError)):
            store_choice(path, "GPU", Q, (1, 8, 8192, 128), False, "t", choice)
        assert snapshot(tmp_path) == before
    else:
        store_choice(path, "GPU", Q, Q, False, "t", choice)
        assert json.loads(path.read_text()) and path.stat().st_mode & 0o777 == 0o644


# --------------------------------------------------------------------------------------------
# The writer itself
# --------------------------------------------------------------------------------------------

def _raise_enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


WRITER = [
    ("target a link to a file", "link_file", "refused"),
    ("target a dangling link", "link_dangling", "refused"),
    ("target a link to a directory", "link_dir", "refused"),
    ("target a directory", "dir", "refused"),
    ("target a FIFO", "fifo", "refused"),
    ("parent missing", "no_parent", "refused"),
    ("ENOSPC while writing", "enospc_write", "refused"),
    ("ENOSPC at fsync", "enospc_fsync", "refused"),
    ("the rename fails", "rename_fails", "refused"),
    ("interrupted while writing", "interrupt", "refused"),
    ("fewer rows than the file", "shrink", "refused"),
    ("fewer rows of a packed file", "shrink_packed", "refused"),
    ("the existing packed file is damaged", "damaged_old", "refused"),
    ("fewer rows, allowed", "shrink_allowed", "accepted"),
    ("more rows", "grow", "accepted"),
    ("a new packed file", "packed_new", "accepted"),
    ("a read-only file's mode kept", "mode_kept", "accepted"),
    ("text with non-ASCII characters", "unicode", "accepted"),
]


@_cases("writer", WRITER)
def test_the_writer_replaces_whole_or_not_at_all(tmp_path, monkeypatch, case):
    name, how, outcome = case
    d = tmp_path / "d"
    d.mkdir()
    target = d / ("t.jsonl.gz" if "packed" in how or how == "damaged_old" else "t.jsonl")
    old = b"1\n2\n3\n"
    if how not in ("link_dangling", "link_dir", "dir", "fifo", "no_parent", "packed_new"):
        target.write_bytes(_member(old) if target.name.endswith(".gz") else old)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    kwargs = {"rows": files.line_rows}
    text = b"1\n2\n3\n4\n"
    if how.startswith("link"):
        target.unlink(missing_ok=True)
        target.symlink_to(victim if how == "link_file" else tmp_path / "nothing"
                          if how == "link_dangling" else tmp_path)
    elif how == "dir":
        target.mkdir()
    elif how == "fifo":
        os.mkfifo(target)
    elif how == "no_parent":
        target = d / "missing" / "t.jsonl"
    elif how == "enospc_write":
        monkeypatch.setattr(os, "write", _raise_enospc)
    elif how == "enospc_fsync":
        monkeypatch.setattr(os, "fsync", _raise_enospc)
    elif how == "rename_fails":
        monkeypatch.setattr(os, "replace", _raise_enospc)
    elif how == "interrupt":
        monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(
            KeyboardInterrupt()))
    elif how in ("shrink", "shrink_packed", "shrink_allowed"):
        text = b"1\n"
        kwargs["allow_shrink"] = how == "shrink_allowed"
    elif how == "damaged_old":
        target.write_bytes(_member(old)[:12])
    elif how == "mode_kept":
        target.chmod(0o444)
    elif how == "unicode":
        text = "é\nü\n✓\nß\n".encode()
    before = snapshot(tmp_path)
    if outcome == "refused":
        with pytest.raises((files.FileRefused, OSError, KeyboardInterrupt)):
            files.write_file(target, text, what="a test file", **kwargs)
        monkeypatch.undo()
        assert snapshot(tmp_path) == before  # the original untouched, no temporary left
    else:
        files.write_file(target, text, what="a test file", **kwargs)
        monkeypatch.undo()
        assert files.read_packed(target) == text
        assert (target.stat().st_mode & 0o777) == (0o444 if how == "mode_kept" else 0o644)
        assert sorted(p.name for p in d.iterdir()) == [target.name]


# --------------------------------------------------------------------------------------------
# Command-line flags this change touches
# --------------------------------------------------------------------------------------------

def _cli_dir(tmp_path, how):
    d = tmp_path / "d"
    d.mkdir()
    if how == "only packed":
        shutil.copy(KNEE / "results.csv.gz", d)
        shutil.copy(KNEE / "manifest.json.gz", d)
    elif how == "plain manifest beside a different packed one":
        shutil.copy(KNEE / "manifest.json.gz", d)
        (d / "manifest.json").write_text('{"r": {}}')
    elif how == "a FIFO named results.csv":
        os.mkfifo(d / "results.csv")
    elif how == "a FIFO named bench.jsonl":
        os.mkfifo(d / "bench.jsonl")
    elif how == "a link named bench.jsonl":
        (tmp_path / "victim.jsonl").write_text('{"a": 1}\n')
        (d / "bench.jsonl").symlink_to(tmp_path / "victim.jsonl")
    elif how == "identical plain and packed records":
        shutil.copy(FOUNDATION, d / "bench.jsonl.gz")
        (d / "bench.jsonl").write_bytes(gzip.decompress(FOUNDATION.read_bytes()))
    elif how == "a plain record file":
        (d / "bench.jsonl").write_text('{"a": 1}\n')
    return d


COMPRESS = [
    ("digits 3", "only packed", ["--significant-digits", "3"], 2, "refused"),
    ("digits 18", "only packed", ["--significant-digits", "18"], 2, "refused"),
    ("digits abc", "only packed", ["--significant-digits", "abc"], 2, "refused"),
    ("digits -7", "only packed", ["--significant-digits", "-7"], 2, "refused"),
    ("a directory that does not exist", "missing", [], 2, "refused"),
    ("a plain manifest beside a different packed one",
     "plain manifest beside a different packed one", [], 1, "refused"),
    ("a FIFO named results.csv", "a FIFO named results.csv", [], 2, "refused"),
    ("a FIFO named bench.jsonl", "a FIFO named bench.jsonl", [], 1, "refused"),
    ("a link named bench.jsonl", "a link named bench.jsonl", [], 1, "refused"),
    ("nothing to pack", "empty", [], 2, "refused"),
    ("identical plain and packed records", "identical plain and packed records", [], 0,
     "accepted"),
    ("a plain record file", "a plain record file", [], 0, "accepted"),
    ("packed files at 7 digits", "only packed", ["--significant-digits", "7"], 0, "accepted"),
]


@_cases("wavefront compress", COMPRESS)
def test_compress_flags(tmp_path, case):
    name, how, extra, code, outcome = case
    d = _cli_dir(tmp_path, how) if how != "missing" else tmp_path / "missing"
    before = snapshot(tmp_path)
    res = CliRunner().invoke(main, ["compress", str(d), *extra])
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output and not isinstance(res.exception, TimeoutError)
    if outcome == "refused":
        assert snapshot(tmp_path) == before
    elif how != "only packed":  # packed again: rows the same (checked by compress itself)
        assert not (d / "bench.jsonl").exists() and (d / "bench.jsonl.gz").exists()


THREADS = [
    ("abc", "refused"), ("0", "refused"), ("-1", "refused"), ("1e3", "refused"),
    ("99999", "refused"), ("4.5", "refused"), ("nan", "refused"),
    ("", "refused"), ("1", "accepted"), ("8", "accepted"), (" 2 ", "accepted"),
]


@_cases("WAVEFRONT_TABLE_THREADS", THREADS)
def test_the_table_threads_setting_is_named_when_wrong(monkeypatch, case):
    value, outcome = case
    monkeypatch.setenv("WAVEFRONT_TABLE_THREADS", value)
    res = CliRunner().invoke(main, ["simulate", "--gpu", "h100", "--seqlen", "1024",
                                    "--head-dim", "64", "--schedule", "persistent+linear"])
    assert "Traceback" not in res.output
    if outcome == "refused":
        assert res.exit_code == 1 and "WAVEFRONT_TABLE_THREADS" in res.output, res.output
    else:
        assert res.exit_code == 0, res.output


OUT_FLAGS = [
    ("timeline into a file, not a directory", "--timeline-out", "file", (), "refused"),
    ("trace into a file, not a directory", "--trace-out", "file", ("--no-clock",), "refused"),
    ("timeline into a linked directory", "--timeline-out", "dirlink", (), "accepted"),
    ("timeline into a new directory", "--timeline-out", "new", (), "accepted"),
]


@_cases("simulate outputs", OUT_FLAGS)
def test_simulate_output_flags(tmp_path, case):
    name, option, how, extra, outcome = case
    out = tmp_path / "out"
    if how == "file":
        out.write_text("a file")
    elif how == "dirlink":
        (tmp_path / "real").mkdir()
        out.symlink_to(tmp_path / "real")
    before = snapshot(tmp_path)
    res = _simulate(option, out, *extra)
    assert "Traceback" not in res.output
    if outcome == "refused":
        assert res.exit_code == 2, res.output
        assert snapshot(tmp_path) == before
    else:
        assert res.exit_code == 0, res.output
        assert len(os.listdir(out)) == 1


SPEC_VALUES = [
    ("timeout_s 1e-300", "timeout_s = 1e-300", "timeout_s", "refused"),
    ("timeout_s 0.5", "timeout_s = 0.5", "timeout_s", "refused"),
    ("timeout_s 1", "timeout_s = 1", None, "accepted"),
]


@_cases("sweep spec", SPEC_VALUES)
def test_spec_values_are_checked_before_a_gpu_is_looked_for(tmp_path, case):
    name, line, named, outcome = case
    spec = tmp_path / "s.toml"
    spec.write_text(f'name = "s"\nmeasure = ["timing"]\n{line}\n[grid]\nseqlen = [1024]\n'
                    'head_dim = [64]\nschedule = ["persistent+linear"]\n')
    res = CliRunner().invoke(main, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    assert "Traceback" not in res.output
    if outcome == "refused":
        assert res.exit_code == 2 and named in res.output, res.output
    else:  # the spec holds: then the missing GPU is what stops it
        assert res.exit_code == 1 and "GPU" in res.output, res.output


def test_a_spec_value_only_expansion_reveals_is_named_before_the_gpu(tmp_path):
    """The issue's case: on a CPU-only machine the spec's bad value is named, not 'no CUDA
    GPU is visible'."""
    CASES.append(("sweep spec", "ctas past the grid (4294967296)", "refused"))
    spec = tmp_path / "s.toml"
    spec.write_text('name = "s"\nmeasure = ["timing"]\n[grid]\nseqlen = [1024]\n'
                    'head_dim = [64]\nschedule = ["persistent+linear"]\n'
                    'ctas = [4294967296]\n')
    res = CliRunner().invoke(main, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    assert "Traceback" not in res.output and "no CUDA GPU" not in res.output, res.output
    assert res.exit_code in (1, 2) and "ctas" in res.output, res.output


PLAN_CTAS = [("ctas 10**12", 10**12, "refused"), ("ctas 2**31", 2**31, "refused"),
             ("ctas 2**31 - 1", 2**31 - 1, "accepted"), ("ctas 48", 48, "accepted")]


@_cases("plan ctas", PLAN_CTAS)
def test_plan_bounds_ctas_by_the_grid(case):
    from wavefront.point import plan
    name, ctas, outcome = case
    call = lambda: plan((1, 2, 256, 64), (1, 2, 256, 64), sms=132, l2_bytes=50 << 20,  # noqa
                        ctas=ctas)
    if outcome == "refused":
        with pytest.raises(ValueError, match="ctas must be a positive integer up to"):
            call()
    else:
        assert call().resident_ctas == ctas


def test_resume_refuses_a_table_fit_would_refuse(tmp_path):
    """A resume appended rows to a table that `fit` refuses (here: one row's point key no
    longer its parameters'); the table is left as it was."""
    CASES.append(("sweep resume", "into a table fit refuses", "refused"))
    from wavefront.results.sweep import load_spec, run_sweep
    d = tmp_path / "out"
    d.mkdir()
    lines = read_results_bytes(KNEE / "results.csv.gz").decode().splitlines()
    lines[1] = lines[1].replace("seqlen=", "seqlen=1", 1)
    (d / "results.csv").write_text("\n".join(lines) + "\n")
    shutil.copy(KNEE / "manifest.json.gz", d)
    spec_path = tmp_path / "s.toml"
    spec_path.write_text('name = "s"\nmeasure = ["timing"]\n[grid]\nseqlen = [1024]\n'
                         'head_dim = [64]\nschedule = ["persistent+linear"]\n')
    before = snapshot(d)
    with pytest.raises(SchemaError, match="not resumed"):
        run_sweep(load_spec(spec_path), d, gpu="G", sms=132, l2_bytes=50 << 20, runner=None,
                  progress=False)
    after = snapshot(d)
    after.pop(".lock", None)
    before.pop(".lock", None)
    assert after == before


def _table_of_cases() -> str:
    counts = Counter(outcome for _, _, outcome in CASES)
    families = Counter(family for family, _, _ in CASES)
    lines = ["| family | cases |", "|---|---|"]
    lines += [f"| {f} | {n} |" for f, n in families.items()]
    lines += ["", "| outcome class | cases |", "|---|---|"]
    lines += [f"| {o} | {n} |" for o, n in sorted(counts.items())]
    lines += [f"| total | {len(CASES)} |"]
    return "\n".join(lines)


def test_there_are_at_least_150_new_cases():
    assert len(CASES) >= 150, len(CASES)
    assert {o for _, _, o in CASES} == {"refused", "recovered", "accepted"}


SINK = [
    ("a link as the record file", "link", "refused"),
    ("a cut packed record file", "cut", "refused"),
    ("a packed file with a torn last member", "torn", "recovered"),
    ("a plain file with a torn last line", "torn_plain", "recovered"),
    ("a packed file as it is", "packed", "accepted"),
]


@_cases("record sink (bench/tune --out)", SINK)
def test_a_run_appends_records_only_behind_whole_ones(tmp_path, case):
    from wavefront.measure.sink import JsonlSink
    name, how, outcome = case
    d = tmp_path / "d"
    d.mkdir()
    if how == "link":
        (tmp_path / "victim.jsonl").write_text('{"a": 1}\n')
        (d / "tune.jsonl").symlink_to(tmp_path / "victim.jsonl")
    elif how == "cut":
        (d / "tune.jsonl.gz").write_bytes(_ONE[:len(_ONE) // 2])
    elif how == "torn":
        (d / "tune.jsonl.gz").write_bytes(_TWO[:-8])
    elif how == "torn_plain":
        (d / "tune.jsonl").write_bytes(_JSONL + b'{"gpu": "G", "sh')
    else:
        (d / "tune.jsonl.gz").write_bytes(_ONE)
    before = snapshot(tmp_path)
    if outcome == "refused":
        with pytest.raises(SchemaError) as err:
            JsonlSink(d, "tune.jsonl", manifest_files=())
        assert str(d) in str(err.value)
        assert snapshot(tmp_path) == before
        return
    with JsonlSink(d, "tune.jsonl", manifest_files=()) as sink:
        sink.write({"gpu": "G", "shape": {"seqlen": 99}})
    rows = TUNE_RECORDS.read(d / ("tune.jsonl" if how == "torn_plain" else "tune.jsonl.gz"))
    assert len(rows) == 51 and rows[-1]["shape"]["seqlen"] == 99
    assert (how == "packed") != (d / "repairs.log").exists()  # what was cut is logged


if __name__ == "__main__":
    print(_table_of_cases())
