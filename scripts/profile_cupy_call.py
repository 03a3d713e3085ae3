"""Where the public call's host time goes on CuPy arrays, beside torch tensors (GPU host).

On the H100 hosts the call on CuPy arrays cost about twice the call on torch tensors
(20-24 against 11 us at B1 H8 S1k, data/public_call/602cf26/), and its rounds spread over
15-30 us. This times each piece of the CuPy call's path alone (median [20%, 80%] of batches of
200 calls, host time), the same pieces for torch, a few alternatives for each piece, and then
a cProfile of the whole call.

    python scripts/profile_cupy_call.py
"""
import cProfile
import gc
import pstats

import cupy
import torch

import wavefront
from launch_cost import spread_us
from wavefront.kernel import launcher as L

q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16)
k, v = torch.randn_like(q), torch.randn_like(q)
cq, ck, cv = (cupy.from_dlpack(x) for x in (q, k, v))
for _ in range(L.PREPARE_AFTER_LAUNCHES + 2):  # both launchers prepared
    wavefront.attention(q, k, v)
    wavefront.attention(cq, ck, cv)
cupy.cuda.Device().synchronize()
plain_torch = L._plain_launchers[(q.shape, q.stride(), q.dtype, q.get_device(), k.shape,
                                  k.stride(), k.dtype, k.get_device(), v.shape, v.stride(),
                                  v.dtype, v.get_device(), False)]
cupy_key = (L._cupy_key(cq), L._cupy_key(ck), L._cupy_key(cv), False)
plain_cupy = L._plain_launchers[cupy_key]
print(torch.cuda.get_device_name(), "host us per call, median [20%, 80%]; prepared:",
      plain_torch.launches_prepared, plain_cupy.launches_prepared)
cout = cupy.empty_like(cq)
out = torch.empty_like(q)
cstream = cupy.cuda.get_current_stream()
raw = torch._C._cuda_getCurrentRawStream(0)
shape, dtype = cq.shape, cq.dtype
rows = {
    "CuPy: wavefront.attention": lambda: wavefront.attention(cq, ck, cv),
    "CuPy: attention_plain": lambda: L.attention_plain(cq, ck, cv, False),
    "CuPy: plain key (3 _cupy_key)": lambda: (L._cupy_key(cq), L._cupy_key(ck),
                                              L._cupy_key(cv), False),
    "CuPy:   cq.device.id": lambda: cq.device.id,
    "CuPy:   (shape, strides, dtype)": lambda: (cq.shape, cq.strides, cq.dtype),
    "CuPy: plain key + dict read": lambda: L._plain_launchers.get(
        (L._cupy_key(cq), L._cupy_key(ck), L._cupy_key(cv), False)),
    "CuPy: new_output (cupy.empty)": lambda: plain_cupy.new_output(cq),
    "CuPy:   cupy.ndarray(shape, dtype)": lambda: cupy.ndarray(shape, dtype),
    "CuPy: current_stream() (object)": plain_cupy.current_stream,
    "CuPy: _stream_handle(object)": lambda: L._stream_handle(cstream),
    "CuPy: capturing(handle)": lambda: plain_cupy.capturing(cstream.ptr),
    "CuPy: _addresses (5 arrays)": lambda: plain_cupy._addresses(
        cq, ck, cv, cout, plain_cupy._lse_argument),
    "CuPy: bound, vouched, stream object": lambda: plain_cupy(cq, ck, cv, cout, cstream,
                                                              None, True),
    "CuPy: bound, vouched, raw handle": lambda: plain_cupy(cq, ck, cv, cout, cstream.ptr,
                                                           None, True),
    "CuPy: _launch_call (no out)": lambda: L._launch_call(plain_cupy, cq, ck, cv, None, None),
    "torch: wavefront.attention": lambda: wavefront.attention(q, k, v),
    "torch: attention_plain": lambda: L.attention_plain(q, k, v, False),
    "torch: plain key + dict read": lambda: L._plain_launchers.get(
        (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype,
         k.get_device(), v.shape, v.stride(), v.dtype, v.get_device(), False)),
    "torch: new_output (empty_like)": lambda: plain_torch.new_output(q),
    "torch: current_stream() (raw)": plain_torch.current_stream,
    "torch: capturing(raw)": lambda: plain_torch.capturing(raw),
    "torch: bound, vouched, raw": lambda: plain_torch(q, k, v, out, raw, None, True),
    "torch: _launch_call (no out)": lambda: L._launch_call(plain_torch, q, k, v, None, None),
}
if hasattr(cupy.cuda.stream, "get_current_stream_ptr"):  # not in CuPy 14.2
    rows["CuPy:   get_current_stream_ptr()"] = cupy.cuda.stream.get_current_stream_ptr
for name, fn in rows.items():
    fn()
    median, low, high = spread_us(fn)
    print(f"{name:40s} {median:7.2f} [{low:6.2f}, {high:6.2f}] us")

# The garbage collector: a call makes container objects; does a collection land in the rounds?
for label, switch in (("gc on", gc.enable), ("gc off", gc.disable)):
    switch()
    for lib, (a, b, c) in (("CuPy", (cq, ck, cv)), ("torch", (q, k, v))):
        median, low, high = spread_us(lambda: wavefront.attention(a, b, c))
        print(f"{lib + ': public call, ' + label:40s} {median:7.2f} [{low:6.2f}, {high:6.2f}] us")
gc.enable()

for lib, (a, b, c) in (("CuPy", (cq, ck, cv)), ("torch", (q, k, v))):
    cupy.cuda.Device().synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        wavefront.attention(a, b, c)
    prof.disable()
    cupy.cuda.Device().synchronize()
    print(f"---- cProfile, 2000 public calls on {lib} arrays (us per call)")
    stats = pstats.Stats(prof).stats
    for (path, line, name), (_, calls, own, total, _) in sorted(
            stats.items(), key=lambda kv: -kv[1][2])[:18]:
        print(f"  own {own / 2000 * 1e6:6.2f}  total {total / 2000 * 1e6:6.2f}  x{calls:<5d} "
              f"{path.split('/')[-1]}:{line} {name}")
