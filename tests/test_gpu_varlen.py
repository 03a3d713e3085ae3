"""Packed variable-length batches on the GPU: every CTA schedule with both scans, causal and
not, GQA, ragged lengths from 1 to 32k with an empty sequence among them, against a float32
reference per sequence; outputs poisoned with NaN first; the LSE; the torch op."""
import itertools

import numpy as np
import pytest

from wavefront.results.measurement import CORRECTNESS_TOLERANCE as TOLERANCE
from wavefront.schedules import CTA_SCHEDULES

pytestmark = pytest.mark.gpu

LENGTHS = (1, 333, 0, 64, 1000, 129, 4096, 17)
LONG = (32768, 5, 2000)


def _packed(lengths, heads, kv_heads, head_dim, seed, dtype="bfloat16"):
    import cupy
    import ml_dtypes
    rng = cupy.random.default_rng(seed)
    total = sum(lengths)
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else cupy.float16
    q = rng.standard_normal((total, heads, head_dim), dtype=cupy.float32).astype(dt)
    k = rng.standard_normal((total, kv_heads, head_dim), dtype=cupy.float32).astype(dt)
    v = rng.standard_normal((total, kv_heads, head_dim), dtype=cupy.float32).astype(dt)
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return q, k, v, bounds


def _check(q, k, v, bounds, out, causal, lse=None, rows_per_seq=512):
    """Each sequence against the float32 reference (a spread of rows of long ones)."""
    import cupy

    from wavefront.measure.bench import check_rows
    from wavefront.measure.reference import reference_attention
    assert bool(cupy.isfinite(out).all()), "rows left unwritten"
    worst = 0.0
    for a, b in zip(bounds, bounds[1:]):
        if a == b:
            continue
        seq = [x[a:b].transpose(1, 0, 2)[None] for x in (q, k, v)]
        rows = check_rows(b - a, 128, rows_per_seq)
        ref, ref_lse = reference_attention(*seq, causal=causal, rows=rows)
        got = out[a:b].transpose(1, 0, 2)[None].astype(cupy.float32)
        got = got if rows is None else got[:, :, rows]
        worst = max(worst, float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)))
        if lse is not None:
            mine = lse[:, a:b][None] if rows is None else lse[:, a:b][None][:, :, rows]
            worst = max(worst, float(cupy.linalg.norm(mine - ref_lse)
                                     / cupy.linalg.norm(ref_lse)))
    return worst


SCHEDULES = [f"{c}+{k}" for c, k in itertools.product(CTA_SCHEDULES, ("linear", "sawtooth"))]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("causal", [False, True])
def test_every_schedule_across_a_ragged_batch(schedule, causal):
    import cupy

    from wavefront import attention_varlen
    q, k, v, bounds = _packed(LENGTHS, 4, 2, 64, seed=5)
    out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
    attention_varlen(q, k, v, bounds, bounds, max(LENGTHS), max(LENGTHS), causal=causal,
                     schedule=schedule, ctas=7, out=out)
    assert _check(q, k, v, bounds, out, causal) < TOLERANCE


@pytest.mark.parametrize("head_dim,tiles", [(64, "64x64"), (128, "128x64"), (128, "128x128")])
@pytest.mark.parametrize("causal", [False, True])
def test_long_and_short_sequences_with_the_lse(head_dim, tiles, causal):
    import cupy

    from wavefront import attention_varlen
    q, k, v, bounds = _packed(LONG, 2, 1, head_dim, seed=9, dtype="float16")
    out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
    _, lse = attention_varlen(q, k, v, bounds, bounds, causal=causal, tiles=tiles,
                              return_lse=True, out=out)
    assert lse.shape == (2, sum(LONG))
    assert _check(q, k, v, bounds, out, causal, lse=lse) < TOLERANCE


