"""The backward of a bottom-right causal mask on the GPU (FlashAttention >= 2.1's: query row i
sees keys j <= i + S_kv - S_q), dense and packed, every named config, the torch autograd
path: dQ, dK, dV against the project's float64 reference (`measure.backward_reference`,
with the same alignment) on fresh random inputs, gradient memory poisoned with NaN before each
call. With S_q > S_kv the first S_q - S_kv query rows see no key: their dQ must be exactly 0
and they must add nothing to dK, dV (which the reference's sums check). The bound: 2e-2 of the
reference's norm, or 3x what torch's own low-precision autograd of the explicitly masked
softmax makes on the same inputs, if larger (as tests/test_gpu_backward.py)."""
import itertools

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from test_gpu_backward import TOLERANCE, _error, _inputs, _poison  # noqa: E402

from wavefront.backward_schedules import BACKWARD_CONFIGS  # noqa: E402
from wavefront.measure.backward_reference import reference_attention_backward  # noqa: E402

ALIGNMENT = "bottom_right"
# (heads, kv_heads, seqlen_q, seqlen_kv): a chunk of queries against a longer cache (GQA),
# more queries than keys (the first 317 rows see nothing), equal ragged lengths, one query
SHAPES = [(4, 2, 200, 517), (4, 2, 517, 200), (3, 3, 333, 333), (4, 1, 1, 300)]


def _blind(seqlen_q, seqlen_kv) -> int:
    """Query rows that see no key under the bottom-right mask."""
    return max(0, seqlen_q - seqlen_kv)


def _torch_lowp(q, k, v, do):
    """torch autograd in q's dtype of the explicitly masked softmax (rows that see no key
    zeroed after it): the rounding a low-precision backward makes here."""
    sq, skv = q.shape[-2], k.shape[-2]
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(rep, 1).transpose(-1, -2) / q.shape[-1] ** 0.5
    allowed = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(skv - sq)
    seen = allowed.any(-1, keepdim=True)
    s = s.masked_fill(~allowed, float("-inf")).masked_fill(~seen, 0.0)
    out = (torch.softmax(s, -1) * seen) @ v.repeat_interleave(rep, 1)
    out.backward(do)
    return q.grad, k.grad, v.grad


def _check(q, k, v, do, grads, blind):
    """grads (dq, dk, dv), (batch, heads, seqlen, D), against the float64 reference."""
    *_, dq, dk, dv = reference_attention_backward(
        *(x.float().cpu().numpy() for x in (q, k, v, do)), causal=True,
        causal_alignment=ALIGNMENT)
    lowp = _torch_lowp(q, k, v, do)
    for name, got, want, theirs in zip(("dq", "dk", "dv"), grads, (dq, dk, dv), lowp):
        assert got.shape == want.shape and got.dtype == q.dtype, name
        want = torch.from_numpy(want).to(got.device)
        bound = max(TOLERANCE, 3 * _error(theirs, want))
        assert _error(got, want) < bound, name
    assert (grads[0][:, :, :blind] == 0).all(), "a row that sees no key got a gradient"


def _run(q, k, v, do, **options):
    import wavefront
    from wavefront.kernel.backward_call import attention_backward
    # one forward binary per head dim (a fixed schedule, default tiles: not the tuned table's
    # choice per shape), so that the run compiles little besides the backward's binaries
    out, lse = wavefront.attention(q, k, v, causal=True, causal_alignment=ALIGNMENT,
                                   return_lse=True, schedule="persistent+linear")
    _poison(q, k, v, q)
    grads = attention_backward(q, k, v, out, lse, do, causal=True, causal_alignment=ALIGNMENT,
                               **options)
    torch.cuda.synchronize()
    return grads


CASES = list(itertools.product(SHAPES, [64, 128], [True, False]))


