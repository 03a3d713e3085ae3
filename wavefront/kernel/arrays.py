"""The caller's arrays as the kernel takes them: views of torch tensors, CuPy arrays and DLPack
arrays, the rules the kernel relies on (each error names the argument), the launcher's own
arrays described once, new outputs, and the layout checks a prepared launch depends on.

Nothing here launches or keeps state between calls but the shared stand-ins (`_stand_in`).
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

from wavefront.kernel.prepared import contiguous_strides
from wavefront.point import DTYPES, HEAD_DIMS


@dataclass(frozen=True)
class _ArrayView:
    """What validation needs to know about an array, whatever library holds it."""

    library: str  # "cupy" | "torch"
    shape: tuple
    dtype: str
    device: int
    strides: tuple  # in elements


def _view(name: str, x) -> tuple[_ArrayView, object]:
    """-> (description, array to hand to cuTile). Accepts CuPy, torch, anything with DLPack."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        if not x.is_cuda:
            raise ValueError(f"{name} must be on a CUDA device, got device {x.device}")
        dtype = str(x.dtype).replace("torch.", "")
        return _ArrayView("torch", tuple(x.shape), dtype, x.device.index, tuple(x.stride())), x
    if mod == "numpy":
        raise ValueError(f"{name} must live in GPU memory, got a NumPy (host) array")
    import cupy
    if not isinstance(x, cupy.ndarray):
        if not hasattr(x, "__dlpack__"):
            raise ValueError(f"{name} must be a CuPy array, a torch tensor or support DLPack, "
                             f"got {type(x).__name__}")
        try:
            x = cupy.from_dlpack(x)
        except Exception as exc:  # host arrays and foreign devices land here
            raise ValueError(f"{name} must live in GPU memory: {exc}") from None
    item = x.dtype.itemsize
    return _ArrayView("cupy", tuple(x.shape), str(x.dtype), x.device.id,
                      tuple(s // item for s in x.strides)), x


def _check_inputs(q, k, v):
    vq, aq = _view("q", q)
    vk, ak = _view("k", k)
    vv, av = _view("v", v)
    validate_views(vq, vk, vv)
    return vq, (aq, ak, av)


def validate_views(vq: _ArrayView, vk: _ArrayView, vv: _ArrayView) -> None:
    """Every rule the kernel relies on, with an error that names the argument."""
    for name, view in (("q", vq), ("k", vk), ("v", vv)):
        if len(view.shape) != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seqlen, head_dim), "
                             f"got shape {view.shape}")
        for axis, size in zip(("batch", "heads", "seqlen", "head_dim"), view.shape):
            if size == 0:
                raise ValueError(f"{name} {axis} must be at least 1, got {name} of shape "
                                 f"{view.shape}")
        if view.dtype not in DTYPES:
            raise ValueError(f"{name} dtype must be one of {DTYPES}, got {view.dtype}")
        if view.strides[-1] != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension, "
                             f"got strides {view.strides}")
    for name, view in (("k", vk), ("v", vv)):
        if view.library != vq.library:
            raise ValueError(f"{name} must come from the same library as q ({vq.library}), "
                             f"got {view.library}")
        if view.dtype != vq.dtype:
            raise ValueError(f"{name} dtype must match q ({vq.dtype}), got {view.dtype}")
        if view.device != vq.device:
            raise ValueError(f"{name} must be on q's device ({vq.device}), got {view.device}")
    b, h, _, d = vq.shape
    if vv.shape != vk.shape:
        raise ValueError(f"v shape must equal k shape {vk.shape}, got {vv.shape}")
    if vk.shape[0] != b:
        raise ValueError(f"k batch must equal q batch ({b}), got {vk.shape[0]}")
    if vk.shape[3] != d:
        raise ValueError(f"k head_dim must equal q head_dim ({d}), got {vk.shape[3]}")
    if d not in HEAD_DIMS:
        raise ValueError(f"q head_dim must be one of {HEAD_DIMS}, got {d}")
    if h % vk.shape[1]:
        raise ValueError(f"q heads ({h}) must be a multiple of k heads ({vk.shape[1]})")


class _Described:
    """One of a launcher's own arrays as `ct.launch` takes it: its CUDA Array Interface,
    worked out once, where a torch tensor or CuPy array would describe itself anew on every
    launch (the six own arrays: 0-4 us of a 12-17 us launch in two runs on the H100 host,
    scripts/profile_call.py). Holds the array, so the memory lives as long as the launcher."""

    __slots__ = ("__cuda_array_interface__", "array")

    def __init__(self, array, description: dict):
        self.__cuda_array_interface__ = description
        self.array = array

    def data_ptr(self) -> int:
        return self.__cuda_array_interface__["data"][0]


# The interface's type strings of the launcher's own arrays (bfloat16 has none of its own:
# partial states in bfloat16 go to ct.launch as they are).
TYPESTRINGS = {"float32": "<f4", "int32": "<i4"}


