"""The KV-cache call: `attention_with_kvcache`, FlashAttention's `flash_attn_with_kvcache`
shape and meaning, on the kernels of `wavefront.kernel.decode`.

Checked on the host before any launch: the arrays (names, shapes, dtypes, devices, layouts)
and every length or page id that is host data (an int, a list, a NumPy array, a CPU tensor).
Lengths and block tables on the GPU are not read (that would wait for the GPU): the kernels
clamp them into the tensors and set a bit in a per-device flags buffer, which is copied to
pinned host memory behind the launches and read by the next call once that copy is done
(`_DeviceFlags`); a bad value then raises on that call, naming the argument. With
WAVEFRONT_CHECK_LENGTHS=1 in the environment every call waits for its launches and checks at
once (a debug switch: it synchronises the stream).

The work table (one row per (batch, K/V head, Q tile, split), `wavefront.decode_schedules`)
depends on shapes only, never on lengths, so a decode loop builds it once; it is kept per
launch with its split-KV workspace in a bounded cache (`_states`). Calls on several streams at
once with the same shapes (the cache's capacity aside) and several splits share that
workspace: serialise them, or pass num_splits=1.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from wavefront.decode_schedules import (CTA_ORDERS, PAGE_SIZES, DecodeLaunch, DecodeProblem,
                                        plan_decode)
from wavefront.kernel.arrays import (_ArrayView, _byte_range, _checked_output, _empty,
                                     _overlaps_an_input, _owned, _view)
from wavefront.kernel.streams import _as_current_stream, _stream_getter, _stream_handle
from wavefront.point import DTYPES, HEAD_DIMS

CHECK_LENGTHS_ENV = "WAVEFRONT_CHECK_LENGTHS"
STATE_CACHE_SIZE = 64
# The most resident attention CTAs per SM a bench may ask for (`ctas_per_sm`). Compiled with
# tileiras 13.4 for sm_90, the D128 split binary fits 2-5 per SM (254-96 registers, 99-34 KB),
# but asked for 6 or 8 it comes back at 255 registers and 145 KB, one per SM (the launch would
# then run sms x 6 CTAs in waves under a "6 per SM" label), and D64 at 8 does not compile.
MAX_CTAS_PER_SM = 4
LOG2_E = 1.0 / math.log(2.0)


class KVCacheLengthError(ValueError):
    """A length or page id outside the cache, found on the GPU by an earlier call's kernels
    (or by this one's, with WAVEFRONT_CHECK_LENGTHS=1)."""


# --------------------------------------------------------------------------------------------
# Checks on the host (no GPU needed: the CPU tests call them on array descriptions)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheShape:
    """What the arrays say about a cache call, once checked."""

    batch: int
    seqlen_q: int
    heads: int
    kv_heads: int
    head_dim: int
    capacity: int  # keys one sequence can hold
    seqlen_new: int
    page_size: int | None  # None: contiguous
    num_pages: int  # paged: pages in the pool; contiguous: the batch


def check_arrays(vq: _ArrayView, vk_cache: _ArrayView, vv_cache: _ArrayView,
                 vk: _ArrayView | None, vv: _ArrayView | None,
                 block_table_shape: tuple | None) -> CacheShape:
    """Every rule the kernels rely on about the arrays, with an error that names the
    argument. `block_table_shape`: None for a contiguous cache."""
    if len(vq.shape) != 4:
        raise ValueError(f"q must be 4-D (batch, seqlen_q, heads, head_dim), got shape "
                         f"{vq.shape}")
    batch, seqlen_q, heads, head_dim = vq.shape
    layout = ("(num_pages, page_size, kv_heads, head_dim)" if block_table_shape is not None
              else "(batch, seqlen_cache, kv_heads, head_dim)")
    for name, view in (("k_cache", vk_cache), ("v_cache", vv_cache)):
        if len(view.shape) != 4:
            raise ValueError(f"{name} must be 4-D {layout}, got shape {view.shape}")
    for name, view in (("q", vq), ("k_cache", vk_cache), ("v_cache", vv_cache), ("k", vk),
                       ("v", vv)):
        if view is None:
            continue
        if name in ("k", "v") and len(view.shape) != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen_new, kv_heads, head_dim), "
                             f"got shape {view.shape}")
        if view.dtype not in DTYPES:
            raise ValueError(f"{name} dtype must be one of {DTYPES}, got {view.dtype}")
        if view is not vq:
            if view.dtype != vq.dtype:
                raise ValueError(f"{name} dtype must match q ({vq.dtype}), got {view.dtype}")
            if view.library != vq.library:
                raise ValueError(f"{name} must come from the same library as q "
                                 f"({vq.library}), got {view.library}")
            if view.device != vq.device:
                raise ValueError(f"{name} must be on q's device ({vq.device}), got "
                                 f"{view.device}")
        if view.strides[-1] != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension, "
                             f"got strides {view.strides}")
    for axis, size in zip(("batch", "seqlen_q", "heads"), vq.shape):
        if size == 0:
            raise ValueError(f"q {axis} must be at least 1, got q of shape {vq.shape}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"q head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    if vv_cache.shape != vk_cache.shape:
        raise ValueError(f"v_cache shape must equal k_cache shape {vk_cache.shape}, got "
                         f"{vv_cache.shape}")
    rows, keys, kv_heads, cache_dim = vk_cache.shape
    if cache_dim != head_dim:
        raise ValueError(f"k_cache head_dim must equal q head_dim ({head_dim}), got "
                         f"{cache_dim}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"q heads ({heads}) must be a multiple of k_cache kv_heads "
                         f"({kv_heads})")
    if block_table_shape is None:
        if rows != batch:
            raise ValueError(f"k_cache batch must equal q batch ({batch}), got {rows} "
                             "(a page pool needs block_table)")
        if keys == 0:
            raise ValueError(f"k_cache must hold at least one key per sequence, got shape "
                             f"{vk_cache.shape}")
        page_size, capacity, num_pages = None, keys, rows
    else:
        if keys not in PAGE_SIZES:
            raise ValueError(f"k_cache page_size (dimension 1 of the page pool) must be one "
                             f"of {PAGE_SIZES}, got {keys}")
        if rows == 0:
            raise ValueError("k_cache must hold at least one page, got 0")
        if len(block_table_shape) != 2 or block_table_shape[0] != batch:
            raise ValueError(f"block_table must be 2-D (batch={batch}, max_pages), got shape "
                             f"{tuple(block_table_shape)}")
        if block_table_shape[1] == 0:
            raise ValueError("block_table must have at least one page per sequence, got "
                             f"shape {tuple(block_table_shape)}")
        page_size, capacity, num_pages = keys, block_table_shape[1] * keys, rows
    seqlen_new = 0
    if (vk is None) != (vv is None):
        raise ValueError("k and v must be given together (new keys and their values), got "
                         f"{'k' if vv is None else 'v'} alone")
    if vk is not None:
        expected = (batch, vk.shape[1], kv_heads, head_dim)
        if vk.shape != expected or vk.shape[1] == 0:
            raise ValueError(f"k must be (batch={batch}, seqlen_new >= 1, kv_heads={kv_heads}, "
                             f"head_dim={head_dim}), got shape {vk.shape}")
        if vv.shape != vk.shape:
            raise ValueError(f"v shape must equal k shape {vk.shape}, got {vv.shape}")
        seqlen_new = vk.shape[1]
        if seqlen_new > capacity:
            raise ValueError(f"k holds {seqlen_new} new keys, more than the cache holds per "
                             f"sequence ({capacity})")
    return CacheShape(batch, seqlen_q, heads, kv_heads, head_dim, capacity, seqlen_new,
                      page_size, num_pages)


def _host_ints(name: str, value, ndim: int):
    """`value` as an int64 NumPy array if it is host data (a list, a NumPy array, a CPU
    tensor), else None (a GPU array)."""
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        if value.is_cuda:
            return None
        value = value.numpy()
    elif module == "cupy" or (hasattr(value, "__cuda_array_interface__")
                              and not isinstance(value, np.ndarray)):
        return None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be integers, got {type(value).__name__}") from None
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} must be integers, got dtype {array.dtype}")
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {array.shape}")
    return array.astype(np.int64)


