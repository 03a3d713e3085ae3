"""Correctness on the GPU: every registered schedule x causal x head dim x dtype on a ragged
GQA shape against a float32 reference, fresh random inputs, output poisoned with NaN before
each run. Seeds are fixed integers (no hash() of strings: it is salted per process)."""
import itertools

import pytest

from wavefront.point import Point as Config
from wavefront.results.measurement import CORRECTNESS_TOLERANCE as TOLERANCE
from wavefront.schedules import schedule_names

pytestmark = pytest.mark.gpu

SCHEDULES = schedule_names()
CASES = list(itertools.product(SCHEDULES, [False, True], [64, 128], ["bfloat16", "float16"]))


def relative_error(*args, **kwargs):
    from wavefront.measure.bench import relative_error as measure_error
    return measure_error(*args, **kwargs)


@pytest.mark.parametrize("schedule,causal,head_dim,dtype", CASES)
def test_matches_reference(schedule, causal, head_dim, dtype):
    # 333 is ragged for every tile shape; 7 CTAs force several work items per persistent CTA,
    # so sawtooth really scans both ways and grid waves alternate too.
    # Tiled: 2 K/V tiles per chunk, so several chunks (some empty past the causal diagonal)
    # are combined.
    cfg = Config(batch=2, heads=4, kv_heads=2, seqlen=333, head_dim=head_dim, dtype=dtype,
                 causal=causal, schedule=schedule, ctas=7,
                 chunk_tiles=2 if "tiled" in schedule else None)
    err = relative_error(cfg, seed=1000 + CASES.index((schedule, causal, head_dim, dtype)))
    assert err < TOLERANCE


@pytest.mark.parametrize("tiles", ["64x64", "128x64", "128x128"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "grouped+sawtooth",
                                      "persistent+tiled"])
def test_tile_shapes(tiles, causal, schedule):
    cfg = Config(batch=1, heads=3, kv_heads=1, seqlen=517, head_dim=128, causal=causal,
                 schedule=schedule, tiles=tiles, ctas=5,
                 chunk_tiles=3 if "tiled" in schedule else None)
    assert relative_error(cfg, seed=11) < TOLERANCE


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "persistent+tiled"])
def test_lse_matches_reference(causal, schedule):
    cfg = Config(batch=1, heads=2, seqlen=300, head_dim=64, causal=causal,
                 schedule=schedule, ctas=3,
                 chunk_tiles=2 if "tiled" in schedule else None)
    assert relative_error(cfg, seed=5, check_lse=True) < TOLERANCE


def test_tiled_with_default_chunks_at_length():
    # Chunk size from the real L2: several chunks at this length.
    cfg = Config(batch=1, heads=2, seqlen=200_000, head_dim=64, causal=True,
                 schedule="persistent+tiled")
    assert relative_error(cfg, seed=13) < TOLERANCE


