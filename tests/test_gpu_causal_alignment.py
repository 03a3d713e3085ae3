"""Bottom-right causal masks and checked lengths on the GPU (issue 51, items 1 and 7).

Every result is compared with a float32 torch reference built with an explicit mask,
torch.tril(ones, diagonal) (diagonal seqlen_kv - seqlen_q for bottom-right, 0 for top-left), on
fresh random inputs, with the output poisoned with NaN before the call. Rows that see no key
(bottom-right, seqlen_q > seqlen_kv) must come out exactly 0 with LSE -inf. Seeds are fixed
integers."""
import itertools
import math

import pytest

from wavefront.results.measurement import CORRECTNESS_TOLERANCE as TOLERANCE

pytestmark = pytest.mark.gpu

ALIGNMENTS = ("top_left", "bottom_right")
# (heads, kv_heads, seqlen_q, seqlen_kv): GQA with a chunk of queries against a longer cache,
# MHA with more queries than keys (bottom-right: the first rows see nothing), one query (a
# decode step), equal lengths (both alignments the same)
SHAPES = [(4, 2, 200, 1000), (2, 2, 1000, 333), (4, 1, 1, 777), (2, 2, 333, 333)]
SCHEDULES = ["persistent+sawtooth", "persistent+linear", "dynamic+sawtooth",
             "grouped_dynamic+linear", "grid+tiled", "persistent+tiled_fit_bf16"]


def _inputs(heads, kv_heads, seqlen_q, seqlen_kv, head_dim, seed, batch=2,
            dtype="bfloat16"):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn(batch, heads, seqlen_q, head_dim, device="cuda", generator=g).to(dt)
    k = torch.randn(batch, kv_heads, seqlen_kv, head_dim, device="cuda", generator=g).to(dt)
    v = torch.randn(batch, kv_heads, seqlen_kv, head_dim, device="cuda", generator=g).to(dt)
    return q, k, v