def check_host_lengths(shape: CacheShape, lengths: np.ndarray,
                       block_table: np.ndarray | None) -> None:
    """Host lengths (and a host block table) against the cache, naming the argument: the
    page ids the lengths reach must be pages of the pool (those past them are not read)."""
    if lengths.shape != (shape.batch,):
        raise ValueError(f"cache_seqlens must hold one length per sequence (batch="
                         f"{shape.batch}), got shape {lengths.shape}")
    negative = np.flatnonzero(lengths < 0)
    if negative.size:
        i = int(negative[0])
        raise ValueError(f"cache_seqlens must be >= 0, got {int(lengths[i])} for sequence {i}")
    total = lengths + shape.seqlen_new
    over = np.flatnonzero(total > shape.capacity)
    if over.size:
        i = int(over[0])
        what = ("S_max (k_cache dimension 1)" if shape.page_size is None
                else f"block_table's {shape.capacity // shape.page_size} pages x page_size "
                     f"{shape.page_size}")
        raise ValueError(f"cache_seqlens[{i}] = {int(lengths[i])}"
                         f"{f' + {shape.seqlen_new} new keys' if shape.seqlen_new else ''} "
                         f"exceeds the cache's {shape.capacity} keys per sequence ({what})")
    if block_table is None or shape.page_size is None:
        return
    used = -(-total // shape.page_size)  # pages each sequence reads
    for i in range(shape.batch):
        ids = block_table[i, :used[i]]
        bad = np.flatnonzero((ids < 0) | (ids >= shape.num_pages))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"block_table[{i}, {j}] = {int(ids[j])} is not a page of k_cache "
                             f"(0 to {shape.num_pages - 1})")


def sharing_keys(block_table: np.ndarray | None, batch: int) -> tuple | None:
    """One key per sequence for the prefix-grouped order: its first page (sequences that
    share a prefix share its pages)."""
    if block_table is None:
        return None
    return tuple(int(x) for x in block_table[:batch, 0])


# The sharing keys of the last GPU block tables read back, by the tensor (weakly) and its
# version counter: a decode loop hands the same table step after step, and reading it back on
# every call would wait for the GPU every step (measured: the prefix-grouped order's calls ran
# at 0.37x the batch-major order's on the H200 while its kernel ran 6% faster).
_GPU_SHARING_KEPT = 8
_gpu_sharing: list = []


def _gpu_table_sharing(block_table) -> tuple | None:
    """`sharing_keys` of a block table on the GPU: read back (this waits for the GPU) the
    first time a tensor is seen and whenever torch's version counter says it was written in
    place since; kept otherwise. A CuPy table (no version counter) is keyed by the array
    object and its pointer: write a new array rather than into the old one. (The keys only
    order the work items: a stale key costs cache reuse, never a wrong result.)"""
    stamp = None
    if hasattr(block_table, "_version"):  # torch (a subclass too)
        from wavefront.kernel.arrays import stamp_matches, tensors_stamp
        for kept_stamp, keys in _gpu_sharing:
            if stamp_matches(kept_stamp, block_table):
                return keys
        stamp = tensors_stamp(block_table)
    else:
        ident = (id(block_table), getattr(getattr(block_table, "data", None), "ptr", None))
        for kept_stamp, keys in _gpu_sharing:
            if kept_stamp == ident:
                return keys
        stamp = ident
    keys = sharing_keys(np.asarray(block_table.tolist()), len(block_table))
    if stamp is not None:
        _gpu_sharing.insert(0, (stamp, keys))
        del _gpu_sharing[_GPU_SHARING_KEPT:]
    return keys