def test_grouped_with_small_l2_budget_is_correct():
    # A tiny L2 forces one K/V head per group, so groups and their boundaries are exercised.
    import cupy
    from wavefront import attention, reference_attention
    from wavefront.measure.bench import random_inputs
    cfg = Config(batch=2, heads=6, kv_heads=3, seqlen=200, head_dim=64, causal=True,
                 schedule="grouped+sawtooth")
    q, k, v = random_inputs(cfg, 3)
    out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
    attention(q, k, v, causal=True, schedule="grouped+sawtooth", out=out, l2_bytes=4096, ctas=4)
    ref, _ = reference_attention(q, k, v, causal=True)
    err = float(cupy.linalg.norm(out.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
    assert err < TOLERANCE


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    from wavefront import attention
    q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
    out = attention(q, k, v, causal=True, schedule="persistent+sawtooth")
    assert isinstance(out, torch.Tensor) and out.device == q.device
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           is_causal=True)
    assert float((out.float() - ref).norm() / ref.norm()) < TOLERANCE


@pytest.mark.parametrize("causal", [False, True])
def test_the_table_built_on_the_gpu_is_the_host_table(causal):
    """The public call builds its work table on the GPU by one kernel printed from the
    schedule's formulas (`table_kernel.build_on_gpu`): row for row the host table, for every
    schedule, GQA and not, ragged, and a table longer than the grid (the kernel loops)."""
    import cupy
    import numpy as np

    from wavefront.kernel import table_kernel as tk
    from wavefront.kernel.table_kernel import build_on_gpu
    from wavefront.point import plan
    for schedule in SCHEDULES:
        for q, k in (((3, 8, 4133, 128), (3, 2, 4133, 128)), ((2, 6, 333, 64), (2, 6, 333, 64)),
                     ((8, 32, 163840, 64), (8, 8, 163840, 64))):
            launch = plan(q, k, sms=132, l2_bytes=50 << 20, causal=causal, schedule=schedule)
            with cupy.cuda.Stream(non_blocking=True) as stream:
                # Freed into the pool, whose block the table then reuses: a row (or counter)
                # the kernel misses shows as -7, not as zeros.
                cupy.full((launch.num_items + 1, 16), -7, dtype=cupy.int32)
                built = build_on_gpu(launch, 0).get()
                stream.synchronize()
            assert np.array_equal(built[:-1], launch.work_table), (schedule, q)
            assert built[-1, :2].tolist() == [0, 0]  # the dynamic schedules' counter
    # The last shape has more items than the kernel's grid has threads.
    assert launch.num_items > tk._blocks_for(0) * tk.THREADS_PER_BLOCK


def test_a_first_call_on_another_stream_waits_for_its_table():
    """The table is built on a stream of its own and the host does not wait: the first launch,
    here on a fresh non-blocking stream with a long kernel queued before the build on the
    default stream, must still read a finished table."""
    torch = pytest.importorskip("torch")
    from wavefront import attention
    from wavefront.kernel.call import clear_launcher_cache
    clear_launcher_cache()
    gen = torch.Generator(device="cuda").manual_seed(21)
    q, k, v = (torch.randn(2, 16, 8192, 64, device="cuda", dtype=torch.bfloat16,
                           generator=gen) for _ in range(3))
    side = torch.cuda.Stream()
    busy = torch.randn(8192, 8192, device="cuda")
    for _ in range(4):
        busy = busy @ busy / 100  # keeps the GPU busy while the table is built
    with torch.cuda.stream(side):
        out = attention(q, k, v, causal=True, schedule="grouped_dynamic+sawtooth")
    side.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           is_causal=True)
    assert float((out.float() - ref).norm() / ref.norm()) < TOLERANCE


def test_long_sequence_spot_check():
    cfg = Config(batch=1, heads=2, seqlen=20000, head_dim=128, causal=True,
                 schedule="persistent+sawtooth")
    assert relative_error(cfg, seed=9) < TOLERANCE


@pytest.mark.parametrize("schedule,causal", [("persistent+sawtooth", True),
                                             ("grid+linear", False), ("persistent+tiled", True),
                                             ("grouped+sawtooth", False),
                                             ("dynamic+linear", True)])
