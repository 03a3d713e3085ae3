"""The store and sweeps survive crashes, short writes, hangs, chatty and failing workers."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from wavefront.measure.runner import SubprocessRunner
from wavefront.results.store import (
    COLUMNS,
    SchemaError,
    StoreLocked,
    DirectoryLock,
    append_row,
    load_results,
    read_results_bytes,
    repair_tail,
    write_manifest,
)
from wavefront.results.sweep import expand, parse_spec, run_sweep

FAKES = Path(__file__).parent / "fakes"
FAKE_WORKER = [sys.executable, str(FAKES / "fake_worker.py")]
GPU = dict(gpu="FakeGPU", sms=132, l2_bytes=50 << 20)

SPEC = """
name = "t"
timeout_s = 3
batch_points = 3
[grid]
seqlen = [128, 256, 384, 512]
head_dim = [64]
causal = [false, true]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""


class CrashingRunner:
    """Measures `limit` tasks, then dies as a killed process would."""

    def __init__(self, limit):
        self.limit = limit

    def run(self, tasks, spec, on_result, on_artifact=None):
        for i, task in enumerate(tasks):
            if i == self.limit:
                raise KeyboardInterrupt
            on_result(task, {"median_ms": 1.0, "rel_error": 1e-3}, None)


def _manifest(path):
    write_manifest(path, "r", {"schema_version": 3, "date": "d", "gpu": "test GPU",
                               "git_commit": "c", "command": "t"})


def test_resume_after_crash_loses_nothing_and_duplicates_nothing(tmp_path):
    spec = parse_spec(SPEC)
    assert len(expand(spec, **GPU)) == 16
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path, runner=CrashingRunner(limit=5), progress=False, **GPU)
    assert len(load_results(tmp_path / "results.csv")) == 5
    summary = run_sweep(spec, tmp_path, runner=CrashingRunner(10**6), progress=False, **GPU)
    assert summary == {"points": 16, "skipped": 5, "ok": 11, "failed": 0}
    df = load_results(tmp_path / "results.csv")
    assert len(df) == 16 and df["point"].is_unique
    assert run_sweep(spec, tmp_path, runner=CrashingRunner(10**6), progress=False,
                     **GPU)["skipped"] == 16


def test_repeats_are_rows_of_their_own_and_interleaved():
    spec = parse_spec(SPEC.replace('name = "t"', 'name = "t"\nrepeats = 3'))
    tasks = expand(spec, **GPU)
    assert len(tasks) == 48
    points = [t["point"] for t in tasks]
    # No point's repeats back to back: all 16 points come between two repeats of one.
    first = [i for i, p in enumerate(points) if p == points[0]]
    assert first == [0, 16, 32] and [t["repeat"] for t in tasks[::16]] == [0, 1, 2]
    # Within a repeat, one kind's tasks are consecutive (a worker measures a batch of them).
    two = expand(parse_spec(SPEC.replace('name = "t"', 'name = "t"\nrepeats = 2\n'
                                                       'measure = ["timing", "counters"]')), **GPU)
    kinds = [t["measurement"] for t in two]
    assert kinds == (["timing"] * 16 + ["counters"] * 16) * 2


def test_torn_last_line_is_repaired_before_the_next_append(tmp_path):
    path = tmp_path / "results.csv"
    append_row(path, {"point": "a", "measurement": "timing", "status": "ok", "run_id": "r"})
    with open(path, "a") as f:
        f.write("b,timing,0,o")  # a write cut short by a crash
    _manifest(tmp_path)
    assert list(load_results(path)["point"]) == ["a"]  # read-only load ignores it
    append_row(path, {"point": "c", "measurement": "timing", "status": "ok", "run_id": "r"})
    assert list(load_results(path)["point"]) == ["a", "c"]
    log = (tmp_path / "repairs.log").read_text()
    assert json.loads(log)["cut"] == "b,timing,0,o"
    assert repair_tail(path) == 0


