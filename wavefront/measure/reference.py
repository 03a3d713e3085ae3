"""The correctness reference: attention in float32 (or float64) with CuPy."""
from __future__ import annotations

import math


def reference_attention(q, k, v, causal=False, scale=None, dtype="float32", rows=None):
    """Attention in float32 (or float64) with CuPy: the correctness reference. -> (out, lse)

    `rows` (query row indices) restricts the reference to those rows, so long sequences can be
    checked without materialising a seqlen x seqlen score matrix.
    """
    import cupy
    q = cupy.asarray(q)
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
        q_pos = (rows if rows is not None else cupy.arange(sq))[:, None]
        s = cupy.where(cupy.arange(skv)[None, :] <= q_pos, s, -cupy.inf)
    row_max = s.max(axis=-1, keepdims=True)
    p = cupy.exp(s - row_max)
    row_sum = p.sum(axis=-1, keepdims=True)
    out = cupy.matmul(p / row_sum, v)
    lse = (row_max + cupy.log(row_sum))[..., 0]
    return out, lse
