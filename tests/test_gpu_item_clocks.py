"""Per-item clocks on the GPU (`wavefront.measure.item_clocks`): the RECORD_ORDER binary's
tickets read the host's clock, copied into the ticket counter while the launch runs. Every
item ends after it starts, a static persistent CTA's next item starts after its previous one
ends, the clocks span no more than the launch's CUDA-event time, and the output is the plain
binary's bit for bit. Fresh random inputs, outputs poisoned with NaN first."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")


@pytest.mark.parametrize("counters", ["shared", "per_cta"])
@pytest.mark.parametrize("causal", [False, True])
def test_item_clocks_are_times_of_the_items(causal, counters):
    from wavefront.kernel.launcher import launcher_for
    from wavefront.measure.bench import random_inputs
    from wavefront.measure.item_clocks import ItemClock
    from wavefront.point import Point
    # items of up to 1024 K/V steps, long against the clock's few microseconds, on every SM
    # as the experiment's launches (a launch of 16 CTAs on fresh H200 hosts saw the clock's
    # copies stop landing after ~0.1 ms: refused by `record`, not yet understood)
    point = Point(batch=1, heads=4, seqlen=65536, head_dim=64, causal=causal, tiles="64x64",
                  occupancy=2, schedule="persistent+linear")
    q, k, v = random_inputs(point, 3)
    plain, _ = launcher_for(q, k, v, **point.attention_kwargs())
    clocked, _ = launcher_for(q, k, v, record_order=counters, **point.attention_kwargs())
    stream = cupy.cuda.Stream(non_blocking=True)
    outs = [cupy.full(q.shape, cupy.nan, dtype=q.dtype) for _ in range(2)]
    plain(q, k, v, outs[0], stream.ptr)
    clock = ItemClock()
    c = clock.record(clocked, q, k, v, outs[1], stream)
    assert bool(cupy.isfinite(outs[0].astype(cupy.float32)).all())
    assert bool(cupy.array_equal(outs[0], outs[1]))
    items = clocked.launch.num_items
    assert c.start_ns.shape == c.end_ns.shape == (items,)
    assert (c.end_ns > c.start_ns).all()
    assert c.copies > 1 and 0 < c.step_ns <= 50e3
    # the items span more than a count of their tickets, and no more than the launch (on the
    # H200 this small launch's events held about 3 ms more than its items; why is not known)
    span_ns = c.end_ns.max() - c.start_ns.min()
    assert 2 * items < span_ns <= c.launch_ms * 1e6 * 1.05 + 1e4
    ctas = clocked.launch.num_ctas
    assert c.first_wave_started(ctas)
    # CTA c runs items c, c + ctas, ...: each starts after the one before it ended (the
    # clock's copy can trail the tickets taken since by a few counts)
    for first in range(ctas):
        mine = np.arange(first, items, ctas)
        assert (c.start_ns[mine[1:]] >= c.end_ns[mine[:-1]] - 1000).all()