def test_recorded_order_is_one_ticket_per_event_and_changes_nothing(schedule, causal):
    """RECORD_ORDER: each work item's start and end take distinct tickets 0..2N-1 (checked by
    relative_error), the output is correct, and the tickets of back-to-back launches need no
    reset. A persistent CTA's items run one after another, so their tickets interleave."""
    import cupy
    import numpy as np

    from wavefront.kernel.launcher import launcher_for
    from wavefront.kernel.streams import current_stream
    from wavefront.measure.bench import check_tickets, random_inputs
    cfg = Config(batch=2, heads=4, kv_heads=2, seqlen=1000, head_dim=64, causal=causal,
                 schedule=schedule, ctas=7)
    assert relative_error(cfg, seed=77, record_order=True) < TOLERANCE
    q, k, v = random_inputs(cfg, 78)
    launcher, _ = launcher_for(q, k, v, record_order=True, **cfg.attention_kwargs())
    out = cupy.empty_like(q)
    for _ in range(3):
        launcher(q, k, v, out, current_stream("cupy"))
        cupy.cuda.Device().synchronize()
        start, end = launcher.tickets()
        check_tickets(start, end)
    if launcher.launch.cta.persistent and not launcher.launch.cta.dynamic:
        n = launcher.launch.num_ctas
        for cta in range(n):
            s, e = start[cta::n], end[cta::n]
            assert (e[:-1] < s[1:]).all()  # a CTA ends one item before it starts the next
    plain, _ = launcher_for(q, k, v, **cfg.attention_kwargs())
    ref = cupy.empty_like(q)
    plain(q, k, v, ref, current_stream("cupy"))
    cupy.cuda.Device().synchronize()
    assert np.array_equal(cupy.asnumpy(out.view(cupy.uint16)), cupy.asnumpy(ref.view(cupy.uint16)))


@pytest.mark.parametrize("schedule", ["persistent+linear", "dynamic+linear"])
def test_per_cta_ticket_counters_count_each_ctas_own_items(schedule):
    """record_order="per_cta": each CTA takes its tickets from a word of its own, so a CTA's
    items hold consecutive tickets (start, end, start, ...) launch after launch, every item's
    two tickets are its CTA's, and the output is the plain binary's bit for bit."""
    import cupy
    import numpy as np

    from wavefront.kernel.launcher import launcher_for
    from wavefront.kernel.streams import current_stream
    from wavefront.measure.bench import random_inputs
    cfg = Config(batch=2, heads=4, seqlen=1000, head_dim=64, schedule=schedule, ctas=7)
    q, k, v = random_inputs(cfg, 79)
    launcher, _ = launcher_for(q, k, v, record_order="per_cta", **cfg.attention_kwargs())
    assert launcher.order_counters == "per_cta" and launcher.counter_words().size == 7
    out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
    launches = 3
    for _ in range(launches):
        launcher(q, k, v, out, current_stream("cupy"))
    cupy.cuda.Device().synchronize()
    start, end = launcher.tickets()
    assert (start < end).all() and (end - start == 1).all()  # nothing else ticks a CTA's word
    counts = cupy.asnumpy(launcher.counter_words())
    assert counts.sum() == 2 * launcher.launch.num_items * launches
    if not launcher.launch.cta.dynamic:
        n = launcher.launch.num_ctas
        for cta in range(n):
            ticks = np.ravel(np.column_stack([start[cta::n], end[cta::n]]))
            assert (np.diff(ticks) == 1).all()
            assert counts[cta] == 2 * len(start[cta::n]) * launches
    plain, _ = launcher_for(q, k, v, **cfg.attention_kwargs())
    ref = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
    plain(q, k, v, ref, current_stream("cupy"))
    cupy.cuda.Device().synchronize()
    assert np.array_equal(cupy.asnumpy(out.view(cupy.uint16)), cupy.asnumpy(ref.view(cupy.uint16)))
    with pytest.raises(ValueError, match="record_order must be"):
        launcher_for(q, k, v, record_order="per_sm", **cfg.attention_kwargs())


@pytest.mark.parametrize("schedule,levers", [
    ("dynamic+sawtooth", {}), ("grouped_dynamic+linear", {}),
    ("grouped_dynamic+linear", dict(tiles="128x128", occupancy=2, cluster=2, kv_latency=8)),
    ("dynamic+sawtooth", dict(tiles="128x64", occupancy=2, cluster=2))])
