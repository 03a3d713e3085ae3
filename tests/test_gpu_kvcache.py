"""The KV-cache call on the GPU against a float32 torch reference: decode and chunked prefill,
contiguous and paged caches (pages of 16, 64, 256), GQA and MHA, ragged lengths from 0 to the
capacity, with and without appended keys (the cache checked after the call), one split and
several, D64 and D128, bfloat16 and float16, the LSE. Fresh random inputs per case (fixed
integer seeds), the output poisoned with NaN before each call."""
import itertools
import math

import pytest

from wavefront.results.measurement import CORRECTNESS_TOLERANCE as TOLERANCE

pytestmark = pytest.mark.gpu


def _torch():
    return pytest.importorskip("torch")


def reference(q, keys, values, lengths, causal, scale):
    """float32 attention of q (B, S_q, H, D) over keys/values (B, S, H_kv, D), sequence b's
    first lengths[b] keys, bottom-right causal. Rows that see no key: output 0, LSE -inf."""
    torch = _torch()
    batch, seqlen_q, heads, _ = q.shape
    group = heads // keys.shape[2]
    outs, lses = [], []
    for b in range(batch):
        n = int(lengths[b])
        k = keys[b, :n].float().repeat_interleave(group, dim=1).transpose(0, 1)  # (H, n, D)
        v = values[b, :n].float().repeat_interleave(group, dim=1).transpose(0, 1)
        s = torch.einsum("qhd,hkd->hqk", q[b].float(), k) * scale  # (H, S_q, n)
        if causal:
            i = torch.arange(seqlen_q, device=q.device)[:, None]
            j = torch.arange(n, device=q.device)[None, :]
            s = s.masked_fill(j > i + n - seqlen_q, -math.inf)
        lse = torch.logsumexp(s, dim=-1)  # (H, S_q); -inf where no key
        p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
        outs.append(torch.einsum("hqk,hkd->qhd", p, v))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _relative(got, ref):
    torch = _torch()
    return float(torch.linalg.norm(got.float() - ref) / max(torch.linalg.norm(ref), 1e-12))


def make_cache(batch, capacity, kv_heads, dim, dtype, page_size, generator, spare_pages=3):
    """A logical cache (B, capacity, H_kv, D) and its layout: contiguous itself, or a pool of
    shuffled pages with a block table."""
    torch = _torch()
    keys = torch.randn(batch, capacity, kv_heads, dim, generator=generator, device="cuda")
    values = torch.randn(batch, capacity, kv_heads, dim, generator=generator, device="cuda")
    keys, values = keys.to(dtype), values.to(dtype)
    if page_size is None:
        return keys, values, keys.clone(), values.clone(), None
    pages = capacity // page_size
    total = batch * pages + spare_pages
    ids = torch.randperm(total, generator=generator, device="cuda")[: batch * pages]
    table = ids.reshape(batch, pages).to(torch.int32)
    pool_k = torch.randn(total, page_size, kv_heads, dim, generator=generator,
                         device="cuda").to(dtype)
    pool_v = torch.randn_like(pool_k)
    pool_k[table.long()] = keys.reshape(batch, pages, page_size, kv_heads, dim)
    pool_v[table.long()] = values.reshape(batch, pages, page_size, kv_heads, dim)
    return keys, values, pool_k, pool_v, table


def logical(cache, table, batch):
    """A pool read back through the block table as (B, capacity, H_kv, D)."""
    if table is None:
        return cache
    return cache[table.long()].reshape(batch, -1, *cache.shape[2:])


