"""A packed batch of sequences of different lengths (GPU): FlashAttention's varlen layout,
one call for all of them, checked sequence by sequence against the dense call.

    python examples/03_varlen.py
"""
import cupy as cp

import wavefront

lengths = [700, 64, 3000, 1]
cu_seqlens = [0]
for n in lengths:  # a host list: the work table is built on the host, once per lengths
    cu_seqlens.append(cu_seqlens[-1] + n)
rng = cp.random.default_rng(0)
# packed: (total tokens, heads, head_dim)
q, k, v = (rng.standard_normal((sum(lengths), 8, 64), dtype=cp.float32).astype(cp.float16)
           for _ in range(3))

out = wavefront.attention_varlen(q, k, v, cu_seqlens, cu_seqlens, causal=True)

for i, n in enumerate(lengths):  # each sequence alone, as a dense batch of one
    s = slice(cu_seqlens[i], cu_seqlens[i + 1])
    dense = [cp.ascontiguousarray(x[s].transpose(1, 0, 2)[None]) for x in (q, k, v)]
    alone = wavefront.attention(*dense, causal=True)[0].transpose(1, 0, 2)  # (n, heads, D)
    error = float(cp.abs(out[s].astype(cp.float32) - alone.astype(cp.float32)).max())
    print(f"sequence {i} ({n} tokens): max difference from the dense call {error:.1e}")
    assert error < 1e-2