@pytest.mark.parametrize("causal", [False, True])
def test_dynamic_schedules_stay_correct_launch_after_launch(schedule, levers, causal):
    """The kernel's last CTA resets the dynamic counter, so launches need no host state. Ten
    launches in a row (output poisoned each time): every output element right each time, and
    the counter back at [0, 0] after each (else the next launch would skip items)."""
    import cupy

    from wavefront.kernel.launcher import launcher_for
    from wavefront.kernel.streams import current_stream
    from wavefront.measure.bench import random_inputs
    from wavefront.measure.reference import reference_attention
    cfg = Config(batch=2, heads=4, kv_heads=2, seqlen=700, head_dim=64, causal=causal,
                 schedule=schedule, ctas=9, **levers)
    q, k, v = random_inputs(cfg, 41)
    ref, _ = reference_attention(q, k, v, causal=causal)
    launcher, _ = launcher_for(q, k, v, **cfg.attention_kwargs())
    out = cupy.empty_like(q)
    for n in range(10):
        out.fill(cupy.nan)
        launcher(q, k, v, out, current_stream("cupy"))
        cupy.cuda.Device().synchronize()
        assert bool(cupy.isfinite(out).all()), n
        err = float(cupy.linalg.norm(out.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
        assert err < TOLERANCE, n
        assert cupy.asnumpy(launcher.next_item).tolist() == [0, 0], n


@pytest.mark.parametrize("levers", [dict(tiles="128x128", occupancy=1, worker_warps=8),
                                    dict(tiles="128x64", occupancy=2, kv_latency=8),
                                    dict(tiles="128x64", occupancy=2, cluster=2),
                                    dict(tiles="64x64", occupancy=2, worker_warps=8),
                                    dict(tiles="128x128", occupancy=2, worker_warps=8,
                                         rescale_threshold=8),
                                    dict(tiles="128x64", occupancy=2, exp2_poly=1),
                                    dict(tiles="128x128", occupancy=2, exp2_poly=4,
                                         rescale_threshold=8),
                                    dict(tiles="128x128", occupancy=2, worker_warps=8,
                                         qk_ahead=1),
                                    dict(tiles="128x64", occupancy=2, qk_ahead=1,
                                         exp2_poly=1)])
@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "dynamic+sawtooth", "grid+linear"])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_levers_keep_the_result(levers, schedule, causal):
    """Every lever `wavefront tune` searches computes the same function (ragged GQA shape,
    several items per CTA, odd grids for the cluster lever)."""
    cfg = Config(batch=2, heads=4, kv_heads=2, seqlen=333, head_dim=128, causal=causal,
                 schedule=schedule, ctas=7, **levers)
    assert relative_error(cfg, seed=61) < TOLERANCE


