"""Bench, tune and lever records: one reader per kind, versioned, older lines upgraded on read,
bad lines refused with their file and line."""
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from wavefront.point import KERNEL_LEVERS
from wavefront.report.analysis import Study
from wavefront.results.records import (BENCH_RECORDS, KINDS, TUNE_RECORDS, RecordKind,
                                       by_shape, shape_name)
from wavefront.results.store import SchemaError

SHAPE_V1 = {"batch": 1, "heads": 8, "kv_heads": None, "seqlen": 1024, "head_dim": 64,
            "dtype": "bfloat16", "causal": False, "schedule": "persistent+linear",
            "tiles": None, "occupancy": None, "ctas": None}


def _bench_row(contender, **extra):
    return {"gpu": "G", "shape": dict(SHAPE_V1), "contender": contender, "samples_ms": [1.0],
            "median_ms": 1.0, "tflops": 10.0, "tflops_ci95": [9.0, 11.0], "rounds": 6,
            "throttled_rounds": 0, **extra}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_version_1_bench_line_reads_with_every_lever_at_its_default(tmp_path):
    path = _write(tmp_path / "b.jsonl", [_bench_row("grid+linear"),
                                         {"gpu": "G", "shape": SHAPE_V1, "error": "boom"}])
    rows = BENCH_RECORDS.read(path)
    assert len(rows) == 1 and rows[0]["record_version"] == BENCH_RECORDS.version
    assert {k: rows[0]["shape"][k] for k in KERNEL_LEVERS} == KERNEL_LEVERS
    assert rows[0]["shape"]["chunk_tiles"] is None
    # the failed shape is kept apart, not dropped silently
    assert [r["error"] for r in BENCH_RECORDS.read(path, failed=True)] == ["boom"]
    # a line the current writer stamps reads back as it was written
    stamped = BENCH_RECORDS.stamp(rows[0])
    assert BENCH_RECORDS.read(_write(tmp_path / "c.jsonl", [stamped])) == [stamped]


def test_a_new_field_is_one_version_and_one_upgrade(tmp_path):
    """The upgrade path a new metric takes: committed lines keep reading, with the field
    filled by the upgrade."""
    kind = RecordKind("demo", 3, ("a", "b", "c"),
                      upgrades={1: lambda r: {**r, "b": 0}, 2: lambda r: {**r, "c": r["a"] * 2}})
    path = _write(tmp_path / "d.jsonl", [{"a": 1}, {"a": 2, "b": 5, "record_version": 2},
                                         {"a": 3, "b": 1, "c": 9, "record_version": 3}])
    assert [(r["a"], r["b"], r["c"]) for r in kind.read(path)] == [(1, 0, 2), (2, 5, 4),
                                                                    (3, 1, 9)]


@pytest.mark.parametrize("line, message", [
    ('{"gpu": "G"}', "b.jsonl:2: a bench record without"),
    ('{"gpu": "G", "shape": 3}', "b.jsonl:2: a bench record without"),
    ('{"contender": "x", "record_version": 99}', "b.jsonl:2: bench record version 99"),
    ("not json", "b.jsonl:2: not a JSON line"),
    ("[1, 2]", "b.jsonl:2: a record is a JSON object"),
])
def test_a_bad_line_is_refused_with_its_file_and_line(tmp_path, line, message):
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps(_bench_row("grid+linear")) + "\n"
                    + (line if "contender" in line or "{" not in line
                       else line[:-1] + ', "contender": "y"}') + "\n")
    with pytest.raises(SchemaError, match=message):
        BENCH_RECORDS.read(path)


