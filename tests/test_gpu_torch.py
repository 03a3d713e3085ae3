"""The call users make, on the GPU: the launcher cache, the PyTorch custom op under
torch.compile and CUDA graphs, the caller's stream, the SDPA-shaped entry point. Fresh random
inputs, outputs poisoned with NaN, a float32 reference."""
import gc

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from wavefront.results.measurement import CORRECTNESS_TOLERANCE as TOLERANCE  # noqa: E402


def _inputs(seed, batch=2, heads=4, kv_heads=2, seqlen=700, head_dim=64,
            dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(batch, kv_heads, seqlen, head_dim, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(batch, kv_heads, seqlen, head_dim, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def _reference(q, k, v, causal):
    rep = q.shape[1] // k.shape[1]
    k, v = (x.float().repeat_interleave(rep, dim=1) for x in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k, v, is_causal=causal)


def _error(out, ref):
    assert torch.isfinite(out).all(), "output elements left unwritten"
    return float((out.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("causal", [False, True])
def test_repeated_calls_reuse_one_launcher_and_stay_correct(causal):
    import wavefront
    from wavefront.kernel import call as kernel_call
    kernel_call.clear_launcher_cache()
    for seed in range(3):
        q, k, v = _inputs(seed)
        out = torch.full_like(q, float("nan"))
        wavefront.attention(q, k, v, causal=causal, out=out)
        assert _error(out, _reference(q, k, v, causal)) < TOLERANCE
    assert len(kernel_call._plans) == 1
    q, k, v = _inputs(9, seqlen=333)
    wavefront.attention(q, k, v, causal=causal)
    assert len(kernel_call._plans) == 2
    # Each call returns its own LSE: the second call must not overwrite the first's.
    q, k, v = _inputs(10)
    _, lse1 = wavefront.attention(q, k, v, causal=causal, return_lse=True)
    first = lse1.clone()
    q2, k2, v2 = _inputs(11)
    _, lse2 = wavefront.attention(q2, k2, v2, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    assert lse1.data_ptr() != lse2.data_ptr() and torch.equal(lse1, first)


def test_the_cache_is_bounded():
    import wavefront
    from wavefront.kernel import call as kernel_call
    kernel_call.clear_launcher_cache()
    for n in range(kernel_call.LAUNCHER_CACHE_SIZE + 5):
        q, k, v = _inputs(n, batch=1, heads=1, kv_heads=1, seqlen=64 + n)
        wavefront.attention(q, k, v)
    assert len(kernel_call._plans) == kernel_call.LAUNCHER_CACHE_SIZE


def test_the_plain_call_shares_the_cached_launcher_and_forgets_evicted_ones(monkeypatch):
    """`wavefront.attention(q, k, v, causal=...)` with no other option keys by the tensors and
    the mask alone (`attention_plain`): its launcher is the one the full path caches, calls
    with any option take the full path, and a launcher the cache lets go leaves the plain map
    too (it must not keep, or launch, what the cache evicted)."""
    import wavefront
    from wavefront.kernel import call as kernel_call
    kernel_call.clear_launcher_cache()
    q, k, v = _inputs(40)
    first = wavefront.attention(q, k, v, causal=True)  # a miss: the full path, remembered
    (launcher,) = (p.launcher for p in kernel_call._plans.values())
    assert list((p.launcher for p in kernel_call._plain_plans.values())) == [launcher]
    again = wavefront.attention(q, k, v, causal=True)  # a plain hit
    _, lse = wavefront.attention(q, k, v, causal=True, return_lse=True)  # the full path
    assert len(kernel_call._plans) == 2 and len(kernel_call._plain_plans) == 1
    torch.cuda.synchronize()
    ref = _reference(q, k, v, True)
    assert _error(first, ref) < TOLERANCE and torch.equal(first, again)
    assert torch.isfinite(lse).all()
    monkeypatch.setattr(kernel_call, "LAUNCHER_CACHE_SIZE", 3)
    for n in range(4):
        small = _inputs(41 + n, batch=1, heads=1, kv_heads=1, seqlen=100 + n)
        wavefront.attention(*small, causal=False)
    cached = list((p.launcher for p in kernel_call._plans.values()))
    assert len(cached) == 3
    assert all(any(kept is c for c in cached)
               for kept in (p.launcher for p in kernel_call._plain_plans.values()))
    out = wavefront.attention(q, k, v, causal=True)  # found or built anew, right either way
    torch.cuda.synchronize()
    assert _error(out, ref) < TOLERANCE


@pytest.mark.parametrize("causal", [False, True])
def test_the_plain_calls_own_launch_is_the_whole_ways_bit_for_bit(causal):
    """Once its launcher is prepared, the plain call launches through `launch_plain` (one
    frame): the same output, bit for bit, as the whole way (`launch_call`), each output's
    memory freed NaN just before (the caching allocator hands the block back); on a stream the
    launcher has not launched on, it goes the whole way and is right there too."""
    import wavefront
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import launcher as kernel_launcher
    kernel_call.clear_launcher_cache()
    q, k, v = _inputs(90, batch=1, heads=8, kv_heads=8, seqlen=1024)
    ref = _reference(q, k, v, causal)
    for _ in range(kernel_launcher.PREPARE_AFTER_LAUNCHES + 1):
        wavefront.attention(q, k, v, causal=causal)
    (launcher,) = (p.launcher for p in kernel_call._plain_plans.values())
    assert launcher.plain_ready, launcher.prepare_failure
    outs = []
    for way in ("plain", "whole"):
        torch.full_like(q, float("nan"))  # freed at once: the next output's block
        outs.append(wavefront.attention(q, k, v, causal=causal) if way == "plain" else
                    launcher.launch_call(q, k, v, None, None))
        torch.cuda.synchronize()
    assert _error(outs[0], ref) < TOLERANCE
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = wavefront.attention(q, k, v, causal=causal)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(on_side.view(torch.int16), outs[0].view(torch.int16))


class _TinyAttentionModel(torch.nn.Module):
    """Projections around the op, as a model uses it: no graph break may come from the op."""

    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x, attend):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2).contiguous()
                   for t in self.qkv(x).chunk(3, dim=-1))
        y = attend(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def test_custom_op_compiles_without_a_graph_break():
    import torch._dynamo

    import wavefront.torch as wft
    model = _TinyAttentionModel().cuda().to(torch.bfloat16)
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)

    def ours(q, k, v):
        return wft.scaled_dot_product_attention(q, k, v, is_causal=True)

    def theirs(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.no_grad():  # inference: the op has no backward
        explanation = torch._dynamo.explain(lambda x: model(x, ours))(x)
        assert explanation.graph_break_count == 0 and explanation.graph_count == 1
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: model(x, ours), fullgraph=True)  # breaks raise
        got = compiled(x)
        want = model(x, theirs)
    assert float((got.float() - want.float()).norm() / want.float().norm()) < TOLERANCE


@pytest.mark.parametrize("prepared", [False, True])
@pytest.mark.parametrize("schedule", ["persistent+linear", "dynamic+sawtooth",
                                      "grouped_dynamic+linear", "persistent+tiled_fit"])
def test_cuda_graph_replay_equals_eager(schedule, prepared, monkeypatch):
    """Captured once, replayed on new inputs copied into the static ones: equal to the eager
    call bit for bit (same kernel, same work table; the dynamic counter reset by the kernel).
    `prepared`: launchers prepare after their first launch, so the capture records a prepared
    launch (cuLaunchKernel from the packed buffer) and the eager calls launch prepared too."""
    import wavefront.torch  # noqa: F401  (registers torch.ops.wavefront.attention)
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import launcher as kernel_launcher
    if prepared:
        monkeypatch.setattr(kernel_launcher, "PREPARE_AFTER_LAUNCHES", 1)
    kernel_call.clear_launcher_cache()
    q, k, v = _inputs(21)
    static = [x.clone() for x in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compile and upload the work table outside capture
        torch.ops.wavefront.attention(*static, True, None, schedule, None)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.ops.wavefront.attention(*static, True, None, schedule, None)
    for seed in (22, 23, 24):
        fresh = _inputs(seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        static_out.fill_(float("nan"))
        graph.replay()
        eager = torch.ops.wavefront.attention(*fresh, True, None, schedule, None)
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager), seed
        assert _error(static_out, _reference(*fresh, True)) < TOLERANCE
    if prepared:
        (launcher,) = (p.launcher for p in kernel_call._plans.values())
        assert launcher.launches_prepared, launcher.prepare_failure


def test_a_launcher_in_a_graph_outlives_the_cache_until_released():
    """A launcher launched into a capture is kept when the cache lets it go (the graph still
    replays on its buffers: the replay must stay right), and goes once the caller says its
    graphs are gone (`release_graph_launchers`)."""
    import weakref

    import wavefront.torch as wft
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import streams as kernel_streams
    kernel_call.clear_launcher_cache()
    static = [x.clone() for x in _inputs(26)]
    schedule = "dynamic+linear"  # writes its counter: a replay on freed buffers would show
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.wavefront.attention(*static, True, None, schedule, None)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.ops.wavefront.attention(*static, True, None, schedule, None)
    (launcher,) = (p.launcher for p in kernel_call._plans.values())
    alive = weakref.ref(launcher)
    del launcher
    kernel_call.clear_launcher_cache()
    gc.collect()
    assert alive() is not None, "a launcher a graph replays on was let go"
    for _ in range(3):
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _error(static_out, _reference(*static, True)) < TOLERANCE
    del graph
    assert wft.release_graph_launchers() >= 1 and not kernel_streams._in_graphs
    gc.collect()
    assert alive() is None, "released, the launcher is still held"


def test_a_capture_before_the_table_is_known_done():
    """The work table is built on a stream of its own, and a launcher learns that the build
    is done only when a call finds it so. Here the build is made to look queued behind a
    0.2 s sleep (the launcher's build event swapped for one recorded after the sleep), so
    the eager call on a side stream finds it pending and orders its launch after it; the
    capture that follows must put its wait into the graph as an external event node, and the
    replay equal the eager call. (Racing a sleep on the table stream against the launcher's
    build was not deterministic: in a fresh process the build compiles the table kernel, and
    on one H100 run the call found the build done. A host function holding the table stream
    deadlocked there.)"""
    import cupy

    import wavefront.torch  # noqa: F401  (registers torch.ops.wavefront.attention)
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import streams as kernel_streams
    q, k, v = _inputs(25)
    schedule = "persistent+sawtooth"  # static: the replay equals the eager call bit for bit
    kernel_call.clear_launcher_cache()
    static = [x.clone() for x in (q, k, v)]
    torch.ops.wavefront.attention(*static, True, None, schedule, None)  # launcher, compiled
    torch.cuda.synchronize()
    (launcher,) = (p.launcher for p in kernel_call._plans.values())
    held = torch.cuda.Stream()
    with torch.cuda.stream(held):
        torch.cuda._sleep(400_000_000)  # about 0.2 s of GPU cycles
    pending = cupy.cuda.Event(disable_timing=True)
    pending.record(kernel_streams.cupy_stream(held.cuda_stream))
    launcher._table_built = pending
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = torch.ops.wavefront.attention(*static, True, None, schedule, None)
    assert launcher._table_built is pending, "the eager call found the sleep over"
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    waits_in_graphs = len(kernel_streams._waited_on_in_graphs)
    with torch.cuda.graph(graph):
        static_out = torch.ops.wavefront.attention(*static, True, None, schedule, None)
    assert len(kernel_streams._waited_on_in_graphs) == waits_in_graphs + 1
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, eager)
    assert _error(static_out, _reference(q, k, v, True)) < TOLERANCE


def test_the_callers_stream_is_honoured():
    """On a side stream held back by a sleep, the call must wait for the sleep: read before the
    side stream finishes, the output is still the poison; after, it is right."""
    import wavefront
    q, k, v = _inputs(31)
    wavefront.attention(q, k, v)  # launcher built, kernel compiled
    out = torch.full_like(q, float("nan"))
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU cycles
        wavefront.attention(q, k, v, out=out)
    # Copy on the default stream, which does not wait for `side`.
    snapshot = torch.empty_like(out, device="cpu")
    snapshot.copy_(out, non_blocking=False)
    assert torch.isnan(snapshot.float()).all(), "the call ran before its stream's earlier work"
    side.synchronize()
    assert _error(out, _reference(q, k, v, False)) < TOLERANCE


def _allocating_stream(tensor):
    """The stream whose memory `tensor` is in torch's caching allocator (its segment's)."""
    ptr = tensor.data_ptr()
    for segment in torch.cuda.memory_snapshot():
        if segment["address"] <= ptr < segment["address"] + segment["total_size"]:
            return segment["stream"]
    raise AssertionError("not memory of torch's caching allocator")


@pytest.mark.parametrize("call", ["dense", "packed, lengths on the host",
                                  "packed, lengths on the GPU"])
def test_what_a_call_given_a_stream_makes_is_that_streams_memory(call):
    """`stream=side` from outside `with torch.cuda.stream(side)`: the output and LSE the call
    makes must be `side`'s memory, as inside the context. Made from the current stream's pool,
    they could take memory that work still queued there reads (the kernel on `side` would
    overwrite it), and a caller's `del` would give it back to the current stream."""
    import wavefront
    side = torch.cuda.Stream()
    q, k, v = _inputs(80)
    if call == "dense":
        out, lse = wavefront.attention(q, k, v, return_lse=True, stream=side)
        ref = _reference(q, k, v, False)
    else:
        packed = [x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]) for x in (q, k, v)]
        lengths = torch.tensor([0, 700, 1400], dtype=torch.int32)
        cu = lengths.cuda() if call.endswith("GPU") else lengths
        out, lse = wavefront.attention_varlen(*packed, cu, cu, return_lse=True, stream=side)
        out = out.reshape(2, 700, *out.shape[1:]).transpose(1, 2)
        ref = _reference(q, k, v, False)
    side.synchronize()
    current = torch.cuda.current_stream().cuda_stream
    assert side.cuda_stream != current
    assert _allocating_stream(out) == side.cuda_stream
    assert _allocating_stream(lse) == side.cuda_stream
    assert _error(out, ref) < TOLERANCE


@pytest.mark.parametrize("call", ["dense", "packed, lengths on the GPU"])
def test_what_a_cupy_call_given_a_stream_makes_is_that_streams_memory(call):
    """The same for CuPy arrays: CuPy's pool keeps freed memory per stream, so the output a
    call given `stream=side` makes, once freed, is reused by an allocation on `side` and not
    by one on the current stream."""
    import cupy

    import wavefront
    side = cupy.cuda.Stream(non_blocking=True)
    q, k, v = (cupy.from_dlpack(x) for x in _inputs(81))
    if call == "dense":
        out = wavefront.attention(q, k, v, stream=side)
        ref = _reference(*(torch.from_dlpack(x) for x in (q, k, v)), False)
    else:
        packed = [x.transpose(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3]) for x in (q, k, v)]
        cu = cupy.asarray([0, 700, 1400], dtype=cupy.int32)
        out = wavefront.attention_varlen(*packed, cu, cu, stream=side)
        out = out.reshape(2, 700, *out.shape[1:]).transpose(0, 2, 1, 3)
        ref = _reference(*(torch.from_dlpack(x) for x in (q, k, v)), False)
    side.synchronize()
    assert _error(torch.from_dlpack(out), ref) < TOLERANCE
    pointer, size = out.data.ptr, out.nbytes
    out = None
    on_current = cupy.empty(size, dtype=cupy.uint8)
    # A stream handle is reused once its stream is destroyed, and CuPy's pool keys free memory
    # by handle: `side` may inherit free blocks of this size from an earlier test's stream (in
    # the same xdist worker), handed out before ours. So allocate a few on `side`.
    with side:
        on_side = [cupy.empty(size, dtype=cupy.uint8) for _ in range(16)]
    assert pointer in {a.data.ptr for a in on_side} and on_current.data.ptr != pointer
    # The stream destroyed (CuPy's are, when collected), then the launcher dropped: its
    # release must not record on the dead stream (that crashed the process).
    del side, on_side
    _release_cupy_launchers()