# --------------------------------------------------------------------------------------------
# Flags raised on the GPU, checked without waiting
# --------------------------------------------------------------------------------------------

_FLAG_MEANINGS = None


def _flag_meanings():
    global _FLAG_MEANINGS
    if _FLAG_MEANINGS is None:
        from wavefront.kernel.decode import FLAG_APPEND, FLAG_PAGE, FLAG_SEQLEN
        _FLAG_MEANINGS = (
            (FLAG_SEQLEN, "cache_seqlens held a length below 0 or, with the new keys, past the "
                          "cache's capacity (clamped into the cache)"),
            (FLAG_PAGE, "block_table held a page id outside k_cache's pages (clamped into "
                        "the pool)"),
            (FLAG_APPEND, "k/v were appended past the cache's capacity or through a bad "
                          "length or page id (those keys were not written)"))
    return _FLAG_MEANINGS


def describe_flags(bits: int) -> str:
    return "; ".join(text for bit, text in _flag_meanings() if bits & bit) or "no fault"


class _DeviceFlags:
    """One device's flags buffer, its pinned host copy and the event the copy is done at."""

    def __init__(self, vq: _ArrayView):
        import cupy

        from wavefront.kernel.decode import FLAG_WORDS
        self.device = vq.device
        self.buffer = _owned(vq, (FLAG_WORDS,), "int32", zeroed=True)
        _zeroed_before_use(vq.device)
        self.pinned = cupy.cuda.alloc_pinned_memory(FLAG_WORDS * 4)
        self.host = np.frombuffer(self.pinned, dtype=np.int32, count=FLAG_WORDS)
        self.host[:] = 0
        self.host_address, self.buffer_address = self.host.ctypes.data, self.buffer.data.ptr
        with cupy.cuda.Device(vq.device):
            self.event = cupy.cuda.Event(disable_timing=True)
        self.pending = False
        self.lock = threading.Lock()

    def copy_behind(self, handle: int) -> None:
        """Queue the buffer's copy to pinned memory on the launch's stream (called with the
        buffer's GPU current, as the launches were made)."""
        from cupy.cuda import runtime
        runtime.memcpyAsync(self.host_address, self.buffer_address, self.host.nbytes,
                            runtime.memcpyDeviceToHost, handle)
        runtime.eventRecord(self.event.ptr, handle)
        self.pending = True

    def check(self, wait: bool = False) -> None:
        """Raise if a copy that is done (or, with `wait`, once it is) holds a flag; the flags
        are cleared first, so that one fault raises once."""
        with self.lock:
            if not self.pending:
                return
            if wait:
                self.event.synchronize()
            elif not self.event.done:
                return  # the launches are still running: the next call looks again
            self.pending = False
            bits = int(np.bitwise_or.reduce(self.host))
            if not bits:
                return
            import cupy
            with cupy.cuda.Device(self.device):
                self.buffer.fill(0)
                cupy.cuda.get_current_stream().synchronize()
            self.host[:] = 0
        raise KVCacheLengthError(f"wavefront.attention_with_kvcache on GPU {self.device}: "
                                 f"{describe_flags(bits)}. Found by the kernels of this call "
                                 "or an earlier one on this GPU (lengths and block tables on "
                                 f"the GPU are checked there; set {CHECK_LENGTHS_ENV}=1 to "
                                 "check each call before it returns)")


_flags: dict = {}


def _flags_for(vq: _ArrayView) -> _DeviceFlags:
    found = _flags.get(vq.device)
    if found is None:
        found = _flags.setdefault(vq.device, _DeviceFlags(vq))
    return found


def check_kvcache_flags(device: int | None = None) -> None:
    """Wait for the cache calls queued on `device` (default: every device used) and raise
    `KVCacheLengthError` if their kernels clamped a length or page id."""
    for index, flags in list(_flags.items()):
        if device is None or index == device:
            flags.check(wait=True)


# --------------------------------------------------------------------------------------------
# The call
# --------------------------------------------------------------------------------------------

@dataclass
class _LaunchState:
    """What a launch keeps across calls: its table on the GPU and split-KV workspace."""

    launch: DecodeLaunch  # the first it was made for: a later one may differ in capacity
    variants: tuple  # (append or None, attention, combine or None)
    work: object
    partials: tuple  # (PartO, PartM, PartL): real ones with splits, else stand-ins


_states: OrderedDict = OrderedDict()
_states_lock = threading.Lock()
_stand_ins: dict = {}


def _stand_in(vq: _ArrayView, name: str, shape: tuple, dtype: str):
    """A small array for a kernel parameter this launch does not use (cuTile needs an array
    for each), one per parameter and device, so no two parameters alias."""
    key = (vq.device, name)
    found = _stand_ins.get(key)
    if found is None:
        found = _owned(vq, shape, dtype, zeroed=True)
        _zeroed_before_use(vq.device)
        found = _stand_ins.setdefault(key, found)
    return found


def _zeroed_before_use(device: int) -> None:
    """Wait for a buffer's zeroing on CuPy's current stream, which a launch on another stream
    does not wait for (once per buffer)."""
    import cupy
    with cupy.cuda.Device(device):
        cupy.cuda.get_current_stream().synchronize()


def _state_key(launch: DecodeLaunch) -> tuple:
    """What a launch's state depends on: everything but the cache's capacity. The kernel reads
    a table row's (batch, K/V head, Q tile, split, splits) and finds its keys from the lengths
    on the GPU; the rows' K/V spans of a full cache are the simulator's, not read. So a cache
    that grows by a key a step (transformers' DynamicCache: a new shape every step) reuses one
    table and workspace while its split count holds, instead of building and copying a table
    (and waiting for the copy) every step."""
    p = launch.problem
    return (p.batch, p.heads, p.kv_heads, p.seqlen_q, p.head_dim, p.seqlen_new, p.page_size,
            p.element_bytes, launch.num_splits, launch.ctas, launch.cta_order, launch.sharing)