def test_bad_cu_seqlens_are_named():
    from wavefront import attention_varlen
    q, k, v, bounds = _packed((10, 20), 2, 2, 64, seed=1)
    with pytest.raises(ValueError, match="^cu_seqlens_q must end at the packed rows"):
        attention_varlen(q, k, v, [0, 10, 25], bounds)
    with pytest.raises(ValueError, match="^cu_seqlens_k must not decrease"):
        attention_varlen(q, k, v, bounds, [0, 20, 10, 30])
    with pytest.raises(ValueError, match="^cu_seqlens_q must start at 0"):
        attention_varlen(q, k, v, [5, 30], bounds)
    with pytest.raises(ValueError, match="no keys"):
        attention_varlen(q, k, v, bounds, [0, 0, 30])
    with pytest.raises(ValueError, match="^max_seqlen_q must be at least"):
        attention_varlen(q, k, v, bounds, bounds, 8, 20)
    with pytest.raises(ValueError, match="^q must be 3-D"):
        attention_varlen(q[None], k, v, bounds, bounds)
    with pytest.raises(ValueError, match="tiled"):
        attention_varlen(q, k, v, bounds, bounds, schedule="persistent+tiled")


def test_the_torch_op_with_host_cu_seqlens():
    torch = pytest.importorskip("torch")
    import cupy

    import wavefront.torch  # noqa: F401
    q, k, v, bounds = _packed(LENGTHS, 4, 4, 128, seed=3)
    tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))
    cu = torch.tensor(bounds, dtype=torch.int32)
    out = torch.ops.wavefront.attention_varlen(tq, tk, tv, cu, cu, max(LENGTHS), max(LENGTHS),
                                               True, None, None, None)
    assert _check(q, k, v, bounds, cupy.from_dlpack(out), True) < TOLERANCE


@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "dynamic+linear",
                                      "grouped_dynamic+sawtooth"])
def test_new_lengths_reuse_the_problems_launcher(schedule):
    """New lengths for a packed problem already called (same arrays, options and number of
    sequences) copy its launcher with a work table of their own: the binary and the bound
    arguments are shared, the table, item count and grid are not, and every result is right,
    the first lengths' again after the second's."""
    import cupy

    from wavefront import attention_varlen
    from wavefront.kernel import call as kernel_call
    kernel_call.clear_launcher_cache()
    q, k, v, first = _packed(LENGTHS, 4, 2, 64, seed=21)
    second = [0, 5, 900, 901, 1500, 3000, 3001, 5600, q.shape[0]]  # as many sequences
    for bounds in (first, second, first):
        out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
        attention_varlen(q, k, v, bounds, bounds, causal=True, schedule=schedule, out=out)
        assert _check(q, k, v, bounds, out, True) < TOLERANCE, bounds
    (made,) = kernel_call._varlen_templates.values()  # the first lengths' launcher
    cached = list(kernel_call._varlen_launchers.values())
    (copied,) = [launcher for launcher in cached if launcher is not made]
    assert len(cached) == 2 and made in cached
    assert copied.kernel is made.kernel and copied.variant == made.variant
    assert copied.launch.num_items != made.launch.num_items
    assert copied._table.data.ptr != made._table.data.ptr


@pytest.mark.parametrize("library", ["cupy", "torch"])
def test_new_lengths_do_not_wait_for_the_gpu(library):
    """Each new set of lengths builds its table on the host and copies it to the GPU. The copy
    is from pinned memory on the tables' own stream, so in a loop of new lengths a call issued
    while the GPU is busy returns at once (a copy from pageable memory waits for the queued
    work first), and the launch still reads the finished table. A few calls with other lengths
    first, as a loop makes them: the first ones may grow CuPy's memory pools, and a new pinned
    or device allocation may wait for the GPU."""
    import time

    import cupy
    if library == "torch":
        torch = pytest.importorskip("torch")
    from wavefront import attention_varlen
    q, k, v, bounds = _packed(LENGTHS, 4, 2, 64, seed=13)
    args = (q, k, v)
    if library == "torch":
        args = tuple(torch.from_dlpack(x) for x in args)
    rng = np.random.default_rng(7)

    def new_bounds():
        cuts = np.sort(rng.choice(np.arange(1, q.shape[0]), size=len(LENGTHS) - 1,
                                  replace=False))
        return [0, *cuts.tolist(), q.shape[0]]  # same rows, new lengths: a new table
    for _ in range(4):
        attention_varlen(*args, new_bounds(), new_bounds(), causal=True)
        cupy.cuda.Device().synchronize()
    fresh = new_bounds()
    out = (torch.full_like(args[0], float("nan")) if library == "torch"
           else cupy.full(q.shape, cupy.nan, dtype=q.dtype))
    cupy.cuda.Device().synchronize()
    if library == "torch":
        torch.cuda._sleep(400_000_000)  # about 0.2 s of GPU cycles on the caller's stream
    else:
        _gpu_sleep(0.2)
    began = time.perf_counter()
    attention_varlen(*args, fresh, fresh, causal=True, out=out)
    host_s = time.perf_counter() - began
    cupy.cuda.Device().synchronize()
    assert host_s < 0.05, f"the call waited for the GPU: {host_s * 1e3:.1f} ms"
    got = cupy.from_dlpack(out) if library == "torch" else out
    assert _check(q, k, v, fresh, got, True) < TOLERANCE


