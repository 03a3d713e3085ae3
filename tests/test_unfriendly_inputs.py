"""Input nobody wrote a test for, written the way an unfriendly user would (CPU only, a fake GPU
where one is needed): every case ends in a clear message naming what was wrong, exit 2 (or 1
where the machine said no), never a traceback, never silently accepted, never a hang, in bounded
memory. These are the cases `test_bad_inputs.py` did not have; `test_the_count` prints the
outcome classes."""
import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import wavefront.cli.measure as measure_commands
from wavefront.cli import main
from wavefront.results.store import manifest_path, read_results_bytes, results_path

ROOT = Path(__file__).parent.parent
KNEE = str(ROOT / "experiments" / "knee.py")


def grid(**overrides):
    lines = {"seqlen": "[4096]", "head_dim": "[64]", "schedule": '["persistent+linear"]'}
    lines.update(overrides)
    return "[grid]\n" + "\n".join(f"{k} = {v}" for k, v in lines.items()) + "\n"


BASE = grid()

# (spec text, text the error must contain): `sweep SPEC --dry-run`, exit 2, file named
SPECS = [
    ('name = "../../etc/passwd"\n' + BASE, "name must be printable, without path separators"),
    ('name = "a/b"\n' + BASE, "without path separators"),
    ('name = "tab\\there"\n' + BASE, "name must be printable"),
    ('name = ".."\n' + BASE, "without path separators"),
    (grid(seqlen="[[4096]]"), "grid.seqlen[0] must be a positive integer"),
    (grid(seqlen="[4096.0]"), "grid.seqlen[0] must be a positive integer"),
    (grid(seqlen="[nan]"), "grid.seqlen[0]"),
    (grid(seqlen="[inf]"), "grid.seqlen[0]"),
    (grid(seqlen="[-inf]"), "grid.seqlen[0]"),
    (grid(seqlen="[16777217]"), "grid.seqlen[0] must be a positive integer up to 16777216"),
    (grid(head_dim="[64.0]"), "head_dim must be"),
    (grid(head_dim="[0]"), "grid.head_dim[0]"),
    (grid(tiles='["128x64x2"]'), "grid.tiles[0]"),
    (grid(tiles='["-128x64"]'), "grid.tiles[0]"),
    (grid(tiles='["0x0"]'), "grid.tiles[0]"),
    (grid(tiles='["64x128"]'), "grid.tiles[0]"),
    (grid(tiles="[[128, 64]]"), "grid.tiles[0]"),
    (grid(occupancy="[1.0]"), "grid.occupancy[0] must be an integer in [1, 32]"),
    (grid(occupancy="[true]"), "grid.occupancy[0]"),
    (grid(occupancy='["2"]'), "grid.occupancy[0]"),
    (grid(occupancy="[-1]"), "grid.occupancy[0]"),
    (grid(ctas="[true]"), "grid.ctas[0]"),
    (grid(ctas="[1.5]"), "grid.ctas[0]"),
    (grid(batch="[true]"), "grid.batch[0]"),
    (grid(batch="[-1]"), "grid.batch[0]"),
    (grid(heads="[0]"), "grid.heads[0]"),
    (grid(heads="[true]"), "grid.heads[0]"),
    (grid(heads="[-8]"), "grid.heads[0]"),
    (grid(kv_heads="[true]"), "grid.kv_heads[0]"),
    (grid(kv_heads="[3]"), "must be a multiple of kv_heads (3)"),
    (grid(chunk_tiles="[true]"), "grid.chunk_tiles[0]"),
    (grid(dtype='["BFLOAT16"]'), "grid.dtype[0] must be one of"),
    (grid(dtype='[""]'), "grid.dtype[0]"),
    (grid(dtype='["fp8"]'), "grid.dtype[0]"),
    (grid(schedule='["persistent+"]'), "grid.schedule[0]"),
    (grid(schedule='["+linear"]'), "grid.schedule[0]"),
    (grid(schedule='["persistent+linear+x"]'), "grid.schedule[0]"),
    (grid(schedule='[" persistent+linear"]'), "grid.schedule[0]"),
    (grid(schedule='["PERSISTENT+LINEAR"]'), "grid.schedule[0]"),
    (grid(schedule="[]"), "grid.schedule must be a non-empty list"),
    (grid(schedule='"persistent+linear"'), "grid.schedule must be a non-empty list"),
    (grid(causal='[true, "x"]'), "grid.causal[1]"),
    (grid(causal="[]"), "grid.causal must be a non-empty list"),
    (grid(head_dim="[]"), "grid.head_dim must be a non-empty list"),
    (grid(tiles="[]"), "grid.tiles must be a non-empty list"),
    (grid(seqlen="{a = 1}"), "grid.seqlen must be a non-empty list"),
    (grid(seqlen="[4096]", extra="1"), "unknown grid keys ['extra']"),
    (grid(seqlen="[4096]\n[grid.sub]\nx = 1"), "unknown grid keys ['sub']"),
    ('measure = ["timing", 3]\n' + BASE, "measure must list some of"),
    ('measure = ["timing", "counters", "timing"]\n' + BASE, "once each"),
    ("measure = 3\n" + BASE, "measure must list some of"),
    ("repeats = -1\n" + BASE, "repeats must be a positive integer"),
    ("repeats = true\n" + BASE, "repeats must be a positive integer"),
    ("repeats = 3.0\n" + BASE, "repeats must be a positive integer"),
    ("reps = true\n" + BASE, "reps must be a positive integer"),
    ("timeout_s = true\n" + BASE, "timeout_s must be a positive number"),
    ("timeout_s = -inf\n" + BASE, "timeout_s must be a positive number"),
    ("batch_points = -5\n" + BASE, "batch_points must be a positive integer"),
    ("peers = 1\n" + BASE, "peers must be true or false"),
    ('record_order = "yes"\n' + BASE, "record_order must be true, false or one of"),
    ('metric_set = ""\n' + BASE, "metric_set must be one of"),
    ("metric_set = 3\n" + BASE, "metric_set must be one of"),
    ('name = ["a"]\n' + BASE, "name must be a non-empty string"),
    ("[grid]\n", "grid needs ['seqlen', 'head_dim', 'schedule']"),
    ("grid = []\n", "needs a [grid] table"),
    ("grid = [1, 2]\n", "needs a [grid] table"),
    ("", "needs a [grid] table"),
    ("\ufeff" + BASE, "not valid TOML"),
    ('name = "a\x00b"\n' + BASE, "not valid TOML"),
    (BASE + "[[grid]]\n", "not valid TOML"),
    ("x = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n", "nested too deeply"),
]


