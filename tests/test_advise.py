"""The advisor (model.advise): candidates, projected steps marked, group budgets, labels."""
import pytest

from wavefront.model.advise import (
    FIXED_BUDGETS_MB, group_budgets, head_label, not_modelled_levers, rank)
from wavefront.model.presets import PRESETS
from wavefront.model.timed import Calibration, memory_timing
from wavefront.point import DEFAULT_OCCUPANCY, TILE_SHAPES, Point

CAL = Calibration("H100", 7000.0, 1100.0, {(64, 64, 64, False, 2): 700.0,
                                           (64, 128, 64, False, 2): 1200.0},
                  "step_time", 5, {"median": 0.01, "max": 0.02})


def _compute(launch):
    return CAL.compute(launch)


def test_head_labels_name_the_kv_heads_only_when_shared():
    assert head_label(24, None) == "H24"
    assert head_label(24, 24) == "H24"
    assert head_label(32, 8) == "H32/KV8"


def test_every_tile_is_ranked_and_uncalibrated_ones_are_marked_projected():
    gpu = PRESETS["h100"]
    point = Point(batch=1, heads=4, seqlen=2048, head_dim=64)
    ranked = rank(point, gpu, memory_timing(gpu), _compute, ["persistent+linear"])
    assert {r.tiles for r in ranked} == {f"{m}x{n}" for m, n in TILE_SHAPES}
    # every CTAs-per-SM count up to the tile's default is a candidate
    assert sorted((r.tiles, r.occupancy) for r in ranked) == sorted(
        (f"{m}x{n}", occ) for (m, n), d in DEFAULT_OCCUPANCY.items() for occ in range(1, d + 1))
    assert [r.time_ms for r in ranked] == sorted(r.time_ms for r in ranked)
    projected = {r.tiles for r in ranked if r.projected}
    assert projected == {"128x128", "128x256"}  # not in the calibration
    assert "kv_latency" in not_modelled_levers()
    with pytest.raises(ValueError, match="K/V steps"):
        rank(point, gpu, memory_timing(gpu), _compute, ["persistent+linear"], max_steps=10)


def test_group_budgets_put_the_fixed_budgets_beside_every_group_size():
    gpu = PRESETS["h100"]
    point = Point(batch=1, heads=8, seqlen=4096, head_dim=64)
    rows = group_budgets(point, gpu, memory_timing(gpu), _compute, tiles="64x64")
    sizes = [r["group_units"] for r in rows if "unit" in r["budget"]]
    assert sizes == [1, 2, 4, 8]
    fixed = [r for r in rows if "MB)" in r["budget"]]
    assert len(fixed) == len(FIXED_BUDGETS_MB)
    assert min(r["vs_best"] for r in rows) == 1.0
    with pytest.raises(ValueError, match="grouped"):
        group_budgets(point, gpu, memory_timing(gpu), _compute, schedule="persistent+linear")


def _advisor_picks():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "experiments" / "advisor_picks.py"
    spec = importlib.util.spec_from_file_location("advisor_picks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_advisor_picks_scores_the_pick_and_the_budgets_from_its_records(tmp_path):
    """experiments/advisor_picks.py (GPU run): its held-out shapes are no training, tuned or
    ablation shape, and its table scores the advised configuration and L2 budget against the
    fastest measured, from records laid out as `measure` writes them."""
    import json

    from wavefront.report.analysis import Study
    from wavefront.results.records import EXPOSURE_RECORDS
    picks = _advisor_picks()
    assert not any(s.get("batch") == 1 and s.get("heads") == 32 and s["seqlen"] in (2048, 8192)
                   for s in picks.SHAPES.values())  # step_time's shapes
    gpu = "NVIDIA H100 80GB HBM3"
    rows = [{"kind": "prediction", "shape": "S", "config": c, "predicted_ms": p}
            for c, p in (("a", 1.0), ("b", 2.0), ("c", 3.0))]
    rows += [{"kind": "budget_prediction", "shape": "S", "budget": b, "predicted_ms": p,
              "group_units": u}
             for b, p, u in (("1 unit(s)", 2.0, 1), ("2 unit(s)", 1.0, 2), ("x (32 MB)", 3.0, 2))]
    timed = {"a": 1.1, "b": 1.0, "c": 1.5, "budget 1 unit(s)": 2.0, "budget 2 unit(s)": 1.0,
             "budget x (32 MB)": 1.2}
    rows += [{"kind": "round", "shape": "S", "config": c, "round": r, "ms": ms * (1 + r / 100)}
             for c, ms in timed.items() for r in range(3)]
    (tmp_path / "advisor_picks").mkdir()
    (tmp_path / "advisor_picks" / "rounds.jsonl").write_text(
        "".join(json.dumps(EXPOSURE_RECORDS.stamp({"gpu": gpu, **r})) + "\n" for r in rows))
    t = picks.table(Study(tmp_path)).iloc[0]
    assert t["advised"] == "a" and t["measured best"] == "b" and t["configurations"] == 3
    assert t["advised / best"] == pytest.approx(1.1)
    assert t["advised budget"] == "2 unit(s)" and t["advised budget / best group"] == 1.0
    assert t["x (32 MB) / best group"] == pytest.approx(1.2) and t["x (32 MB) units"] == 2
    assert t["rounds"] == t["budget rounds"] == 3 and t["budgets timed"] == "3 of 3"
    assert t["lo"] == t["hi"] == pytest.approx(1.1)  # the same 1% a round on both
    assert t["group lo"] == t["group hi"] == 1.0  # the advised group is the best


def test_advisor_picks_measures_the_shapes_asked_for(monkeypatch):
    """WAVEFRONT_ADVISOR_SHAPES: all shapes by default, the first N, or a list of indices
    (lanes of several GPUs share the shapes); anything else is refused, naming the variable."""
    picks = _advisor_picks()
    names = list(picks.SHAPES)
    monkeypatch.delenv("WAVEFRONT_ADVISOR_SHAPES", raising=False)
    assert picks._shapes_asked() == names
    monkeypatch.setenv("WAVEFRONT_ADVISOR_SHAPES", "2")
    assert picks._shapes_asked() == names[:2]
    monkeypatch.setenv("WAVEFRONT_ADVISOR_SHAPES", "4,2,4")
    assert picks._shapes_asked() == [names[3], names[1]]
    for bad in ("0", "5", "2-3", "x", "1,"):
        monkeypatch.setenv("WAVEFRONT_ADVISOR_SHAPES", bad)
        with pytest.raises(SystemExit, match="WAVEFRONT_ADVISOR_SHAPES"):
            picks._shapes_asked()
