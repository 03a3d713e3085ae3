"""The cache call's prepared launches and its state across a growing cache, on the GPU: a
layout called PREPARE_AFTER_CALLS times launches through the driver, bit for bit what
`ct.launch` gave on the same inputs (one split and several, paged, the LSE); an `out` over q
goes back to `ct.launch`; a CUDA graph captured after preparing replays new inputs; a cache
that grows a key a call (transformers' DynamicCache) keeps one work table per split count.
Fresh random inputs (fixed seeds), outputs poisoned with NaN, against the float32 reference."""
import math

import pytest

from tests.test_gpu_kvcache import _relative, make_cache, reference
from wavefront.results.measurement import CORRECTNESS_TOLERANCE as TOLERANCE

pytestmark = pytest.mark.gpu


def _torch():
    return pytest.importorskip("torch")


def _only_prepared():
    from wavefront.kernel import kvcache
    assert len(kvcache._prepared) == 1
    return next(iter(kvcache._prepared.values()))


@pytest.mark.parametrize("page_size,batch,num_splits,return_lse", [
    (None, 1, None, False),  # B1: several splits, the combine prepared too
    (None, 1, 7, True),
    (64, 2, None, True),
    (16, 4, 1, False),  # one split: no combine
])
def test_prepared_launches_give_what_ct_launch_gave(page_size, batch, num_splits,
                                                    return_lse):
    torch = _torch()
    import wavefront
    from wavefront.kernel import kvcache
    kvcache._prepared.clear()
    g = torch.Generator(device="cuda").manual_seed(700 + batch)
    capacity = 2048
    keys, values, k_cache, v_cache, table = make_cache(batch, capacity, 8, 128,
                                                       torch.bfloat16, page_size, g)
    lengths = torch.randint(1, capacity + 1, (batch,), generator=g, device="cuda")
    seqlens = lengths.to(torch.int32)

    def call(q):
        out = torch.full_like(q, math.nan)
        result = wavefront.attention_with_kvcache(q, k_cache, v_cache, seqlens,
                                                  block_table=table, num_splits=num_splits,
                                                  return_lse=return_lse, out=out)
        torch.cuda.synchronize()
        return result if return_lse else (result, None)

    q = torch.randn(batch, 1, 32, 128, generator=g, device="cuda").to(torch.bfloat16)
    first, first_lse = call(q)
    prepared = _only_prepared()
    assert prepared.launches is None
    for _ in range(kvcache.PREPARE_AFTER_CALLS):
        call(torch.randn(batch, 1, 32, 128, generator=g, device="cuda").to(torch.bfloat16))
    assert prepared.launches is not None, prepared.failure
    assert (prepared.launches.combine is None) == (prepared.combine is None)

    class Counted:  # the prepared launch, counting what it launched
        def __init__(self, launch):
            self.inner, self.launched = launch, 0

        def launch(self, stream, addresses):
            done = self.inner.launch(stream, addresses)
            self.launched += bool(done)
            return done
    counted = Counted(prepared.launches.attention)
    prepared.launches.attention = counted
    again, again_lse = call(q)
    assert counted.launched == 1  # through the driver, not a silent fall-back to ct.launch
    assert torch.equal(again, first)
    if return_lse:
        assert torch.equal(again_lse, first_lse)
    ref, _ = reference(q, keys, values, lengths.tolist(), True, 1 / math.sqrt(128))
    assert _relative(again, ref) < TOLERANCE


def test_an_out_over_q_goes_through_ct_launch(monkeypatch):
    torch = _torch()
    import wavefront
    from wavefront.kernel import kvcache
    kvcache._prepared.clear()
    g = torch.Generator(device="cuda").manual_seed(710)
    keys, values, k_cache, v_cache, _ = make_cache(1, 1024, 8, 128, torch.bfloat16, None, g)
    seqlens = torch.tensor([1000], dtype=torch.int32, device="cuda")
    q = torch.randn(1, 1, 32, 128, generator=g, device="cuda").to(torch.bfloat16)
    for _ in range(kvcache.PREPARE_AFTER_CALLS + 1):
        wavefront.attention_with_kvcache(q, k_cache, v_cache, seqlens,
                                         out=torch.empty_like(q))
    prepared = _only_prepared()
    assert prepared.launches is not None, prepared.failure

    class Refuses:
        def launch(self, *args):
            raise AssertionError("a prepared launch with out over q")
    monkeypatch.setattr(prepared.launches, "attention", Refuses())
    ref, _ = reference(q, keys, values, [1000], True, 1 / math.sqrt(128))
    in_place = q.clone()
    wavefront.attention_with_kvcache(in_place, k_cache, v_cache, seqlens, out=in_place)
    torch.cuda.synchronize()
    assert _relative(in_place, ref) < TOLERANCE