def test_short_writes_are_completed(tmp_path, monkeypatch):
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data[:7])))
    append_row(tmp_path / "results.csv", {"point": "a" * 50, "measurement": "timing",
                                          "status": "ok", "run_id": "r"})
    monkeypatch.undo()
    _manifest(tmp_path)
    assert list(load_results(tmp_path / "results.csv")["point"]) == ["a" * 50]


def test_a_second_sweep_into_the_same_directory_is_refused(tmp_path):
    with DirectoryLock(tmp_path):
        with pytest.raises(StoreLocked, match="another sweep"):
            run_sweep(parse_spec(SPEC), tmp_path, runner=CrashingRunner(10**6),
                      progress=False, **GPU)
    run_sweep(parse_spec(SPEC), tmp_path, runner=CrashingRunner(10**6), progress=False, **GPU)


def test_data_without_a_valid_manifest_is_refused(tmp_path):
    append_row(tmp_path / "results.csv", {"point": "a", "measurement": "timing",
                                          "status": "ok", "run_id": "r1"})
    with pytest.raises(SchemaError, match="manifest"):
        load_results(tmp_path / "results.csv")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(SchemaError, match="not valid JSON"):
        load_results(tmp_path / "results.csv")
    (tmp_path / "manifest.json").write_text(json.dumps({"r1": {"date": "x"}}))
    with pytest.raises(SchemaError, match="lacks"):
        load_results(tmp_path / "results.csv")
    (tmp_path / "manifest.json").unlink()
    _manifest(tmp_path)
    with pytest.raises(SchemaError, match="no entry for runs"):
        load_results(tmp_path / "results.csv")


def test_failing_hanging_chatty_and_crashing_points_are_recorded(tmp_path):
    spec = parse_spec(SPEC.replace("[128, 256, 384, 512]", "[128, 666, 256, 999, 777, 555, 888]")
                      .replace("causal = [false, true]", "causal = [false]"))
    start = time.monotonic()
    summary = run_sweep(spec, tmp_path, runner=SubprocessRunner(worker_cmd=FAKE_WORKER),
                        progress=False, **GPU)
    assert time.monotonic() - start < 60
    df = load_results(tmp_path / "results.csv")
    assert summary["ok"] == 4 and summary["failed"] == 10
    assert len(df) == 14 and df["point"].is_unique
    by_len = df.groupby("seqlen")["status"].agg(set).to_dict()
    assert by_len == {128: {"ok"}, 256: {"ok"}, 666: {"failed"}, 999: {"failed"},
                      777: {"failed"}, 555: {"failed"}, 888: {"failed"}}
    errors = df.set_index("seqlen")["error"]
    assert errors.loc[666].str.startswith("hung").all()
    assert errors.loc[555].str.contains("wall clock").all()  # printing does not keep it alive
    assert errors.loc[999].str.contains("worker exited 3").all()
    assert errors.loc[777].str.contains("planted failure").all()
    assert errors.loc[888].str.contains("IncorrectResult").all()  # wrong results are failures
    assert run_sweep(spec, tmp_path, runner=SubprocessRunner(worker_cmd=FAKE_WORKER),
                     progress=False, **GPU)["skipped"] == 14


def test_loader_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(SchemaError, match="header does not match"):
        load_results(path, require_manifest=False)
    path.write_text(",".join(COLUMNS) + "\n" + ",".join(["x"] * len(COLUMNS)) + "\n")
    with pytest.raises(SchemaError):
        load_results(path, require_manifest=False)


def test_rows_with_unknown_columns_are_refused(tmp_path):
    with pytest.raises(SchemaError, match="not in the schema"):
        append_row(tmp_path / "r.csv", {"point": "a", "colour": "red"})


