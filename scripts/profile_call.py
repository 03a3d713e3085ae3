"""Where the public call's host time goes (GPU host): each piece timed alone, median of
batches of 200 calls, then a cProfile of the whole call.

    python scripts/profile_call.py
"""
import cProfile
import functools
import operator
import pstats
import time

import cupy
import torch

import wavefront
from launch_cost import Described, per_call_us
from wavefront.kernel import launcher as L
from wavefront.point import LEVERS


q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16)
k, v = torch.randn_like(q), torch.randn_like(q)
wavefront.attention(q, k, v)
# the options tuple the public call keys on: its 9 options, then every lever unset
OPTIONS = (False, None, None, None, None, False, None, None, None) + (None,) * len(LEVERS)
launcher = next(iter(L._launchers.values()))
out = torch.empty_like(q)
stream = torch.cuda.current_stream()
cq, ck, cv, cout = (cupy.from_dlpack(x) for x in (q, k, v, out))
cstream = cupy.cuda.get_current_stream()
rows = {
    "wavefront.attention (public call)": lambda: wavefront.attention(q, k, v),
    "kernel.launcher.attention": lambda: L.attention(q, k, v),
    "_call_key": lambda: L._call_key(q, k, v, OPTIONS),
    "_call_key + cache read": lambda: L._launchers.get(L._call_key(q, k, v, OPTIONS)),
    "torch.empty": lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device),
    "q.new_empty(tuple)": lambda: q.new_empty(launcher.view.shape),
    "torch.empty_like(q)": lambda: torch.empty_like(q),
    "launcher.current_stream()": launcher.current_stream,
    "torch.cuda.current_stream(device)": lambda: torch.cuda.current_stream(q.device),
    "bound launcher, torch arrays": lambda: launcher(q, k, v, out, stream),
    "bound launcher, cupy arrays (ct.launch)": lambda: launcher(cq, ck, cv, cout, cstream),
    "cudnn via SDPA (sdpa_kernel ctx)": None,
}
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402


def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        sdpa(q, k, v)


rows["cudnn via SDPA (sdpa_kernel ctx)"] = cudnn
rows["SDPA default dispatch"] = lambda: sdpa(q, k, v)
for name, fn in rows.items():
    fn()
    print(f"{name:40s} {per_call_us(fn):7.1f} us")

# The prepared launch's pieces (the launcher prepares on its PREPARE_AFTER_LAUNCHES-th launch).
for _ in range(L.PREPARE_AFTER_LAUNCHES + 1):
    wavefront.attention(q, k, v)
torch.cuda.synchronize()
raw = torch._C._cuda_getCurrentRawStream(0)
prepared = launcher._prepared
lse_arg = launcher._lse_argument
addresses = launcher._addresses(q, k, v, out, lse_arg)
pieces = {
    "launcher.capturing(raw stream)": lambda: launcher.capturing(raw),
    "launcher._addresses (5 data_ptr)": lambda: launcher._addresses(q, k, v, out, lse_arg),
    "prepared.launch(raw, addresses)": lambda: prepared.launch(raw, addresses),
    "  its alignment test": lambda: functools.reduce(operator.or_, addresses) & prepared._mask,
    "  its buffer write": lambda: prepared._addresses.__setitem__(slice(None), addresses),
    "  cuLaunchKernel (CuPy) alone": lambda: prepared._launch(
        prepared.function, *prepared.grid, 1, 1, 1, 0, raw, prepared._buffer_address, 0),
    "bound launcher, prepared, torch, raw": lambda: launcher(q, k, v, out, raw),
    "  the same, vouched (no layout check)": lambda: launcher(q, k, v, out, raw, None, True),
}
print(f"prepared: {launcher.launches_prepared}")
for name, fn in pieces.items():
    fn()
    print(f"{name:40s} {per_call_us(fn):7.1f} us")
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(2000):
    wavefront.attention(q, k, v)
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(14)

# The first call of a new shape (kernel compiled already): where its host time goes.
from wavefront.kernel.launcher import clear_launcher_cache  # noqa: E402

big_q = torch.randn(4, 32, 98304 // 4, 128, device="cuda", dtype=torch.bfloat16)
for causal in (False, True):
    wavefront.attention(big_q, big_q, big_q, causal=causal)
    torch.cuda.synchronize()
    clear_launcher_cache()
    prof = cProfile.Profile()
    began = time.perf_counter()
    prof.enable()
    wavefront.attention(big_q, big_q, big_q, causal=causal)
    prof.disable()
    print(f"first call causal={causal}: {(time.perf_counter() - began) * 1e3:.2f} ms "
          "(under cProfile)")
    torch.cuda.synchronize()
    # In microseconds: print_stats rounds to milliseconds, the size of the whole call.
    stats = pstats.Stats(prof).stats
    for (path, line, name), (_, calls, own, total, _) in sorted(
            stats.items(), key=lambda kv: -kv[1][2])[:25]:
        print(f"  own {own * 1e6:8.1f} us  total {total * 1e6:8.1f} us  x{calls:<4d} "
              f"{path.split('/')[-1]}:{line} {name}")

# The launch alone, fresh vs reused output, torch vs CuPy arrays: what ct.launch costs per array.
fresh = lambda: launcher(q, k, v, torch.empty_like(q), torch._C._cuda_getCurrentRawStream(0))  # noqa: E731
print(f"{'bound launcher, torch, fresh out':40s} {per_call_us(fresh):7.1f} us")
raw = torch._C._cuda_getCurrentRawStream(0)
print(f"{'bound launcher, torch, raw stream':40s} "
      f"{per_call_us(lambda: launcher(q, k, v, out, raw)):7.1f} us")
print(f"{'torch._C._to_dlpack x5':40s} "
      f"{per_call_us(lambda: [torch._C._to_dlpack(x) for x in (q, k, v, out, out)]):7.1f} us")

# What ct.launch costs by the kind of object each argument is. The launcher's own buffers (the
# work table, the counters, the stand-ins) are the same on every call: made by CuPy, by torch,
# or wrapped in an object whose CUDA Array Interface is a plain attribute (nothing built per
# call).


def own_buffers_as(bound, wrap):
    """`bound`'s own arguments (those after q, k, v, out, lse), every array wrapped."""
    return tuple(wrap(value) if hasattr(value, "__cuda_array_interface__") else value
                 for value in bound._bound_args)


launcher_cupy_built, _ = L.launcher_for(cq, ck, cv)
launcher_cupy_built(cq, ck, cv, cout, cstream.ptr)
torch.cuda.synchronize()
variants = {
    "own buffers torch, q/k/v torch": (launcher, (q, k, v, out, launcher.lse)),
    "own buffers cupy, q/k/v torch": (launcher_cupy_built, (q, k, v, out, launcher.lse)),
    "own buffers cupy, q/k/v cupy": (launcher_cupy_built,
                                     (cq, ck, cv, cout, launcher_cupy_built.lse)),
}
import cuda.tile as ct  # noqa: E402

for name, (bound, per_call) in variants.items():
    for label, own in (("", bound._bound_args),
                       (" (own wrapped)", own_buffers_as(bound, Described))):
        frozen = tuple(per_call) + own
        fn = lambda: ct.launch(raw, bound.grid, bound.kernel, frozen)  # noqa: E731
        fn()
        print(f"{'ct.launch, ' + name + label:58s} {per_call_us(fn):7.1f} us")