def _noted_handles(launcher) -> set:
    """The streams a CuPy launcher and its per-stream copies noted launches on."""
    return {handle for own in (launcher, *launcher._streams.values())
            for handle in own._last_launch_on}


def _release_cupy_launchers() -> None:
    """Drop every cached launcher once the test's streams are gone: a release must not record
    on a destroyed stream (that crashed the process)."""
    import cupy

    from wavefront.kernel import call as kernel_call
    gc.collect()
    kernel_call.clear_launcher_cache()
    gc.collect()
    cupy.cuda.Device().synchronize()


@pytest.mark.parametrize("causal", [False, True])
def test_a_cupy_call_on_its_current_stream_is_noted_there(causal):
    """A call on CuPy arrays inside `with side:` launches on the current stream's handle, read
    from its object once, and notes its launch on that handle (an event recorded after it),
    so that the launcher's release waits on the event, not on the stream, which CuPy destroys
    when collected. On the null stream, current or given as CuPy's object, it notes nothing
    (never destroyed)."""
    import cupy

    import wavefront
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import launcher as kernel_launcher
    kernel_call.clear_launcher_cache()
    q, k, v = (cupy.from_dlpack(x) for x in _inputs(82))
    ref = _reference(*(torch.from_dlpack(x) for x in (q, k, v)), causal)
    # the inputs were made on torch's stream: a non-blocking stream does not wait for them
    # (seen once in a parallel GPU run: an output from half-written inputs, error 1.29)
    torch.cuda.synchronize()
    side = cupy.cuda.Stream(non_blocking=True)
    for _ in range(kernel_launcher.PREPARE_AFTER_LAUNCHES + 2):  # ct.launch, then prepared
        with side:
            out = wavefront.attention(q, k, v, causal=causal)
        on_null = wavefront.attention(q, k, v, causal=causal)
        given_null = wavefront.attention(q, k, v, causal=causal, stream=cupy.cuda.Stream.null)
        side.synchronize()
        cupy.cuda.Device().synchronize()
        assert _error(torch.from_dlpack(out), ref) < TOLERANCE
        assert _error(torch.from_dlpack(on_null), ref) < TOLERANCE
        assert _error(torch.from_dlpack(given_null), ref) < TOLERANCE
    launcher = next(x for x in (p.launcher for p in kernel_call._plans.values())
                    if x.view.library == "cupy")
    assert launcher.launches_prepared or launcher.on_stream(side.ptr).launches_prepared
    assert _noted_handles(launcher) == {side.ptr}
    del side, out
    _release_cupy_launchers()