def test_a_graph_captured_after_preparing_replays_new_inputs():
    torch = _torch()
    import wavefront
    from wavefront.kernel import kvcache
    kvcache._prepared.clear()
    g = torch.Generator(device="cuda").manual_seed(720)
    keys, values, k_cache, v_cache, _ = make_cache(2, 4096, 8, 128, torch.bfloat16, None, g)
    seqlens = torch.tensor([4000, 2500], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 32, 128, generator=g, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(kvcache.PREPARE_AFTER_CALLS + 1):
            wavefront.attention_with_kvcache(q, k_cache, v_cache, seqlens, out=out)
    torch.cuda.current_stream().wait_stream(side)
    assert _only_prepared().launches is not None, _only_prepared().failure
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wavefront.attention_with_kvcache(q, k_cache, v_cache, seqlens, out=out)
    q.copy_(torch.randn(2, 1, 32, 128, generator=g, device="cuda").to(torch.bfloat16))
    seqlens.copy_(torch.tensor([17, 4096], dtype=torch.int32, device="cuda"))
    out.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = reference(q, keys, values, [17, 4096], True, 1 / math.sqrt(128))
    assert _relative(out, ref) < TOLERANCE


def test_a_growing_cache_keeps_one_table_per_split_count():
    torch = _torch()
    import wavefront
    from wavefront.decode_schedules import DecodeProblem, plan_decode
    from wavefront.device import current_device
    from wavefront.kernel import kvcache
    from wavefront.kernel.decode import DECODE_OCCUPANCY
    g = torch.Generator(device="cuda").manual_seed(730)
    # transformers' DynamicCache: (B, H_kv, L, D), one key concatenated a step; the call
    # sees the (B, L, H_kv, D) transpose
    k = torch.randn(1, 8, 1000, 128, generator=g, device="cuda").to(torch.bfloat16)
    v = torch.randn_like(k)
    before = len(kvcache._states)
    splits = set()
    sms = current_device().sms
    for step in range(40):
        k = torch.cat([k, torch.randn(1, 8, 1, 128, generator=g, device="cuda")
                       .to(torch.bfloat16)], dim=2)
        v = torch.cat([v, torch.randn_like(k[:, :, :1])], dim=2)
        length = k.shape[2]
        splits.add(plan_decode(DecodeProblem(1, 32, 8, 1, length, 128), sms=sms,
                               ctas_per_sm=DECODE_OCCUPANCY).num_splits)
        q = torch.randn(1, 1, 32, 128, generator=g, device="cuda").to(torch.bfloat16)
        out = torch.full_like(q, math.nan)
        lengths = torch.full((1,), length, dtype=torch.int32, device="cuda")
        wavefront.attention_with_kvcache(q, k.transpose(1, 2), v.transpose(1, 2), lengths,
                                         out=out)
        if step % 13 == 0:
            torch.cuda.synchronize()
            ref, _ = reference(q, k.transpose(1, 2), v.transpose(1, 2), [length], True,
                               1 / math.sqrt(128))
            assert _relative(out, ref) < TOLERANCE
    assert len(kvcache._states) - before <= len(splits)


@pytest.mark.parametrize("return_lse", [False, True])
def test_a_grown_cache_is_planned_from_the_last_call_and_still_checked(monkeypatch,
                                                                        return_lse):
    """A cache one key longer than the last call's (a DynamicCache step) is planned from that
    call (`_replanned`: no `_prepare`), and its combine launches through the prepared launch
    the grown layouts share once they made PREPARE_AFTER_CALLS of them; every step's output
    right against the reference; a grown cache that breaks a rule (v shorter than k) is still
    refused, naming the argument."""
    torch = _torch()
    import wavefront
    from wavefront.kernel import kvcache
    from wavefront.kernel.prepared import PreparedLaunch
    if not kvcache.PREPARED_LAUNCHES:
        pytest.skip("prepared launches are off (WAVEFRONT_PREPARED_LAUNCH=0)")
    kvcache._prepared.clear()
    kvcache._families.clear()
    kvcache._combines.clear()
    prepares, driver = [], []
    real_prepare, real_launch = kvcache._prepare, PreparedLaunch.launch
    monkeypatch.setattr(kvcache, "_prepare",
                        lambda *a, **kw: prepares.append(1) or real_prepare(*a, **kw))
    monkeypatch.setattr(PreparedLaunch, "launch",
                        lambda self, *a: driver.append(real_launch(self, *a)) or driver[-1])
    g = torch.Generator(device="cuda").manual_seed(731)
    # 3073-3084 keys: 49 K/V tiles at every step, so one split count (one launch state)
    k = torch.randn(2, 8, 3072, 128, generator=g, device="cuda").to(torch.bfloat16)
    v = torch.randn_like(k)
    for step in range(12):
        k = torch.cat([k, torch.randn(2, 8, 1, 128, generator=g, device="cuda")
                       .to(torch.bfloat16)], dim=2)
        v = torch.cat([v, torch.randn_like(k[:, :, :1])], dim=2)
        q = torch.randn(2, 1, 32, 128, generator=g, device="cuda").to(torch.bfloat16)
        out = torch.full_like(q, math.nan)
        lengths = [k.shape[2], k.shape[2] - 5 * step]  # ragged: the second lags behind
        result = wavefront.attention_with_kvcache(q, k.transpose(1, 2), v.transpose(1, 2),
                                                  lengths, out=out, return_lse=return_lse)
        torch.cuda.synchronize()
        ref, ref_lse = reference(q, k.transpose(1, 2), v.transpose(1, 2), lengths, True,
                                 1 / math.sqrt(128))
        assert _relative(out, ref) < TOLERANCE, step
        if return_lse:  # a new LSE each call: the shared combine takes its address
            assert torch.allclose(result[1], ref_lse, atol=2e-2, rtol=1e-3), step
    assert len(prepares) == 1  # the first call's; every grown cache was replanned
    # steps 1-8 counted (the first call is no grown layout's), steps 9-11 shared the combine
    assert driver == [True] * (11 - kvcache.PREPARE_AFTER_CALLS)
    assert len(kvcache._combines) == 1
    short_v = v[:, :, :-1]
    with pytest.raises(ValueError, match="v_cache shape must equal k_cache shape"):
        wavefront.attention_with_kvcache(q, k.transpose(1, 2), short_v.transpose(1, 2),
                                         k.shape[2] - 1, out=out, return_lse=return_lse)
    assert len(prepares) == 1  # refused by the replanned call's own check
