"""Every bad input is a clear error that names what was wrong, or a documented repair: never a
traceback, never silently accepted (CPU, no GPU). The tables below are the issue's >= 100 cases:
sweep specs, command-line flags, data files, and API arguments."""
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from wavefront.cli import main
from wavefront.results.store import manifest_path, read_results_bytes, results_path

ROOT = Path(__file__).parent.parent

BASE = """
[grid]
seqlen = [4096]
head_dim = [64]
schedule = ["persistent+linear"]
"""


def grid(**overrides):
    lines = {"seqlen": "[4096]", "head_dim": "[64]", "schedule": '["persistent+linear"]'}
    lines.update(overrides)
    return "[grid]\n" + "\n".join(f"{k} = {v}" for k, v in lines.items()) + "\n"


# (spec text, text the error must contain)
SPECS = [
    (grid(causal='["false"]'), "grid.causal[0] must be True or False"),
    (grid(causal="[1]"), "grid.causal[0]"),
    (grid(seqlen="[0]"), "grid.seqlen[0]"),
    (grid(seqlen="[-4096]"), "grid.seqlen[0]"),
    (grid(seqlen="[1099511627776]"), "grid.seqlen[0] must be a positive integer up to"),
    (grid(seqlen='["4096"]'), "grid.seqlen[0]"),
    (grid(seqlen="[1.5]"), "grid.seqlen[0]"),
    (grid(seqlen="[4096, true]"), "grid.seqlen[1]"),
    (grid(head_dim="[96]"), "grid.head_dim[0] must be one of [64, 128]"),
    (grid(head_dim='["64"]'), "grid.head_dim[0]"),
    (grid(dtype='["float32"]'), "grid.dtype[0]"),
    (grid(tiles='["32x32"]'), "grid.tiles[0]"),
    (grid(tiles='["abc"]'), "grid.tiles[0]"),
    (grid(tiles="[128]"), "grid.tiles[0]"),
    (grid(occupancy="[0]"), "grid.occupancy[0]"),
    (grid(occupancy="[33]"), "grid.occupancy[0]"),
    (grid(ctas="[-1]"), "grid.ctas[0]"),
    (grid(chunk_tiles="[-2]"), "grid.chunk_tiles[0]"),
    (grid(schedule='["grid+blocked"]'), "grid.schedule[0]"),
    (grid(schedule='["diagonal"]'), "grid.schedule[0]"),
    (grid(schedule="[3]"), "grid.schedule[0]"),
    (grid(schedule='["grouped+tiled"]'), "grouped+tiled"),
    (grid(schedule='["longest_first+tiled"]'), "longest_first+tiled"),
    (grid(chunk_tiles="[4]"), "chunk_tiles applies to the tiled schedule only"),
    (grid(batch="[0]"), "grid.batch[0]"),
    (grid(heads="[3]", kv_heads="[2]"), "multiple of kv_heads"),
    (grid(kv_heads="[0]"), "grid.kv_heads[0]"),
    (grid(seqlen="4096"), "grid.seqlen must be a non-empty list"),
    (grid(seqlen="[]"), "grid.seqlen must be a non-empty list"),
    (grid(colour='["red"]'), "unknown grid keys ['colour']"),
    ('[grid]\nhead_dim = [64]\nschedule = ["grid"]\n', "grid needs ['seqlen']"),
    ('measure = "speed"\n' + BASE, "measure must list some of"),
    ("measure = []\n" + BASE, "measure must list some of"),
    ('measure = ["timing", "timing"]\n' + BASE, "once each"),
    ("repeats = 0\n" + BASE, "repeats must be a positive integer"),
    ('repeats = "3"\n' + BASE, "repeats must be a positive integer"),
    ("reps = 0\n" + BASE, "reps must be a positive integer"),
    ("reps = 1.5\n" + BASE, "reps must be a positive integer"),
    ("batch_points = 0\n" + BASE, "batch_points must be a positive integer"),
    ("timeout_s = 0\n" + BASE, "timeout_s must be a positive number"),
    ("timeout_s = -1\n" + BASE, "timeout_s must be a positive number"),
    ('timeout_s = "fast"\n' + BASE, "timeout_s must be a positive number"),
    ("timeout_s = nan\n" + BASE, "timeout_s must be a positive number"),
    ('peers = "yes"\n' + BASE, "peers must be true or false"),
    ('metric_set = "all"\n' + BASE, "metric_set must be one of"),
    ("name = 5\n" + BASE, "name must be a non-empty string"),
    ("colour = 1\n" + BASE, "unknown keys ['colour']"),
    ('name = "x"\n', "needs a [grid] table"),
    ("grid = 3\n", "needs a [grid] table"),
    ("this is not toml", "not valid TOML"),
    ("[[grid]]\nseqlen = [1]\n[[grid]]\nhead_dim = [64]\n", "grid[0]: grid needs"),
    # totals: each value fine, the product not (checked before anything is built)
    ("repeats = 1000000000000\n" + BASE, "repeats must be a positive integer up to 1000"),
    ("repeats = 1000\n" + grid(seqlen=str(list(range(1, 2001)))),
     "more than the limit of 1000000 (MAX_TASKS)"),
    (grid(seqlen=str(list(range(1, 401))), batch=str(list(range(1, 401)))),
     "more than the limit of 100000 (MAX_POINTS)"),
    ("reps = 100000000\n" + BASE, "reps must be a positive integer up to"),
    ("batch_points = 100000000\n" + BASE, "batch_points must be a positive integer up to"),
    ("timeout_s = 1e300\n" + BASE, "timeout_s must be a positive number of seconds up to"),
    ("timeout_s = inf\n" + BASE, "timeout_s must be a positive number"),
    (grid(ctas="[1000000000000]"), "grid.ctas[0] must be a positive integer up to 2147483647, or 0 for the default"),
    (grid(chunk_tiles="[1000000000000]"), "grid.chunk_tiles[0]"),
    (grid(batch="[100000000]"), "grid.batch[0] must be a positive integer up to 65536"),
    (grid(heads="[100000000]"), "grid.heads[0]"),
    # TOML that is valid but nested past the parser's recursion limit
    ("x = " + "[" * 100000 + "]" * 100000 + "\n", "nested too deeply"),
]