@pytest.mark.parametrize("text,expected", SPECS)
def test_unfriendly_specs(tmp_path, text, expected):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    res = CliRunner().invoke(main, ["sweep", str(path), "--dry-run"])
    assert res.exit_code == 2, res.output
    assert expected in res.output and "bad.toml" in res.output, res.output
    assert "Traceback" not in res.output


def _tmp_objects(tmp_path):
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "empty-experiments").mkdir()
    return tmp_path


# (argv with {tmp} for a scratch directory, exit code, text the message must contain)
FLAGS = [
    (["run", "--seqlen", "1e3"], 2, "comma-separated list"),
    (["run", "--seqlen", " "], 2, "at least one value"),
    (["run", "--seqlen", "-1"], 2, "must be a positive integer"),
    (["run", "--heads", "0"], 2, "--heads"),
    (["run", "--kv-heads", "0"], 2, "--kv-heads"),
    (["simulate", "--seqlen", "0"], 2, "must be a positive integer"),
    (["simulate", "--sms", "-1"], 2, "--sms"),
    (["simulate", "--l2-mib", "-inf"], 2, "not a finite number"),
    (["simulate", "--capacity-mib", "-1"], 2, "--capacity-mib"),
    (["simulate", "--jitter", "-0.1"], 2, "--jitter"),
    (["simulate", "--gpu", ""], 2, "gpu must be one of"),
    (["simulate", "--tile", "64x128"], 2, "tiles must be one of"),
    (["simulate", "--head-dim", "64,96"], 2, "head_dim must be one of"),
    (["simulate", "--schedule", ""], 2, "at least one value"),
    (["simulate", "--schedule", "persistent+"], 2, "names no K/V scan"),
    (["simulate", "--seqlen", "131072", "--batch", "60000"], 2, "K/V steps"),
    (["fit", "{tmp}"], 2, "is a directory"),
    (["fit", "{tmp}/fifo"], 2, "must be a regular file, not a device, FIFO"),
    (["fit", "/dev/zero"], 2, "must be a regular file, not a device, FIFO"),
    (["fit", "/dev/null"], 2, "must be a regular file, not a device, FIFO"),
    (["fit", "{tmp}/afile"], 2, "header does not match"),
    (["paper", "--data", "{tmp}/afile"], 2, "is a file"),
    (["paper", "--out", "{tmp}/afile/sub"], 1, "Not a directory"),
    (["paper", "--experiments", "{tmp}/empty-experiments"], 1, "not an experiments package"),
    (["paper", "--data", "{tmp}/empty-experiments"], 1, "no such results file"),
    (["compile", "--jobs", "-1"], 2, "--jobs"),
    (["bench", "--per-round", "0"], 2, "--per-round"),
    (["bench", "--warmup", "-1"], 2, "--warmup"),
    (["bench", "--cluster", "3"], 2, "--cluster"),
    (["bench", "--kv-latency", "11"], 2, "--kv-latency"),
    (["bench", "--rescale-threshold", "17"], 2, "--rescale-threshold"),
    (["bench", "--exp2-poly", "5"], 2, "--exp2-poly"),
    (["bench", "--worker-warps", "6"], 2, "--worker-warps"),
    (["bench", "--head-dim", "96"], 2, "head_dim must be one of"),
    (["bench", "--seqlen", "0"], 2, "must be a positive integer"),
    (["bench", "--tile", "1x1"], 2, "tiles must be one of"),
    (["bench", "--out", "{tmp}/afile"], 2, "is a file"),
    (["bench", "--schedule", "persistent+"], 2, "names no K/V scan"),
    (["profile", "--seqlen", "abc"], 2, "comma-separated list"),
    (["profile", "--repeats", "-3"], 2, "--repeats"),
    (["bench-varlen", "--lengths", "0,0"], 2, "at least one token"),
    (["bench-varlen", "--lengths", "-5"], 2, "lengths must be >= 0"),
    (["bench-varlen", "--tokens", "0"], 2, "--tokens"),
    (["bench-varlen", "--longest", "0"], 2, "--longest"),
    (["prefill", "--layers", "0"], 2, "--layers"),
    (["prefill", "--seqlen", "0"], 2, "prompt lengths must be positive"),
    (["prefill", "--seqlen", "x"], 2, "comma-separated list"),
    (["prefill", "--hidden", "0"], 2, "--hidden"),
    (["prefill", "--rounds", "2"], 2, "--rounds"),
    (["tune", "--seqlen", "0"], 2, "--seqlen"),
    (["tune", "--head-dim", "96"], 2, "head_dim must be one of"),
    (["tune", "--rounds", "0"], 2, "--rounds"),
    (["sweep", "{tmp}"], 2, "is a directory"),
    (["sweep", "{tmp}/afile", "--dry-run"], 2, "not valid TOML"),
    (["sweep", KNEE, "--out", "{tmp}/afile"], 2, "is a file"),
    (["sweep", KNEE, "--out", "x", "--gpus", "-1"], 2, "expected a count or 'all'"),
    (["sweep", KNEE, "--out", "x", "--gpus", "0"], 1, "no GPU is visible"),
    (["sweep", KNEE, "--dry-run", "--gpu", "h1000"], 2, "gpu must be one of"),
]