def _state_for(vq: _ArrayView, launch: DecodeLaunch, write_lse: bool,
               occupancy: int) -> _LaunchState:
    key = (vq.device, vq.dtype, _state_key(launch), write_lse, occupancy)
    with _states_lock:
        state = _states.get(key)
        if state is not None:
            _states.move_to_end(key)
            return state
    import cupy

    from wavefront.kernel.decode import variants_for
    p = launch.problem
    with cupy.cuda.Device(vq.device):
        work = cupy.asarray(launch.work_table())
        # copied on CuPy's stream, which the launch's need not wait for: once per table
        cupy.cuda.get_current_stream().synchronize()
    if launch.num_splits > 1:
        rows = (launch.num_splits * p.batch, p.seqlen_q, p.kv_heads, p.group)
        partials = (_owned(vq, rows + (p.head_dim,), "float32"), _owned(vq, rows, "float32"),
                    _owned(vq, rows, "float32"))
    else:
        partials = (_stand_in(vq, "PartO", (1, 1, 1, 1, 1), "float32"),
                    _stand_in(vq, "PartM", (1, 1, 1, 1), "float32"),
                    _stand_in(vq, "PartL", (1, 1, 1, 1), "float32"))
    state = _LaunchState(launch, variants_for(p, vq.dtype, launch.num_splits, write_lse,
                                              p.seqlen_new > 0, occupancy), work, partials)
    with _states_lock:
        state = _states.setdefault(key, state)
        while len(_states) > STATE_CACHE_SIZE:
            _states.popitem(last=False)
    return state


def _to_device(vq: _ArrayView, host: np.ndarray):
    """A host int array as an int32 array of q's library on q's device, copied on the
    current stream of that library (the launch's)."""
    data = np.ascontiguousarray(host, dtype=np.int32)
    if vq.library == "torch":
        import torch
        return torch.from_numpy(data).to(device=f"cuda:{vq.device}")
    import cupy
    with cupy.cuda.Device(vq.device):
        return cupy.asarray(data)


def _device_ints(name: str, value, vq: _ArrayView, shape: tuple):
    """A GPU array of lengths or page ids, checked for what can be checked without reading
    it: int32, its shape, q's device."""
    view, array = _view(name, value)
    if view.dtype != "int32":
        raise ValueError(f"{name} on the GPU must be int32, got {view.dtype}")
    if view.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {view.shape}")
    if view.device != vq.device:
        raise ValueError(f"{name} must be on q's device ({vq.device}), got {view.device}")
    return array


def _grouped(vq: _ArrayView, x, shape: CacheShape):
    """(batch, seqlen_q, heads, D) -> (batch, seqlen_q, kv_heads, group, D): a view."""
    grouped = (shape.batch, shape.seqlen_q, shape.kv_heads, shape.heads // shape.kv_heads,
               shape.head_dim)
    if vq.library == "torch":
        return x.unflatten(2, grouped[2:4])
    from cupy.lib.stride_tricks import as_strided  # a view whatever the strides (no copy)
    s0, s1, s2, s3 = x.strides
    return as_strided(x, shape=grouped, strides=(s0, s1, s2 * grouped[3], s2, s3))


@dataclass
class _Prepared:
    """What a call of one layout and set of options launches, made once (`_prepare`): its
    checked shape, launch, buffers and launch arguments that do not change per call."""

    vq: _ArrayView
    shape: CacheShape
    launch: DecodeLaunch
    state: _LaunchState
    flags: _DeviceFlags
    bound: dict  # the attention kernel's arguments that are the same every call
    append: dict | None  # the append kernel's constants
    combine: dict | None  # the combine kernel's arguments that are the same every call
    lse_shape: tuple
    grid: tuple  # the attention kernel's
    combine_grid: tuple | None
    current_stream: object  # () -> the raw handle of q's library's current stream on its GPU
    # Launches through the driver once the layout has been called PREPARE_AFTER_CALLS times
    # (`_prepare_launches`); None before, and for good where preparing failed (`failure`).
    launches: "_PreparedLaunches | None" = None
    calls_left: int | None = None
    failure: str | None = None
    # What a call of the same arrays but caches of another length plans from (`_replanned`):
    # the new keys' views and the options as `_prepare` checked and resolved them.
    plan: "_PlanOptions | None" = None
    grown: bool = False  # a DynamicCache step's (`_replanned`): its combine is shared (`_combines`)


@dataclass(frozen=True)
class _PlanOptions:
    """A call's checked options and what `_prepare` resolved of them, for `_planned`."""

    vk: _ArrayView | None
    vv: _ArrayView | None
    sms: int
    occupancy: int
    num_splits: int | None
    cta_order: str | None
    sharing: tuple | None
    return_lse: bool
    scale: float
    causal: bool


_prepared: OrderedDict = OrderedDict()
# The latest call's `_Prepared` per key without the caches' lengths (`_without_length`): what a
# call of a grown cache is planned from (`_replanned`).
_families: OrderedDict = OrderedDict()


def _layout(x):
    """What a launch depends on of an array: its type, shape, strides, dtype and device; None
    for anything but a torch tensor or a CuPy array (checked and converted every call)."""
    kind = type(x)
    if kind.__module__ == "torch":
        return kind, x.shape, x.stride(), x.dtype, x.device
    if kind.__module__.startswith("cupy"):
        return kind, x.shape, x.strides, x.dtype, x.data.device_id
    return None


def _without_length(layout):
    """A cache's layout (`_layout`) without what its length changes: its dimension 1 (keys
    per sequence, or a page's keys) and its strides but the last (a cache viewed from
    (batch, kv_heads, keys, D), as transformers keeps one, strides its heads by its length)."""
    kind, shape, strides, dtype, device = layout
    return kind, shape[0], tuple(shape[2:]), strides[-1], dtype, device