def test_spec_paths_that_are_not_regular_files_are_refused(tmp_path):
    """A device reads forever, a FIFO blocks until a writer comes, a huge file fills memory:
    each is refused by name before a byte of it is parsed."""
    import os
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1 << 21) + "\n" + BASE)
    fake_experiment = tmp_path / "fifo.py"
    os.mkfifo(fake_experiment)
    for path, expected in ((fifo, "must be a regular file"), ("/dev/zero", "must be a regular file"),
                           (big, "at most 1048576 bytes"),
                           (fake_experiment, "must be a regular file")):
        res = CliRunner().invoke(main, ["sweep", str(path), "--dry-run"])
        assert res.exit_code == 2 and expected in res.output, (path, res.output)
        assert "Traceback" not in res.output
    not_utf8 = tmp_path / "latin.toml"
    not_utf8.write_bytes(b"name = '\xe9'\n")
    res = CliRunner().invoke(main, ["sweep", str(not_utf8), "--dry-run"])
    assert res.exit_code == 2 and "not UTF-8" in res.output


def test_a_large_dry_run_lists_in_linear_time(tmp_path):
    """Thousands of tasks list in well under a second of work per thousand (the listing used to
    scan every task for every point)."""
    import time
    path = tmp_path / "wide.toml"
    path.write_text("repeats = 3\n" + grid(seqlen=str(list(range(64, 64 * 2001, 64)))))
    began = time.perf_counter()
    res = CliRunner().invoke(main, ["sweep", str(path), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "2000 points" in res.output or "6000 tasks" in res.output
    assert time.perf_counter() - began < 60


@pytest.mark.parametrize("text,expected", SPECS)
def test_bad_spec_is_named_with_file_and_key(tmp_path, text, expected):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    res = CliRunner().invoke(main, ["sweep", str(path), "--dry-run"])
    assert res.exit_code == 2, res.output
    assert expected in res.output and "bad.toml" in res.output
    assert "Traceback" not in res.output


# (argv, exit code, text the message must contain)
FLAGS = [
    (["run", "--seqlen", "0"], 2, "seqlen must be a positive integer"),
    (["run", "--seqlen", "abc"], 2, "comma-separated list"),
    (["run", "--head-dim", "96"], 2, "head_dim must be one of"),
    (["run", "--dtype", "float32"], 2, "--dtype"),
    (["run", "--tile", "32x32"], 2, "tiles must be one of"),
    (["run", "--tile", "abc"], 2, "tiles must look like"),
    (["run", "--occupancy", "0"], 2, "--occupancy"),
    (["run", "--occupancy", "40"], 2, "--occupancy"),
    (["run", "--ctas", "0"], 2, "--ctas"),
    (["run", "--batch", "0"], 2, "--batch"),
    (["run", "--heads", "3", "--kv-heads", "2"], 2, "multiple of kv_heads"),
    (["run", "--schedule", "x+y"], 2, "not a schedule"),
    (["bench", "--schedule", "grouped+tiled"], 2, "not a schedule"),
    (["bench", "--seqlen", ","], 2, "at least one value"),
    (["profile", "--repeats", "0"], 2, "--repeats"),
    (["profile", "--timeout", "0"], 2, "--timeout"),
    (["simulate", "--gpu", "a100"], 2, "gpu must be one of"),
    (["simulate", "--l2-mib", "0"], 2, "--l2-mib"),
    (["simulate", "--partitions", "3"], 2, "--partitions"),
    (["simulate", "--jitter", "1.0"], 2, "--jitter"),
    (["simulate", "--capacity-mib", "0"], 2, "--capacity-mib"),
    (["simulate", "--sms", "0"], 2, "--sms"),
    (["simulate", "--seqlen", "2147483648"], 2, "seqlen must be a positive integer up to 16777216"),
    (["simulate", "--schedule", "grouped+tiled"], 2, "not a schedule"),
    (["sweep", "no-such-spec.toml", "--dry-run"], 2, "does not exist"),
    (["sweep", str(ROOT / "experiments" / "knee.py")], 2, "--out DIR is required"),
    (["sweep", str(ROOT / "experiments" / "knee.py"), "--out", "x", "--gpus", "abc"], 2,
     "expected a count or 'all'"),
    (["sweep", str(ROOT / "experiments" / "closed_form.py"), "--dry-run"], 2, "owns 0 sweeps"),
    (["sweep", str(ROOT / "experiments" / "knee.py"), "--dry-run", "--gpu", "a100"], 2,
     "gpu must be one of"),
    (["fit", "no-such-results.csv"], 2, "does not exist"),
    (["paper", "--data", "no-such-dir"], 2, "does not exist"),
    (["compile", "--filter", "no-such-variant"], 2, "--filter"),
    (["compile", "--jobs", "0"], 2, "--jobs"),
    (["frobnicate"], 2, "No such command"),
    # non-finite numbers: click's FloatRange lets nan through every bound and inf past a lower
    (["simulate", "--l2-mib", "nan"], 2, "not a finite number"),
    (["simulate", "--l2-mib", "inf"], 2, "not a finite number"),
    (["simulate", "--capacity-mib", "1e400"], 2, "not a finite number"),
    (["simulate", "--jitter", "nan"], 2, "not a finite number"),
    (["profile", "--timeout", "inf"], 2, "not a finite number"),
    # the new commands
    (["bench-varlen", "--lengths", "a,b"], 2, "comma-separated list"),
    (["bench-varlen", "--heads", "3", "--kv-heads", "2"], 2, "multiple of kv-heads"),
    (["bench-varlen", "--sequences", "0"], 2, "--sequences"),
    (["bench-varlen", "--head-dim", "96"], 2, "--head-dim"),
    (["prefill", "--hidden", "2048", "--heads", "12"], 2, "hidden / heads must be one of"),
    (["prefill", "--heads", "16", "--kv-heads", "3"], 2, "multiple of kv-heads"),
    (["prefill", "--batch", "0"], 2, "--batch"),
    (["bench", "--api", "--rounds", "2"], 2, "--rounds"),
    # more GPUs than the host has (none here): no workers started
    (["sweep", str(ROOT / "experiments" / "knee.py"), "--out", "x", "--gpus", "40"], 1,
     "no GPU is visible"),
    (["sweep", str(ROOT / "experiments" / "knee.py"), "--out", "x", "--gpus", "all"], 1,
     "no GPU is visible"),
]


@pytest.mark.parametrize("argv,code,expected", FLAGS)
def test_bad_flags(argv, code, expected):
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == code, res.output
    assert expected in res.output
    assert "Traceback" not in res.output


def _results(tmp_path, mutate=None, manifest=True):
    """A copy of a committed results file (knee, S <= 24k) and its manifest, mutated."""
    src = ROOT / "data" / "knee"
    lines = read_results_bytes(results_path(src)).decode().splitlines()
    keep = [lines[0]] + [ln for ln in lines[1:] if "seqlen=16384," in ln or "seqlen=24576," in ln]
    if mutate:
        keep = mutate(keep)
    d = tmp_path / "r"
    d.mkdir(exist_ok=True)
    (d / "results.csv").write_text("\n".join(keep) + "\n" if keep else "")
    if manifest:
        (d / "manifest.json").write_bytes(read_results_bytes(manifest_path(src)))
    return d / "results.csv"


def _cell(lines, column, value, row=1):
    import csv
    import io
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    rows[row][rows[0].index(column)] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue().splitlines()


DATA = [
    ("header only", lambda ls: ls[:1], "no rows"),
    ("empty file", lambda ls: [], "header does not match"),
    ("duplicated rows", lambda ls: ls + ls[1:3], "duplicated rows"),
    ("non-boolean causal", lambda ls: _cell(ls, "causal", "yes"), "column 'causal'"),
    ("empty causal", lambda ls: _cell(ls, "causal", ""), "column 'causal' must be True or False"),
    ("non-finite time", lambda ls: _cell(ls, "median_ms", "inf", _first(ls, "timing")),
     "non-finite"),
    ("text in a number", lambda ls: _cell(ls, "seqlen", "many"), "column 'seqlen' is not int"),
    ("unknown status", lambda ls: _cell(ls, "status", "maybe"), "status must be one of"),
    ("unknown measurement", lambda ls: _cell(ls, "measurement", "vibes"),
     "measurement must be one of"),
    ("foreign header", lambda ls: ["a,b"] + ["1,2"], "header does not match"),
    ("extra column", lambda ls: [ls[0] + ",colour"] + [x + ",red" for x in ls[1:]],
     "unexpected ['colour']"),
    ("missing column", lambda ls: [",".join(ls[0].split(",")[1:])] + ls[1:],
     "header does not match"),
    ("unknown run id", lambda ls: _cell(ls, "run_id", "nobody-ran-this"), "no entry for runs"),
    ("binary garbage", lambda ls: ["\x00\x01\x02garbage"], "header does not match"),
    ("rows that do not parse", lambda ls: ls[:1] + ['"unterminated'], "do not parse"),
    # provenance: a row must be what its own columns and its run's manifest say it is
    ("point key disagrees with its columns", lambda ls: _cell(ls, "seqlen", "16385"),
     "disagrees with its parameter columns"),
    ("another GPU than its manifest", lambda ls: _cell(ls, "gpu", "NVIDIA B200"),
     "its manifest 'NVIDIA H100 80GB HBM3'"),
    ("negative DRAM bytes", lambda ls: _cell(ls, "dram_read_bytes", "-5", _first(ls, "counters")),
     "column 'dram_read_bytes' holds a negative value"),
    ("DRAM bytes no memory can move", lambda ls: _cell(ls, "dram_read_bytes", "1e308",
                                                       _first(ls, "counters")),
     "faster than any GPU's memory"),
    ("infinite counter", lambda ls: _cell(ls, "l2_tex_read_sectors", "inf",
                                          _first(ls, "counters")), "non-finite"),
    ("negative time", lambda ls: _cell(ls, "median_ms", "-0.5", _first(ls, "timing")),
     "column 'median_ms' holds a negative value"),
    ("negative relative error", lambda ls: _cell(ls, "rel_error", "-1", _first(ls, "timing")),
     "column 'rel_error' holds a negative value"),
]


def _first(lines, kind):
    return next(i for i, ln in enumerate(lines) if f",{kind}," in ln)


@pytest.mark.parametrize("name,mutate,expected", DATA, ids=[d[0] for d in DATA])
def test_bad_data_files_are_refused_with_the_reason(tmp_path, name, mutate, expected):
    path = _results(tmp_path, mutate)
    res = CliRunner().invoke(main, ["fit", str(path)])
    assert res.exit_code == 2, res.output
    assert expected in res.output and "Traceback" not in res.output


MANIFESTS = [
    ("missing", None, "missing; results without a manifest"),
    ("not JSON", "{oops", "not valid JSON"),
    ("not an object", "[1, 2]", "must map run ids"),
    ("entry not an object", '{"r": 3}', "is not an object"),
    ("entry lacks keys", '{"r": {"date": "today"}}', "lacks"),
]


def _manifest_with(tmp_path, change):
    """The knee copy with its H100 run's manifest entry changed by `change(entry)`."""
    import json as json_module
    path = _results(tmp_path)
    runs = json_module.loads((path.parent / "manifest.json").read_text())
    h100 = next(r for r, e in runs.items() if "H100" in str(e["gpu"]))
    change(runs, h100)
    (path.parent / "manifest.json").write_text(json_module.dumps(runs))
    return path


MANIFEST_CHANGES = [
    ("a schema from the future", lambda runs, r: runs[r].update(schema_version=99),
     "has schema_version 99"),
    ("schema version as text", lambda runs, r: runs[r].update(schema_version="3"),
     "has schema_version '3'"),
    ("no commit", lambda runs, r: runs[r].update(git_commit=None), "has no git_commit"),
    ("no date", lambda runs, r: runs[r].update(date=""), "has no date"),
    ("no GPU named", lambda runs, r: runs[r].update(gpu={"sms": 132}), "names no GPU"),
    ("another GPU than its rows", lambda runs, r: runs[r]["gpu"].update(name="NVIDIA H200"),
     "name GPU 'NVIDIA H100 80GB HBM3', its manifest 'NVIDIA H200'"),
]


@pytest.mark.parametrize("name,change,expected", MANIFEST_CHANGES,
                         ids=[m[0] for m in MANIFEST_CHANGES])
def test_manifests_that_do_not_vouch_for_their_rows_are_refused(tmp_path, name, change,
                                                                 expected):
    path = _manifest_with(tmp_path, change)
    res = CliRunner().invoke(main, ["fit", str(path)])
    assert res.exit_code == 2, res.output
    assert expected in res.output and "Traceback" not in res.output


def test_the_same_rows_under_two_runs_are_not_counted_twice(tmp_path):
    import csv
    import io
    import json as json_module
    path = _results(tmp_path)
    runs = json_module.loads((path.parent / "manifest.json").read_text())
    lines = path.read_text().splitlines()
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    run_col = rows[0].index("run_id")
    for run in {row[run_col] for row in rows[1:]}:
        runs[f"{run}-copy"] = runs[run]
    (path.parent / "manifest.json").write_text(json_module.dumps(runs))
    for row in rows[1:]:
        rows.append(row[:run_col] + [f"{row[run_col]}-copy"] + row[run_col + 1:])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path.write_text(buf.getvalue())
    res = CliRunner().invoke(main, ["fit", str(path)])
    assert res.exit_code == 2 and "measured again under another run" in res.output, res.output


@pytest.mark.parametrize("name,text,expected", MANIFESTS, ids=[m[0] for m in MANIFESTS])
def test_bad_manifests_are_refused(tmp_path, name, text, expected):
    path = _results(tmp_path, manifest=False)
    if text is not None:
        (path.parent / "manifest.json").write_text(text)
    res = CliRunner().invoke(main, ["fit", str(path)])
    assert res.exit_code == 2 and expected in res.output and "Traceback" not in res.output


def test_documented_repairs(tmp_path):
    """A torn last line (a crash mid-write) is ignored on load and cut, logged, before the next
    append; a schema-v2 file (before repeats) is upgraded on load."""
    from wavefront.results.store import V2_COLUMNS, append_row, load_results
    path = _results(tmp_path, lambda ls: ls + ["batch=1,head"])
    path.write_text(path.read_text().rstrip("\n"))  # the last row torn: no newline
    assert CliRunner().invoke(main, ["fit", str(path), "--json"]).exit_code == 0
    append_row(path, {"point": "p", "measurement": "timing", "status": "failed",
                      "run_id": json.loads((path.parent / "manifest.json").read_text()).popitem()[0]})
    assert "batch=1,head" in (path.parent / "repairs.log").read_text()
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "results.csv").write_text(",".join(V2_COLUMNS) + "\n")
    shutil.copy(path.parent / "manifest.json", v2 / "manifest.json")
    df = load_results(v2 / "results.csv")
    assert "repeat" in df.columns and len(df) == 0


def _point(**kw):
    from wavefront.point import Point
    return Point(**kw)


def _plan(**kw):
    from wavefront.point import plan
    return plan((1, 2, 256, 64), (1, 2, 256, 64), sms=132, l2_bytes=50 << 20, **kw)


def _varlen(cu_seqlens_q, **kw):
    from wavefront.point import plan_varlen
    return plan_varlen((256, 2, 64), (256, 2, 64), cu_seqlens_q, [0, 128, 256], sms=132,
                       l2_bytes=50 << 20, **kw)


def _schedules(what, **kw):
    from wavefront import schedules as s
    return getattr(s, what)(**kw)


def _sim(**kw):
    import numpy as np

    from wavefront.model.simulation import Trace, access_trace, sampled_reuse_distances, simulate_l2
    trace = Trace(np.arange(4, dtype=np.int64), np.full(4, 64, np.int32), np.zeros(4, np.int8),
                  np.zeros(4, np.int32), 1)
    what = kw.pop("what")
    if what == "simulate":
        return simulate_l2(trace, **kw)
    if what == "sample":
        return sampled_reuse_distances(trace, **kw)
    return access_trace(_plan(), **kw)


API = [
    (lambda: _point(batch=0), "batch must be a positive integer"),
    (lambda: _point(heads="32"), "heads must be a positive integer"),
    (lambda: _point(seqlen=-1), "seqlen must be a positive integer"),
    (lambda: _point(head_dim=96), "head_dim must be one of"),
    (lambda: _point(head_dim=True), "head_dim must be one of"),
    (lambda: _point(dtype="fp8"), "dtype must be one of"),
    (lambda: _point(causal="yes"), "causal must be True or False"),
    (lambda: _point(schedule="diagonal+linear"), "cta schedule must be one of"),
    (lambda: _point(schedule="persistent+blocked"), "kv schedule must be one of"),
    (lambda: _point(schedule=""), "schedule must be a string"),
    (lambda: _point(tiles="1x1"), "tiles must be one of"),
    (lambda: _point(tiles="wide"), "tiles must look like"),
    (lambda: _point(ctas=0), "ctas must be a positive integer"),
    (lambda: _point(chunk_tiles=-1), "chunk_tiles must be a positive integer"),
    (lambda: _point(heads=32, kv_heads=5), "multiple of kv_heads"),
    (lambda: _point(kv_heads=0), "kv_heads must be a positive integer"),
    (lambda: _point(schedule="grouped+tiled").launch(_Gpu()), "grouped+tiled"),
    (lambda: _plan(occupancy=0), "occupancy must be an integer in [1, 32]"),
    (lambda: _plan(occupancy=True), "occupancy must be an integer"),
    (lambda: _plan(causal="no"), "causal must be True or False"),
    (lambda: _plan(chunk_tiles=2), "chunk_tiles applies to the tiled schedule only"),
    (lambda: _plan(tiles=(64, 32)), "tiles must be one of"),
    (lambda: _plan(tiles=7), "tiles must look like"),
    (lambda: _schedules("GroupedSchedule", l2_fraction=0), "l2_fraction must be in"),
    (lambda: _schedules("TiledScan", tiles_per_chunk=0), "tiles_per_chunk must be a positive"),
    (lambda: _schedules("TiledScan", l2_fraction=9), "l2_fraction must be in"),
    (lambda: _schedules("AttentionProblem", batch=1, heads=2, kv_heads=1, seqlen_q=10,
                        seqlen_kv=10, head_dim=64, tile_m=True), "tile_m must be a positive"),
    (lambda: _schedules("cta_schedule", name="diagonal"), "cta schedule must be one of"),
    (lambda: _schedules("kv_schedule", name="blocked"), "kv schedule must be one of"),
    (lambda: _sim(what="simulate", capacity_bytes=1 << 20, partitions=3),
     "partitions must be 1 or 2"),
    (lambda: _sim(what="simulate", capacity_bytes=0), "capacity_bytes must be positive"),
    (lambda: _sim(what="simulate", capacity_bytes=1 << 20, partitions=2), "sms"),
    (lambda: _sim(what="sample", rate=0), "rate must be in (0, 1]"),
    (lambda: _sim(what="trace", jitter=1.5), "jitter must be in [0, 1)"),
    (lambda: _plan(causal=True, causal_alignment="bottom"), "causal_alignment must be one of"),
    (lambda: _schedules("AttentionProblem", batch=1, heads=2, kv_heads=1, seqlen_q=10,
                        seqlen_kv=20, head_dim=64, causal=True, causal_alignment=None),
     "causal_alignment must be one of"),
    (lambda: _varlen([0, 100, 50, 256]), "cu_seqlens_q must not decrease, got cu_seqlens_q[2]"),
    (lambda: _varlen([1, 100, 256]), "cu_seqlens_q must start at 0, got cu_seqlens_q[0] = 1"),
    (lambda: _varlen([0, 300, 256]), "cu_seqlens_q must stay within the packed rows (256)"),
    (lambda: _varlen([0, 100, 200]), "cu_seqlens_q must end at the packed rows (256)"),
    (lambda: _varlen([0, 100, 256], max_seqlen_q=155), "max_seqlen_q must be at least the "
                                                       "longest sequence (156, sequence 1)"),
    (lambda: _varlen([0, 100, 256], max_seqlen_k=2.5), "max_seqlen_k must be an integer"),
    (lambda: _attention_on_host(), "q must live in GPU memory"),
    (lambda: _attention_on_list(), "q must be a CuPy array, a torch tensor or support DLPack"),
]


class _Gpu:
    sms, l2_bytes = 132, 50 << 20


def _attention_on_host():
    import numpy as np

    import wavefront
    a = np.ones((1, 1, 8, 64), dtype=np.float16)
    return wavefront.attention(a, a, a)


def _attention_on_list():
    import wavefront
    pytest.importorskip("cupy")
    return wavefront.attention([1, 2], [1, 2], [1, 2])


@pytest.mark.parametrize("call,expected", API, ids=[f"api{i}" for i in range(len(API))])
def test_bad_api_arguments_name_the_argument(call, expected):
    with pytest.raises(ValueError) as err:
        call()
    assert expected in str(err.value)


def test_there_are_at_least_100_cases():
    total = len(SPECS) + len(FLAGS) + len(DATA) + len(MANIFESTS) + len(API) + 2
    print(f"{total} bad inputs: {len(SPECS)} specs, {len(FLAGS)} flags, "
          f"{len(DATA) + len(MANIFESTS)} data files and manifests, {len(API)} API calls, "
          "2 documented repairs")
    assert total >= 100


def test_the_store_never_writes_through_a_link(tmp_path):
    """With `.lock`, `results.csv` or `repairs.log` in the out directory a symbolic link to
    another file, the store refuses by name and the other file keeps its bytes."""
    from wavefront.results.store import DirectoryLock, UnsafePath, append_row, repair_tail
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    with pytest.raises(UnsafePath, match=r"\.lock: is a symbolic link"):
        with DirectoryLock(out):
            pass
    (out / "results.csv").symlink_to(victim)
    with pytest.raises(UnsafePath, match="results.csv: is a symbolic link"):
        append_row(out / "results.csv", {"point": "x"})
    dangling = tmp_path / "dangling"
    dangling.mkdir()
    (dangling / "results.csv").symlink_to(tmp_path / "nowhere.csv")
    with pytest.raises(UnsafePath):
        append_row(dangling / "results.csv", {"point": "x"})
    assert not (tmp_path / "nowhere.csv").exists()
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "results.csv").write_bytes(b"a,b\n1,2\n3,")  # a torn last row to cut
    (torn / "repairs.log").symlink_to(victim)
    with pytest.raises(UnsafePath, match="repairs.log: is a symbolic link"):
        repair_tail(torn / "results.csv")
    assert (torn / "results.csv").read_bytes() == b"a,b\n1,2\n3,"  # nothing cut unlogged
    assert victim.read_text() == "precious\n"