@pytest.mark.parametrize("argv,code,expected", FLAGS)
def test_unfriendly_flags(tmp_path, argv, code, expected):
    _tmp_objects(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == code, res.output
    assert expected in res.output, res.output
    assert "Traceback" not in res.output


def _plan(q=(1, 2, 256, 64), k=(1, 2, 256, 64), **kw):
    from wavefront.point import plan
    return plan(q, k, **{"sms": 132, "l2_bytes": 50 << 20, **kw})


def _varlen(q=(10, 2, 64), k=(10, 2, 64), cq=(0, 10), ck=(0, 10), **kw):
    from wavefront.point import plan_varlen
    return plan_varlen(q, k, cq, ck, sms=132, l2_bytes=50 << 20, **kw)


def _point(**kw):
    from wavefront.point import Point
    return Point(**kw)


def _schedules(what, **kw):
    from wavefront import schedules
    return getattr(schedules, what)(**kw)


# (id, call, text the ValueError must contain)
API = [
    ("plan q 3-D", lambda: _plan(q=(1, 2, 256)), "q_shape must be 4 sizes"),
    ("plan q 5-D", lambda: _plan(q=(1, 1, 2, 256, 64)), "q_shape must be 4 sizes"),
    ("plan q not a shape", lambda: _plan(q=5), "q_shape must be 4 sizes"),
    ("plan k 3-D", lambda: _plan(k=(1, 2, 256)), "k_shape must be 4 sizes"),
    ("plan float seqlen", lambda: _plan(q=(1, 2, 256.0, 64)), "seqlen_q must be a positive"),
    ("plan bool batch", lambda: _plan(q=(True, 2, 256, 64), k=(True, 2, 256, 64)),
     "batch must be a positive integer"),
    ("plan negative seqlen", lambda: _plan(q=(1, 2, -256, 64)), "seqlen_q must be a positive"),
    ("plan k batch differs", lambda: _plan(k=(2, 2, 256, 64)), "k_shape must have q's batch"),
    ("plan k head_dim differs", lambda: _plan(k=(1, 2, 256, 128)), "head_dim (64)"),
    ("plan sms 0", lambda: _plan(sms=0), "sms must be a positive integer"),
    ("plan l2 negative", lambda: _plan(l2_bytes=-1), "l2_bytes must be a positive integer"),
    ("plan l2 nan", lambda: _plan(l2_bytes=float("nan")), "l2_bytes must be a positive"),
    ("plan ctas 0", lambda: _plan(ctas=0), "ctas must be a positive integer"),
    ("plan ctas float", lambda: _plan(ctas=2.5), "ctas must be a positive integer"),
    ("plan chunk 0", lambda: _plan(schedule="persistent+tiled", chunk_tiles=0),
     "tiles_per_chunk must be a positive integer"),
    ("plan schedule None", lambda: _plan(schedule=None), "schedule must be a string"),
    ("plan schedule int", lambda: _plan(schedule=5), "schedule must be a string"),
    ("plan schedule trailing +", lambda: _plan(schedule="grouped+"), "names no K/V scan"),
    ("plan tiles of 3", lambda: _plan(tiles=(128, 64, 1)), "tiles must be one of"),
    ("plan occupancy 33", lambda: _plan(occupancy=33), "occupancy must be an integer"),
    ("plan occupancy float", lambda: _plan(occupancy=2.0), "occupancy must be an integer"),
    ("plan causal None", lambda: _plan(causal=None), "causal must be True or False"),
    ("plan causal 1", lambda: _plan(causal=1), "causal must be True or False"),
    ("varlen decreasing", lambda: _varlen(cq=(0, 6, 4, 10), ck=(0, 6, 4, 10)),
     "must not decrease"),
    ("varlen not from 0", lambda: _varlen(cq=(2, 10), ck=(2, 10)), "must start at 0"),
    ("varlen wrong end", lambda: _varlen(cq=(0, 8), ck=(0, 8)), "must end at the packed rows"),
    ("varlen counts differ", lambda: _varlen(cq=(0, 5, 10)), "the same number"),
    ("varlen empty", lambda: _varlen(cq=(), ck=()), "at least two entries"),
    ("varlen one entry", lambda: _varlen(cq=(0,), ck=(0,)), "at least two entries"),
    ("varlen floats", lambda: _varlen(cq=(0, 5.5, 10), ck=(0, 5.5, 10)),
     "must be a sequence of integers"),
    ("varlen strings", lambda: _varlen(cq=("0", "10"), ck=("0", "10")),
     "must be a sequence of integers"),
    ("varlen booleans", lambda: _varlen(q=(1, 2, 64), k=(1, 2, 64), cq=(False, True),
                                        ck=(False, True)), "not booleans"),
    ("varlen queries without keys", lambda: _varlen(cq=(0, 5, 10), ck=(0, 0, 10)), "no keys"),
    ("varlen negative", lambda: _varlen(cq=(0, -1, 10), ck=(0, -1, 10)), "must not decrease"),
    ("varlen tiled", lambda: _varlen(schedule="persistent+tiled"), "does not apply"),
    ("varlen 4-D q", lambda: _varlen(q=(1, 10, 2, 64)), "q_shape must be 3 sizes"),
    ("varlen k head_dim differs", lambda: _varlen(k=(10, 2, 128)), "k_shape must have q's"),
    ("point seqlen float", lambda: _point(seqlen=4096.0), "seqlen must be a positive integer"),
    ("point seqlen bool", lambda: _point(seqlen=True), "seqlen must be a positive integer"),
    ("point seqlen huge", lambda: _point(seqlen=1 << 40), "seqlen must be a positive integer up to 16777216"),
    ("point occupancy 0", lambda: _point(occupancy=0), "occupancy must be an integer"),
    ("point occupancy text", lambda: _point(occupancy="2"), "occupancy must be an integer"),
    ("point tiles pair", lambda: _point(tiles=(1, 2)), "tiles must be one of"),
    ("point schedule None", lambda: _point(schedule=None), "schedule must be a string"),
    ("point kv_heads > heads", lambda: _point(heads=2, kv_heads=4), "must be a multiple"),
    ("point dtype None", lambda: _point(dtype=None), "dtype must be one of"),
    ("point causal None", lambda: _point(causal=None), "causal must be True or False"),
    ("point batch float", lambda: _point(batch=1.0), "batch must be a positive integer"),
    ("point heads negative", lambda: _point(heads=-1), "heads must be a positive integer"),
    ("point chunk bool", lambda: _point(chunk_tiles=True, schedule="persistent+tiled"),
     "chunk_tiles must be a positive integer"),
    ("point ctas bool", lambda: _point(ctas=True), "ctas must be a positive integer"),
    ("point cluster bool", lambda: _point(cluster=True), "cluster"),
    ("point worker warps 6", lambda: _point(worker_warps=6), "worker_warps must be"),
    ("grouped l2 nan", lambda: _schedules("GroupedSchedule", l2_fraction=float("nan")),
     "l2_fraction must be in"),
    ("grouped l2 inf", lambda: _schedules("GroupedSchedule", l2_fraction=float("inf")),
     "l2_fraction must be in"),
    ("tiled scan float", lambda: _schedules("TiledScan", tiles_per_chunk=2.5),
     "tiles_per_chunk must be a positive integer"),
    ("tiled scan bool", lambda: _schedules("TiledScan", tiles_per_chunk=True),
     "tiles_per_chunk must be a positive integer"),
    ("problem seqlen 0", lambda: _schedules("AttentionProblem", batch=1, heads=2, kv_heads=1,
                                            seqlen_q=0, seqlen_kv=10, head_dim=64),
     "seqlen_q must be a positive integer"),
    ("problem head_dim 0", lambda: _schedules("AttentionProblem", batch=1, heads=2, kv_heads=1,
                                              seqlen_q=10, seqlen_kv=10, head_dim=0),
     "head_dim must be a positive integer"),
]


@pytest.mark.parametrize("call,expected", [a[1:] for a in API], ids=[a[0] for a in API])
def test_unfriendly_api_calls(call, expected):
    with pytest.raises(ValueError) as err:
        call()
    assert expected in str(err.value)


# --------------------------------------------------------------------------------------------
# Files that are not what they claim, machines that say no
# --------------------------------------------------------------------------------------------

def _knee_copy(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "results.csv").write_bytes(read_results_bytes(results_path(ROOT / "data" / "knee")))
    (d / "manifest.json").write_bytes(read_results_bytes(manifest_path(ROOT / "data" / "knee")))
    return d


MANIFEST_OBJECTS = [
    ("a FIFO", lambda p: os.mkfifo(p), "a manifest must be a regular file"),
    ("a directory", lambda p: p.mkdir(), "a manifest must be a regular file"),
    ("JSON nested past the parser", lambda p: p.write_text("[" * 100000 + "]" * 100000),
     "not valid JSON"),
    ("NaN for a run", lambda p: p.write_text('{"r": NaN}'), "is not an object"),
]


@pytest.mark.parametrize("name,make,expected", MANIFEST_OBJECTS,
                         ids=[m[0] for m in MANIFEST_OBJECTS])
def test_manifests_that_are_not_files_or_not_json(tmp_path, name, make, expected):
    d = _knee_copy(tmp_path)
    (d / "manifest.json").unlink()
    make(d / "manifest.json")
    res = CliRunner().invoke(main, ["fit", str(d / "results.csv")])
    assert res.exit_code == 2 and expected in res.output, res.output
    assert "Traceback" not in res.output


class _FakeGpu:
    name, sms, l2_bytes = "FakeGPU", 132, 50 << 20


class _InstantRunner:
    def run(self, tasks, spec, on_result, on_artifact=None):
        for task in tasks:
            on_result(task, {"median_ms": 1.0, "rel_error": 1e-3}, None)


@pytest.fixture
def fake_gpu_sweep(monkeypatch):
    """`wavefront sweep` on a fake GPU with an instant in-process runner."""
    monkeypatch.setattr(measure_commands, "_require_gpu", lambda: _FakeGpu())
    monkeypatch.setattr(measure_commands, "_sweep_runner", lambda out: _InstantRunner())
    monkeypatch.setattr(measure_commands, "environment", lambda: {"gpu": {"name": "FakeGPU", "sms": 132}})


SPEC6 = ('[grid]\nseqlen = [128, 256, 384]\nhead_dim = [64]\n'
         'schedule = ["persistent+linear", "persistent+sawtooth"]\n')


@pytest.mark.parametrize("code,remedy", [(errno.ENOSPC, "the disk is full"),
                                         (errno.EROFS, "read-only"),
                                         (errno.EACCES, "permission denied"),
                                         (errno.EPERM, "not permitted"),
                                         (errno.EDQUOT, "quota")])
def test_the_disk_saying_no_mid_sweep_is_a_message_and_loses_nothing(tmp_path, monkeypatch,
                                                                     fake_gpu_sweep, code,
                                                                     remedy):
    """The fourth row write fails half-written; the sweep ends in a message naming the file and
    the remedy, the rows stored before it load, and the same command resumes to every task
    once."""
    import wavefront.results.store as store
    from wavefront.results.store import load_results
    real, calls = store._write_all, {"n": 0}

    def failing(fd, data):
        calls["n"] += 1
        if calls["n"] == 4:
            real(fd, data[:10])
            raise OSError(code, os.strerror(code))
        return real(fd, data)
    monkeypatch.setattr(store, "_write_all", failing)
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC6)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["sweep", str(spec), "--out", str(out)])
    assert res.exit_code == 1 and remedy in res.output, res.output
    assert "results.csv" in res.output and "Traceback" not in res.output
    stored = load_results(out / "results.csv")
    assert 1 <= len(stored) < 6
    monkeypatch.setattr(store, "_write_all", real)
    res = CliRunner().invoke(main, ["sweep", str(spec), "--out", str(out)])
    assert res.exit_code == 0, res.output
    done = load_results(out / "results.csv")
    assert len(done) == 6 and not done.duplicated(["point", "measurement", "repeat"]).any()