def _reference(q, k, v, alignment, scale=None):
    """float32 attention with the explicit causal mask of `alignment`; rows that see no key:
    output 0, LSE -inf. -> (out, lse), q's layout (batch, heads, seqlen_q, D)."""
    import torch
    sq, skv = q.shape[-2], k.shape[-2]
    rep = q.shape[1] // k.shape[1]
    qf = q.float()
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float().repeat_interleave(rep, dim=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = qf @ kf.transpose(-1, -2) * scale
    allowed = torch.tril(torch.ones(sq, skv, dtype=torch.bool, device=q.device),
                         diagonal=skv - sq if alignment == "bottom_right" else 0)
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    seen = torch.isfinite(m)
    p = torch.exp(s - torch.where(seen, m, torch.zeros_like(m)))
    total = p.sum(dim=-1, keepdim=True)
    out = (p / torch.where(seen, total, torch.ones_like(total))) @ vf
    lse = torch.where(seen, m + torch.log(total), torch.full_like(m, float("-inf")))[..., 0]
    return out, lse


def _error(got, want):
    import torch
    return float(torch.linalg.norm(got.float() - want) / max(float(torch.linalg.norm(want)),
                                                             1e-30))


def _check(out, lse, ref, ref_lse, seqlen_q, seqlen_kv, alignment):
    import torch
    assert not torch.isnan(out).any(), "rows left unwritten"
    assert _error(out, ref) < TOLERANCE
    blind = max(0, seqlen_q - seqlen_kv) if alignment == "bottom_right" else 0
    if blind:
        assert (out[:, :, :blind] == 0).all()
    if lse is not None:
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        assert (lse[:, :, :blind] == float("-inf")).all()
        finite = torch.isfinite(ref_lse)
        assert _error(lse[finite], ref_lse[finite]) < TOLERANCE


CASES = list(itertools.product(SCHEDULES, (64, 128), ALIGNMENTS))


@pytest.mark.parametrize("schedule,head_dim,alignment", CASES)
def test_dense_matches_the_explicitly_masked_reference(schedule, head_dim, alignment):
    import torch

    from wavefront import attention
    for i, (heads, kv_heads, sq, skv) in enumerate(SHAPES):
        q, k, v = _inputs(heads, kv_heads, sq, skv, head_dim,
                          seed=100 * CASES.index((schedule, head_dim, alignment)) + i)
        out = torch.full_like(q, float("nan"))
        got, lse = attention(q, k, v, causal=True, causal_alignment=alignment,
                             schedule=schedule, ctas=7, out=out, return_lse=True,
                             chunk_tiles=2 if "tiled" in schedule else None)
        ref, ref_lse = _reference(q, k, v, alignment)
        _check(got, lse, ref, ref_lse, sq, skv, alignment)


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_the_plan_and_the_tuned_call_take_the_alignment(alignment):
    """A Plan made with the option runs it; the call that chooses nothing but the mask and
    the alignment takes the tuned configuration and is right too (float16 here)."""
    import torch

    import wavefront
    q, k, v = _inputs(8, 2, 512, 2048, 128, seed=7, dtype="float16")
    plan = wavefront.plan(q, k, v, causal=True, causal_alignment=alignment)
    assert plan.options.causal_alignment == alignment
    ref, _ = _reference(q, k, v, alignment)
    out = torch.full_like(q, float("nan"))
    plan.run(q, k, v, out=out)
    assert _error(out, ref) < TOLERANCE
    assert _error(wavefront.attention(q, k, v, causal=True, causal_alignment=alignment),
                  ref) < TOLERANCE


def test_the_torch_op_and_the_sdpa_entry():
    """The op's new argument; the SDPA-shaped entry keeps torch's top-left meaning."""
    import torch
    import torch.nn.functional as F

    import wavefront.torch as wft
    q, k, v = _inputs(4, 2, 300, 900, 64, seed=21)
    out = torch.ops.wavefront.attention(q, k, v, True, None, None, None, "bottom_right")
    assert _error(out, _reference(q, k, v, "bottom_right")[0]) < TOLERANCE
    out = torch.ops.wavefront.attention(q, k, v, True, None, None, None)
    assert _error(out, _reference(q, k, v, "top_left")[0]) < TOLERANCE
    sdpa = wft.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                          enable_gqa=True)
    assert _error(sdpa, want) < TOLERANCE

    @torch.compile(fullgraph=True)
    def compiled(q, k, v):
        return torch.ops.wavefront.attention(q, k, v, True, None, None, None, "bottom_right")
    assert _error(compiled(q, k, v), _reference(q, k, v, "bottom_right")[0]) < TOLERANCE


def test_the_transformers_hook_runs_a_mask_less_short_query_top_left_as_sdpa():
    """With no mask tensor, a query shorter than the key runs top-left, as the torch
    is_causal transformers' SDPA function passes (transformers skips the mask there only at
    the prefill of an empty StaticCache: its empty slots stay unseen); one query sees every
    key."""
    import wavefront.torch as wft

    class Module:
        is_causal = True
    for sq in (7, 1):
        q, k, v = _inputs(4, 2, sq, 600, 128, seed=30 + sq, batch=1)
        out, _ = wft.hf_attention_forward(Module(), q, k, v, None)
        ref, _ = _reference(q, k, v, "top_left" if sq > 1 else "bottom_right")
        assert _error(out.transpose(1, 2), ref) < TOLERANCE


# --------------------------------------------------------------------------------------------
# Packed batches
# --------------------------------------------------------------------------------------------

LENGTHS_Q = (70, 0, 300, 1, 1000, 129)
LENGTHS_K = (200, 0, 100, 64, 1000, 4096)


def _packed(lengths_q, lengths_k, heads, kv_heads, head_dim, seed):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(lengths_q), heads, head_dim, device="cuda", generator=g)
    k = torch.randn(sum(lengths_k), kv_heads, head_dim, device="cuda", generator=g)
    v = torch.randn(sum(lengths_k), kv_heads, head_dim, device="cuda", generator=g)
    bounds_q = [0, *itertools.accumulate(lengths_q)]
    bounds_k = [0, *itertools.accumulate(lengths_k)]
    return (*(x.to(torch.bfloat16) for x in (q, k, v)), bounds_q, bounds_k)