def test_committed_data_loads_with_the_schema():
    root = Path(__file__).parent.parent / "data"
    files = sorted(root.glob("*/results.csv*"))
    assert files, "data/ holds measured results"
    # committed tables travel compressed (`wavefront compress DIR`): a plain one is a slip
    assert not [f for f in files if f.suffix == ".csv"], "commit results as results.csv.gz"
    for f in files:
        df = load_results(f, strict=True)
        assert len(df) > 0


def _read_log(path):
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(tuple(json.loads(line)))
        except ValueError:
            pass  # the log line of a killed driver may itself be torn
    return out


def test_sweep_killed_at_random_moments_loses_and_duplicates_nothing(tmp_path):
    """SIGKILL the sweep at random moments (with short writes and a full disk injected), resume,
    until it finishes: the file always loads, every stored task survives, none twice."""
    out, log = tmp_path / "out", tmp_path / "finished.log"
    rng = random.Random(2026)
    kills = runs = 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    while runs < 200:
        runs += 1
        proc = subprocess.Popen([sys.executable, str(FAKES / "sweep_driver.py"), str(out),
                                 str(runs), str(log)], env=env, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=rng.uniform(0.6, 1.1) if kills < 40 else 120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
        if (out / "results.csv").exists():
            load_results(out / "results.csv")  # loads after every crash
        if proc.returncode == 0:
            break
    assert proc.returncode == 0 and kills >= 20, (runs, kills)
    print(f"{runs} runs, {kills} SIGKILLs, {runs - kills - 1} injected crashes")
    df = load_results(out / "results.csv", strict=True)
    stored = set(zip(df["point"], df["measurement"], df["repeat"].astype(int)))
    assert len(stored) == len(df) == 800  # every task (200 points x 2 kinds x 2 repeats) once
    assert set(_read_log(log)) <= stored  # nothing that was reported stored is lost


def test_a_killed_runner_takes_its_worker_with_it(tmp_path):
    pidfile = tmp_path / "worker.pid"
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent.parent)!r});"
              "from wavefront.measure.runner import SubprocessRunner;"
              "from wavefront.results.sweep import parse_spec, run_sweep;"
              f"spec = parse_spec('''timeout_s=600\\n[grid]\\nseqlen=[666]\\nhead_dim=[64]\\n"
              f"schedule=['persistent+linear']''');"
              f"run_sweep(spec, {str(tmp_path / 'o')!r}, gpu='G', sms=132, l2_bytes=1<<20,"
              f"runner=SubprocessRunner(worker_cmd={FAKE_WORKER!r}), progress=False)")
    proc = subprocess.Popen([sys.executable, "-c", script],
                            env={**os.environ, "FAKE_WORKER_PIDFILE": str(pidfile)})
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text() or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the runner died before starting its worker"
    pid = int(pidfile.read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"worker {pid} outlived its killed runner")


@pytest.mark.parametrize("setting,value", [("reps", "reps = 5"), ("metric_set", 'metric_set = "dram"'),
                                           ("peers", "peers = true"),
                                           ("record_order", "record_order = true")])
def test_a_resume_that_measures_differently_is_refused(tmp_path, setting, value):
    """Rows measured under the old settings would be skipped as done and kept beside new ones:
    the resume says which setting changed and measures nothing."""
    spec = parse_spec(SPEC)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path, runner=CrashingRunner(limit=3), progress=False, **GPU)
    changed = parse_spec(SPEC.replace('name = "t"', f'name = "t"\n{value}'))
    with pytest.raises(SchemaError, match=f"measures differently from run .*{setting}"):
        run_sweep(changed, tmp_path, runner=CrashingRunner(10**6), progress=False, **GPU)
    assert len(load_results(tmp_path / "results.csv")) == 3
    # the same settings resume as before
    summary = run_sweep(spec, tmp_path, runner=CrashingRunner(10**6), progress=False, **GPU)
    assert summary["skipped"] == 3 and summary["ok"] == 13