def test_attention_defaults_to_the_tuned_table_for_this_gpu():
    """With no configuration named, `wavefront.attention` runs the tuned entry for this GPU
    (or the defaults where there is none) and stays correct."""
    import cupy
    from wavefront import attention, reference_attention
    from wavefront.device import current_device
    from wavefront.kernel.tuning import _one_wave_causal, resolve_config
    from wavefront.kernel.tuning import tuned_config
    from wavefront.point import KERNEL_LEVERS
    from wavefront.measure.bench import random_inputs
    for head_dim, causal in ((64, False), (128, True)):
        cfg = Config(batch=1, heads=2, seqlen=1000, head_dim=head_dim, causal=causal)
        q_shape = (cfg.batch, cfg.heads, cfg.seqlen, head_dim)
        tuned = tuned_config(current_device().name, q_shape, q_shape, causal)
        resolved = resolve_config(q_shape, q_shape, causal, None, None, None,
                                  dict.fromkeys(KERNEL_LEVERS))
        if tuned is not None:  # 16 items: a causal launch of one wave takes 64-row tiles
            dev = current_device()
            tuned = _one_wave_causal(tuned, q_shape, q_shape, causal, sms=dev.sms,
                                     l2_bytes=dev.l2_bytes)
        assert resolved == (tuned or resolved) and resolved["schedule"]
        q, k, v = random_inputs(cfg, 17)
        out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
        attention(q, k, v, causal=causal, out=out)
        ref, _ = reference_attention(q, k, v, causal=causal)
        err = float(cupy.linalg.norm(out.astype(cupy.float32) - ref) / cupy.linalg.norm(ref))
        assert err < TOLERANCE


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_bfloat16_partials_stay_within_their_error_bound(causal, dtype):
    """tiled_fit_bf16 rounds each chunk's output to bfloat16 (u = 2^-8). Its documented bound:
    at most u x (softmax-weighted mean of |v|) more per element than the kernel's other
    roundings (bf16 P before the PV product, the output's own rounding), each of that size.
    Checked element by element against float64, with many chunks (2 K/V tiles each), and the
    float32-partial schedule on the same inputs as the yardstick."""
    import cupy
    from wavefront import attention, reference_attention
    from wavefront.measure.bench import random_inputs
    cfg = Config(batch=1, heads=4, kv_heads=2, seqlen=1100, head_dim=128, dtype=dtype,
                 causal=causal)
    q, k, v = random_inputs(cfg, 71)
    ref, _ = reference_attention(q, k, v, causal=causal, dtype="float64")
    weighted_abs_v, _ = reference_attention(q, k, cupy.abs(v.astype(cupy.float64)),
                                            causal=causal, dtype="float64")
    u = 2.0 ** -8
    worst = {}
    for schedule in ("persistent+tiled_fit", "persistent+tiled_fit_bf16"):
        out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
        attention(q, k, v, causal=causal, schedule=schedule, chunk_tiles=2, out=out)
        err = cupy.abs(out.astype(cupy.float64) - ref)
        worst[schedule] = float((err / (u * (cupy.abs(ref) + weighted_abs_v))).max())
    # fp32 partials: the kernel's own roundings; bf16 partials add at most one more u term
    assert worst["persistent+tiled_fit"] <= 2.0, worst
    assert worst["persistent+tiled_fit_bf16"] <= worst["persistent+tiled_fit"] + 1.0, worst


def test_tune_warms_candidates_in_checked_processes():
    """`wavefront tune`'s warming step: each candidate compiled, launched and checked against
    float32 in a process of its own pool, a verdict per candidate (None: ready to time)."""
    from wavefront.measure.tune import warm
    points = [Config(batch=1, heads=4, kv_heads=2, seqlen=300, head_dim=128, causal=causal,
                     tiles="128x128", occupancy=1, worker_warps=8, qk_ahead=ahead)
              for causal in (False, True) for ahead in (0, 1)]
    assert warm(points, jobs=2) == dict.fromkeys(points)


@pytest.fixture
def prepare_after_one_launch(monkeypatch):
    """Launchers made meanwhile prepare after their first launch (the library waits for
    PREPARE_AFTER_LAUNCHES, to pay preparing's 0.4 ms only for launchers used a while)."""
    from wavefront.kernel import launcher as L
    monkeypatch.setattr(L, "PREPARE_AFTER_LAUNCHES", 1)


@pytest.mark.usefixtures("prepare_after_one_launch")
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("causal", [False, True])
def test_the_prepared_launch_is_the_jit_launch_bit_for_bit(schedule, causal):
    """A launcher's first launch goes through ct.launch and prepares; the second through the
    prepared launch (the exported binary, the packed arguments). Both outputs, and the LSE,
    poisoned with NaN first, must be equal bit for bit: the same binary on the same inputs."""
    import cupy

    from wavefront.kernel.launcher import launcher_for
    from wavefront.kernel.streams import current_stream
    from wavefront.measure.bench import random_inputs
    cfg = Config(batch=2, heads=4, kv_heads=2, seqlen=333, head_dim=64, causal=causal,
                 schedule=schedule, ctas=7, chunk_tiles=2 if "tiled" in schedule else None)
    q, k, v = random_inputs(cfg, 77 + SCHEDULES.index(schedule))
    launcher, _ = launcher_for(q, k, v, return_lse=True, **cfg.attention_kwargs())
    results = []
    for n in range(2):
        assert launcher.launches_prepared == (n == 1), launcher.prepare_failure
        out = cupy.full_like(q, cupy.nan)
        lse = cupy.full(q.shape[:3], cupy.nan, dtype=cupy.float32)
        launcher(q, k, v, out, current_stream("cupy"), lse)
        cupy.cuda.Device().synchronize()
        results.append((cupy.asnumpy(out).view("u2"), cupy.asnumpy(lse)))
    (out_jit, lse_jit), (out_prepared, lse_prepared) = results
    # the JIT's own binary, recorded as it compiled (or found) it, not a second export
    assert launcher._prepared.binary_from == "jit"
    assert (out_jit == out_prepared).all() and (lse_jit == lse_prepared).all()
    assert not cupy.isnan(lse).any()