def run_case(*, batch=3, seqlen_q=1, heads=32, kv_heads=8, dim=128, dtype="bfloat16",
             capacity=1024, lengths=None, new=0, page_size=None, causal=True, num_splits=None,
             return_lse=False, lengths_on_gpu=True, cta_order=None, seed=0):
    import wavefront
    torch = _torch()
    torch_dtype = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    keys, values, k_cache, v_cache, table = make_cache(batch, capacity, kv_heads, dim,
                                                       torch_dtype, page_size, g)
    if lengths is None:
        lengths = torch.randint(0, capacity - new + 1, (batch,), generator=g,
                                device="cuda").tolist()
    q = torch.randn(batch, seqlen_q, heads, dim, generator=g, device="cuda").to(torch_dtype)
    k = v = None
    if new:
        k = torch.randn(batch, new, kv_heads, dim, generator=g, device="cuda").to(torch_dtype)
        v = torch.randn_like(k)
        for b in range(batch):  # the logical cache after the append
            keys[b, lengths[b]:lengths[b] + new] = k[b]
            values[b, lengths[b]:lengths[b] + new] = v[b]
    out = torch.full_like(q, math.nan)
    seqlens = (torch.tensor(lengths, dtype=torch.int32, device="cuda") if lengths_on_gpu
               else list(lengths))
    result = wavefront.attention_with_kvcache(
        q, k_cache, v_cache, seqlens, k=k, v=v, block_table=table, causal=causal,
        num_splits=num_splits, cta_order=cta_order, return_lse=return_lse, out=out)
    torch.cuda.synchronize()
    from wavefront.kernel.kvcache import check_kvcache_flags
    check_kvcache_flags()  # the kernels clamped nothing
    got, lse = result if return_lse else (result, None)
    assert got is out
    assert torch.isfinite(out).all(), "an output element was not written"
    total = [n + new for n in lengths]
    ref, ref_lse = reference(q, keys, values, total, causal, 1.0 / math.sqrt(dim))
    assert _relative(out, ref) < TOLERANCE
    if return_lse:  # (B, H, S_q), FlashAttention's layout
        assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == torch.float32
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        assert torch.allclose(lse[finite], ref_lse[finite], atol=2e-2, rtol=1e-3)
    if new:  # written in place, every other key untouched
        after_k, after_v = logical(k_cache, table, batch), logical(v_cache, table, batch)
        assert torch.equal(after_k, keys) and torch.equal(after_v, values)
    return out


DECODE = list(itertools.product([None, 16, 64, 256], [(32, 8), (8, 8)], [64, 128],
                                ["bfloat16", "float16"]))


@pytest.mark.parametrize("page_size,heads,dim,dtype", DECODE)
def test_decode_matches_reference(page_size, heads, dim, dtype):
    h, kv = heads
    run_case(seqlen_q=1, heads=h, kv_heads=kv, dim=dim, dtype=dtype, page_size=page_size,
             capacity=1024, seed=DECODE.index((page_size, heads, dim, dtype)))


@pytest.mark.parametrize("page_size", [None, 16, 64, 256])
@pytest.mark.parametrize("num_splits", [1, 3, 16, 37])
def test_splits_and_ragged_lengths_including_empty_and_full(page_size, num_splits):
    run_case(batch=4, capacity=2048, lengths=[0, 2048, 1, 1333], page_size=page_size,
             num_splits=num_splits, return_lse=True, seed=100 + num_splits)


@pytest.mark.parametrize("seqlen_q,num_splits", [(1, 5), (2, 3)])
def test_a_group_of_eight_merges_four_splits_a_load(seqlen_q, num_splits):
    """64 query heads over 8: the combine loads 4 splits at a time (8 at a group of 4), the
    last chunk padded; with the LSE."""
    run_case(batch=2, seqlen_q=seqlen_q, heads=64, kv_heads=8, capacity=1024,
             lengths=[1000, 7], num_splits=num_splits, return_lse=True, seed=700 + seqlen_q)


