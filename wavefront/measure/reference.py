"""The correctness reference: attention in float32 (or float64) with CuPy."""
from __future__ import annotations

import math


def reference_attention(q, k, v, causal=False, scale=None, dtype="float32", rows=None,
                        causal_alignment="top_left"):
    """Attention in float32 (or float64) with CuPy: the correctness reference. -> (out, lse)

    `rows` (query row indices) restricts the reference to those rows, so long sequences can be
    checked without materialising a seqlen x seqlen score matrix. `causal_alignment`: as
    `wavefront.attention` takes it; a row that sees no key gives output 0 and LSE -inf.
    """
    import cupy
    q = cupy.asarray(q)
    q_rows = q.shape[2]  # the whole query's length (the causal diagonal's)
    if rows is not None:
        rows = cupy.asarray(rows)
        q = q[:, :, rows]
    q = q.astype(dtype)
    k = cupy.asarray(k).astype(dtype)
    v = cupy.asarray(v).astype(dtype)
    b, h, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    rep = h // hkv
    k = cupy.repeat(k, rep, axis=1)
    v = cupy.repeat(v, rep, axis=1)
    s = cupy.matmul(q, k.transpose(0, 1, 3, 2)) * scale
    if causal:
        from wavefront.schedules import causal_diagonal
        q_pos = (rows if rows is not None else cupy.arange(sq))[:, None]
        q_pos = q_pos + causal_diagonal(q_rows, skv, causal_alignment)
        s = cupy.where(cupy.arange(skv)[None, :] <= q_pos, s, -cupy.inf)
    row_max = s.max(axis=-1, keepdims=True)
    seen = cupy.isfinite(row_max)
    p = cupy.exp(s - cupy.where(seen, row_max, 0))
    row_sum = p.sum(axis=-1, keepdims=True)
    out = cupy.matmul(p / cupy.where(seen, row_sum, 1), v)
    lse = cupy.where(seen, row_max + cupy.log(cupy.where(seen, row_sum, 1)), -cupy.inf)[..., 0]
    return out, lse