def _check_packed(q, k, v, bounds_q, bounds_k, out, lse, alignment):
    import torch
    assert not torch.isnan(out).any(), "rows left unwritten"
    for s in range(len(bounds_q) - 1):
        rows = slice(bounds_q[s], bounds_q[s + 1])
        keys = slice(bounds_k[s], bounds_k[s + 1])
        if rows.start == rows.stop:
            continue
        seq = [x[i].transpose(0, 1)[None] for x, i in ((q, rows), (k, keys), (v, keys))]
        ref, ref_lse = _reference(*seq, alignment)
        _check(out[rows].transpose(0, 1)[None], lse[:, rows][None], ref, ref_lse,
               rows.stop - rows.start, keys.stop - keys.start, alignment)


@pytest.mark.parametrize("lengths_on", ["host", "gpu"])
@pytest.mark.parametrize("alignment", ALIGNMENTS)
@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "dynamic+linear",
                                      "grouped_dynamic+sawtooth", "longest_first+linear"])
def test_a_packed_batch_aligns_each_sequence_by_its_own_lengths(schedule, alignment,
                                                                lengths_on):
    import torch

    from wavefront import attention_varlen
    q, k, v, bounds_q, bounds_k = _packed(LENGTHS_Q, LENGTHS_K, 4, 2, 64, seed=41)
    cu_q, cu_k = bounds_q, bounds_k
    if lengths_on == "gpu":
        cu_q, cu_k = (torch.tensor(b, dtype=torch.int32, device="cuda")
                      for b in (bounds_q, bounds_k))
    out = torch.full_like(q, float("nan"))
    _, lse = attention_varlen(q, k, v, cu_q, cu_k, max(LENGTHS_Q), max(LENGTHS_K),
                              causal=True, causal_alignment=alignment, schedule=schedule,
                              ctas=7, out=out, return_lse=True)
    _check_packed(q, k, v, bounds_q, bounds_k, out, lse, alignment)


def test_the_varlen_op_takes_the_alignment():
    import torch
    q, k, v, bounds_q, bounds_k = _packed(LENGTHS_Q, LENGTHS_K, 4, 4, 128, seed=43)
    cu_q, cu_k = (torch.tensor(b, dtype=torch.int32, device="cuda")
                  for b in (bounds_q, bounds_k))
    out = torch.ops.wavefront.attention_varlen(q, k, v, cu_q, cu_k, max(LENGTHS_Q),
                                               max(LENGTHS_K), True, None, None, None,
                                               "bottom_right")
    for s in range(len(bounds_q) - 1):
        rows, keys = slice(bounds_q[s], bounds_q[s + 1]), slice(bounds_k[s], bounds_k[s + 1])
        if rows.start == rows.stop:
            continue
        seq = [x[i].transpose(0, 1)[None] for x, i in ((q, rows), (k, keys), (v, keys))]
        assert _error(out[rows].transpose(0, 1)[None], _reference(*seq, "bottom_right")[0]) \
            < TOLERANCE


# --------------------------------------------------------------------------------------------
# Lengths on the GPU: flagged there, raised by a later call (or at once with the switch)
# --------------------------------------------------------------------------------------------

def _gpu_lengths_call(q, k, v, cu_q, cu_k, **options):
    from wavefront import attention_varlen
    return attention_varlen(q, k, v, cu_q, cu_k, causal=True, schedule="persistent+linear",
                            **options)