def test_a_spec_error_only_the_gpus_shape_reveals_is_a_message(tmp_path, monkeypatch,
                                                                 fake_gpu_sweep):
    from wavefront.point import Point
    monkeypatch.setattr(Point, "to_record", lambda self, gpu, name: (_ for _ in ()).throw(
        ValueError("this GPU cannot place it")))
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC6)
    res = CliRunner().invoke(main, ["sweep", str(spec), "--out", str(tmp_path / "out")])
    assert res.exit_code == 1 and "this GPU cannot place it" in res.output, res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("address,expected", [("nonsense://x", "unknown address scheme"),
                                              ("127.0.0.1:notaport", "cannot connect"),
                                              ("tcp://127.0.0.1:1", "Timed out")])
def test_an_unusable_scheduler_is_named(address, expected):
    dask = pytest.importorskip("dask")
    pytest.importorskip("distributed")
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        res = CliRunner().invoke(main, ["sweep", KNEE, "--out", "x", "--scheduler", address])
    assert res.exit_code == 1, res.output
    assert f"--scheduler {address!r}" in res.output and expected in res.output, res.output


def test_the_simulators_memory_guard_reads_this_process_limits():
    """Under `ulimit -v` the guard sees the limit, not the machine's free memory: a launch too
    big for the limit is refused by name instead of dying in MemoryError."""
    code = textwrap.dedent("""
        import resource
        from wavefront.model.simulation import (_process_virtual_bytes, available_memory_bytes,
                                                check_simulable, memory_estimate)
        from wavefront.point import plan
        launch = plan((64, 64, 131072, 64), (64, 64, 131072, 64), sms=132, l2_bytes=50 << 20)
        need = memory_estimate(launch)
        check_simulable(launch, memory_bytes=4 * need)  # fits a machine with room for it
        # room for half of it left under the limit: the guard must see the limit
        soft = _process_virtual_bytes() + need // 2
        resource.setrlimit(resource.RLIMIT_AS, (soft, resource.RLIM_INFINITY))
        seen = available_memory_bytes()
        try:
            check_simulable(launch)
        except ValueError as exc:
            print("refused:", exc)
        print("limit seen", seen <= need // 2)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-1500:]
    assert "refused:" in res.stdout and "memory" in res.stdout and "limit seen True" in res.stdout


@pytest.mark.parametrize("files,expected", [
    ({"memory.max": "1073741824\n", "memory.current": "268435456\n"}, 805306368),
    ({"memory.max": "max\n", "memory.current": "5\n"}, None),
    ({"memory.max": "100\n", "memory.current": "500\n"}, 0),
    ({"memory/memory.limit_in_bytes": "9223372036854771712\n",
      "memory/memory.usage_in_bytes": "5\n"}, None),
    ({"memory/memory.limit_in_bytes": "2000\n", "memory/memory.usage_in_bytes": "500\n"}, 1500),
    ({"memory.max": "garbage\n", "memory.current": "5\n"}, None),
    ({}, None),
])
def test_cgroup_headroom(tmp_path, files, expected):
    from wavefront.model.simulation import _cgroup_headroom_bytes
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _cgroup_headroom_bytes(str(tmp_path)) == expected


def test_miss_curves_kept_per_distance_answer_as_per_access():
    """The compact miss curve (one entry per distinct need) gives exactly the per-access
    curve's misses at every capacity, the steps and between them."""
    from wavefront.model.simulation import COLD, MissCurve
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 5000):
        d = rng.integers(-1, 40, n) * 1024
        d[d < 0] = COLD
        b = rng.choice([1024, 2048], n).astype(np.int32)
        need = np.where(d == COLD, np.inf, d + b).astype(np.float64)
        order = np.argsort(need, kind="stable")
        per_access = np.concatenate([[0.0], np.cumsum(b[order], dtype=np.float64)])
        finite = np.unique(need[np.isfinite(need)])
        caps = np.concatenate([finite, finite + 0.5, finite - 0.5, [0.0, 1e18, np.inf]])
        full = per_access[-1] - per_access[np.searchsorted(need[order], caps, side="right")]
        curve = MissCurve(d, b)
        assert np.array_equal(curve.miss_bytes(caps), full)
        assert len(curve._need) <= len(finite) + 1


