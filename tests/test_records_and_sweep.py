"""Schema, manifests, and sweeps that survive crashes, failing and hanging points."""
import sys
from pathlib import Path

import pytest

from wavefront.records import COLUMNS, SchemaError, append_row, load_results
from wavefront.sweep import SubprocessRunner, expand, parse_spec, run_sweep

FAKE_WORKER = [sys.executable, str(Path(__file__).parent / "fakes" / "fake_worker.py")]
GPU = dict(gpu="FakeGPU", sms=132, l2_bytes=50 << 20)

SPEC = """
name = "t"
timeout_s = 4
batch_points = 3
[grid]
seqlen = [128, 256, 384, 512]
head_dim = [64]
causal = [false, true]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""


class CrashingRunner:
    """Measures `limit` points, then dies as a killed process would."""

    def __init__(self, limit):
        self.limit = limit
        self.calls = []

    def run(self, points, spec, on_result):
        for i, point in enumerate(points):
            if i == self.limit:
                raise KeyboardInterrupt
            self.calls.append(point["key"])
            on_result(point, {"median_ms": 1.0, "rel_error": 1e-3}, None)


def test_resume_after_crash_loses_nothing_and_duplicates_nothing(tmp_path):
    spec = parse_spec(SPEC)
    total = len(expand(spec, **GPU))
    assert total == 16
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path, runner=CrashingRunner(limit=5), progress=False, **GPU)
    assert len(load_results(tmp_path / "results.csv")) == 5
    second = CrashingRunner(limit=10**6)
    summary = run_sweep(spec, tmp_path, runner=second, progress=False, **GPU)
    assert summary == {"points": 16, "skipped": 5, "ok": 11, "failed": 0}
    df = load_results(tmp_path / "results.csv")
    assert len(df) == 16 and df["point"].is_unique
    assert run_sweep(spec, tmp_path, runner=second, progress=False, **GPU)["skipped"] == 16


def test_line_cut_by_a_crash_is_ignored(tmp_path):
    path = tmp_path / "results.csv"
    append_row(path, {"point": "a", "measurement": "timing", "status": "ok"})
    with open(path, "a") as f:
        f.write("b,timing,o")  # a write cut short
    df = load_results(path)
    assert list(df["point"]) == ["a"]


def test_failing_hanging_and_crashing_points_are_recorded(tmp_path):
    spec = parse_spec(SPEC.replace("[128, 256, 384, 512]", "[128, 666, 256, 999, 777, 512]")
                      .replace('causal = [false, true]', 'causal = [false]'))
    summary = run_sweep(spec, tmp_path, runner=SubprocessRunner(worker_cmd=FAKE_WORKER),
                        progress=False, **GPU)
    df = load_results(tmp_path / "results.csv")
    assert summary["ok"] == 6 and summary["failed"] == 6
    assert len(df) == 12 and df["point"].is_unique
    by_len = df.groupby("seqlen")["status"].agg(set).to_dict()
    assert by_len == {128: {"ok"}, 256: {"ok"}, 512: {"ok"}, 666: {"failed"},
                      999: {"failed"}, 777: {"failed"}}
    errors = df.set_index("seqlen")["error"]
    assert errors.loc[666].str.startswith("hung").all()
    assert errors.loc[999].str.contains("worker exited 3").all()
    assert errors.loc[777].str.contains("planted failure").all()
    # Re-running skips failed points unless asked, then measures them again.
    assert run_sweep(spec, tmp_path, runner=SubprocessRunner(worker_cmd=FAKE_WORKER),
                     progress=False, **GPU)["skipped"] == 12


def test_loader_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(SchemaError, match="header does not match"):
        load_results(path)
    path.write_text(",".join(COLUMNS) + "\n" + ",".join(["x"] * len(COLUMNS)) + "\n")
    with pytest.raises(SchemaError):
        load_results(path)


def test_rows_with_unknown_columns_are_refused(tmp_path):
    with pytest.raises(SchemaError, match="not in the schema"):
        append_row(tmp_path / "r.csv", {"point": "a", "colour": "red"})


@pytest.mark.parametrize("text,match", [
    ("name='x'", "needs a \\[grid\\] table"),
    ("[grid]\nseqlen=[1]\nhead_dim=[64]", "grid needs"),
    ("[grid]\nseqlen=[1]\nhead_dim=[64]\nschedule=['grid']\ncolour=['red']", "unknown grid keys"),
    ("[grid]\nseqlen=1\nhead_dim=[64]\nschedule=['grid']", "non-empty list"),
    ("measure=['speed']\n[grid]\nseqlen=[1]\nhead_dim=[64]\nschedule=['grid']", "measure"),
    ("this is not toml", "not valid TOML"),
])
def test_bad_specs(text, match):
    with pytest.raises(ValueError, match=match):
        parse_spec(text)


def test_committed_data_loads_with_the_schema():
    root = Path(__file__).parent.parent / "data"
    files = sorted(root.glob("*/results.csv"))
    assert files, "data/ holds measured results"
    for f in files:
        df = load_results(f)
        assert len(df) > 0
        assert (f.parent / "manifest.json").exists()