def _gpu_sleep(seconds: float):
    """Queue a kernel that spins for about `seconds` on CuPy's current stream."""
    import cupy
    spin = cupy.RawKernel(r'''
    extern "C" __global__ void spin(long long cycles) {
        long long start = clock64();
        while (clock64() - start < cycles) {}
    }''', "spin")
    rate_khz = cupy.cuda.Device().attributes["ClockRate"]
    spin((1,), (1,), (cupy.int64(seconds * rate_khz * 1e3),))


# --- cu_seqlens on the GPU: the table written there from them, nothing read back ------------

GPU_LENGTHS_SCHEDULES = SCHEDULES


def _on_torch(*arrays):
    torch = pytest.importorskip("torch")
    return tuple(torch.from_dlpack(x) for x in arrays)


def _cu(bounds):
    import torch
    return torch.tensor(bounds, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("schedule", GPU_LENGTHS_SCHEDULES + [None])
@pytest.mark.parametrize("causal", [False, True])
def test_lengths_on_the_gpu_every_order(schedule, causal):
    """cu_seqlens as CUDA tensors: every order that needs only the lengths (and the tuned
    default, None), GQA, an empty sequence and a one-row one among them, the LSE too."""
    import cupy
    import torch

    from wavefront import attention_varlen
    q, k, v, bounds = _packed(LENGTHS, 4, 2, 64, seed=31)
    tq, tk, tv = _on_torch(q, k, v)
    out = torch.full_like(tq, float("nan"))
    _, lse = attention_varlen(tq, tk, tv, _cu(bounds), _cu(bounds), causal=causal,
                              schedule=schedule, ctas=7 if schedule else None, out=out,
                              return_lse=True)
    assert _check(q, k, v, bounds, cupy.from_dlpack(out), causal,
                  lse=cupy.from_dlpack(lse)) < TOLERANCE


def test_lengths_on_the_gpu_change_without_a_new_launcher(monkeypatch):
    """New lengths on the GPU (same number of sequences, other lengths, another total of
    packed rows in the same bucket) are read there by the same launcher: results right for
    each, the first lengths' again after the others'; bad cu_seqlens are named."""
    import cupy
    import torch

    from wavefront import attention_varlen
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import launcher as kernel_launcher
    monkeypatch.setattr(kernel_launcher, "PREPARE_AFTER_LAUNCHES", 1)
    kernel_call.clear_launcher_cache()
    q, k, v, first = _packed(LENGTHS, 4, 2, 128, seed=37)
    tq, tk, tv = _on_torch(q, k, v)
    second = [0, 5, 900, 901, 1500, 3000, 3001, 5600, q.shape[0]]
    fewer_rows = [0, 5, 900, 901, 1500, 3000, 3001, 4500, 5000]  # another total, one bucket
    for bounds in (first, second, fewer_rows, first):
        rows = bounds[-1]
        out = torch.full_like(tq[:rows], float("nan"))
        attention_varlen(tq[:rows], tk[:rows], tv[:rows], _cu(bounds), _cu(bounds),
                         causal=True, schedule="dynamic+sawtooth", out=out)
        assert _check(q[:rows], k[:rows], v[:rows], bounds, cupy.from_dlpack(out),
                      True) < TOLERANCE, bounds
    assert len(kernel_call._varlen_launchers) == 1
    (made,) = kernel_call._varlen_launchers.values()
    assert made.next_item.tolist() == [0, 0]
    # its arrays' row counts change call by call: never a prepared launch (addresses only)
    assert not made.launches_prepared
    with pytest.raises(ValueError, match="^cu_seqlens_k on the GPU must be a 1-D int32"):
        attention_varlen(tq, tk, tv, _cu(first), _cu(first).float())


def test_lengths_on_the_gpu_in_a_cuda_graph():
    """A call captured in a CUDA graph with its cu_seqlens on the GPU replays for whatever
    lengths those tensors hold at replay: new lengths copied into them, replayed, are right."""
    import cupy
    import torch

    from wavefront import attention_varlen
    q, k, v, first = _packed(LENGTHS, 4, 4, 64, seed=41)
    tq, tk, tv = _on_torch(q, k, v)
    cu_q, cu_k = _cu(first), _cu(first)
    out = torch.full_like(tq, float("nan"))
    for causal in (False, True):
        attention_varlen(tq, tk, tv, cu_q, cu_k, causal=causal, out=out)  # the launcher
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            attention_varlen(tq, tk, tv, cu_q, cu_k, causal=causal, out=out)
        for bounds in ([0, 5, 900, 901, 1500, 3000, 3001, 5600, q.shape[0]], first):
            cu_q.copy_(_cu(bounds))
            cu_k.copy_(_cu(bounds))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert _check(q, k, v, bounds, cupy.from_dlpack(out), causal) < TOLERANCE, bounds


def test_layers_that_share_cu_seqlens_write_the_table_once(monkeypatch):
    """A model's layers call with the same cu_seqlens tensors: the table is written for the
    first call only, and every call is right. Lengths changed in place (`copy_`), new
    tensors, and inference tensors (no version counter) are written anew; so is everything
    after a capture wrote the launcher's table (a replay changes the lengths unseen: an eager
    call after it with the first tensors must not take the replay's table for theirs), and
    everything with `REUSE_UNCHANGED_LENGTHS` off."""
    import cupy
    import torch

    from wavefront import attention_varlen
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import varlen as kernel_varlen
    kernel_call.clear_launcher_cache()
    staged = []
    stage = kernel_varlen._stage
    monkeypatch.setattr(kernel_varlen, "_stage", lambda *a: (staged.append(1), stage(*a)))
    q, k, v, first = _packed(LENGTHS, 4, 2, 64, seed=53)
    tq, tk, tv = _on_torch(q, k, v)
    other = [0, 5, 900, 901, 1500, 3000, 3001, 5600, q.shape[0]]

    def layer(cu, bounds):
        out = torch.full_like(tq, float("nan"))
        attention_varlen(tq, tk, tv, cu, cu, causal=True, out=out)
        torch.cuda.synchronize()
        assert _check(q, k, v, bounds, cupy.from_dlpack(out), True) < TOLERANCE, bounds

    cu = _cu(first)
    for _ in range(3):
        layer(cu, first)
    assert len(staged) == 1
    cu.copy_(_cu(other))
    layer(cu, other)
    layer(cu, other)
    assert len(staged) == 2
    layer(_cu(other), other)  # equal lengths in another tensor
    assert len(staged) == 3
    with torch.inference_mode():
        frozen = _cu(first)
    layer(frozen, first)
    layer(frozen, first)
    assert len(staged) == 5
    layer(cu, other)
    static = _cu(first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention_varlen(tq, tk, tv, static, static, causal=True)
    graph.replay()  # the launcher's table now holds `first`
    layer(cu, other)
    assert len(staged) == 7
    assert len(kernel_call._varlen_launchers) == 1
    kernel_call.clear_launcher_cache()
    monkeypatch.setattr(kernel_varlen, "REUSE_UNCHANGED_LENGTHS", False)
    for _ in range(3):
        layer(cu, other)
    assert len(staged) == 10


def test_lengths_on_the_gpu_do_not_wait_for_the_gpu():
    """With the GPU busy, a call with new lengths on the GPU returns at once (nothing is read
    back) and still reads the lengths the GPU holds when its turn comes."""
    import time

    import cupy
    import torch

    from wavefront import attention_varlen
    q, k, v, bounds = _packed(LENGTHS, 4, 2, 64, seed=43)
    tq, tk, tv = _on_torch(q, k, v)
    out = torch.full_like(tq, float("nan"))
    attention_varlen(tq, tk, tv, _cu(bounds), _cu(bounds), causal=True, out=out)
    fresh = [0, 17, 18, 600, 700, 701, 3000, 5000, q.shape[0]]
    cu = _cu(fresh)
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # about 0.2 s of GPU cycles on the caller's stream
    began = time.perf_counter()
    attention_varlen(tq, tk, tv, cu, cu, causal=True, out=out)
    host_s = time.perf_counter() - began
    torch.cuda.synchronize()
    assert host_s < 0.05, f"the call waited for the GPU: {host_s * 1e3:.1f} ms"
    assert _check(q, k, v, fresh, cupy.from_dlpack(out), True) < TOLERANCE


@pytest.mark.parametrize("cta_name", sorted(CTA_SCHEDULES))
def test_the_table_written_on_the_gpu_is_the_hosts(cta_name):
    """The table written on the GPU from CUDA cu_seqlens (torch's operations, the grouped
    orders' fill in a CUDA kernel of one thread) is, row for row, the table the host builds
    from the same lengths, then padding: ragged batches with empty sequences, GQA, L2 budgets
    that make groups of one unit and of many."""
    torch = pytest.importorskip("torch")
    import random

    import wavefront.kernel.torch_arrays  # noqa: F401
    from wavefront.schedules import (AttentionProblem, DeviceVarlenLaunch, VarlenLaunch,
                                     cta_schedule, fill_rows, kv_schedule)
    rng = random.Random(cta_name)
    for _ in range(12):
        n = rng.randint(1, 40)
        lengths = [rng.choice([0, 1, 200, 4096, rng.randint(1, 20000)]) for _ in range(n)]
        lengths[-1] = lengths[-1] or 7
        kv_heads = rng.choice([1, 4, 8])
        p = AttentionProblem(1, kv_heads * rng.choice([1, 4]), kv_heads, sum(lengths),
                             sum(lengths), 128, rng.random() < 0.5, 128, 64)
        placement = dict(cta=cta_schedule(cta_name),
                         kv=kv_schedule(rng.choice(["linear", "sawtooth"])), sms=132,
                         ctas_per_sm=1, l2_bytes=rng.choice([1 << 20, 50 << 20]))
        host = VarlenLaunch(p, tuple(lengths), tuple(lengths), **placement)
        device = DeviceVarlenLaunch(p, n, **placement)
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32,
                          device="cuda")
        columns, count = device.table_columns(cu, cu)
        table = np.empty((device.num_items, 16), dtype=np.int32)
        fill_rows(table, [c.cpu().numpy() if hasattr(c, "cpu") else c for c in columns])
        assert int(count) == host.num_items
        assert np.array_equal(table[:host.num_items], host.work_table), (lengths, p)


def test_lengths_on_the_gpu_through_the_compiled_op_and_on_a_side_stream():
    """The torch op with CUDA cu_seqlens under `torch.compile(fullgraph=True)` (a graph break
    would raise), and the call on a stream the caller names: its table is written on that
    stream, which the launch follows; both right."""
    import cupy
    import torch

    import wavefront.torch  # noqa: F401  (registers torch.ops.wavefront.attention_varlen)
    from wavefront import attention_varlen
    q, k, v, bounds = _packed(LENGTHS, 4, 2, 64, seed=47)
    tq, tk, tv = _on_torch(q, k, v)
    cu = _cu(bounds)

    def step(q, k, v, cu):
        return torch.ops.wavefront.attention_varlen(q * 1.0, k, v, cu, cu, max(LENGTHS),
                                                    max(LENGTHS), True, None, None, None)
    torch._dynamo.reset()
    out = torch.compile(step, fullgraph=True)(tq, tk, tv, cu)
    torch.cuda.synchronize()
    assert _check(q, k, v, bounds, cupy.from_dlpack(out), True) < TOLERANCE
    side = torch.cuda.Stream()
    attention_varlen(tq, tk, tv, cu, cu, causal=False, stream=side)  # launcher and writer made
    torch.cuda.synchronize()
    fresh = [0, 17, 18, 600, 700, 701, 3000, 5000, q.shape[0]]
    cu_fresh = _cu(fresh)
    out = torch.full_like(tq, float("nan"))
    side.wait_stream(torch.cuda.current_stream())
    # The current stream held back: a table written there instead of on `side` would come
    # after the launch on `side`, which would read the first call's lengths.
    torch.cuda._sleep(100_000_000)
    attention_varlen(tq, tk, tv, cu_fresh, cu_fresh, causal=False, out=out, stream=side)
    side.synchronize()
    torch.cuda.synchronize()
    assert _check(q, k, v, fresh, cupy.from_dlpack(out), False) < TOLERANCE


def test_lengths_on_the_gpu_on_two_streams_at_once(on_two_streams_at_once):
    """Calls of one launcher on two streams at once, each stream its own lengths and inputs:
    each stream writes its own table and counter (a shared table would hand one stream's
    launch the other's lengths), bit for bit the calls made one at a time."""
    import torch
    from wavefront import attention_varlen
    from wavefront.kernel import call as kernel_call
    kernel_call.clear_launcher_cache()
    batches = []
    for seed, lengths in ((61, [3000, 100, 9000, 4284]), (62, [16000, 10, 200, 174])):
        q, k, v, bounds = _packed(lengths, 32, 8, 128, seed=seed)
        batches.append((*_on_torch(q, k, v), _cu(bounds)))
    alone, together = on_two_streams_at_once(
        lambda q, k, v, cu: attention_varlen(q, k, v, cu, cu, causal=True,
                                             schedule="dynamic+linear"), batches)
    for want, outs in zip(alone, together):
        for n, out in enumerate(outs):
            assert torch.equal(out, want), f"call {n}"


def test_lengths_on_the_gpu_under_reduce_overhead_compile():
    """The varlen op with cu_seqlens on the GPU in `torch.compile(mode="reduce-overhead")`
    (CUDA graph trees: warm-up runs, a recording, then replays with the new lengths copied in):
    each call bit for bit the eager call, for lengths that change call by call."""
    import torch
    import torch._dynamo

    import wavefront.torch  # noqa: F401  (registers torch.ops.wavefront.attention_varlen)
    q, k, v, first = _packed(LENGTHS, 4, 2, 64, seed=53)
    tq, tk, tv = _on_torch(q, k, v)
    longest = q.shape[0]

    def step(q, k, v, cu):
        out = torch.ops.wavefront.attention_varlen(q * 2.0, k, v, cu, cu, longest, longest,
                                                   True, None, None, None)
        return out + 1.0
    torch._dynamo.reset()
    compiled = torch.compile(step, mode="reduce-overhead")
    total = q.shape[0]
    with torch.no_grad():
        for n, bounds in enumerate([first, [0, 5, 900, 901, 1500, 3000, 3001, 5600, total],
                                    [0, 1, 2, 3, 4, 5, 6, 7, total], first, first]):
            cu = _cu(bounds)
            got = compiled(tq, tk, tv, cu).clone()
            want = step(tq, tk, tv, cu)
            torch.cuda.synchronize()
            assert torch.equal(got, want), n


def test_lengths_on_the_gpu_of_other_sequence_counts_share_a_launcher():
    """Calls of 3, 8 and 5 sequences (one bucket of 8) through one launcher, the sequences a
    call lacks padded as empty ones: each right."""
    import cupy
    import torch

    from wavefront import attention_varlen
    from wavefront.kernel import call as kernel_call
    q, k, v, every = _packed(LENGTHS, 4, 2, 64, seed=57)
    tq, tk, tv = _on_torch(q, k, v)
    total = q.shape[0]
    kernel_call.clear_launcher_cache()
    for bounds in ([0, 1000, 1001, total], every, [0, 5, 700, 701, 4000, total]):
        out = torch.full_like(tq, float("nan"))
        attention_varlen(tq, tk, tv, _cu(bounds), _cu(bounds), causal=True, out=out)
        assert _check(q, k, v, bounds, cupy.from_dlpack(out), True) < TOLERANCE, bounds
    assert len(kernel_call._varlen_launchers) == 1
