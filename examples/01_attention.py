"""The public call on CuPy arrays (GPU): make the inputs, hold the Plan the call runs, run it,
and check the output against a float32 reference.

    python examples/01_attention.py

The first call of a shape compiles the kernel (seconds; cuTile keeps it on disk for the next
process) and builds its work table; later calls of the same shape reuse both.
"""
import cupy as cp

import wavefront

rng = cp.random.default_rng(0)
q = rng.standard_normal((2, 16, 4096, 128), dtype=cp.float32).astype(cp.float16)
k = rng.standard_normal((2, 4, 4096, 128), dtype=cp.float32).astype(cp.float16)  # GQA: 4 K/V heads
v = rng.standard_normal((2, 4, 4096, 128), dtype=cp.float32).astype(cp.float16)

plan = wavefront.plan(q, k, v, causal=True)  # schedule, tiles, CTAs, predicted DRAM bytes
print(plan)
out = plan.run(q, k, v)                      # what wavefront.attention(q, k, v, causal=True) runs
same = wavefront.attention(q, k, v, causal=True)

reference, _ = wavefront.reference_attention(q, k, v, causal=True)  # float32, and its LSE
error = float(cp.linalg.norm(out.astype(cp.float32) - reference) / cp.linalg.norm(reference))
print(f"relative error against float32: {error:.2e}")
assert error < 2e-2 and bool((out == same).all())