def test_a_binary_compiled_with_free_shapes_is_another_binary_with_the_same_output():
    """`prepared_for(free_shapes=True)`: at one head the JIT bakes the batch and head counts
    of 1 into its signature; the shape-free binary is exported (not the JIT's), launches from
    the same argument buffer, and is correct against the float32 reference; the launcher's
    own launches are unchanged."""
    import cupy

    from wavefront.kernel.launcher import launcher_for
    from wavefront.measure.bench import output_error, random_inputs
    cfg = Config(batch=1, heads=1, seqlen=4096, head_dim=128, tiles="128x64", occupancy=2,
                 schedule="persistent+linear")
    q, k, v = random_inputs(cfg, 91)
    launcher, _ = launcher_for(q, k, v, **cfg.attention_kwargs())
    stream = cupy.cuda.Stream(non_blocking=True)
    outs = {}
    for free in (False, True):
        out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
        prepared = launcher.prepared_for(q, k, v, out, free_shapes=free)
        assert prepared.launch(stream.ptr, launcher.addresses(q, k, v, out))
        stream.synchronize()
        assert output_error(cfg, q, k, v, out, 128) < TOLERANCE
        outs[free] = (prepared, out)
    assert outs[True][0].binary_from == "export"
    assert outs[True][0].cubin != outs[False][0].cubin
    assert outs[True][0].signature != outs[False][0].signature
    assert launcher._prepared is None  # its own launches: ct.launch until it prepares


