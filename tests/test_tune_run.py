"""`measure/tune.run`, the two-stage search `wavefront tune` calls, on the CPU: the timing
replaced by a stand-in that ranks candidates by a made-up speed, so what is checked is the
loop: the softmax stage searches around the first stage's winner, a shape with nothing timed
is a failure, records reach their sinks, and --write refuses a winner that ran under half the
table's speed."""
import types

from wavefront.measure import tune
from wavefront.point import Point


def _speed(p: Point) -> float:
    """A made-up speed: bigger tiles and more worker warps are faster."""
    m, n = map(int, str(p.tiles or "64x64").split("x"))
    return m * n / 100 + (p.worker_warps or 4) + (p.rescale_threshold or 0)


def _fake_search(timed=True, calls=None):
    def search(candidates, gpu, gpu_name, dtype, *, rounds, per_round, jobs=None, log=print):
        if calls is not None:
            calls.append(list(candidates))
        rows = [{"gpu": gpu_name, "shape": p.problem_only().as_dict(), "label": f"c{i}",
                 "levers": {k: getattr(p, k) for k in tune.ALL_LEVERS},
                 "tflops": _speed(p) if timed else None, "tflops_ci95": [0.0, 1.0],
                 "not_timed": None if timed else "spills"}
                for i, p in enumerate(candidates)]
        return rows, timed
    return search


class _Sink:
    def __init__(self):
        self.rows = []

    def write(self, row):
        self.rows.append(row)


GPU = types.SimpleNamespace(name="FakeGPU")
SHAPE = Point(1, 8, None, 1024, 64, "bfloat16", True)


def test_the_softmax_stage_searches_around_the_first_stages_winner(monkeypatch):
    calls = []
    monkeypatch.setattr(tune, "search", _fake_search(calls=calls))
    seen, sink, levers_sink = [], _Sink(), _Sink()
    result = tune.run([SHAPE], GPU, "bfloat16", rounds=6, per_round=1, sink=sink,
                      levers_sink=levers_sink, log=lambda m: None, on_stage=seen.append)
    assert [s.stage for s in seen] == ["levers", "softmax"] and result.failed == 0
    first, second = seen
    assert calls[0] == tune.lever_space(SHAPE)
    assert first.best["tflops"] == max(_speed(p) for p in calls[0])
    assert calls[1] == tune.softmax_space(SHAPE.replace(**first.best["levers"]))
    assert len(sink.rows) == len(calls[0]) + len(calls[1])
    assert result.best[SHAPE] is second.best and second.best["tflops"] >= first.best["tflops"]
    assert {r["stage"] for r in levers_sink.rows} == {"levers", "softmax"}
    assert result.written == {}  # nothing written without write_dims


def test_a_shape_with_nothing_timed_fails_and_stops_its_search(monkeypatch):
    monkeypatch.setattr(tune, "search", _fake_search(timed=False))
    seen = []
    result = tune.run([SHAPE], GPU, "bfloat16", rounds=6, per_round=1, log=lambda m: None,
                      on_stage=seen.append)
    assert [s.stage for s in seen] == ["levers"] and seen[0].best is None
    assert result.best == {} and result.failed == 2  # the search that did not run, the shape


def test_write_keeps_the_winner_unless_it_ran_under_half_the_tables_speed(monkeypatch):
    import wavefront.kernel.tuning as tuning
    monkeypatch.setattr(tune, "search", _fake_search())
    written, table = {}, {}
    monkeypatch.setattr(tuning, "load_table", lambda: table)
    monkeypatch.setattr(tuning, "write_entry",
                        lambda gpu, d, causal, entry: written.setdefault((gpu, d, causal),
                                                                         entry) and "key")
    dims = (1, 8, 8, 1024)
    result = tune.run([SHAPE], GPU, "bfloat16", rounds=6, per_round=1, softmax_levers=False,
                      write_dims=dims, log=lambda m: None)
    assert result.written == {SHAPE: "key"} and result.failed == 0
    assert written[("FakeGPU", 64, True)]["tflops"] == round(result.best[SHAPE]["tflops"], 1)
    key = tuning.entry_key(64, True, dims)
    table["FakeGPU"] = {key: {"tflops": 10 * result.best[SHAPE]["tflops"]}}
    written.clear()
    again = tune.run([SHAPE], GPU, "bfloat16", rounds=6, per_round=1, softmax_levers=False,
                     write_dims=dims, log=lambda m: None)
    assert written == {} and again.failed == 1 and "slowed GPU" in again.refused[SHAPE]


def test_the_bench_table_takes_its_columns_from_the_record_kind():
    """The bench printer's columns are `BENCH_RECORDS.columns`: a header per column, the paired
    ratios with their intervals, a failed shape's row with its error and '-' elsewhere."""
    from wavefront.cli.common import print_records
    from wavefront.results.records import BENCH_RECORDS
    row = {"gpu": "G", "shape": {"seqlen": 1024, "head_dim": 64, "causal": True},
           "contender": "api", "tflops": 101.25, "tflops_ci95": [99.0, 103.5], "x_cudnn": 0.98,
           "x_bound": 0.9512, "x_bound_ci95": [0.94, 0.96], "host_us": 14.04,
           "host_probe_us": [2.7, 2.9, 3.1], "host_cpu_jiffies": [[1, 100], [1, 100]],
           "throttled_rounds": 0}
    failed = {"gpu": "G", "shape": {"seqlen": 2048, "head_dim": 64, "causal": False},
              "error": "RuntimeError: out of memory"}
    lines = []
    print_records([row, failed], BENCH_RECORDS, echo=lines.append)
    assert lines[0].split("  ")[0] == "contender"
    assert [c.header for c in BENCH_RECORDS.columns] == [
        h.strip() for h in lines[0].split("  ") if h.strip()]
    assert "101.2" in lines[1] and "99.0-103.5" in lines[1] and "0.951 [0.940,0.960]" in lines[1]
    assert "2.90 [2.70-3.10]" in lines[1] and "1.0" in lines[1] and lines[1].endswith("ok")
    assert lines[2].startswith("-") and lines[2].endswith("RuntimeError: out of memory")
