"""The first calls of a process with new varlen lengths, the GPU busy (GPU host): does a call
wait for queued GPU work while CuPy's pools grow? One call compiles and builds a first table,
then five calls bring new lengths (16, 64, 256, 16, 64 sequences of the same tokens), each
behind a 200 ms sleep kernel queued on the caller's stream; prints each call's host ms. Run it
in several fresh processes.

    python scripts/varlen_first_calls.py [--causal]
"""
import sys
import time

import torch

from wavefront.kernel.launcher import attention_varlen
from wavefront.measure.varlen_bench import long_tailed_lengths

T, H, KV, D = 65536, 32, 8, 128
causal = "--causal" in sys.argv
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(T, KV, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))


def bounds(seed, n=16):
    b = [0]
    for x in long_tailed_lengths(n, T, seed=seed):
        b.append(b[-1] + int(x))
    return b


attention_varlen(q, k, v, bounds(0), bounds(0), causal=causal)  # compile, first table
torch.cuda.synchronize()
start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
torch.cuda._sleep(10_000_000)  # cycles: calibrated to ms on this GPU
stop.record()
stop.synchronize()
cycles = int(200 / start.elapsed_time(stop) * 10_000_000)
out = []
for i, n in enumerate((16, 64, 256, 16, 64)):
    batch = bounds(100 + i, n)
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    t = time.perf_counter()
    attention_varlen(q, k, v, batch, batch, causal=causal)
    out.append(f"{n} seqs: {(time.perf_counter() - t) * 1e3:.2f} ms")
torch.cuda.synchronize()
print(f"fresh process, GPU busy (200 ms queued){', causal' if causal else ''}:", "; ".join(out))
