"""PyTorch (GPU): the custom op under torch.compile and a CUDA graph, and the SDPA-shaped entry
point, each against torch's own scaled_dot_product_attention.

    python examples/02_torch.py
"""
import torch
import torch.nn.functional as F

import wavefront.torch as wft

torch.manual_seed(0)
q, k, v = (torch.randn(1, 8, 2048, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)


def relative_error(out):
    return float((out.float() - expected).norm() / expected.norm())


out = wft.scaled_dot_product_attention(q, k, v, is_causal=True)  # drop-in for F.sdpa
print(f"sdpa-shaped call, relative error {relative_error(out):.2e}")

compiled = torch.compile(lambda q, k, v: torch.ops.wavefront.attention(q, k, v, True))
print(f"torch.compile,    relative error {relative_error(compiled(q, k, v)):.2e}")

wft.attention(q, k, v, True)  # a shape's first call compiles and uploads; a capture may not
graph, static_out = torch.cuda.CUDAGraph(), None
with torch.cuda.graph(graph):
    static_out = wft.attention(q, k, v, True)
graph.replay()
torch.cuda.synchronize()
print(f"CUDA graph,       relative error {relative_error(static_out):.2e}")
assert max(relative_error(x) for x in (out, static_out)) < 2e-2