def test_a_chunk_tiles_sweep_measures_and_records_each_chunk_size(tmp_path):
    """chunk_tiles is a point parameter: two values are two tasks, and each row records its
    value in its own column and its key."""
    spec = parse_spec('[grid]\nseqlen = [8192]\nhead_dim = [64]\nschedule = ["persistent+tiled"]\n'
                      'chunk_tiles = [16, 64]\n')
    tasks = expand(spec, **GPU)
    assert len(tasks) == 2 and {t["chunk_tiles"] for t in tasks} == {16, 64}
    summary = run_sweep(spec, tmp_path, runner=CrashingRunner(10**6), progress=False, **GPU)
    assert summary["ok"] == 2
    df = load_results(tmp_path / "results.csv")
    assert sorted(df["chunk_tiles"].astype(int)) == [16, 64]
    assert all(p.endswith(f",chunk_tiles={c}") for p, c in zip(df["point"], df["chunk_tiles"]))


def test_a_v3_results_file_is_upgraded_before_a_v4_row_is_appended(tmp_path):
    """Committed data (schema v3) loads with the new column empty; appending to it first
    rewrites it as v4 (logged), so a resumed old sweep never mixes two row layouts."""
    import csv
    import io
    from wavefront.results.store import COLUMNS, V3_COLUMNS
    spec = parse_spec(SPEC)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path, runner=CrashingRunner(limit=3), progress=False, **GPU)
    path = tmp_path / "results.csv"
    rows = list(csv.reader(io.StringIO(path.read_text())))
    keep = [i for i, c in enumerate(rows[0]) if c in V3_COLUMNS]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([[r[i] for i in keep] for r in rows])
    path.write_text(buf.getvalue())  # the same rows as schema v3 wrote them
    before = load_results(path)
    assert len(before) == 3 and before["chunk_tiles"].isna().all()
    summary = run_sweep(spec, tmp_path, runner=CrashingRunner(10**6), progress=False, **GPU)
    assert summary["skipped"] == 3 and summary["ok"] == 13
    assert path.read_text().splitlines()[0].split(",") == COLUMNS
    after = load_results(path)
    assert len(after) == 16 and not after.duplicated(["point", "measurement", "repeat"]).any()
    assert "schema v3 -> v4" in (tmp_path / "repairs.log").read_text()


def test_a_compressed_table_loads_appends_and_repairs_like_a_plain_one(tmp_path):
    """The committed tables are gzip-compressed: the store loads them as the plain ones, appends
    a row as one more gzip member, ignores a member cut mid-append on read and cuts it (logged)
    before the next append; the model cache keys a table by its rows, not by its packing."""
    import gzip

    from wavefront.report.analysis import _inputs_key
    from wavefront.results.store import compress_results, manifest_path, results_path
    d = tmp_path / "headline"
    d.mkdir()
    src = Path(__file__).parent.parent / "data" / "headline"
    (d / "results.csv").write_bytes(read_results_bytes(results_path(src)))
    (d / "manifest.json").write_bytes(read_results_bytes(manifest_path(src)))
    plain = load_results(d / "results.csv", strict=True)
    key = _inputs_key([d / "results.csv"])
    packed = compress_results(d)
    assert results_path(d) == packed and not (d / "results.csv").exists()
    assert packed.stat().st_size * 4 < len(read_results_bytes(packed))
    assert _inputs_key([packed]) == key
    pd.testing.assert_frame_equal(load_results(packed, strict=True), plain)
    row = {k: (None if pd.isna(v) else v) for k, v in plain.iloc[-1].to_dict().items()}
    append_row(packed, {**row, "repeat": 99})
    grown = load_results(packed)
    assert len(grown) == len(plain) + 1 and int(grown["repeat"].iloc[-1]) == 99
    with open(packed, "ab") as f:
        f.write(gzip.compress(b"a torn row\n")[:10])
    assert len(load_results(packed)) == len(plain) + 1
    assert repair_tail(packed) == 10
    assert "cut_bytes" in (d / "repairs.log").read_text()