def _described(array, dtype: str, shape: tuple | None = None, offset: int = 0):
    """A contiguous array made here, of `dtype`, as a `_Described` (else as it is), its
    description written from what we know rather than asked of the array (torch builds its
    interface in Python: about 14 us per array under cProfile on the H100 host, on a new
    shape's first call). `shape` and `offset` (bytes) describe a contiguous part of it
    instead, without slicing (a CuPy slice costs microseconds)."""
    typestr = TYPESTRINGS.get(dtype)
    if typestr is None:
        return array
    ptr = offset + (array.data_ptr() if type(array).__module__ == "torch" else array.data.ptr)
    shape = tuple(array.shape) if shape is None else shape
    strides = tuple(4 * stride for stride in contiguous_strides(shape))
    return _Described(array, {"shape": shape, "typestr": typestr, "data": (ptr, False),
                              "strides": strides, "version": 2})


_stand_ins: dict = {}


def _stand_in(vq: _ArrayView, name: str, shape: tuple, dtype: str):
    """A one-element array for kernel parameter `name` where this launch does not use it
    (cuTile needs an array for every parameter), described once and shared by every launcher
    of q's library and device: a launch that does not use a parameter neither reads nor
    writes it. One per parameter, so no two parameters of a launch alias."""
    key = (vq.library, vq.device, name, shape, dtype)
    found = _stand_ins.get(key)
    if found is None:
        found = _stand_ins.setdefault(key, _described(_owned(vq, shape, dtype), dtype))
    return found


def _array_of(argument):
    """The array behind a launch argument (a `_Described` or the array itself)."""
    return argument.array if isinstance(argument, _Described) else argument


def _address_reader(library: str):
    """A function of the per-call arrays (q, k, v, out, LSE) that returns their addresses."""
    if library == "torch":
        return lambda q, k, v, out, lse: (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                          out.data_ptr(), lse.data_ptr())
    # CuPy: the per-call arrays are the caller's (anything else raises AttributeError: the
    # launch goes to ct.launch); the LSE may be the launcher's stand-in, a `_Described`.
    return lambda q, k, v, out, lse: (q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr,
                                      lse.data_ptr() if type(lse) is _Described
                                      else lse.data.ptr)


def _workspace(vq, n_chunks, output_dtype="float32"):
    """Partial states of the tiled schedule, as launch arguments: output (chunks x batch,
    heads, seqlen, head_dim) in `output_dtype`, fp32 row max and row sum (chunks x batch,
    heads, seqlen)."""
    b, h, s, d = vq.shape
    shapes = [(n_chunks * b, h, s, d), (n_chunks * b, h, s), (n_chunks * b, h, s)]
    dtypes = (output_dtype, "float32", "float32")
    return tuple(_described(_owned(vq, sh, dt), dt) for sh, dt in zip(shapes, dtypes))


def _empty(vq: _ArrayView, shape, dtype):
    """An uninitialised array of q's library on q's device (`dtype` by name; a NumPy dtype
    too for CuPy)."""
    if vq.library == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype), device=_torch_device(vq.device))
    import cupy
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy/CuPy)
    with cupy.cuda.Device(vq.device):
        return cupy.empty(shape, dtype=dtype)


@functools.lru_cache(maxsize=None)
def _torch_device(index: int):
    import torch
    return torch.device("cuda", index)


def _owned(vq: _ArrayView, shape, dtype: str, zeroed: bool = False):
    """A buffer of a launcher's own on q's device: a CuPy array, whatever q's library
    (cuTile takes either). Not torch's: its allocator would put a launcher made while
    torch.compile's CUDA graphs warm a model up (`mode="reduce-overhead"`) into their memory
    pool, whose recording then fails on tensors it does not track ("Detected 5 tensor(s) in
    the cudagraph pool not tracked as outputs", on the H100: the five stand-ins)."""
    import cupy
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy/CuPy)
    with cupy.cuda.Device(vq.device):
        return (cupy.zeros if zeroed else cupy.empty)(shape, dtype=dtype)


def _in_library(vq: _ArrayView, array):
    """A CuPy array of a launcher's own as q's library sees it (torch: a view, by DLPack), for
    the buffers torch operations write or a caller is handed."""
    if vq.library == "torch":
        import torch
        return torch.from_dlpack(array)
    return array


def _output_maker(vq: _ArrayView):
    """A function of q that returns a new contiguous output of q's shape, dtype and device,
    made once per launcher: for a contiguous torch q, `torch.empty_like` (2.1-3.3 us a call on
    the H100 hosts against 4.7-5.4 us for `new_empty` of a shape and 8.4-8.9 us for
    `torch.empty`: scripts/profile_call.py, data/public_call/RUNS.md.gz#4448846)."""
    if vq.library == "torch" and vq.strides == contiguous_strides(vq.shape):
        import torch
        return torch.empty_like
    if vq.library == "torch":
        return lambda q, shape=vq.shape: q.new_empty(shape)
    import cupy
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy/CuPy)
    import numpy as np
    shape, dtype = vq.shape, np.dtype(vq.dtype)  # the dtype resolved from its name once
    if cupy.cuda.runtime.getDeviceCount() == 1:
        # one GPU: it is current, and entering its context would cost about a microsecond;
        # `cupy.empty` is this constructor behind one more Python call
        new = cupy.ndarray
        return lambda q: new(shape, dtype)
    return lambda q: _empty(vq, shape, dtype)