@pytest.mark.parametrize("causal", [False, True])
def test_the_plain_cupy_calls_own_launch_is_the_whole_ways_bit_for_bit(causal):
    """On CuPy arrays too, once prepared, the plain call launches in one frame
    (`launch_plain`): bit for bit the whole way's output, each output's memory freed NaN
    just before; inside `with side:` it is right there and noted on `side`'s handle."""
    import cupy

    import wavefront
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import launcher as kernel_launcher
    kernel_call.clear_launcher_cache()
    q, k, v = (cupy.from_dlpack(x) for x in _inputs(91, batch=1, heads=8, kv_heads=8,
                                                   seqlen=1024))
    ref = _reference(*(torch.from_dlpack(x) for x in (q, k, v)), causal)
    for _ in range(kernel_launcher.PREPARE_AFTER_LAUNCHES + 1):
        wavefront.attention(q, k, v, causal=causal)
    (launcher,) = (p.launcher for p in kernel_call._plain_plans.values())
    assert launcher.plain_ready, launcher.prepare_failure
    assert launcher.view.library == "cupy"
    outs = []
    for way in ("plain", "whole"):
        cupy.full_like(q, float("nan"))  # freed at once: the next output's block
        outs.append(wavefront.attention(q, k, v, causal=causal) if way == "plain" else
                    launcher.launch_call(q, k, v, None, None))
        cupy.cuda.Device().synchronize()
    assert _error(torch.from_dlpack(outs[0]), ref) < TOLERANCE
    assert bool((outs[0].view(cupy.int16) == outs[1].view(cupy.int16)).all())
    side = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    for _ in range(kernel_launcher.PREPARE_AFTER_LAUNCHES + 2):
        with side:
            on_side = wavefront.attention(q, k, v, causal=causal)
    side.synchronize()
    assert bool((on_side.view(cupy.int16) == outs[0].view(cupy.int16)).all())
    assert _noted_handles(launcher) == {side.ptr}
    del side, on_side
    _release_cupy_launchers()