@pytest.mark.parametrize("seqlen_q", [16, 100, 512])
@pytest.mark.parametrize("page_size", [None, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_chunked_prefill_appends_and_attends(seqlen_q, page_size, causal):
    run_case(batch=2, seqlen_q=seqlen_q, new=seqlen_q, capacity=1024, page_size=page_size,
             causal=causal, return_lse=True, seed=200 + seqlen_q)


@pytest.mark.parametrize("page_size", [None, 16, 256])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_appends_one_key(page_size, num_splits):
    run_case(batch=5, new=1, capacity=768, lengths=[0, 5, 767, 300, 64], page_size=page_size,
             num_splits=num_splits, seed=300 + num_splits)


def test_queries_before_the_first_key_see_nothing():
    """8 queries against 3 keys, bottom-right: the first 5 see no key (output 0, LSE -inf)."""
    run_case(batch=1, seqlen_q=8, heads=4, kv_heads=2, capacity=64, lengths=[3],
             return_lse=True, seed=400)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("dim", [64, 128])
def test_host_lengths_group_of_three_and_orders(dtype, dim):
    for i, order in enumerate(("batch_major", "kv_head_major", "prefix_grouped")):
        run_case(batch=3, seqlen_q=3, heads=12, kv_heads=4, dim=dim, dtype=dtype,
                 capacity=512, page_size=64, lengths=[17, 0, 400], lengths_on_gpu=False,
                 cta_order=order, num_splits=2, seed=500 + i)


def test_cupy_arrays_and_a_given_stream():
    cupy = pytest.importorskip("cupy")
    torch = _torch()
    import wavefront
    g = torch.Generator(device="cuda").manual_seed(600)
    q = torch.randn(2, 1, 8, 64, generator=g, device="cuda").to(torch.float16)
    keys = torch.randn(2, 256, 2, 64, generator=g, device="cuda").to(torch.float16)
    values = torch.randn_like(keys)
    lengths = [100, 256]
    ref, _ = reference(q, keys, values, lengths, True, 1 / 8)
    stream = cupy.cuda.Stream(non_blocking=True)
    as_cupy = [cupy.from_dlpack(x) for x in (q, keys, values)]
    seqlens = cupy.asarray(lengths, dtype=cupy.int32)
    # a non-blocking stream waits for neither library's default stream
    cupy.cuda.get_current_stream().synchronize()
    torch.cuda.synchronize()
    out = wavefront.attention_with_kvcache(*as_cupy, seqlens, stream=stream)
    stream.synchronize()
    assert isinstance(out, cupy.ndarray)
    assert _relative(torch.from_dlpack(out), ref) < TOLERANCE


def test_bad_lengths_on_the_gpu_are_clamped_and_raise_on_the_next_check():
    torch = _torch()
    import wavefront
    from wavefront.kernel.kvcache import KVCacheLengthError, check_kvcache_flags
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.bfloat16)
    pool = torch.randn(8, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    table = torch.tensor([[0, 1], [2, 99]], dtype=torch.int32, device="cuda")
    lengths = torch.tensor([-4, 30], dtype=torch.int32, device="cuda")
    out = wavefront.attention_with_kvcache(q, pool, pool, lengths, block_table=table)
    with pytest.raises(KVCacheLengthError, match="cache_seqlens .*block_table"):
        check_kvcache_flags()
    assert torch.isfinite(out).all()  # read within the pool
    check_kvcache_flags()  # raised once
    too_long = torch.tensor([10, 40], dtype=torch.int32, device="cuda")
    k = torch.randn(2, 1, 2, 64, device="cuda", dtype=torch.bfloat16)
    wavefront.attention_with_kvcache(q, pool, pool, too_long, k=k, v=k,
                                     block_table=table[:, :1] * 0 + 3)
    with pytest.raises(KVCacheLengthError, match="appended past"):
        check_kvcache_flags()


def test_bad_host_lengths_raise_before_the_launch():
    torch = _torch()
    import wavefront
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(2, 32, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 33 exceeds"):
        wavefront.attention_with_kvcache(q, cache, cache, [3, 33])
    with pytest.raises(ValueError, match="cache_seqlens on the GPU must be int32"):
        wavefront.attention_with_kvcache(q, cache, cache,
                                         torch.tensor([1, 2], device="cuda"))
