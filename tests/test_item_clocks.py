"""Per-item clocks on the CPU: what `ItemClocks` derives from a launch's item times (first
wave, each CTA's ns per K/V step) and where `experiments/item_clocks.py` reads the CTAs' spread
along K/V, on timelines whose answers are known."""
from pathlib import Path

import numpy as np
import pytest

from wavefront.measure.item_clocks import ItemClocks
from wavefront.model.simulation import item_steps
from wavefront.point import GpuShape, Point
from wavefront.report.experiments import load_experiment


def _experiment():
    path = Path(__file__).resolve().parents[1] / "experiments" / "item_clocks.py"
    return load_experiment(path).module


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


def test_the_clocked_binary_differs_from_the_plain_one_only_by_its_tickets():
    """What Appendix G says of the two binaries at the S256k launch: the same K/V loop (its
    instruction mix and its rings), and the clocked one's only atomics are its two tickets per
    work item (start and end)."""
    from collections import Counter

    from wavefront.kernel.attention import KernelVariant, compile_variant
    from wavefront.kernel.sass import ADDRESSED, disassemble, find_cuobjdump, kv_loop_mix
    from wavefront.model.pipeline import kv_pipeline
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump/nvdisasm not installed")
    launch = _experiment().points()["S256k 128x64 non-causal"].launch(GpuShape(132, 50 << 20))
    sass = {clocked: disassemble(compile_variant(
        KernelVariant.for_launch(launch, "bfloat16", record_order=clocked), "sm_90"))
        for clocked in (False, True)}
    assert kv_pipeline(sass[True]).as_dict() == kv_pipeline(sass[False]).as_dict()
    assert kv_loop_mix(sass[True]) == kv_loop_mix(sass[False])
    # global and shared atomics and reductions (not REDUX, a warp-wide reduction)
    kinds = {"ATOM", "ATOMG", "ATOMS", "RED", "REDG"}
    atomics = {clocked: Counter(op for _, op, _ in ADDRESSED.findall(s)
                                if op.split(".")[0] in kinds)
               for clocked, s in sass.items()}
    assert sum(atomics[False].values()) == 0
    assert sum(atomics[True].values()) == 2, atomics[True]