@pytest.mark.slow
def test_every_experiment_plot_names_missing_data(tmp_path, run_each):
    """`python experiments/<name>.py plot` on a data directory without its data sets ends in a
    message naming what is missing (exit 1), never a traceback; an --out under a file too."""
    import subprocess
    import sys
    empty = tmp_path / "empty"
    empty.mkdir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    from wavefront.report.experiments import discover
    # not those without a figure (their section's missing data: tests/test_paper.py) nor
    # those drawn from the model alone (phase_diagram)
    drawn = [(name, exp) for name, exp in discover(ROOT / "experiments").items()
             if exp.has_figure and (exp.datasets or exp.records)]
    done = run_each([[sys.executable, str(exp.path), "plot", "--data", str(empty), "--out",
                      str(tmp_path / "out" / name)] for name, exp in drawn],
                    capture_output=True, text=True, timeout=300)
    assert len(done) >= 10
    for (name, _), res in zip(drawn, done):
        assert res.returncode == 1, (name, res.stderr[-500:])
        assert "Traceback" not in res.stderr and str(empty) in res.stderr, name
    res = subprocess.run([sys.executable, str(ROOT / "experiments" / "knee.py"), "plot",
                          "--out", str(blocker / "sub")], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 1 and "Not a directory" in res.stderr, res.stderr[-500:]