def test_a_manifest_that_is_a_link_is_refused_and_its_target_kept(tmp_path):
    from wavefront.results.store import UnsafePath, write_manifest
    victim = tmp_path / "victim.json"
    victim.write_text('{"precious": {}}\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").symlink_to(victim)
    with pytest.raises(UnsafePath, match="manifest.json: is a symbolic link"):
        write_manifest(out, "r", {"schema_version": 3, "date": "d", "gpu": "g",
                                  "git_commit": "c", "command": "t"})
    assert victim.read_text() == '{"precious": {}}\n'


@pytest.mark.parametrize("source,expected", [
    ("SPEC = (\n", "not valid Python"),
    ("SPECS = ['a']\n", "SPECS must map data set names"),
    ("SPECS = {'a': 3}\n", "SPECS must map data set names"),
    ("SPEC = open('x').read()\n", "SPEC must be built from literals"),
])
def test_experiment_files_that_do_not_read_as_data(tmp_path, source, expected):
    path = tmp_path / "exp.py"
    path.write_text(source)
    res = CliRunner().invoke(main, ["sweep", str(path), "--dry-run"])
    assert res.exit_code == 2 and expected in res.output, res.output
    assert "Traceback" not in res.output


def test_the_count():
    functions = (len(MANIFEST_OBJECTS) + 5 + 1 + 3 + 1 + 7 + 1 + 4)
    total = len(SPECS) + len(FLAGS) + len(API) + functions
    print(f"{total} new unfriendly inputs: {len(SPECS)} specs, {len(FLAGS)} flags and files, "
          f"{len(API)} API calls, {functions} files, machine refusals, schedulers and limits")
    assert total >= 150