def test_gzipped_records_and_missing_ones(tmp_path):
    (tmp_path / "tune" / "s1").mkdir(parents=True)
    with gzip.open(tmp_path / "tune" / "s1" / "tune.jsonl.gz", "wt") as f:
        f.write(json.dumps({"gpu": "G", "shape": SHAPE_V1, "label": "peer", "peer": True}) + "\n")
    study = Study(tmp_path)
    got = study.records(TUNE_RECORDS, "tune", "*/tune.jsonl.gz")
    assert list(got) == ["s1/tune"] and got["s1/tune"][0]["shape"]["cluster"] == 1
    with pytest.raises(SchemaError, match=f"{tmp_path / 'bench_rounds'}: no bench records"):
        study.records(BENCH_RECORDS, "bench_rounds")
    with pytest.raises(SchemaError, match="no such tune record file"):
        TUNE_RECORDS.read(tmp_path / "absent.jsonl")


def test_a_run_into_packed_records_appends_to_them(tmp_path):
    """A run whose out directory holds committed (packed) records appends to the packed file,
    a gzip member a line, instead of starting a plain file the readers would confuse with it;
    a member cut mid-append is left out on read."""
    from wavefront.measure.sink import JsonlSink
    gzip_path = tmp_path / "bench.jsonl.gz"
    gzip_path.write_bytes(gzip.compress((json.dumps(_bench_row("grid+linear")) + "\n").encode()))
    with JsonlSink(tmp_path, "bench.jsonl", manifest_files=()) as sink:
        sink.write(_bench_row("persistent+linear"))
    assert not (tmp_path / "bench.jsonl").exists()
    assert [r["contender"] for r in BENCH_RECORDS.read(gzip_path)] == ["grid+linear",
                                                                       "persistent+linear"]
    whole = gzip_path.read_bytes()
    gzip_path.write_bytes(whole + gzip.compress(b'{"contender": "torn"}\n')[:-6])
    assert len(BENCH_RECORDS.read(gzip_path)) == 2


def test_shapes_and_kinds():
    rows = [_bench_row("a"), _bench_row("b")]
    for r in rows:
        r["shape"] = {**SHAPE_V1, "kv_heads": 2, "causal": True}
    assert shape_name(rows[0]["shape"]) == "B1 H8 KV2 S1k D64 causal"
    assert set(by_shape(rows)["B1 H8 KV2 S1k D64 causal"]) == {"a", "b"}
    assert set(by_shape(rows, per_gpu=True)) == {("G", "B1 H8 KV2 S1k D64 causal")}
    assert all(k.name == name for name, k in KINDS.items())


def test_a_new_metric_upgrades_every_committed_results_file(tmp_path):
    """The metric change-trace: one METRICS entry and its METRIC_SINCE version, and committed
    results files read (new column empty) and are rewritten before a row is appended. Run in a
    fresh process: the schema is built when the store is imported."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).parent.parent
    shutil.copytree(root / "data" / "tiled_fit", tmp_path / "tiled_fit")
    code = f"""
import wavefront.results.measurement as m
m.METRICS["lts__t_sectors_new_metric.sum"] = "new_metric"
m.METRIC_SINCE["new_metric"] = 5
from wavefront.results import store
assert store.SCHEMA_VERSION == 5 and store.COLUMNS[-len(store.DERIVED) - 1] == "new_metric"
path = {str(tmp_path / "tiled_fit" / "results.csv.gz")!r}  # compressed, as committed
rows = store.read_results_bytes(path).count(b"\\n") - 1
df = store.load_results(path)
assert len(df) == rows and df["new_metric"].isna().all(), df.shape
store.upgrade_in_place(__import__("pathlib").Path(path))
assert store.read_header(path) == store.COLUMNS
assert len(store.load_results(path)) == rows
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]
    log = (tmp_path / "tiled_fit" / "repairs.log").read_text()
    assert "-> v5" in log and "new_metric" in log  # the committed file is v3: both steps at once