@pytest.mark.usefixtures("prepare_after_one_launch")
def test_the_public_call_falls_back_where_the_prepared_launch_does_not_fit():
    """The prepared binary assumes 16-byte aligned arrays and an output that overlaps no
    input: a q one element into its buffer, and an `out` that is q itself, must take
    ct.launch and still be right."""
    torch = pytest.importorskip("torch")
    from wavefront import attention
    from wavefront.kernel import call as C
    torch.manual_seed(5)
    shape = (1, 2, 256, 64)
    base = torch.randn(1 + 2 * 256 * 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    aligned = base[:-1].view(shape)
    C.clear_launcher_cache()
    attention(aligned, k, v)
    attention(aligned, k, v)
    (launcher,) = (plan.launcher for plan in C._plans.values())
    assert launcher.launches_prepared, launcher.prepare_failure

    def ref(q):
        return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    misaligned = base[1:].view(shape)
    assert misaligned.data_ptr() % 16
    expected = ref(misaligned)
    out = attention(misaligned, k, v)
    assert float((out.float() - expected).norm() / expected.norm()) < TOLERANCE
    q = misaligned.clone()
    expected = ref(q)
    attention(q, k, v, out=q)  # in place: rows are read before they are written
    assert float((q.float() - expected).norm() / expected.norm()) < TOLERANCE


@pytest.mark.usefixtures("prepare_after_one_launch")
@pytest.mark.parametrize("made_from", ["torch", "cupy"])
def test_a_prepared_launcher_takes_the_other_librarys_arrays(made_from):
    """A bound launcher made from torch tensors, once prepared, called with CuPy arrays (and
    the other way round): it read their addresses the way of its own library and raised
    AttributeError. It must launch (through ct.launch) and write what the first library's
    call writes, bit for bit."""
    torch = pytest.importorskip("torch")
    import cupy

    from wavefront.kernel.launcher import launcher_for
    torch.manual_seed(9)
    as_torch = [torch.randn(1, 2, 300, 64, device="cuda", dtype=torch.bfloat16)
                for _ in range(3)]
    as_cupy = [cupy.from_dlpack(x) for x in as_torch]
    made, other = (as_torch, as_cupy) if made_from == "torch" else (as_cupy, as_torch)
    launcher, _ = launcher_for(*made)
    outs = []
    for arrays in (made, made, other):  # the second launch is prepared
        out = (torch.full_like(as_torch[0], float("nan")) if arrays is as_torch
               else cupy.full(as_cupy[0].shape, cupy.nan, dtype=as_cupy[0].dtype))
        launcher(*arrays, out, 0)
        outs.append(out)
    assert launcher.launches_prepared, launcher.prepare_failure
    torch.cuda.synchronize()
    bits = [torch.from_dlpack(o).view(torch.int16).cpu() for o in outs]
    assert torch.equal(bits[0], bits[1]) and torch.equal(bits[1], bits[2])
    assert not torch.from_dlpack(outs[2]).isnan().any()


@pytest.mark.usefixtures("prepare_after_one_launch")
@pytest.mark.parametrize("call", ["q of other strides", "out in place of q"])
def test_a_direct_call_unlike_the_prepared_one_takes_ct_launch(call):
    """A prepared launch fixes the strides it packed and an out apart from the inputs. A
    bound launcher called directly with a q of other strides (same shape), or with out=q,
    must see that and launch with ct.launch: the result must be the attention of the arrays
    given, against float32 SDPA."""
    torch = pytest.importorskip("torch")
    from wavefront.kernel.launcher import launcher_for
    torch.manual_seed(11)
    q, k, v = (torch.randn(1, 2, 300, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    launcher, _ = launcher_for(q, k, v)
    for _ in range(2):
        launcher(q, k, v, torch.empty_like(q), 0)
    assert launcher.launches_prepared, launcher.prepare_failure
    if call == "q of other strides":
        other = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, S, H, D) memory
        assert other.shape == q.shape and other.stride() != q.stride()
        out = torch.full_like(q, float("nan"))
    else:
        other = q.clone()
        out = other
    expected = torch.nn.functional.scaled_dot_product_attention(
        other.float(), k.float(), v.float())
    launcher(other, k, v, out, 0)
    torch.cuda.synchronize()
    assert float((out.float() - expected).norm() / expected.norm()) < TOLERANCE
    # and a call like the prepared one still goes through it
    arrays = (q, k, v, torch.empty_like(q), launcher._lse_argument)
    assert launcher._fits_prepared(arrays, launcher._addresses(*arrays))


def test_a_launcher_prepares_only_once_used_a_while():
    """By default a launcher keeps ct.launch for its first PREPARE_AFTER_LAUNCHES launches (a
    packed batch's launcher for one step's lengths never pays the 0.4 ms of preparing), then
    prepares."""
    import cupy

    from wavefront.kernel import launcher as L
    from wavefront.kernel.launcher import launcher_for
    from wavefront.kernel.streams import current_stream
    from wavefront.measure.bench import random_inputs
    cfg = Config(batch=1, heads=2, seqlen=256, head_dim=64, schedule="persistent+linear")
    q, k, v = random_inputs(cfg, 3)
    launcher, _ = launcher_for(q, k, v, **cfg.attention_kwargs())
    out = cupy.empty_like(q)
    for n in range(L.PREPARE_AFTER_LAUNCHES):
        assert not launcher.launches_prepared, n
        launcher(q, k, v, out, current_stream("cupy"))
    assert launcher.launches_prepared, launcher.prepare_failure