@pytest.mark.parametrize("shape,head_dim,deterministic", CASES)
def test_dense_gradients(shape, head_dim, deterministic):
    """The default config, both dQ modes, D64 and D128, GQA, 7 CTAs (several items each)."""
    heads, kv_heads, sq, skv = shape
    q, k, v, do = _inputs(300 + CASES.index((shape, head_dim, deterministic)), 2, heads,
                          kv_heads, sq, skv, head_dim, torch.bfloat16)
    _check(q, k, v, do, _run(q, k, v, do, deterministic=deterministic, ctas=7),
           _blind(sq, skv))


@pytest.mark.parametrize("schedule", ["persistent+sawtooth", "grouped+linear",
                                      "longest_first+sawtooth", "grid+linear"])
def test_every_cta_order_and_q_scan(schedule):
    """The schedules share the binaries (their work tables differ): each one's table carries
    the diagonal and the spans."""
    q, k, v, do = _inputs(320, 2, 8, 2, 400, 250, 64, torch.bfloat16)
    for deterministic in (True, False):
        _check(q, k, v, do, _run(q, k, v, do, schedule=schedule, deterministic=deterministic,
                                 ctas=5), _blind(400, 250))


@pytest.mark.parametrize("config", sorted(BACKWARD_CONFIGS))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_named_configs(config, head_dim):
    """Every named config (`BACKWARD_CONFIGS`), both dQ modes, GQA, S_q on either side of
    S_kv; the deterministic mode bit for bit across two runs."""
    for seed, (sq, skv) in enumerate([(300, 700), (700, 300)]):
        q, k, v, do = _inputs(330 + seed, 1, 4, 2, sq, skv, head_dim, torch.bfloat16)
        first = _run(q, k, v, do, config=config, ctas=7)
        _check(q, k, v, do, first, _blind(sq, skv))
        again = _run(q, k, v, do, config=config, ctas=7)
        for a, b in zip(first, again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        _check(q, k, v, do, _run(q, k, v, do, config=config, deterministic=False, ctas=7),
               _blind(sq, skv))


# --------------------------------------------------------------------------------------------
# Packed variable-length batches: each sequence aligned by its own lengths
# --------------------------------------------------------------------------------------------

# more keys, none, fewer, keys and no queries (dK, dV written 0), one query, equal, more,
# fewer (83 rows see nothing)
LENGTHS_Q = (70, 0, 300, 0, 1, 333, 129, 90)
LENGTHS_K = (200, 0, 100, 50, 64, 333, 400, 7)


def _packed(seed, heads, kv_heads, head_dim):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(rows, h):
        return torch.randn(rows, h, head_dim, device="cuda", generator=g).to(torch.bfloat16)
    q, do = randn(sum(LENGTHS_Q), heads), randn(sum(LENGTHS_Q), heads)
    k, v = randn(sum(LENGTHS_K), kv_heads), randn(sum(LENGTHS_K), kv_heads)
    bounds_q = [0, *itertools.accumulate(LENGTHS_Q)]
    bounds_k = [0, *itertools.accumulate(LENGTHS_K)]
    return q, k, v, do, bounds_q, bounds_k


def _check_packed(q, k, v, do, bounds_q, bounds_k, grads):
    """Each sequence's float64 reference, packed back, against the packed gradients (a
    sequence with keys and no queries: dK, dV exactly 0); each sequence's blind rows' dQ 0."""
    want = [np.zeros(x.shape) for x in (q, k, v)]
    for s in range(len(bounds_q) - 1):
        rows, keys = slice(bounds_q[s], bounds_q[s + 1]), slice(bounds_k[s], bounds_k[s + 1])
        if rows.start == rows.stop:
            for g in grads[1:]:
                assert (g[keys] == 0).all()
            continue
        seq = [x[i].transpose(0, 1)[None].float().cpu().numpy()
               for x, i in ((q, rows), (k, keys), (v, keys), (do, rows))]
        *_, dq, dk, dv = reference_attention_backward(*seq, causal=True,
                                                      causal_alignment=ALIGNMENT)
        for w, r, where in zip(want, (dq, dk, dv), (rows, keys, keys)):
            w[where] = r[0].transpose(1, 0, 2)
        blind = _blind(rows.stop - rows.start, keys.stop - keys.start)
        assert (grads[0][rows.start:rows.start + blind] == 0).all()
    for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
        assert got.shape == ref.shape, name
        assert _error(got, torch.from_numpy(ref).to(got.device)) < TOLERANCE, name


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("schedule", ["persistent+linear", "longest_first+sawtooth"])
def test_varlen_gradients(schedule, head_dim, deterministic):
    import wavefront
    q, k, v, do, bounds_q, bounds_k = _packed(340, 4, 2, head_dim)
    out, lse = wavefront.attention_varlen(q, k, v, bounds_q, bounds_k, causal=True,
                                          causal_alignment=ALIGNMENT, return_lse=True)
    _poison(q, k, v, q)
    grads = wavefront.attention_backward_varlen(q, k, v, out, lse, do, bounds_q, bounds_k,
                                                causal=True, causal_alignment=ALIGNMENT,
                                                schedule=schedule,
                                                deterministic=deterministic)
    torch.cuda.synchronize()
    _check_packed(q, k, v, do, bounds_q, bounds_k, grads)


# --------------------------------------------------------------------------------------------
# PyTorch: the ops' autograd (once refused for this mask), eager and compiled
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["op", "op_lse"])
@pytest.mark.parametrize("seqlens", [(200, 517), (517, 200)])
def test_torch_autograd(entry, seqlens):
    """`wavefront::attention` (its formula recomputes the LSE) and `attention_fwd_lse` (the
    forward that keeps it, as the SDPA entry runs when training) with "bottom_right"."""
    import wavefront.torch  # noqa: F401  (registers the ops)
    sq, skv = seqlens
    q, k, v, do = _inputs(350 + sq, 2, 4, 2, sq, skv, 64, torch.bfloat16)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    if entry == "op":
        out = torch.ops.wavefront.attention(*leaves, True, None, None, None, ALIGNMENT)
    else:
        out = torch.ops.wavefront.attention_fwd_lse(*leaves, True, None, None, None,
                                                    ALIGNMENT)[0]
    out.backward(do)
    _check(q, k, v, do, [x.grad for x in leaves], _blind(sq, skv))