@pytest.mark.parametrize("schedule,causal", [(None, True), ("dynamic+linear", False),
                                             ("persistent+tiled", False)])
def test_two_streams_at_once_keep_their_own_work(schedule, causal, on_two_streams_at_once):
    """Calls of one shape on two streams at once, bit for bit the calls made one at a time:
    the streams must not share the dynamic schedules' item counter (each would take the
    other's items) or the tiled schedules' partial states. (When they shared them, 12-20 of
    24 such calls came out different on the H100; the tuned causal call is grouped_dynamic.)"""
    import wavefront
    from wavefront.kernel import call as kernel_call
    kernel_call.clear_launcher_cache()
    input_sets = [_inputs(60 + i, batch=4, heads=32, kv_heads=8, seqlen=4096, head_dim=128)
                  for i in range(2)]
    alone, together = on_two_streams_at_once(
        lambda q, k, v: wavefront.attention(q, k, v, causal=causal, schedule=schedule),
        input_sets)
    for want, outs in zip(alone, together):
        for n, out in enumerate(outs):
            assert torch.equal(out, want), f"call {n}"
    # The launcher itself on the stream of the calls made alone, a copy for each side stream.
    (launcher,) = (p.launcher for p in kernel_call._plans.values())
    owns = [launcher, *launcher._streams.values()]
    assert len(launcher._launched_on) == 1 and len(launcher._streams) == 2
    assert len({own._table.data.ptr for own in owns}) == 3


