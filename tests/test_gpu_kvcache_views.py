"""The cache call on transformers' layout: q, k and v handed over as (B, S, heads, D) views of
(B, heads, S, D) tensors (transposes, no copy), as `wavefront.serving` hands a StaticCache's
prefill and decode steps over: S_q from 1 to 100 against a cache longer than its valid keys,
GQA at D128 (H32 KV8) and at the D64 of tests/test_gpu_serving.py's Llama (H8 KV2), against
the float32 reference of tests/test_gpu_kvcache.py on fresh random inputs."""
import pytest

from test_gpu_kvcache import _relative, reference
from wavefront.results.measurement import CORRECTNESS_TOLERANCE as TOLERANCE

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dim,heads,kv_heads", [(128, 32, 8), (64, 8, 2)])
@pytest.mark.parametrize("seqlen_q", [1, 7, 100])
@pytest.mark.parametrize("contiguous_q", [False, True])
def test_transposed_views_as_transformers_hands_them(seqlen_q, contiguous_q, dim, heads,
                                                     kv_heads):
    torch = pytest.importorskip("torch")
    import wavefront
    g = torch.Generator(device="cuda").manual_seed(seqlen_q)
    batch, capacity = 2, 148
    lengths = torch.tensor([100, 117], dtype=torch.int32, device="cuda")
    q_bhsd = torch.randn(batch, heads, seqlen_q, dim, generator=g, device="cuda").bfloat16()
    k_bhsd = torch.randn(batch, kv_heads, capacity, dim, generator=g, device="cuda").bfloat16()
    v_bhsd = torch.randn(batch, kv_heads, capacity, dim, generator=g, device="cuda").bfloat16()
    q = q_bhsd.transpose(1, 2)
    if contiguous_q:
        q = q.contiguous()
    k, v = k_bhsd.transpose(1, 2), v_bhsd.transpose(1, 2)
    out = wavefront.attention_with_kvcache(q, k, v, lengths, causal=True)
    ref, _ = reference(q, k, v, lengths.cpu(), True, dim ** -0.5)
    assert out.shape == (batch, seqlen_q, heads, dim)
    assert _relative(out, ref) < TOLERANCE
