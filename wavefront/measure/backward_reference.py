"""The backward's reference: attention and its gradients in float64 with NumPy (small shapes).

Written from the softmax's derivative, not from the kernel's tiling, so it checks the
kernel's algebra (P recomputed from the LSE, dS = P (dP - rowsum(dO O)), GQA sums) as well as
its tiles: the tests hold it against torch autograd where torch is installed.
"""
from __future__ import annotations

import math

import numpy as np

from wavefront.schedules import causal_diagonal


def reference_attention_backward(q, k, v, dout, causal=False, scale=None,
                                 causal_alignment="top_left"):
    """-> (out, lse, dq, dk, dv) in float64 for NumPy arrays q (B, H, S_q, D), k, v
    (B, H_kv, S_kv, D), dout like q. `causal_alignment` as `wavefront.attention` takes it
    (query row i sees keys j <= i + `schedules.causal_diagonal`): a row that sees no key
    (bottom-right, S_q > S_kv) has output 0, LSE -inf, dq 0 and adds nothing to dk, dv. dk and
    dv are summed over each K/V head's query heads (GQA)."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    batch, heads, seqlen_q, head_dim = q.shape
    kv_heads, seqlen_kv = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"q heads ({heads}) must be a multiple of k heads ({kv_heads})")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    group = heads // kv_heads
    kr, vr = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, kr) * scale
    if causal:
        diagonal = causal_diagonal(seqlen_q, seqlen_kv, causal_alignment)
        s = np.where(np.arange(seqlen_kv)[None, :] <= np.arange(seqlen_q)[:, None] + diagonal,
                     s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(row_max)
    p = np.exp(s - np.where(seen, row_max, 0))  # a row that sees nothing: all 0
    row_sum = p.sum(axis=-1, keepdims=True)
    p /= np.where(seen, row_sum, 1)
    out = p @ vr
    lse = np.where(seen, row_max + np.log(np.where(seen, row_sum, 1)), -np.inf)[..., 0]
    dv = np.einsum("bhij,bhid->bhjd", p, dout)
    dp = dout @ vr.transpose(0, 1, 3, 2)
    delta = (dout * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    dq = ds @ kr * scale
    dk = np.einsum("bhij,bhid->bhjd", ds, q) * scale

    def per_kv_head(x):  # the query heads of one K/V head, summed
        return x.reshape(batch, kv_heads, group, seqlen_kv, head_dim).sum(axis=2)
    return out, lse, dq, per_kv_head(dk), per_kv_head(dv)
