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