def _lengths_kind(value):
    """'host' or the GPU array's layout (its values are read on the GPU)."""
    module = type(value).__module__.split(".")[0]
    if module == "torch" and value.is_cuda or module == "cupy":
        return _layout(value)
    return "host"


def _prepare(q, k_cache, v_cache, cache_seqlens, k, v, block_table, table_host, causal,
             scale, num_splits, cta_order, return_lse, out, sharing,
             ctas_per_sm=None) -> _Prepared:
    """Check the arrays and options (naming the argument), plan the launch, make its table
    and buffers."""
    vq, _ = _view("q", q)
    vkc, _ = _view("k_cache", k_cache)
    vvc, _ = _view("v_cache", v_cache)
    vk = None if k is None else _view("k", k)[0]
    vv = None if v is None else _view("v", v)[0]
    table_shape = None
    if block_table is not None:
        table_shape = (table_host.shape if table_host is not None
                       else tuple(_view("block_table", block_table)[0].shape))
    shape = check_arrays(vq, vkc, vvc, vk, vv, table_shape)
    if _lengths_kind(cache_seqlens) != "host":
        _device_ints("cache_seqlens", cache_seqlens, vq, (shape.batch,))
    if block_table is not None and table_host is None:
        _device_ints("block_table", block_table, vq, table_shape)
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(shape.head_dim)
    elif (isinstance(scale, bool) or not isinstance(scale, (int, float))
          or not math.isfinite(scale) or scale <= 0):
        raise ValueError(f"scale must be a finite number above 0, got {scale!r}")
    if cta_order is not None and cta_order not in CTA_ORDERS:
        raise ValueError(f"cta_order must be one of {CTA_ORDERS}, got {cta_order!r}")
    if num_splits is not None and (isinstance(num_splits, bool)
                                   or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive integer or None, got {num_splits!r}")
    if ctas_per_sm is not None and (isinstance(ctas_per_sm, bool)
                                    or not isinstance(ctas_per_sm, int)
                                    or not 1 <= ctas_per_sm <= MAX_CTAS_PER_SM):
        raise ValueError(f"ctas_per_sm must be an integer in [1, {MAX_CTAS_PER_SM}] or None, "
                         f"got {ctas_per_sm!r}")
    if out is not None:
        _checked_output(vq, out)

    from wavefront.device import current_device
    from wavefront.kernel.decode import DECODE_OCCUPANCY
    device = current_device()
    if device is None:
        raise RuntimeError("wavefront.attention_with_kvcache needs a CUDA GPU; none is visible")
    options = _PlanOptions(vk, vv, device.sms,
                           DECODE_OCCUPANCY if ctas_per_sm is None else ctas_per_sm,
                           num_splits, cta_order, sharing, bool(return_lse), float(scale),
                           bool(causal))
    return _planned(vq, shape, options, _flags_for(vq), _stream_getter(vq.library, vq.device),
                    PREPARE_AFTER_CALLS)


def _planned(vq: _ArrayView, shape: CacheShape, options: _PlanOptions, flags, stream_getter,
             prepare_after: int) -> _Prepared:
    """The launch of a checked call: its plan, table, buffers and bound arguments."""
    problem = DecodeProblem(shape.batch, shape.heads, shape.kv_heads, shape.seqlen_q,
                            shape.capacity, shape.head_dim, shape.seqlen_new, shape.page_size)
    launch = plan_decode(problem, sms=options.sms, ctas_per_sm=options.occupancy,
                         num_splits=options.num_splits, cta_order=options.cta_order,
                         sharing=options.sharing)
    state = _state_for(vq, launch, options.return_lse, options.occupancy)
    bound, combined = bound_arguments(launch, state.variants, state.partials, state.work,
                                      flags.buffer, options.scale, options.causal)
    append = state.variants[0]
    lse_shape = (shape.batch, shape.kv_heads, problem.group, shape.seqlen_q)
    combine_grid = None if combined is None else (
        -(-shape.seqlen_q // combined["ROWS"]), shape.batch * shape.kv_heads, 1)
    return _Prepared(vq, shape, launch, state, flags, bound,
                     None if append is None else append.constants, combined, lse_shape,
                     (launch.grid, 1, 1), combine_grid, stream_getter,
                     calls_left=prepare_after if PREPARED_LAUNCHES else None, plan=options)


def _replanned(base: _Prepared, k_cache, v_cache, block_table, table_host) -> _Prepared:
    """The launch of a call whose arrays are laid out as `base`'s except for the caches'
    length (their capacity: transformers' DynamicCache grows by a key each step, so every
    step is a new layout): only the caches and the block table are checked again, and the
    plan is made for the new capacity; q, the new keys, `out` and the options were checked
    for `base` and are the same (the call's key says so). Checking and planning all anew was
    about 40% of a growing call's host time under cProfile on the H200 host
    (scripts/profile_cache_call.py --mode growing)."""
    vkc, _ = _view("k_cache", k_cache)
    vvc, _ = _view("v_cache", v_cache)
    table_shape = None
    if block_table is not None:
        table_shape = (table_host.shape if table_host is not None
                       else tuple(_view("block_table", block_table)[0].shape))
    options = base.plan
    shape = check_arrays(base.vq, vkc, vvc, options.vk, options.vv, table_shape)
    # Grown: by at most the call's queries since the base call, as a DynamicCache grows a step
    # (two fixed caches of different lengths, alternating, are no growth: they prepare as any)
    grown = 0 < shape.capacity - base.shape.capacity <= shape.seqlen_q
    prepared = _planned(base.vq, shape, options, base.flags, base.current_stream,
                        REPLANNED_PREPARE_AFTER_CALLS if grown else PREPARE_AFTER_CALLS)
    prepared.grown = grown
    return prepared


# A layout called this often launches through the driver (`prepared.PreparedLaunch`):
# `ct.launch` derives every argument's constraints on each launch, about 20 us of host time
# per kernel on the H200 hosts (scripts/profile_cache_call.py), where a decode step's kernels
# run 15-50 us at B1. Preparing costs about 0.4 ms once, so a layout called only a few times
# keeps `ct.launch`.
PREPARE_AFTER_CALLS = 8
# A layout reached by a cache's growth by the call's queries (`_replanned`) is a DynamicCache
# step's: called once per layer, then never again. It prepares only if called this often (a
# cache that stopped growing), so that no model's step pays the 0.4 ms of preparing for every
# layer's call.
REPLANNED_PREPARE_AFTER_CALLS = 256
PREPARED_LAUNCHES = os.environ.get("WAVEFRONT_PREPARED_LAUNCH", "1") != "0"


def _address(x) -> int:
    return x.data_ptr() if hasattr(x, "data_ptr") else x.data.ptr


@dataclass
class _PreparedLaunches:
    """The attention and combine kernels of one layout, prepared: their per-call arrays'
    addresses are all a launch takes. The per-call arrays are the kernels' leading parameters
    (ATTENTION_PREPARED, COMBINE_PREPARED); the split workspace among them keeps its
    addresses."""

    attention: object  # prepared.PreparedLaunch
    combine: object | None
    partials: tuple  # the workspace's addresses
    spans: tuple  # bytes spanned by q, k_cache, v_cache and out (their layouts are the key's)


# The leading parameters of each kernel, passed by address to a prepared launch.
ATTENTION_PREPARED = ("Q", "K", "V", "Out", "Lse", "PartO", "PartM", "PartL", "CacheSeqlens",
                      "BlockTable")
COMBINE_PREPARED = ("PartO", "PartM", "PartL", "Out", "Lse")


def _prepare_launches(prepared: _Prepared, attention_args: tuple, combine_args: tuple | None,
                      arrays: tuple) -> None:
    """Prepare the layout's launches from the arguments of a launch just made (`arrays`: q,
    k_cache, v_cache, out). Not from a capture (loading a binary is no stream's work), nor
    from an `out` overlapping an input (the binary would assume it does; the next call
    tries); a failure keeps `ct.launch` for this layout, with the reason kept."""
    from wavefront.kernel.decode import combine_splits, decode_kernel_for
    from wavefront.kernel.prepared import PreparedLaunch
    try:
        ranges = [_byte_range(x) for x in arrays]
    except (AttributeError, TypeError):
        prepared.calls_left, prepared.failure = None, "arrays of no library read here"
        return
    if _overlaps_an_input(ranges):
        return
    prepared.calls_left = None
    device = prepared.vq.device
    try:
        attention = PreparedLaunch(decode_kernel_for(prepared.state.variants[1].occupancy),
                                   "decode_attention", attention_args, len(ATTENTION_PREPARED),
                                   prepared.grid, device)
        combine = None if combine_args is None else PreparedLaunch(
            combine_splits, "combine_splits", combine_args, len(COMBINE_PREPARED),
            prepared.combine_grid, device)
    except Exception as exc:  # noqa: BLE001  (whatever it was, ct.launch still works)
        prepared.failure = f"{type(exc).__name__}: {exc}"
        return
    partials = tuple(_address(x) for x in prepared.state.partials)
    prepared.launches = _PreparedLaunches(attention, combine, partials,
                                          tuple(end - start for start, end in ranges))


# The combine kernel's prepared launches shared by the layouts of a growing cache: the combine
# reads only the split workspace, `out` and the LSE, none of which the cache's length changes,
# so one prepared launch serves every step of a DynamicCache with the same split count (the
# attention kernel's arguments change with the length: it keeps `ct.launch`). Keyed by the
# launch state (its workspace), the output's and the LSE's layouts and the grid; prepared once
# a key has launched PREPARE_AFTER_CALLS times. Value: [state, calls left, "preparing", the
# prepared launch, or why preparing failed (a str)].
_combines: OrderedDict = OrderedDict()
_combines_lock = threading.Lock()


def _combine_key(prepared: _Prepared, out, lse) -> tuple:
    return (id(prepared.state), _layout(out), _layout(lse), prepared.combine_grid)


def _launch_shared_combine(prepared: _Prepared, handle: int, out5, lse) -> bool:
    """Launch a grown layout's combine through the shared prepared launch of its key, if it
    has one and the addresses fit its binary -> True; else False (the caller launches it)."""
    found = _combines.get(_combine_key(prepared, out5, lse))
    if found is None or found[0] is not prepared.state or not hasattr(found[1], "launch"):
        return False
    part_o, part_m, part_l = (_address(x) for x in prepared.state.partials)
    return found[1].launch(handle, (part_o, part_m, part_l, _address(out5), _address(lse)))


def _count_shared_combine(prepared: _Prepared, out5, lse, combine_args: tuple,
                          capturing: bool) -> None:
    """Count a grown layout's combine launched through `ct.launch` towards its key's
    preparing, and prepare it on the PREPARE_AFTER_CALLS-th (not from a capture)."""
    from wavefront.kernel.decode import combine_splits
    from wavefront.kernel.prepared import PreparedLaunch
    key = _combine_key(prepared, out5, lse)
    with _combines_lock:
        found = _combines.get(key)
        if found is None or found[0] is not prepared.state:
            found = _combines[key] = [prepared.state, PREPARE_AFTER_CALLS]
            while len(_combines) > STATE_CACHE_SIZE:
                _combines.popitem(last=False)
        if not isinstance(found[1], int) or capturing:
            return
        if found[1] > 1:
            found[1] -= 1
            return
        found[1] = "preparing"  # (built outside the lock: an export can take 0.1 s)
    try:
        launch = PreparedLaunch(combine_splits, "combine_splits", combine_args,
                                len(COMBINE_PREPARED), prepared.combine_grid,
                                prepared.vq.device)
    except Exception as exc:  # noqa: BLE001  (whatever it was, ct.launch still works)
        launch = f"{type(exc).__name__}: {exc}"  # (kept: why it stays on ct.launch)
    found[1] = launch


# What each kernel takes per call, beside what `bound_arguments` binds once.
ATTENTION_PER_CALL = ("Q", "K", "V", "Out", "Lse", "CacheSeqlens", "BlockTable")
COMBINE_PER_CALL = ("Out", "Lse")
APPEND_PER_CALL = ("KNew", "VNew", "K", "V", "CacheSeqlens", "BlockTable", "Flags")


def bound_arguments(launch: DecodeLaunch, variants: tuple, partials: tuple, work, flags,
                    scale: float, causal: bool) -> tuple[dict, dict | None]:
    """-> (the attention kernel's arguments that are the same on every call, the combine
    kernel's or None): with ATTENTION_PER_CALL and COMBINE_PER_CALL, every parameter."""
    _, attention, combine = variants
    part_o, part_m, part_l = partials
    bound = {"PartO": part_o, "PartM": part_m, "PartL": part_l, "Work": work, "Flags": flags,
             "qk_scale_log2": float(scale * LOG2_E), "num_items": launch.num_items,
             "seqlen_new": launch.problem.seqlen_new, "causal": int(bool(causal)),
             **attention.constants}
    combined = None if combine is None else {
        "PartO": part_o, "PartM": part_m, "PartL": part_l, "num_splits": launch.num_splits,
        **combine.constants}
    return bound, combined


def _launch_prepared(launches: _PreparedLaunches, handle: int, q, k_cache, v_cache, out, lse,
                     lengths, table) -> str:
    """-> "all" (both kernels launched), "attention" (the combine's addresses do not fit its
    binary: the caller launches it) or "none" (an `out` over q or the cache, which the binary
    assumes apart, or addresses that do not fit: the caller launches both). An `out` over GPU
    lengths or a block table is not looked for: the call's contract has them apart."""
    q_at, k_at, v_at, out_at = at = (_address(q), _address(k_cache), _address(v_cache),
                                     _address(out))
    if _overlaps_an_input([(a, a + span) for a, span in zip(at, launches.spans)]):
        return "none"
    lse_at = _address(lse)
    part_o, part_m, part_l = launches.partials
    if not launches.attention.launch(handle, (q_at, k_at, v_at, out_at, lse_at, part_o, part_m,
                                              part_l, _address(lengths), _address(table))):
        return "none"
    if launches.combine is None or launches.combine.launch(
            handle, (part_o, part_m, part_l, out_at, lse_at)):
        return "all"
    return "attention"


def _launch_append(prepared: _Prepared, handle: int, k, v, k_cache, v_cache, lengths,
                   table) -> None:
    """The call's new keys and values written into the cache (`append_kv`)."""
    import cuda.tile as ct

    from wavefront.kernel.attention import launch_args
    from wavefront.kernel.decode import APPEND_PARAMS, append_kv
    shape = prepared.shape
    ct.launch(handle, (shape.seqlen_new, shape.batch, 1), append_kv,
              launch_args(APPEND_PARAMS, {
                  **dict(zip(APPEND_PER_CALL, (k, v, k_cache, v_cache, lengths, table,
                                               prepared.flags.buffer))),
                  **prepared.append}))


def _launch(prepared: _Prepared, handle: int, capturing: bool, q, k, v, k_cache, v_cache, out,
            lse, lengths, table) -> None:
    """Queue the call's kernels on the stream `handle`: through the layout's prepared launches
    where it has them and the addresses fit their binaries, else through `ct.launch` (counting
    the layout's calls towards preparing)."""
    shape = prepared.shape
    if prepared.append is not None:  # (the cache's new keys first: the attention reads them)
        _launch_append(prepared, handle, k, v, k_cache, v_cache, lengths, table)
    launched = "none" if prepared.launches is None else _launch_prepared(
        prepared.launches, handle, q, k_cache, v_cache, out, lse, lengths, table)
    if launched == "all":  # a decode loop's call, no import on its way
        return
    import cuda.tile as ct

    from wavefront.kernel.attention import launch_args
    from wavefront.kernel.decode import (COMBINE_SPLITS_PARAMS, DECODE_PARAMS, combine_splits,
                                         decode_kernel_for)
    if launched == "attention":
        ct.launch(handle, prepared.combine_grid, combine_splits,
                  launch_args(COMBINE_SPLITS_PARAMS, {
                      **dict(zip(COMBINE_PER_CALL, (_grouped(prepared.vq, out, shape), lse))),
                      **prepared.combine}))
        return
    out5 = _grouped(prepared.vq, out, shape)
    attention_args = launch_args(DECODE_PARAMS, {
        **dict(zip(ATTENTION_PER_CALL, (_grouped(prepared.vq, q, shape), k_cache, v_cache, out5,
                                        lse, lengths, table))),
        **prepared.bound})
    ct.launch(handle, prepared.grid, decode_kernel_for(prepared.state.variants[1].occupancy),
              attention_args)
    combine_args = None
    if prepared.combine is not None and not (
            prepared.grown and _launch_shared_combine(prepared, handle, out5, lse)):
        combine_args = launch_args(COMBINE_SPLITS_PARAMS, {
            **dict(zip(COMBINE_PER_CALL, (out5, lse))), **prepared.combine})
        ct.launch(handle, prepared.combine_grid, combine_splits, combine_args)
        if prepared.grown and PREPARED_LAUNCHES:
            _count_shared_combine(prepared, out5, lse, combine_args, capturing)
    left = prepared.calls_left  # (read once: another thread may be preparing it)
    if left is not None and not capturing:
        if left > 1:
            prepared.calls_left = left - 1
        else:  # (an `out` over an input leaves it at 1: the next call tries again)
            if prepared.combine is not None and combine_args is None:  # (launched shared)
                combine_args = launch_args(COMBINE_SPLITS_PARAMS, {
                    **dict(zip(COMBINE_PER_CALL, (out5, lse))), **prepared.combine})
            _prepare_launches(prepared, attention_args, combine_args, (q, k_cache, v_cache, out))


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None,
                           block_table=None, causal: bool = True, scale: float | None = None,
                           num_splits: int | None = None, cta_order: str | None = None,
                           return_lse: bool = False, out=None, stream=None,
                           ctas_per_sm: int | None = None):
    """Attention of q against a KV cache; see `wavefront.api.attention_with_kvcache`.

    A call of arrays laid out as an earlier call's (shapes, strides, dtypes, devices) with the
    same options skips the checks and the planning that call made (`_prepared`); one whose
    caches differ from the latest such call's only in length checks the caches alone and plans
    for their length (`_replanned`); host lengths and block tables are checked on every
    call. `ctas_per_sm` (a bench's knob, not the public
    call's): the persistent attention CTAs per SM, compiled as the kernel's occupancy
    (default `decode.DECODE_OCCUPANCY`); more CTAs keep more K/V loads in flight per SM, which
    a one-sequence step with few items needs to reach the DRAM bandwidth."""
    if isinstance(cache_seqlens, bool) or cache_seqlens is None:
        raise ValueError(f"cache_seqlens must be an int or one length per sequence, got "
                         f"{cache_seqlens!r}")
    table_host = None if block_table is None else _host_ints("block_table", block_table, 2)
    sharing = None
    if cta_order == "prefix_grouped" and block_table is not None:
        sharing = (sharing_keys(table_host, len(table_host)) if table_host is not None
                   else _gpu_table_sharing(block_table))
    layouts = (_layout(q), _layout(k_cache), _layout(v_cache),
               None if k is None else _layout(k), None if v is None else _layout(v),
               None if out is None else _layout(out))
    key = family = None
    if None not in layouts[:3] and (k is None or None not in layouts[3:5]) and (
            out is None or layouts[5] is not None):
        table_key = (None if block_table is None else "host" if table_host is not None
                     else _layout(block_table))
        options = (causal, scale, num_splits, cta_order, return_lse, sharing, ctas_per_sm)
        rest = (table_key, _lengths_kind(cache_seqlens), options, tuple(map(type, options)))
        key = (layouts, table_host is None or table_host.shape) + rest
    prepared = None if key is None else _prepared.get(key)
    if prepared is None:
        if key is not None:
            # the key without the caches' and the block table's lengths
            family = (layouts[0], _without_length(layouts[1]), _without_length(layouts[2]),
                      layouts[3:]) + rest
            base = _families.get(family)
            if base is not None:
                prepared = _replanned(base, k_cache, v_cache, block_table, table_host)
        if prepared is None:
            from wavefront.device import require_gpu_stack
            require_gpu_stack("wavefront.attention_with_kvcache")
            prepared = _prepare(q, k_cache, v_cache, cache_seqlens, k, v, block_table,
                                table_host, causal, scale, num_splits, cta_order, return_lse,
                                out, sharing, ctas_per_sm)
        if key is not None:
            _prepared[key] = prepared
            _families[family] = prepared
            _families.move_to_end(family)
            while len(_prepared) > STATE_CACHE_SIZE:
                _prepared.popitem(last=False)
            while len(_families) > STATE_CACHE_SIZE:
                _families.popitem(last=False)
        else:  # (keyed calls are of torch tensors and CuPy arrays: no conversion)
            q, k_cache, v_cache = (_view(n, x)[1] for n, x in (("q", q), ("k_cache", k_cache),
                                                                 ("v_cache", v_cache)))
            if k is not None:
                k, v = _view("k", k)[1], _view("v", v)[1]
            if out is not None:
                out = _view("out", out)[1]
    vq, shape, flags = prepared.vq, prepared.shape, prepared.flags
    if isinstance(cache_seqlens, (int, np.integer)):
        lengths_host = np.full(shape.batch, int(cache_seqlens), dtype=np.int64)
    else:
        lengths_host = _host_ints("cache_seqlens", cache_seqlens, 1)
    if lengths_host is not None:
        # (with lengths on the GPU, the pages they reach are unknown here: the kernels check)
        check_host_lengths(shape, lengths_host, table_host)

    import cupy
    on_device = (contextlib.nullcontext() if cupy.cuda.runtime.getDevice() == vq.device
                 else cupy.cuda.Device(vq.device))
    in_stream = contextlib.nullcontext() if stream is None else _as_current_stream(vq, stream)
    with on_device, in_stream:
        handle = prepared.current_stream() if stream is None else _stream_handle(stream)
        # Inside a CUDA graph capture nothing is queried or copied: the flags are read by the
        # first call outside it (or `check_kvcache_flags`).
        capturing = cupy.cuda.runtime.streamIsCapturing(handle)
        if not capturing:
            flags.check()  # an earlier call's kernels' findings, if their copy has landed
        lengths = (_to_device(vq, lengths_host) if lengths_host is not None
                   else _view("cache_seqlens", cache_seqlens)[1])
        if block_table is None:
            table = _stand_in(vq, "BlockTable", (1, 1), "int32")
        elif table_host is not None:
            table = _to_device(vq, table_host)
        else:
            table = _view("block_table", block_table)[1]
        if out is None:
            out = _empty(vq, vq.shape, vq.dtype)
        lse = (_empty(vq, (shape.batch, shape.heads, shape.seqlen_q), "float32")
               if return_lse else None)
        lse_argument = (lse.reshape(prepared.lse_shape) if return_lse
                        else _stand_in(vq, "Lse", (1, 1, 1, 1), "float32"))
        _launch(prepared, handle, capturing, q, k, v, k_cache, v_cache, out, lse_argument,
                lengths, table)
        if not capturing:
            flags.copy_behind(handle)
    if os.environ.get(CHECK_LENGTHS_ENV, "") not in ("", "0"):
        flags.check(wait=True)
    return (out, lse) if return_lse else out
