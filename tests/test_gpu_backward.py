"""The backward on the GPU: gradients against float32 torch autograd on fresh random inputs
(ragged lengths, GQA, both masks, D=64/128, bf16/fp16, every backward schedule), gradient
memory poisoned with NaN before each call (the caching allocator hands the freed blocks
back), the deterministic mode bit for bit across runs."""
import itertools

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from wavefront.backward_schedules import (  # noqa: E402
    BACKWARD_CTA_SCHEDULES,
    BACKWARD_SCANS,
    BACKWARD_TILE_SHAPES,
)

# bf16 gradients of a float32 reference: the kernel's error must stay within the tolerance,
# or within 3x what torch's own low-precision SDPA backward makes on the same inputs.
TOLERANCE = 2e-2


def _inputs(seed, batch, heads, kv_heads, seqlen_q, seqlen_kv, head_dim, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)
    q = randn(batch, heads, seqlen_q, head_dim)
    k = randn(batch, kv_heads, seqlen_kv, head_dim)
    v = randn(batch, kv_heads, seqlen_kv, head_dim)
    do = randn(batch, heads, seqlen_q, head_dim)
    return q, k, v, do


def _reference_grads(q, k, v, do, causal, dtype=torch.float32):
    """torch autograd of float32 attention (top-left causal), GQA through repeat_interleave (so
    dk, dv are summed over each K/V head's query heads)."""
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(rep, 1).transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device="cuda").tril()
        s = s.masked_fill(~mask, float("-inf"))
    out = torch.softmax(s, -1) @ v.repeat_interleave(rep, 1)
    out.backward(do.to(dtype))
    return q.grad, k.grad, v.grad


def _poison(*shapes_like):
    for x in shapes_like:
        torch.full_like(x, float("nan"))  # freed at once: the next gradient's block


def _error(got, want):
    assert torch.isfinite(got).all(), "gradient elements left unwritten or NaN"
    return float((got.float() - want.float()).norm() / want.float().norm())


def _run(q, k, v, do, causal, **options):
    import wavefront
    from wavefront.kernel.backward_call import attention_backward
    out, lse = wavefront.attention(q, k, v, causal=causal, return_lse=True)
    _poison(q, k, v, q)
    grads = attention_backward(q, k, v, out, lse, do, causal=causal, **options)
    torch.cuda.synchronize()
    return grads


def _check(q, k, v, do, causal, grads):
    want = _reference_grads(q, k, v, do, causal)
    lowp = _reference_grads(q, k, v, do, causal, dtype=q.dtype)  # torch's own rounding
    for name, got, ref, theirs in zip(("dq", "dk", "dv"), grads, want, lowp):
        assert got.shape == ref.shape and got.dtype == q.dtype, name
        bound = max(TOLERANCE, 3 * _error(theirs, ref))
        assert _error(got, ref) < bound, name


CASES = list(itertools.product([False, True], [64, 128], ["bfloat16", "float16"],
                               [(4, 2), (3, 3)], [False, True]))


@pytest.mark.parametrize("causal,head_dim,dtype,heads,deterministic", CASES)
def test_gradients_match_autograd(causal, head_dim, dtype, heads, deterministic):
    # 333 is ragged for every tile shape; 7 CTAs give each persistent CTA several items.
    h, hkv = heads
    q, k, v, do = _inputs(100 + CASES.index((causal, head_dim, dtype, heads, deterministic)),
                          2, h, hkv, 333, 333, head_dim, getattr(torch, dtype))
    grads = _run(q, k, v, do, causal, deterministic=deterministic, ctas=7)
    _check(q, k, v, do, causal, grads)


@pytest.mark.parametrize("schedule", [f"{c}+{s}" for c in BACKWARD_CTA_SCHEDULES
                                      for s in BACKWARD_SCANS])
@pytest.mark.parametrize("causal", [False, True])
def test_every_backward_schedule(schedule, causal):
    q, k, v, do = _inputs(7, 2, 8, 2, 517, 517, 64, torch.bfloat16)
    grads = _run(q, k, v, do, causal, schedule=schedule, ctas=5)
    _check(q, k, v, do, causal, grads)


@pytest.mark.parametrize("tiles", ["%dx%d" % t for t in BACKWARD_TILE_SHAPES])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tile_shapes(tiles, head_dim):
    q, k, v, do = _inputs(8, 1, 4, 1, 300, 300, head_dim, torch.bfloat16)
    grads = _run(q, k, v, do, True, tiles=tiles, schedule="persistent+sawtooth", ctas=3)
    _check(q, k, v, do, True, grads)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [(200, 333), (333, 200)])
def test_query_and_key_lengths_differ(causal, lengths):
    q, k, v, do = _inputs(9, 1, 4, 2, *lengths, 64, torch.bfloat16)
    for deterministic in (False, True):
        grads = _run(q, k, v, do, causal, deterministic=deterministic, ctas=4)
        _check(q, k, v, do, causal, grads)


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_mode_is_bit_identical_across_runs(causal):
    q, k, v, do = _inputs(10, 2, 8, 2, 1000, 1000, 128, torch.bfloat16)
    first = _run(q, k, v, do, causal, deterministic=True)
    second = _run(q, k, v, do, causal, deterministic=True)
    for a, b in zip(first, second):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    _check(q, k, v, do, causal, first)
    # the atomic mode writes dK and dV once too: only its dQ's sum order varies
    atomic = _run(q, k, v, do, causal, deterministic=False)
    for a, b in zip(first[1:], atomic[1:]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_public_call_and_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    import wavefront
    q, k, v, do = _inputs(11, 1, 2, 2, 256, 256, 64, torch.bfloat16)
    out, lse = wavefront.attention(q, k, v, return_lse=True)
    grads = wavefront.attention_backward(q, k, v, out, lse, do)
    torch.cuda.synchronize()
    _check(q, k, v, do, False, grads)
    as_cupy = [cupy.from_dlpack(x) for x in (q, k, v, out, lse, do)]
    cupy_grads = wavefront.attention_backward(*as_cupy, deterministic=True)
    cupy.cuda.get_current_stream().synchronize()
    assert all(isinstance(g, cupy.ndarray) for g in cupy_grads)
    _check(q, k, v, do, False, [torch.from_dlpack(g) for g in cupy_grads])


def test_bad_arguments_are_named():
    import wavefront
    q, k, v, do = _inputs(12, 1, 2, 2, 64, 64, 64, torch.bfloat16)
    out, lse = wavefront.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="dout"):
        wavefront.attention_backward(q, k, v, out, lse, do[:, :1])
    with pytest.raises(ValueError, match="lse"):
        wavefront.attention_backward(q, k, v, out, lse.to(torch.bfloat16), do)
    with pytest.raises(ValueError, match="schedule"):
        wavefront.attention_backward(q, k, v, out, lse, do, schedule="dynamic+linear")
    with pytest.raises(ValueError, match="tiles"):
        wavefront.attention_backward(q, k, v, out, lse, do, tiles="32x32")