def _lays_out_as_own(vq: _ArrayView, out, inputs) -> bool:
    """Whether a caller's `out` is contiguous, as the launcher's own outputs are, and its
    memory overlaps none of `inputs` (what a prepared launch assumes of it)."""
    vo, out = _view("out", out)
    if vo.strides != contiguous_strides(vo.shape):
        return False
    return not _overlaps_an_input([*(_byte_range(_view("q", x)[1]) for x in inputs),
                                   _byte_range(out)])


def _layout(arrays) -> tuple:
    """Per array: its type, shape, strides and dtype (whatever units its library has)."""
    return tuple(_array_layout(a) for a in arrays)


def _array_layout(a) -> tuple:
    if type(a) is _Described:
        d = a.__cuda_array_interface__
        return _Described, d["shape"], d["strides"], d["typestr"]
    if type(a).__module__ == "torch":
        return type(a), a.shape, a.stride(), a.dtype
    return type(a), getattr(a, "shape", None), getattr(a, "strides", None), getattr(a, "dtype",
                                                                                    None)


def _overlaps_an_input(ranges) -> bool:
    """Whether the fourth byte range (out's) overlaps any of the first three (q, k, v)."""
    start, end = ranges[3]
    return any(x_start < end and start < x_end for x_start, x_end in ranges[:3])


def _byte_range(x) -> tuple[int, int]:
    """[first byte, last byte + 1) of a torch tensor or CuPy array (non-negative strides)."""
    if type(x).__module__.split(".")[0] == "torch":
        start, item, strides = x.data_ptr(), x.element_size(), x.stride()
    else:
        start, item = x.data.ptr, x.dtype.itemsize
        strides = tuple(s // item for s in x.strides)
    last = sum((size - 1) * stride for size, stride in zip(x.shape, strides))
    return start, start + (last + 1) * item


def _checked_output(vq, out):
    """The output the caller gave, checked against q (a new one is the launcher's
    `new_output`)."""
    vo, out = _view("out", out)
    if (vo.library, vo.device, vo.shape, vo.dtype) != (vq.library, vq.device, vq.shape,
                                                      vq.dtype) or vo.strides[-1] != 1:
        raise ValueError(f"out must be a {vq.library} array on q's device with q's shape "
                         f"{vq.shape} and dtype {vq.dtype}, contiguous in its last "
                         f"dimension; got {vo.library} {vo.shape} {vo.dtype} on device "
                         f"{vo.device}")
    return out


def _cupy_key(x):
    """What a launch depends on of a CuPy array (shape, strides, dtype, device), read without
    building anything; None for any other array (converted and checked on every call)."""
    if type(x).__module__.startswith("cupy"):
        # the device's number as its memory holds it: `x.device` builds a Device object
        return (x.shape, x.strides, x.dtype, x.data.device_id)
    return None


def _call_key(q, k, v, options: tuple):
    # The options' types too: True == 1 == 1.0 hash alike, and must not share a launcher.
    kind = type(q)
    if kind.__module__ == "torch" and type(k) is kind and type(v) is kind:
        # Three torch tensors, the common call: one flat tuple, no helper calls (the key is a
        # tenth of a short launch's host time, on the H100 hosts' CPUs). Torch mixed with
        # another library, or a tensor subclass, gets no key: it fails or converts anyway.
        return (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype,
                k.get_device(), v.shape, v.stride(), v.dtype, v.get_device(), options,
                tuple(map(type, options)))
    keys = (_cupy_key(q), _cupy_key(k), _cupy_key(v))
    if None in keys:
        return None
    return (keys, options, tuple(map(type, options)))


def tensors_stamp(*tensors):
    """What identifies the contents of torch tensors without reading them: each tensor
    (weakly: a new tensor at a freed one's address is another object) and its version
    counter, which an in-place write bumps; None where one keeps no version counter (an
    inference tensor, made under `torch.inference_mode`)."""
    if any(t.is_inference() for t in tensors):
        return None
    return tuple((weakref.ref(t), t._version) for t in tensors)


def stamp_matches(stamp, *tensors) -> bool:
    """Whether `tensors` are those `stamp` (`tensors_stamp`) was taken of, unmodified since."""
    return (stamp is not None and len(stamp) == len(tensors)
            and all(ref() is t and t._version == version
                    for (ref, version), t in zip(stamp, tensors)))
