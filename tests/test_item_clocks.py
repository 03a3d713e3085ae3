"""Per-item clocks on the CPU: what `ItemClocks` derives from a launch's item times (first
wave, each CTA's ns per K/V step) and where `experiments/item_clocks.py` reads the CTAs' spread
along K/V, on timelines whose answers are known."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from wavefront.measure.item_clocks import ItemClocks
from wavefront.model.simulation import item_steps
from wavefront.point import GpuShape, Point


def _experiment():
    path = Path(__file__).resolve().parents[1] / "experiments" / "item_clocks.py"
    spec = importlib.util.spec_from_file_location("item_clocks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAUNCH = Point(batch=1, heads=1, seqlen=8192, head_dim=64, tiles="64x64", occupancy=1,
               ctas=8, schedule="persistent+linear").launch(GpuShape(132, 50 << 20))


def _lockstep(ns_per_step: np.ndarray):
    """Static persistent items back to back per CTA, CTA c at ns_per_step[c] a step."""
    steps = item_steps(LAUNCH)
    slots = np.arange(LAUNCH.num_items) % LAUNCH.num_ctas
    start, end = np.zeros(LAUNCH.num_items), np.zeros(LAUNCH.num_items)
    free = np.zeros(LAUNCH.num_ctas)
    for i, s in enumerate(slots):
        start[i] = free[s]
        free[s] = end[i] = start[i] + steps[i] * ns_per_step[s]
    return ItemClocks(start.astype(np.int64), end.astype(np.int64), 10, 1000.0, 1.0), slots, steps


def test_a_cta_twice_as_slow_shows_in_its_ns_per_step_and_speed():
    rates = np.full(LAUNCH.num_ctas, 100.0)
    rates[3] = 200.0
    clocks, slots, steps = _lockstep(rates)
    assert clocks.first_wave() == LAUNCH.num_ctas and clocks.first_wave_started(LAUNCH.num_ctas)
    assert np.allclose(clocks.ns_per_step(slots, steps), rates, rtol=1e-6)
    speeds = _experiment().cta_speeds(clocks, slots, steps)
    assert speeds[3] == pytest.approx(0.5) and np.allclose(np.delete(speeds, 3), 1.0)


def test_ctas_in_lock_step_have_no_spread_and_drifting_ones_do():
    ic = _experiment()
    steps = item_steps(LAUNCH)
    together, _, _ = _lockstep(np.full(LAUNCH.num_ctas, 100.0))
    assert ic.spread_mb(LAUNCH, steps, together.start_ns, together.end_ns, 0.5) == 0.0
    apart, _, _ = _lockstep(np.linspace(90.0, 110.0, LAUNCH.num_ctas))
    assert ic.spread_mb(LAUNCH, steps, apart.start_ns, apart.end_ns, 0.5) > 0.5