@pytest.mark.parametrize("bad_q,bad_k,max_q,name", [
    ([0, 100, 50, 300], None, None, "cu_seqlens_q"),  # decreasing
    ([7, 100, 200, 300], None, None, "cu_seqlens_q"),  # not starting at 0
    (None, [0, 100, 200, 10_000_000], None, "cu_seqlens_k"),  # past the packed rows
    (None, None, 50, "max_seqlen_q"),  # a sequence longer than max_seqlen_q
])
def test_malformed_gpu_lengths_raise_on_a_later_call_and_read_nothing_outside(
        bad_q, bad_k, max_q, name):
    import torch
    q, k, v, bounds_q, bounds_k = _packed((100, 100, 100), (100, 100, 100), 2, 2, 64, seed=51)
    good_q, good_k = (torch.tensor(b, dtype=torch.int32, device="cuda")
                      for b in (bounds_q, bounds_k))
    cu_q = good_q if bad_q is None else torch.tensor(bad_q, dtype=torch.int32, device="cuda")
    cu_k = good_k if bad_k is None else torch.tensor(bad_k, dtype=torch.int32, device="cuda")
    _gpu_lengths_call(q, k, v, cu_q, cu_k, max_seqlen_q=max_q)  # flags, does not wait
    torch.cuda.synchronize()  # no illegal address: the offsets were clamped to the arrays
    with pytest.raises(ValueError, match=name):
        _gpu_lengths_call(q, k, v, good_q, good_k)
    # the flag was cleared: the next call runs, and is right
    out, lse = _gpu_lengths_call(q, k, v, good_q, good_k, return_lse=True)
    _check_packed(q, k, v, bounds_q, bounds_k, out, lse, "top_left")


def test_the_debug_switch_raises_in_the_call_that_passes_them(monkeypatch):
    import torch

    import wavefront.kernel.varlen as varlen
    monkeypatch.setattr(varlen, "CHECK_LENGTHS", True)
    q, k, v, bounds_q, bounds_k = _packed((100, 100, 100), (100, 100, 100), 2, 2, 64, seed=53)
    cu_q, cu_k = (torch.tensor(b, dtype=torch.int32, device="cuda")
                  for b in (bounds_q, bounds_k))
    _gpu_lengths_call(q, k, v, cu_q, cu_k, max_seqlen_k=100)
    bad = torch.tensor([0, 150, 100, 300], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="cu_seqlens_k must start at 0, never decrease"):
        _gpu_lengths_call(q, k, v, cu_q, bad)
    with pytest.raises(ValueError, match="max_seqlen_k must be at least"):
        _gpu_lengths_call(q, k, v, cu_q, cu_k, max_seqlen_k=99)
    _gpu_lengths_call(q, k, v, cu_q, cu_k)


def test_the_check_never_waits_for_the_gpu():
    """The hot path: with the GPU busy, calls with new lengths on the GPU (good or malformed)
    return at once, the flag's copy queued behind the work; nothing is raised across calls
    with good lengths, and the malformed call's flag is raised once the GPU got there."""
    import time

    import torch
    q, k, v, _, _ = _packed((100, 100, 100), (100, 100, 100), 2, 2, 64, seed=55)
    cu = torch.tensor([0, 100, 200, 300], dtype=torch.int32, device="cuda")
    _gpu_lengths_call(q, k, v, cu, cu)
    # made before the GPU is busy (a copy from pageable host memory may wait for it)
    lengths = [torch.tensor([0, 10 + step * 7, 200, 300], dtype=torch.int32, device="cuda")
               for step in range(20)]
    bad = torch.tensor([0, 200, 100, 300], dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # about 0.2 s of GPU cycles on the caller's stream
    began = time.perf_counter()
    for cu in lengths:
        _gpu_lengths_call(q, k, v, cu, cu)
    _gpu_lengths_call(q, k, v, bad, cu)
    host_s = time.perf_counter() - began
    assert host_s < 0.1, f"the calls waited for the GPU: {host_s * 1e3:.1f} ms"
    torch.cuda.synchronize()
    _gpu_lengths_call(q, k, v, cu, cu)  # reads the copy queued before the malformed call
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        _gpu_lengths_call(q, k, v, cu, cu)