def test_torch_compile_with_gradients_matches_eager():
    """The op compiled (fullgraph: no graph break) on inputs that require grad, its backward
    through AOTAutograd's graph: the gradients equal eager's bit for bit (the same kernels,
    deterministic dQ)."""
    import wavefront.torch  # noqa: F401
    q, k, v, do = _inputs(360, 1, 4, 2, 300, 450, 128, torch.bfloat16)

    def attend(q, k, v):
        return torch.ops.wavefront.attention(q, k, v, True, None, None, None, ALIGNMENT)
    grads = {}
    for mode, forward in (("eager", attend), ("compiled", torch.compile(attend,
                                                                         fullgraph=True))):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        forward(*leaves).backward(do)
        grads[mode] = [x.grad for x in leaves]
    torch._dynamo.reset()
    for a, b in zip(grads["eager"], grads["compiled"]):
        assert torch.equal(a, b)
    _check(q, k, v, do, grads["eager"], 0)


def test_varlen_op_autograd():
    import wavefront.torch  # noqa: F401
    q, k, v, do, bounds_q, bounds_k = _packed(370, 4, 2, 64)
    cu_q, cu_k = (torch.tensor(b, dtype=torch.int32, device="cuda")
                  for b in (bounds_q, bounds_k))
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = torch.ops.wavefront.attention_varlen(*leaves, cu_q, cu_k, max(LENGTHS_Q),
                                               max(LENGTHS_K), True, None, None, None,
                                               ALIGNMENT)
    out.backward(do)
    _check_packed(q, k, v, do, bounds_q, bounds_k, [x.grad for x in leaves])