def test_a_static_schedule_is_one_launcher_on_every_stream():
    """A launch that only reads its launcher's buffers (persistent, linear) needs no copy per
    stream: nothing is built for a second stream."""
    import wavefront
    from wavefront.kernel import call as kernel_call
    kernel_call.clear_launcher_cache()
    q, k, v = _inputs(70)
    wavefront.attention(q, k, v, schedule="persistent+linear")
    (launcher,) = (p.launcher for p in kernel_call._plans.values())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = wavefront.attention(q, k, v, schedule="persistent+linear")
    assert launcher.on_stream(side) is launcher and not launcher._streams
    assert len(launcher._launched_on) == 2
    side.synchronize()
    assert _error(out, _reference(q, k, v, False)) < TOLERANCE


@pytest.mark.parametrize("dropped_by", ["no cache key", "eviction"])
def test_a_dropped_launcher_keeps_its_buffers_until_its_launches_are_done(dropped_by,
                                                                           monkeypatch):
    """Launchers dropped while their launches are still queued (the stream held back by a
    sleep): made for one call that cannot be cached (tiles given as a list), or evicted from
    a cache of two by four configurations of one shape, whose tables are the same size. Each
    call bit for bit the same call made alone: a table's memory must not go to the next
    table built before the launch that reads it has run. (Let go at once, 9 of 12 such calls
    came out wrong on the H100.)"""
    import wavefront
    from wavefront.kernel import call as kernel_call
    q, k, v = _inputs(80, batch=2, heads=16, kv_heads=16, seqlen=4096, head_dim=128)
    configs = [(causal, schedule) for schedule in ("persistent+linear", "persistent+sawtooth")
               for causal in (False, True)]
    tiles = [128, 128] if dropped_by == "no cache key" else "128x128"
    if dropped_by == "eviction":
        monkeypatch.setattr(kernel_call, "LAUNCHER_CACHE_SIZE", 2)
    kernel_call.clear_launcher_cache()

    def call(causal, schedule):
        return wavefront.attention(q, k, v, causal=causal, schedule=schedule, tiles=tiles)
    alone = [call(*config) for config in configs]
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # about half a second: every launch below waits behind it
    queued = [call(*config) for _ in range(3) for config in configs]
    torch.cuda.synchronize()
    for n, out in enumerate(queued):
        assert torch.equal(out, alone[n % len(configs)]), f"call {n}"


def test_a_launcher_in_a_graph_outlives_its_eviction(monkeypatch):
    """A call captured on the stream it was warmed up on, its launcher then evicted from a
    cache of one by five other configurations of the shape (tables of the same size, built
    where the evicted one's memory would go): the graph's replay must still read its own
    table, bit for bit the eager call."""
    import wavefront
    from wavefront.kernel import call as kernel_call
    monkeypatch.setattr(kernel_call, "LAUNCHER_CACHE_SIZE", 1)
    kernel_call.clear_launcher_cache()
    static = _inputs(90, batch=2, heads=16, kv_heads=16, seqlen=2048, head_dim=128)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = wavefront.attention(*static, schedule="persistent+linear")
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = wavefront.attention(*static, schedule="persistent+linear")
    for causal, schedule in [(True, "persistent+linear"), (False, "persistent+sawtooth"),
                             (True, "persistent+sawtooth"), (False, "grouped+linear"),
                             (True, "grouped+linear")]:
        wavefront.attention(*static, causal=causal, schedule=schedule)
    torch.cuda.synchronize()
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_reduce_overhead_compile_replays_equal_eager():
    """`torch.compile(mode="reduce-overhead")`, how torch users put a model in CUDA graphs
    (CUDA graph trees: warm-up runs, a recording, then replays), with the op between two
    torch operations: each call bit for bit the eager call, over several fresh inputs."""
    import torch._dynamo

    import wavefront.torch  # noqa: F401  (registers torch.ops.wavefront.attention)

    def block(q, k, v):
        return torch.ops.wavefront.attention(q * 2.0, k, v, True, None, None, None) + 1.0
    torch._dynamo.reset()
    compiled = torch.compile(block, mode="reduce-overhead")
    with torch.no_grad():
        for seed in range(5):
            q, k, v = _inputs(100 + seed)
            got = compiled(q, k, v).clone()  # a replay's output is overwritten by the next
            want = block(q, k, v)
            torch.cuda.synchronize()
            assert torch.equal(got, want), seed
    assert _error(got - 1.0, _reference(q * 2.0, k, v, True)) < TOLERANCE


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_a_gpu_other_than_the_current_one():
    """Layers split across GPUs in one process (device_map="auto"): tensors on cuda:1 while
    the current device is cuda:0. Dense (a static and a dynamic schedule) and packed (host and
    GPU cu_seqlens) calls, on the tensors' GPU, right."""
    import wavefront
    from wavefront.kernel import call as kernel_call
    kernel_call.clear_launcher_cache()
    torch.cuda.set_device(0)
    other = torch.device("cuda", 1)
    q, k, v = (x.to(other) for x in _inputs(110))
    for schedule in ("persistent+linear", "dynamic+linear"):
        out = wavefront.attention(q, k, v, causal=True, schedule=schedule)
        assert out.device == other
        torch.cuda.synchronize(other)
        assert _error(out, _reference(q, k, v, True)) < TOLERANCE, schedule
    lengths = [700, 1, 300, 1000]
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    g = torch.Generator(device=other).manual_seed(111)
    packed = [torch.randn(bounds[-1], heads, 64, device=other, dtype=torch.bfloat16,
                          generator=g) for heads in (4, 2, 2)]
    for cu in (bounds, torch.tensor(bounds, dtype=torch.int32, device=other)):
        out = wavefront.attention_varlen(*packed, cu, cu, causal=True)
        torch.cuda.synchronize(other)
        assert out.device == other
        for a, b in zip(bounds, bounds[1:]):
            q1, k1, v1 = (x[a:b].transpose(0, 1)[None] for x in packed)
            want = _reference(q1, k1, v1, True)
            assert _error(out[a:b].transpose(0, 1)[None], want) < TOLERANCE, (type(cu), a, b)
    assert torch.cuda.current_device() == 0


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_entry_point_matches_torch(causal):
    import wavefront.torch as wft
    q, k, v = _inputs(41, heads=8, kv_heads=2, seqlen=513, head_dim=128)
    got = wft.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True,
                                           scale=0.05)
    rep = 4
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1),
        is_causal=causal, scale=0.05)
    assert _error(got, want) < TOLERANCE