def test_bench_records_name_what_the_public_call_resolved_to():
    from wavefront.measure.rounds import API_CONTENDER, RoundsResult, bench_records
    from wavefront.point import Point

    def result(name, ms):
        return RoundsResult(name, ms, sorted(ms)[len(ms) // 2], (min(ms), max(ms)), 1.0,
                            (1.0, 1.0), 0, len(ms))
    bound = "persistent+linear [tiles=128x128]"
    shape = Point(schedule="persistent+linear", seqlen=1024, head_dim=64, batch=1, heads=2)
    rows = bench_records("GPU", shape, [
        result(bound, [1.0] * 7), result(API_CONTENDER, [1.25] * 7),
        result("cudnn", [1.1] * 7)], bound_reference=bound)
    api = next(r for r in rows if r["contender"] == API_CONTENDER)
    assert api["bound"] == bound
    assert api["x_bound"] == pytest.approx(0.8)  # 1.0 ms bound / 1.25 ms call
    assert api["x_cudnn"] == pytest.approx(1.1 / 1.25)
    assert all("bound" not in r for r in rows if r["contender"] != API_CONTENDER)


def test_bench_records_carry_each_contenders_whole_configuration():
    """A contender's name shows only what differs from the shape's first point, so levers given
    on the command line (the same for every point) are in no name and not in the problem
    shape: each of our records carries its point's whole configuration, the public call the
    configuration it resolved to; the peers none."""
    from wavefront.measure.rounds import API_CONTENDER, RoundsResult, bench_records
    from wavefront.point import Point

    def result(name):
        return RoundsResult(name, [1.0] * 7, 1.0, (1.0, 1.0), 1.0, (1.0, 1.0), 0, 7)
    asked = Point(schedule="persistent+linear", seqlen=8192, head_dim=128, tiles="128x128",
                  occupancy=1, worker_warps=8, kv_latency=8, qk_ahead=1)
    tuned = asked.replace(schedule="grouped_dynamic+linear", occupancy=2)
    members = [asked, tuned]
    names = ["persistent+linear", "grouped_dynamic+linear [occupancy=2]"]
    rows = bench_records("GPU", asked.problem_only(),
                         [result(n) for n in (*names, API_CONTENDER, "cudnn")],
                         bound_reference=names[1], members=members)
    by = {r["contender"]: r for r in rows}
    assert by[names[0]]["config"] == asked.as_dict()
    assert by[names[0]]["config"]["qk_ahead"] == 1 and by[names[0]]["shape"]["qk_ahead"] == 0
    assert by[names[1]]["config"] == tuned.as_dict()
    assert by[API_CONTENDER]["config"] == tuned.as_dict()
    assert "config" not in by["cudnn"]


def _public_call_run(tmp_path, probes, call_ms):
    """A data/public_call with one commit folder: a run with the host probe (bench_s1k) and
    one from before it (bench_old). -> the experiment module."""
    from wavefront.measure.rounds import API_CONTENDER, RoundsResult, bench_records
    from wavefront.point import Point
    from wavefront.report.experiments import discover
    public_call = discover(Path(__file__).parent.parent / "experiments")["public_call"].module

    def result(name, ms, probes):
        return RoundsResult(name, ms, sorted(ms)[len(ms) // 2], (min(ms), max(ms)), 1.0,
                            (1.0, 1.0), 0, len(ms), per_round=20, host_probe_us=probes)
    bound = "persistent+linear [tiles=128x128]"
    shape = Point(schedule="persistent+linear", seqlen=1024, head_dim=64, batch=1, heads=8)
    folder = tmp_path / "public_call" / "abc1234"
    folder.mkdir(parents=True)
    rows = bench_records("NVIDIA H100 80GB HBM3", shape, [
        result(bound, [0.0148] * 7, probes), result(API_CONTENDER, call_ms, probes)],
        bound_reference=bound)
    (folder / "bench_s1k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    old = [{**r, "host_probe_us": []} for r in rows]  # a run from before the probe
    (folder / "bench_old.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    return public_call


PROBES = [2.8, 2.8, 5.0, 2.9, 6.0, 2.8, 2.7]
CALL_MS = [0.015, 0.015, 0.02, 0.0149, 0.021, 0.0151, 0.015]


def test_the_public_call_experiment_reads_each_rounds_ratio_against_its_hosts_speed(tmp_path):
    """`experiments/public_call.py`'s per-round rows: each round's ratio is the bound launch's
    sample over the call's of the same round, beside the host probe read after that round;
    records without a probe (before c0ad489) give no rows."""
    public_call = _public_call_run(tmp_path, PROBES, CALL_MS)
    got = public_call.probe_rounds(Study(tmp_path))
    assert list(got["round"]) == list(range(7)) and set(got["file"]) == {"bench_s1k"}
    assert list(got["probe us"]) == PROBES
    assert list(got["x bound"]) == pytest.approx([0.0148 / ms for ms in CALL_MS])
    assert set(got["shape"]) == {"B1 H8 S1k D64"} and set(got["mask"]) == {"full"}
    assert set(got["per round"]) == {20}


def test_folded_public_call_runs_read_as_their_files(tmp_path):
    """`wavefront fold` (results/fold.py) moves each commit folder's bench files into one records
    file, each record marked with its file; the experiment reads the same runs from it, a new
    run's file beside it too, and refuses a run that is in both (so does a second fold)."""
    from wavefront.results import fold
    public_call = _public_call_run(tmp_path, PROBES, CALL_MS)
    before = public_call.probe_rounds(Study(tmp_path))
    directory = tmp_path / "public_call"
    assert fold.fold(directory) == 2
    assert not list(directory.glob("*/bench*")) and (directory / fold.FOLDED).exists()
    pd.testing.assert_frame_equal(public_call.probe_rounds(Study(tmp_path)), before)
    assert list(public_call.bench_files(Study(tmp_path))) == ["abc1234/bench_old",
                                                              "abc1234/bench_s1k"]
    new = directory / "def5678"
    new.mkdir()
    (new / "bench.jsonl").write_text((directory / fold.FOLDED).read_text().splitlines()[0]
                                     + "\n")
    assert list(public_call.bench_files(Study(tmp_path)))[-1] == "def5678/bench"
    again = directory / "abc1234" / "bench_s1k.jsonl"
    again.write_text((new / "bench.jsonl").read_text())
    with pytest.raises(ValueError, match="abc1234/bench_s1k is both in bench_runs.jsonl"):
        public_call.bench_files(Study(tmp_path))
    with pytest.raises(ValueError, match="folded already"):
        fold.fold(directory)
    assert again.exists()  # nothing written by the refused fold


def test_the_bench_names_the_shapes_whose_rounds_ran_on_a_slow_host():
    """A shape's rounds whose host probe read 1.4x the bench's fastest or more are counted
    once per shape (its contenders share the rounds), with the public call against its bound
    launch over the other rounds; a bench without probes, or without a slow round, names
    none."""
    from wavefront.measure.rounds import slow_host_rounds
    full = {"seqlen": 1024, "causal": False}
    causal = {"seqlen": 1024, "causal": True}
    probes = [2.8, 2.8, 5.0, 3.9, 4.0]  # 5.0 and 4.0 >= 1.4 x 2.8 (3.92)
    records = [
        {"shape": full, "contender": "bound", "host_probe_us": probes,
         "samples_ms": [0.014] * 5},
        {"shape": full, "contender": "api", "bound": "bound", "host_probe_us": probes,
         "samples_ms": [0.0140, 0.0155, 0.0200, 0.0150, 0.0210]},
        {"shape": full, "contender": "cudnn", "host_probe_us": probes,
         "samples_ms": [0.04] * 5}]
    records += [{"shape": causal, "contender": c, "host_probe_us": [2.9, 3.0, 3.1, 3.0, 2.8],
                 "samples_ms": [0.014] * 5} for c in ("bound", "cudnn")]
    (found,) = slow_host_rounds(records)
    assert (found["shape"], found["slow"], found["rounds"]) == (full, 2, 5)
    # rounds 0, 1 and 3: 1.0, 0.014 / 0.0155 and 0.014 / 0.015
    assert found["api_vs_bound_usual"] == pytest.approx(0.014 / 0.015)
    no_call = [r for r in records if r["contender"] != "api"]
    assert slow_host_rounds(no_call)[0]["api_vs_bound_usual"] is None
    assert slow_host_rounds([{**r, "host_probe_us": []} for r in records]) == []
    assert slow_host_rounds([r for r in records if r["shape"] is causal]) == []
    assert slow_host_rounds([{"shape": full, "error": "failed"}]) == []


def test_a_held_out_shape_measured_again_is_read_from_its_latest_run(tmp_path):
    """`experiments/untuned_shapes.py`: a shape re-measured after the tuned table changed is
    taken from the run whose manifest date is later (the other stays, as the table of then, in
    `replaced`); two runs of one shape at the same date are refused."""
    from wavefront.measure.rounds import API_CONTENDER, RoundsResult, bench_records
    from wavefront.point import Point
    from wavefront.report.experiments import discover
    untuned = discover(Path(__file__).parent.parent / "experiments")["untuned_shapes"].module

    def result(name, ms):
        return RoundsResult(name, ms, sorted(ms)[len(ms) // 2], (min(ms), max(ms)), 1.0,
                            (1.0, 1.0), 0, len(ms))
    shape = Point(schedule="persistent+linear", seqlen=4096, head_dim=128, batch=4, heads=16)
    directory = tmp_path / "untuned_shapes"
    directory.mkdir()
    manifest = {}
    for run, (bound, call_ms, date) in {
            "old": ("persistent+linear [tiles=128x128]", 1.05, "2026-11-26T01:55:08+00:00"),
            "new": ("persistent+linear [tiles=128x256]", 0.95, "2026-11-26T23:54:49+00:00")
    }.items():
        rows = bench_records("NVIDIA H100 80GB HBM3", shape, [
            result(bound, [call_ms * 0.99] * 7), result(API_CONTENDER, [call_ms] * 7),
            result("cudnn", [1.0] * 7)], bound_reference=bound)
        (directory / f"{run}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        manifest[run] = {"date": date, "files": [f"{run}.jsonl"], "schema_version": 4,
                         "gpu": {"name": "NVIDIA H100 80GB HBM3"}, "git_commit": "abc1234",
                         "command": "wavefront bench"}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    study = Study(tmp_path)
    call = untuned.rows(study).query("contender == 'public call'")
    assert list(call["run"]) == ["new"] and call["x cudnn"].iloc[0] == pytest.approx(1 / 0.95)
    both = untuned.replaced(study)
    assert list(both["run then"]) == ["old"] and list(both["run now"]) == ["new"]
    assert both["configuration now"].iloc[0].endswith("[tiles=128x256]")
    manifest["new"]["date"] = manifest["old"]["date"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="keep one run per GPU"):
        untuned.rows(Study(tmp_path))


def test_the_fold_command_folds_and_names_a_source_folded_twice(tmp_path):
    """`wavefront fold DIR`: the run folders' files into one, each record with its `source`;
    a run folded already and present again is refused by name, nothing written."""
    from click.testing import CliRunner

    from wavefront.cli import main
    for run, value in (("abc1234", 1), ("def5678", 2)):
        (tmp_path / run).mkdir()
        (tmp_path / run / "bench.jsonl").write_text(json.dumps({"value": value}) + "\n")
    done = CliRunner().invoke(main, ["fold", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert "2 files folded" in done.output and "wavefront compress" in done.output
    folded = [json.loads(line) for line in (tmp_path / "bench_runs.jsonl").read_text()
              .splitlines()]
    assert folded == [{"source": "abc1234/bench", "value": 1},
                      {"source": "def5678/bench", "value": 2}]
    (tmp_path / "abc1234" / "bench.jsonl").write_text(json.dumps({"value": 3}) + "\n")
    refused = CliRunner().invoke(main, ["fold", str(tmp_path)])
    assert refused.exit_code == 1 and "abc1234/bench is folded already" in refused.output
    assert (tmp_path / "abc1234" / "bench.jsonl").exists()
    assert "Traceback" not in refused.output