def test_sdpa_entry_point_refuses_what_it_does_not_run():
    import wavefront.torch as wft
    q, k, v = _inputs(51)
    with pytest.raises(ValueError, match="^attn_mask must be None"):
        wft.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(1, device="cuda"))
    with pytest.raises(ValueError, match="^dropout_p must be 0.0"):
        wft.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        wft.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="^query must be 4-D"):
        wft.scaled_dot_product_attention(q[0], k, v)


def test_an_empty_sequence_is_named():
    import wavefront
    q, k, v = _inputs(61)
    with pytest.raises(ValueError, match="^q seqlen must be at least 1"):
        wavefront.attention(q[:, :, :0], k, v)
    with pytest.raises(ValueError, match="^k seqlen must be at least 1"):
        wavefront.attention(q, k[:, :, :0], v[:, :, :0])


def _noting_masks():
    """wavefront's attention function for transformers' registry, noting the mask each call
    gets: -> (the function, the list of masks)."""
    import wavefront.torch as wft
    masks = []

    def forward(module, query, key, value, attention_mask, *args, **kwargs):
        masks.append(attention_mask)
        return wft.hf_attention_forward(module, query, key, value, attention_mask, *args,
                                        **kwargs)
    return forward, masks


def _small_llama():
    """transformers' `LlamaForCausalLM` of 3 layers, hidden 512, 8/2 heads, random weights
    (seed 0), bf16, on its SDPA path: -> (config, model)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=4096, attn_implementation="sdpa")
    return config, LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()


def test_a_padding_free_batch_through_transformers_llama_runs_packed(monkeypatch):
    """Sequences packed in one row with position_ids restarting (transformers' padding-free
    batches), through transformers' `LlamaForCausalLM` with its attention routed to wavefront:
    every layer gets the sequences' bounds from wavefront's mask builder (not the T x T
    tensor) and runs the packed batch (`attention_varlen`), the table written once for the
    forward's layers; each sequence's logits are those of the same sequence run alone on the
    SDPA path, as close as transformers' own SDPA path on the packed row gets. The same row
    with SDPA's mask tensor handed to the hook (the tensor route) gives the same logits.
    Skips where transformers is not installed."""
    pytest.importorskip("transformers")
    import wavefront.torch as wft
    from wavefront.kernel import varlen as kernel_varlen
    staged, packed_calls = [], []
    stage = kernel_varlen._stage
    monkeypatch.setattr(kernel_varlen, "_stage", lambda *a: (staged.append(1), stage(*a)))
    launch_varlen = kernel_varlen.attention_varlen
    monkeypatch.setattr(kernel_varlen, "attention_varlen",
                        lambda *a, **kw: (packed_calls.append(1), launch_varlen(*a, **kw))[1])
    forward, masks = _noting_masks()
    name = wft.register_with_transformers(forward=forward)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register("wavefront_sdpa_mask", forward)
    AttentionMaskInterface.register("wavefront_sdpa_mask", sdpa_mask)
    config, model = _small_llama()
    model.set_attn_implementation(name)
    model.set_attn_implementation("sdpa")
    lengths = [300, 77, 1000, 5, 640]
    g = torch.Generator(device="cuda").manual_seed(1)
    sequences = [torch.randint(0, 1000, (n,), device="cuda", generator=g) for n in lengths]
    ids = torch.cat(sequences)[None]
    position_ids = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]

    def logits(implementation, ids, position_ids=None):
        model.config._attn_implementation = implementation
        with torch.no_grad():
            return model(input_ids=ids, position_ids=position_ids, use_cache=False).logits[0]

    alone = torch.cat([logits("sdpa", s[None]) for s in sequences]).float()
    ours_alone = torch.cat([logits(name, s[None]) for s in sequences]).float()
    packed_calls.clear()
    masks.clear()
    ours = logits(name, ids, position_ids).float()
    assert len(packed_calls) == config.num_hidden_layers and len(staged) == 1
    assert all(isinstance(m, wft.SequencesMask) for m in masks), masks
    assert masks[0].cu_seqlens.tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    masks.clear()
    from_tensor = logits("wavefront_sdpa_mask", ids, position_ids).float()
    assert all(isinstance(m, torch.Tensor) and m.shape[-1] == len(position_ids[0])
               for m in masks), masks
    assert torch.equal(from_tensor, ours)
    theirs = logits("sdpa", ids, position_ids).float()

    def error(x):
        return float((x - alone).norm() / alone.norm())
    # Packing adds to the kernels' own difference from SDPA what it adds to transformers' own
    # path (other matmul shapes); attending across sequences would differ by far more.
    assert torch.isfinite(ours).all()
    bound = min(0.05, 2 * (error(ours_alone) + error(theirs)) + 1e-3)
    assert error(ours) < bound, (error(ours), error(ours_alone), error(theirs))


def test_a_padded_batch_through_transformers_llama_runs_packed():
    """A padded batch (left padded, right padded, unpadded rows; the 2D attention mask)
    through transformers' `LlamaForCausalLM` with its attention routed to wavefront: every
    layer gets a `SequencesMask` of the rows' real tokens and runs them as one packed
    batch; at real tokens the logits are those of each sequence run alone on the SDPA path,
    as close as transformers' own SDPA path on the padded batch gets. Then two rows that
    each pack two sequences: the same. Skips where transformers is not installed."""
    pytest.importorskip("transformers")
    import wavefront.torch as wft
    forward, masks = _noting_masks()
    name = wft.register_with_transformers("wavefront_padded_test", forward=forward)
    config, model = _small_llama()
    rows = 700
    spans = [(rows - 450, rows), (0, 333), (0, rows)]  # left, right, no padding
    g = torch.Generator(device="cuda").manual_seed(2)
    ids = torch.randint(0, 1000, (len(spans), rows), device="cuda", generator=g)
    padding = torch.zeros(len(spans), rows, dtype=torch.long, device="cuda")
    position_ids = torch.zeros_like(padding)
    for b, (first, last) in enumerate(spans):
        padding[b, first:last] = 1
        position_ids[b, first:last] = torch.arange(last - first, device="cuda")

    def logits(implementation, ids, padding=None, position_ids=None):
        model.config._attn_implementation = implementation
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=padding, position_ids=position_ids,
                         use_cache=False).logits.float()

    alone = [logits("sdpa", ids[b:b + 1, first:last])[0]
             for b, (first, last) in enumerate(spans)]
    masks.clear()
    ours = logits(name, ids, padding, position_ids)
    assert len(masks) == config.num_hidden_layers
    assert all(isinstance(m, wft.SequencesMask) for m in masks), masks
    assert masks[0].cu_seqlens.tolist() == [0, 450, 783, 783 + rows]
    theirs = logits("sdpa", ids, padding, position_ids)

    def error(x):
        got = torch.cat([x[b, first:last] for b, (first, last) in enumerate(spans)])
        want = torch.cat(alone)
        return float((got - want).norm() / want.norm())
    assert torch.isfinite(ours).all()
    # wavefront's difference from SDPA on one sequence, and what the padded batch adds to
    # transformers' own path; attending to padding or across rows would differ by far more
    ours_alone = [logits(name, ids[b:b + 1, first:last])[0]
                  for b, (first, last) in enumerate(spans)]
    alone_error = float((torch.cat(ours_alone) - torch.cat(alone)).norm()
                        / torch.cat(alone).norm())
    bound = min(0.05, 2 * (alone_error + error(theirs)) + 1e-3)
    assert error(ours) < bound, (error(ours), alone_error, error(theirs))
    # Rows that each pack sequences (position_ids restarting, no padding): the same packed
    # batch, every token of it in place.
    halves = [(0, 450), (450, rows), (0, 333), (333, rows)]
    packed_positions = torch.cat([torch.arange(last - first, device="cuda")
                                  for first, last in halves]).reshape(2, rows)
    masks.clear()
    two_rows = logits(name, ids[:2], None, packed_positions)
    assert all(isinstance(m, wft.SequencesMask) and m.tokens is None for m in masks)
    assert masks[0].cu_seqlens.tolist() == [0, 450, 700, 1033, 1400]
    for n, (first, last) in enumerate(halves):
        want = logits("sdpa", ids[n // 2:n // 2 + 1, first:last])[0]
        got = two_rows[n // 2, first:last]
        assert float((got - want).norm() / want.norm()) < bound


def test_a_padded_batch_through_transformers_bert_runs_packed():
    """An encoder: a right-padded batch through transformers' `BertModel` with its attention
    routed to wavefront gets a bidirectional `SequencesMask` in every layer and runs the real
    tokens as one packed batch; at real tokens the hidden states are those of each sequence
    run alone on the SDPA path, as close as transformers' own SDPA path on the padded batch
    gets. Skips where transformers is not installed."""
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertModel

    import wavefront.torch as wft
    forward, masks = _noting_masks()
    name = wft.register_with_transformers("wavefront_encoder_test", forward=forward)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512,
                        attn_implementation="sdpa")
    model = BertModel(config).to(device="cuda", dtype=torch.bfloat16).eval()
    model.set_attn_implementation(name)
    model.set_attn_implementation("sdpa")
    lengths = [500, 37, 260, 512]
    rows = max(lengths)
    g = torch.Generator(device="cuda").manual_seed(3)
    ids = torch.randint(1, 1000, (len(lengths), rows), device="cuda", generator=g)
    padding = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        padding[b, :n] = 1

    def hidden(implementation, ids, padding=None):
        model.config._attn_implementation = implementation
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=padding).last_hidden_state.float()

    alone = torch.cat([hidden("sdpa", ids[b:b + 1, :n])[0] for b, n in enumerate(lengths)])
    ours_alone = torch.cat([hidden(name, ids[b:b + 1, :n])[0] for b, n in enumerate(lengths)])
    masks.clear()
    ours = hidden(name, ids, padding)
    assert len(masks) == config.num_hidden_layers
    assert all(isinstance(m, wft.SequencesMask) and not m.causal for m in masks), masks
    assert masks[0].cu_seqlens.tolist() == [0, 500, 537, 797, 1309]
    theirs = hidden("sdpa", ids, padding)
    real = padding.bool()

    def error(x):
        return float((x - alone).norm() / alone.norm())
    assert torch.isfinite(ours).all()
    assert error(ours_alone) < 0.03  # one sequence, no mask: not causal (an encoder)
    bound = min(0.05, 2 * (error(ours_alone) + error(theirs[real])) + 1e-3)
    assert error(ours[real]) < bound, (error(ours[real]), error(ours_alone), error(theirs[real]))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_prepared_launch_on_a_gpu_other_than_the_current_one(monkeypatch):
    """A launcher launches with its own GPU current (a raw stream handle, 0 above all, names a
    stream of the current device; a prepared launch's kernel is loaded for the launcher's
    GPU). Tensors on cuda:1, the current device switched 1, 0, 1 between calls, the launcher
    preparing after its first launch: right every time (an illegal address on the two-H100
    host before, with or without prepared launches), and the current device left as it was."""
    import wavefront
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import launcher as kernel_launcher
    monkeypatch.setattr(kernel_launcher, "PREPARE_AFTER_LAUNCHES", 1)
    kernel_call.clear_launcher_cache()
    other = torch.device("cuda", 1)
    q, k, v = (x.to(other) for x in _inputs(120))
    want = _reference(q, k, v, False)
    try:
        for current in (1, 0, 1):
            torch.cuda.set_device(current)
            for _ in range(2):
                out = wavefront.attention(q, k, v)
                torch.cuda.synchronize(other)
                torch.cuda.synchronize(0)
                assert _error(out, want) < TOLERANCE, current
                assert torch.cuda.current_device() == current
    finally:
        torch.cuda.set_device(0)
    (launcher,) = (p.launcher for p in kernel_call._plans.values())
    assert launcher.launches_prepared, launcher.prepare_failure


def test_a_measured_carry_over_times_the_entries_and_launches_the_fastest(monkeypatch,
                                                                          tmp_path):
    """Under WAVEFRONT_CARRY_OVER=measure a shape without an entry of its own times its GPU's
    entries' distinct configurations on its first call, each output agreeing with the nearest
    entry's, and launches the fastest: correct, once per problem (a later call with other
    options or CuPy arrays takes the kept choice), on a side stream too; stored in the choices
    file for later processes."""
    import json

    import cupy

    import wavefront
    from wavefront.device import current_device
    from wavefront.kernel import call as kernel_call
    from wavefront.kernel import tuning as kernel_tuning
    from wavefront.kernel.carry_over import CARRY_OVER_FILE_VARIABLE
    from wavefront.kernel.tuning import CARRY_OVER_VARIABLE, carry_over_configs
    monkeypatch.setenv(CARRY_OVER_VARIABLE, "measure")
    monkeypatch.setenv(CARRY_OVER_FILE_VARIABLE, str(tmp_path / "choices.json"))
    kernel_call.clear_launcher_cache()
    q, k, v = _inputs(31, batch=1, heads=8, kv_heads=8, seqlen=1024)
    gpu = current_device().name
    exact, configs = carry_over_configs(gpu, tuple(q.shape), tuple(k.shape), False)
    if exact or len(configs) < 2:
        pytest.skip(f"{gpu}: the table offers this shape nothing to choose from")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = torch.full_like(q, float("nan"))
        wavefront.attention(q, k, v, out=out)
    torch.cuda.current_stream().wait_stream(side)
    assert _error(out, _reference(q, k, v, False)) < TOLERANCE
    key = (gpu, tuple(q.shape), tuple(k.shape), False)
    choice = kernel_tuning.carry_over_choices()[key]
    assert [c for c, _, _ in choice.timed] == configs and choice.left_out == ()
    assert all(lo <= ms <= hi and ms > 0 for _, ms, (lo, hi) in choice.timed)
    assert choice.seconds > 0
    assert choice.config == min(choice.timed, key=lambda t: t[1])[0]
    (stored,) = json.loads((tmp_path / "choices.json").read_text()).values()
    assert stored["config"] == choice.config
    (launcher,) = (p.launcher for p in kernel_call._plans.values())
    launch = launcher.launch
    assert (f"{launch.cta.name}+{launch.kv.name}", launch.ctas_per_sm) == (
        choice.config["schedule"], choice.config["occupancy"])
    plain = wavefront.attention(q, k, v)
    assert _error(plain, _reference(q, k, v, False)) < TOLERANCE
    cq, ck, cv = (cupy.from_dlpack(x) for x in (q, k, v))
    assert kernel_call.measure_carry_over(cq, ck, cv) is choice
    assert kernel_tuning.carry_over_choices() == {key: choice}
    kernel_call.clear_launcher_cache()
