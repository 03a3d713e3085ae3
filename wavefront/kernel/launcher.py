"""Host side of the kernel: validate arrays, bind a specialisation and its buffers once, launch.

`AttentionLauncher` binds the variant, the kernel object, the work table on the GPU and the
tiled schedule's workspace for one shape, so a timing loop measures the launch and nothing
else. `attention`, the call users make, keeps launchers in a bounded cache keyed by everything
a launch depends on, so a repeated call costs a dictionary look-up and the launch.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import os
import threading
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass

import cuda.tile as ct
import numpy as np

from wavefront.device import current_device
from wavefront.kernel.attention import (
    ATTENTION_PARAMS,
    COMBINE_PARAMS,
    COMBINE_TILE_M,
    LOG2_E,
    KernelVariant,
    combine_partials,
    flash_attention_fwd,
    launch_args,
)
from wavefront.kernel.prepared import PreparedLaunch, contiguous_strides, record_jit_binaries
from wavefront.kernel.table_kernel import build_on_gpu
from wavefront.point import (DTYPES, HEAD_DIMS, KERNEL_LEVERS, NO_LEVER_VALUES, check_levers,
                             lever_values, plan, plan_varlen, plan_varlen_on_device)
from wavefront.schedules import WORK_COLUMNS, Launch

# The kernel's parameters that change from call to call lead its parameter list, so a launch
# is the per-call arrays followed by the launcher's bound arguments.
PER_CALL_PARAMS = ("Q", "K", "V", "Out", "Lse")
assert tuple(prm.name for prm in ATTENTION_PARAMS[:len(PER_CALL_PARAMS)]) == PER_CALL_PARAMS
# Where a bound argument sits in a launcher's bound tuple (the parameters after the per-call ones).
BOUND_INDEX = {prm.name: i - len(PER_CALL_PARAMS) for i, prm in enumerate(ATTENTION_PARAMS)
               if i >= len(PER_CALL_PARAMS)}


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


class AttentionLauncher:
    """One launch configuration bound to its kernel and buffers: call it with q, k, v, out.

    Everything that does not depend on the data (the binary, the kernel object, the work table
    on the GPU, the tiled schedule's fp32 partial states, the LSE buffer, the scalar arguments)
    is made once here; `__call__` only launches.
    """

    def __init__(self, launch: Launch, q_view: _ArrayView, *, scale: float | None = None,
                 return_lse: bool = False, record_order: bool = False, **levers):
        p = launch.problem
        if scale is None:
            scale = 1.0 / math.sqrt(p.head_dim)
        if (isinstance(scale, bool) or not isinstance(scale, (int, float))
                or not math.isfinite(scale) or scale <= 0):
            raise ValueError(f"scale must be a positive finite number, got {scale!r}")
        self.launch = launch
        self.view = q_view
        self.tiled = launch.kv.writes_partials
        self.return_lse = bool(return_lse)
        self.record_order = bool(record_order)
        check_levers(**levers)
        levers = {**KERNEL_LEVERS, **levers}
        cluster = levers["cluster"]
        self.variant = KernelVariant.for_launch(launch, q_view.dtype, write_lse=self.return_lse,
                                                record_order=self.record_order, **levers)
        self.kernel = self.variant.kernel()
        record_jit_binaries(self.kernel)  # before its first launch: preparing loads that binary
        # cuTile needs an array for every parameter: shared 1-element stand-ins for those this
        # launch does not use (the LSE when not asked, the partial states when not tiled).
        if return_lse:
            self._lse_argument = _in_library(q_view, _owned(
                q_view, (p.batch, p.heads, p.seqlen_q), "float32"))
        else:
            self._lse_argument = _stand_in(q_view, "Lse", (1, 1, 1), "float32")
        self.lse = _array_of(self._lse_argument)
        partial_args = (_workspace(q_view, launch.n_chunks, self.variant.partials_dtype)
                        if self.tiled else
                        tuple(_stand_in(q_view, name, shape, dtype) for name, shape, dtype in (
                            ("PartO", (1, 1, 1, 1), self.variant.partials_dtype),
                            ("PartM", (1, 1, 1), "float32"), ("PartL", (1, 1, 1), "float32"))))
        self.partials = tuple(map(_array_of, partial_args))
        # The work table, then one row whose first two numbers are the dynamic schedules'
        # [item counter, CTAs finished]: zero before every launch (the kernel's last CTA
        # resets it), so nothing on the host changes between launches.
        self._table, self._table_built = _device_work_table(q_view, launch)
        items = launch.num_items
        # [counter, (start, end) ticket per work item]; zeroed once, never reset (see tickets).
        order = (_described(_owned(q_view, 1 + 2 * launch.num_items, "int32", zeroed=True),
                            "int32")
                 if record_order else _stand_in(q_view, "Order", (1,), "int32"))
        self.order = _array_of(order)
        scalars = {"qk_scale_log2": float(scale * LOG2_E), "num_items": launch.num_items,
                   "alternate": launch.alternate}
        self.cluster = cluster
        self.grid = _grid(launch, cluster)
        self.combine_grid = (-(-p.seqlen_q // COMBINE_TILE_M), p.batch * p.heads, 1)
        # The argument tuple, bound by name once, less the per-call arrays that lead it: a
        # launch prepends them (one tuple concatenation, not a list filled slot by slot).
        part_o, part_m, part_l = partial_args
        self._bound_args = launch_args(ATTENTION_PARAMS, {
            **dict.fromkeys(PER_CALL_PARAMS), "PartO": part_o, "PartM": part_m,
            "PartL": part_l, **_table_arguments(self._table, items), "Order": order,
            **scalars, **self.variant.constants})[len(PER_CALL_PARAMS):]
        self.current_stream = _stream_getter(q_view.library, q_view.device)
        # CuPy destroys a stream when its object is collected: a CuPy launcher notes its last
        # launch on each stream, whose handle the call takes from the object (`_note_launch_on`)
        self._notes_launches = q_view.library != "torch"
        self.new_output = _output_maker(q_view)
        self._table_writer = None  # cu_seqlens on the GPU: see _write_table_from_lengths
        self._lengths_written = None  # and which its table holds (`_lengths_stamp`)
        self._lengths_may_change_unseen = False  # a capture wrote its table (ditto)
        self._writes_state = _writes_own_state(launch)
        self.recently_used = False  # called since the cache last looked (`_keep`)
        import cupy
        self.capturing = cupy.cuda.runtime.streamIsCapturing  # of a stream handle
        self._record_event = cupy.cuda.runtime.eventRecord  # (event, stream handle)
        self._own_buffers([self._table, *self.partials, self.lse, self.order])
        # Prepared once launched PREPARE_AFTER_LAUNCHES times (`_prepare`), if ever.
        self._prepared = None
        self.plain_ready = False  # `launch_plain` may serve the plain call (`_prepare`)
        self._prepared_layout = self._spans = None  # set by `_prepare`
        self._launches_until_prepared = (PREPARE_AFTER_LAUNCHES
                                         if PREPARED_LAUNCHES and cluster == 1 else None)
        self.prepare_failure = None  # why it could not be prepared, if it could not
        self._addresses = _address_reader(q_view.library)
        # Launches go to the current context: with one GPU visible it is always this
        # launcher's; with several, a launch checks (`__call__`).
        self._device_free = cupy.cuda.runtime.getDeviceCount() == 1
        self._current_device = cupy.cuda.runtime.getDevice
        self._own_device = functools.partial(cupy.cuda.Device, q_view.device)

    def _prepare(self, stream, per_call: tuple) -> None:
        """Prepare this launcher's launch from the arguments of a launch it just made (not
        one being captured: loading a binary is not a stream's work; the next launch tries).
        A failure is kept, not raised: `ct.launch` stays."""
        if self.capturing(stream if type(stream) is int else _stream_handle(stream)):
            return
        q, k, v, out, _ = per_call
        try:
            ranges = [_byte_range(x) for x in (q, k, v, out)]
        except (AttributeError, TypeError):  # arrays of no library we read: ct.launch stays
            ranges = None
        if ranges is not None and _overlaps_an_input(ranges):
            return  # an `out` in place of an input (the binary assumes none): the next launch
        self._launches_until_prepared = None
        if ranges is None:
            self.prepare_failure = "per-call arrays neither torch tensors nor CuPy arrays"
            return
        # What the binary and the packed arguments fix of the per-call arrays besides their
        # addresses: a direct call (`__call__`) is checked against it.
        self._prepared_layout = _layout(per_call)
        self._spans = tuple(end - start for start, end in ranges)
        try:
            self._prepared = PreparedLaunch(self.kernel, flash_attention_fwd.__name__,
                                            per_call + self._bound_args, len(PER_CALL_PARAMS),
                                            self.grid, self.view.device)
        except Exception as exc:  # noqa: BLE001  (whatever it was, ct.launch still works)
            self._prepared, self.prepare_failure = None, f"{type(exc).__name__}: {exc}"
            return
        # What `launch_plain` leaves out, fixed for this launcher: another GPU to make
        # current, the tiled schedule's second kernel, an LSE of the call's own, a recorded
        # order.
        self.plain_ready = (self._device_free and not self.tiled and not self.return_lse
                            and not self.record_order)

    def _fits_prepared(self, arrays: tuple, addresses: tuple) -> bool:
        """Whether a direct call's per-call arrays are laid out as those the launcher prepared
        from, with an `out` that overlaps no input."""
        q, k, v, out, lse = arrays
        layout = self._prepared_layout
        if (_array_layout(q) != layout[0] or _array_layout(k) != layout[1]
                or _array_layout(v) != layout[2] or _array_layout(out) != layout[3]):
            return False
        if lse is not self._lse_argument and _array_layout(lse) != layout[4]:
            return False
        return not _overlaps_an_input([(at, at + span)
                                       for at, span in zip(addresses, self._spans)])

    @property
    def launches_prepared(self) -> bool:
        """Whether this launcher's launches go through a prepared launch (see `__call__`)."""
        return bool(self._prepared)

    def launch_plain(self, q, k, v):
        """The plain call's launch (`attention_plain`: arrays its key vouches for, a new
        output, the caller's current stream, no LSE) once `plain_ready`: `_launch_call` and
        `__call__` in one frame, less what `plain_ready` rules out. Anything else this call
        may meet (a stream this launcher has not launched on, a work table still being built,
        a capture) goes the whole way."""
        stream = self.current_stream()
        if (stream not in self._launched_on or self._table_built is not None
                or self.capturing(stream)):
            return _launch_call(self, q, k, v, None, None)
        out = self.new_output(q)
        if not self._prepared.launch(stream, self._addresses(q, k, v, out, self._lse_argument)):
            ct.launch(stream, self.grid, self.kernel,
                      (q, k, v, out, self._lse_argument) + self._bound_args)
        if stream and self._notes_launches:  # a CuPy launcher's, as `__call__` notes them
            self._note_launch_on(stream)
        return out

    def _own_buffers(self, buffers: list) -> None:
        """Own `buffers` (GPU arrays of this launcher's) and launch on no stream yet: when the
        launcher is dropped, they are kept until every launch it queued is done."""
        self._buffers = buffers
        self._launched_on: set = set()  # stream handles this launcher launches on (on_stream)
        self._streams: dict = {}  # stream handle -> this launcher's copy for it (on_stream)
        # CuPy stream handle -> an event recorded after this launcher's last launch there: a
        # CuPy stream is destroyed when its object is collected, and the release must not
        # record on a destroyed stream (it crashed the process on the H100)
        self._last_launch_on: dict = {}
        weakref.finalize(self, _release_when_done, buffers, self._launched_on,
                         self.view.device, self._last_launch_on).atexit = False

    def __call__(self, q, k, v, out, stream, lse=None, prepared_ok=None):
        """Launch on `stream`; `lse`: where to write the LSE (default: the launcher's own
        buffer, which the next launch overwrites).

        q, k, v and out must have the shapes and dtype the launcher was made for. Once launched
        PREPARE_AFTER_LAUNCHES times, a launcher launches through a prepared launch
        (`prepared.PreparedLaunch`), which takes only the arrays' addresses: the binary and
        the packed strides are those of the arrays of the launch that prepared it.

        `prepared_ok`: None (a direct call) checks each launch's arrays against those (library,
        shapes, strides, dtypes, an `out` overlapping no input; 2.8-4.4 us of host time on the
        H100 hosts, scripts/profile_call.py) and launches any others with `ct.launch`, which
        derives everything from the arrays. True:
        the caller vouches for them (the public call, whose cache key holds them; a bench
        timing the arrays it made the launcher from). False: `ct.launch`, counting nothing
        towards preparing (a packed batch's arrays)."""
        if not (self._device_free or self._current_device() == self.view.device):
            # A raw handle means a stream of the current device (0: its null stream), and the
            # driver launches in the current context: with this launcher's GPU not current,
            # a launch went to the other GPU's null stream (an illegal address on a two-H100
            # host). So launch with this launcher's GPU current.
            with self._own_device():
                return self(q, k, v, out, stream, lse, prepared_ok)
        if type(stream) is not int or stream not in self._launched_on:
            own = self.on_stream(stream)
            if own is not self:
                return own(q, k, v, out, stream, lse, prepared_ok)
        if lse is None:
            lse = self._lse_argument
        if self._table_built is not None:
            self._wait_for_table(stream)
        prepared = self._prepared
        if prepared and prepared_ok is not False:
            try:
                addresses = self._addresses(q, k, v, out, lse)
            except AttributeError:
                # Arrays of another library than the launcher was made for (a bound launcher
                # made from torch tensors, called with CuPy arrays): ct.launch reads any.
                addresses = None
            if prepared_ok is None and addresses is not None and not self._fits_prepared(
                    (q, k, v, out, lse), addresses):
                addresses = None
            if addresses is None or not prepared.launch(
                    stream if type(stream) is int else _stream_handle(stream), addresses):
                ct.launch(stream, self.grid, self.kernel, (q, k, v, out, lse) + self._bound_args)
        else:
            ct.launch(stream, self.grid, self.kernel, (q, k, v, out, lse) + self._bound_args)
            left = self._launches_until_prepared
            if left is not None and prepared_ok is not False:
                if left > 1:
                    self._launches_until_prepared = left - 1
                else:
                    self._prepare(stream, (q, k, v, out, lse))
        if self.tiled:
            part_o, part_m, part_l = self.partials
            p = self.launch.problem
            ct.launch(stream, self.combine_grid, combine_partials, launch_args(COMBINE_PARAMS, {
                "PartO": part_o, "PartM": part_m, "PartL": part_l, "Out": out, "Lse": lse,
                "n_chunks": self.launch.n_chunks, "HEAD_DIM": p.head_dim,
                "TILE_M": COMBINE_TILE_M, "WRITE_LSE": self.return_lse}))
        if stream and (self._notes_launches or type(stream) is not int
                       and type(stream).__module__.startswith("cupy")):
            self._note_launch_on(stream if type(stream) is int else _stream_handle(stream))
        return (out, lse) if self.return_lse else out

    def _note_launch_on(self, handle: int) -> None:
        """Record that this launcher's work on a stream that may be destroyed (a CuPy
        stream's, or any stream of a CuPy launcher's: its current stream comes as a handle)
        ends here (`_last_launch_on`), for its release. Not the null stream (never
        destroyed; a CuPy caller's null stream object is handle 0), not inside a capture."""
        if not handle or self.capturing(handle):
            return
        event = self._last_launch_on.get(handle)
        if event is None:
            import cupy
            with cupy.cuda.Device(self.view.device):
                event = self._last_launch_on.setdefault(
                    handle, cupy.cuda.Event(disable_timing=True))
        self._record_event(event.ptr, handle)

    def for_lengths(self, launch) -> "AttentionLauncher":
        """This launcher for a packed batch of other lengths (`launch`: the same problem and
        schedule, new `cu_seqlens`): a copy that shares the binary, the stand-ins and the
        bound arguments, with a work table, item count and grid of its own. A training or
        serving loop brings new lengths every call; everything else stays."""
        mine = self.launch
        if not (mine.varlen and launch.varlen) or self.record_order or (
                (launch.problem, launch.cta, launch.kv, launch.ctas_per_sm)
                != (mine.problem, mine.cta, mine.kv, mine.ctas_per_sm)):
            raise ValueError("for_lengths takes a packed batch of this launcher's problem and "
                             "schedule, other lengths only")
        other = self._copy(launch, {"num_items": launch.num_items})
        other.grid = _grid(launch, self.cluster)
        return other

    def on_stream(self, stream) -> "AttentionLauncher":
        """The launcher that launches on `stream` (a raw handle, or a torch or CuPy stream):
        this one, or a copy of it with buffers of its own.

        A launch writes to some of a launcher's buffers: the dynamic schedules' item counter,
        the tiled schedules' partial states, a table written from lengths on the GPU. Two
        streams launching one launcher at once shared them, and took each other's work items
        (wrong outputs on the H100: `data/queued_calls/`). So the first stream a launcher
        meets uses its buffers, and every other stream gets a copy with buffers of its own,
        made the first time it calls (a work table built like the first, on its own stream:
        the host does not wait). Launchers that write nothing (the static schedules) serve
        every stream themselves. Either way the launcher learns the streams it launches on,
        for `_release_when_done`.

        A stream being captured into a CUDA graph gets no copy (a build inside a capture could
        not wait for its table): the graph uses this launcher's buffers, those of the first
        stream, where the usual warm-up on a side stream made the launcher. Replay such a graph
        and call eagerly on that first stream one after the other, not at once. (A graph keeps
        the buffers' addresses for as long as it lives: the public call keeps a launcher it
        launched into a capture for good, `_in_graphs`.)"""
        handle = stream if type(stream) is int else _stream_handle(stream)
        if handle in self._launched_on:
            return self
        own = self._streams.get(handle)
        return self._own_for(handle) if own is None else own

    def _own_for(self, handle: int) -> "AttentionLauncher":
        if self.capturing(handle):
            return self
        with _streams_lock:
            if handle in self._launched_on:
                return self
            if handle in self._streams:
                return self._streams[handle]
            if not (self._writes_state and self._launched_on):
                self._launched_on.add(handle)
                return self
        other = self._copy(self.launch, {})
        if self.tiled:
            partial_args = _workspace(self.view, self.launch.n_chunks,
                                      self.variant.partials_dtype)
            other.partials = tuple(map(_array_of, partial_args))
            other._buffers.extend(other.partials)
            other._bound_args = _rebound(other._bound_args, dict(
                zip(("PartO", "PartM", "PartL"), partial_args)))
        other._launched_on.add(handle)
        with _streams_lock:
            return self._streams.setdefault(handle, other)

    def _copy(self, launch, bound: dict) -> "AttentionLauncher":
        """A copy of this launcher for `launch` (this one's problem and schedule) with a work
        table of its own and `bound` arguments rebound; it shares everything else, and has
        launched nowhere yet."""
        other = copy.copy(self)
        other.launch = launch
        other._table, other._table_built = _device_work_table(self.view, launch)
        other._table_writer = None
        other._lengths_written = None
        other._lengths_may_change_unseen = False
        if other._prepared is not None or other._launches_until_prepared is not None:
            # prepared anew, if ever: its own buffers' addresses
            other._prepared, other._launches_until_prepared = None, PREPARE_AFTER_LAUNCHES
        other.plain_ready = False
        other._bound_args = _rebound(self._bound_args, {
            **_table_arguments(other._table, launch.num_items), **bound})
        other._own_buffers([other._table])
        return other

    @property
    def next_item(self):
        """The dynamic schedules' [item counter, CTAs finished] on the GPU."""
        return self._table[self.launch.num_items, :2]

    def _wait_for_table(self, stream):
        """Order this launch after the work table's build (on its own stream): until the build
        is known to be done, every launch's stream waits for it on the GPU, not the host.

        On a stream being captured into a CUDA graph the event is not queried, and the wait
        goes into the graph as an external event node (`cudaEventWaitExternal`), so that every
        replay waits on the build by name rather than on whatever a plain wait captures; the
        event is then kept for as long as graphs may live. (`test_gpu_torch` captures while a
        table is held back; the code before this passed that test too, so this is the
        documented form of the wait, not a fix of a failure seen.)"""
        import cupy
        handle = _stream_handle(stream)
        capturing = cupy.cuda.runtime.streamIsCapturing(handle)
        if not capturing and self._table_built.done:
            self._table_built = None
            return
        with cupy.cuda.Device(self.view.device):
            cupy.cuda.runtime.streamWaitEvent(handle, self._table_built.ptr,
                                              _EVENT_WAIT_EXTERNAL if capturing else 0)
        if capturing:
            _waited_on_in_graphs.append(self._table_built)

    def tickets(self):
        """(start, end) ticket of every work item of the last launch, as NumPy int64 arrays
        counted from the launch's first event (0 .. 2 x items - 1). Synchronise first."""
        if not self.record_order:
            raise ValueError("tickets need a launcher made with record_order=True")
        order = self.order[1:]
        host = np.asarray(order.get() if hasattr(order, "get") else order.cpu().numpy(),
                          dtype=np.int64)
        host -= host.min()
        return host[0::2], host[1::2]


# Launchers launch through prepared launches (`prepared.PreparedLaunch`) once launched
# PREPARE_AFTER_LAUNCHES times: preparing costs about 0.4 ms of host time and saves 3-7 us a
# launch (data/public_call/93d2c14/), so a launcher used a few times is better off without.
# Packed batches' launchers never prepare (`_launch_packed`).
# WAVEFRONT_PREPARED_LAUNCH=0 keeps `ct.launch` for every launch (to compare).
PREPARED_LAUNCHES = os.environ.get("WAVEFRONT_PREPARED_LAUNCH", "1") != "0"
PREPARE_AFTER_LAUNCHES = 64


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


def _rebound(bound_args: tuple, values: dict) -> tuple:
    """A launcher's bound arguments with some of them, by parameter name, replaced."""
    bound = list(bound_args)
    for name, value in values.items():
        bound[BOUND_INDEX[name]] = value
    return tuple(bound)


def _writes_own_state(launch) -> bool:
    """Whether a launch writes to its launcher's buffers (see `AttentionLauncher.on_stream`)."""
    return (launch.cta.dynamic or launch.kv.writes_partials
            or getattr(launch, "lengths_on_device", False))


def _grid(launch, cluster: int) -> tuple[int, int, int]:
    """A cluster launch needs a whole number of clusters; a spare CTA finds no item."""
    return (-(-launch.num_ctas // cluster) * cluster, 1, 1)


def _table_arguments(table, items: int) -> dict:
    """The kernel's Work and NextItem arguments: views of one device table, `items` rows and
    then the row whose first two numbers are the dynamic schedules' counter and whose third
    is a packed batch's item count."""
    return {"Work": _described(table, "int32", (items, WORK_COLUMNS)),
            "NextItem": _described(table, "int32", (4,), items * WORK_COLUMNS * 4)}


def launcher_for(q, k, v, *, causal=False, schedule="persistent+linear", tiles=None,
                 occupancy=None, scale=None, return_lse=False, l2_bytes=None, ctas=None,
                 chunk_tiles=None, record_order=False,
                 **levers) -> tuple[AttentionLauncher, tuple]:
    """-> (launcher for these arrays' shapes, the arrays as cuTile takes them)."""
    vq, arrays = _check_inputs(q, k, v)
    return _new_launcher(vq, arrays[1].shape, causal=causal, schedule=schedule, tiles=tiles,
                         occupancy=occupancy, scale=scale, return_lse=return_lse,
                         l2_bytes=l2_bytes, ctas=ctas, chunk_tiles=chunk_tiles,
                         record_order=record_order, **levers), arrays


def launcher_for_launch(launch: Launch, q, k, v, *, scale=None, return_lse=False,
                        record_order=False, **levers) -> tuple[AttentionLauncher, tuple]:
    """-> (launcher of a `Launch` the caller built, for these arrays; the arrays as cuTile
    takes them): a measured point builds its launch once and binds it here."""
    vq, arrays = _check_inputs(q, k, v)
    if tuple(vq.shape) != (launch.problem.batch, launch.problem.heads,
                           launch.problem.seqlen_q, launch.problem.head_dim):
        raise ValueError(f"q shape {tuple(vq.shape)} is not the launch's problem")
    return AttentionLauncher(launch, vq, scale=scale, return_lse=return_lse,
                             record_order=record_order, **levers), arrays


def kernel_arrays(q, k, v) -> tuple:
    """q, k, v as cuTile takes them (checked as a launcher checks them)."""
    return _check_inputs(q, k, v)[1]


def _new_launcher(vq: _ArrayView, k_shape, *, causal, schedule, tiles, occupancy, scale,
                  return_lse, l2_bytes, ctas, chunk_tiles, record_order=False,
                  **levers) -> AttentionLauncher:
    dev = current_device()
    if dev is None:
        raise RuntimeError("wavefront.attention needs a CUDA GPU; none is visible")
    launch = plan(vq.shape, tuple(k_shape), causal=causal, schedule=schedule, tiles=tiles,
                  occupancy=occupancy, sms=dev.sms,
                  l2_bytes=l2_bytes if l2_bytes is not None else dev.l2_bytes, ctas=ctas,
                  chunk_tiles=chunk_tiles)
    return AttentionLauncher(launch, vq, scale=scale, return_lse=return_lse,
                             record_order=record_order, **levers)


DEFAULT_SCHEDULE = "persistent+linear"


# A causal launch of at most one wave of CTAs lasts as long as its longest work item, the last
# Q tile, which scans every K/V tile up to the diagonal; 64-row tiles halve that item. Under
# CUDA-graph replay on the H100 (data/public_call/graph_replay/) they ran 1.42x the nearest
# entry's 128-row tiles at B1 H8 S1k D64 causal and 1.59x at B1 H16 S2k D128 causal; without
# the mask, where items are equal, they lost (0.94x, 0.86x).
ONE_WAVE_CAUSAL = dict(tiles="64x64", occupancy=2, worker_warps=None, cluster=1, qk_ahead=0)


def _one_wave_causal(config: dict, q_shape, k_shape, causal: bool, *, sms: int,
                     l2_bytes: int) -> dict:
    """A tuned entry's configuration, or for a causal launch whose work items (as the entry
    would plan them) fit one wave of resident CTAs, the same with ONE_WAVE_CAUSAL's tiles."""
    if not causal:
        return config
    launch = plan(q_shape, k_shape, sms=sms, l2_bytes=l2_bytes, causal=True,
                  schedule=config["schedule"], tiles=config["tiles"],
                  occupancy=config["occupancy"])
    return config if launch.num_items > launch.resident_ctas else {**config, **ONE_WAVE_CAUSAL}


def resolve_config(q_shape, k_shape, causal: bool, schedule, tiles, occupancy,
                   levers: dict, measure=None) -> dict:
    """The caller's choices, or where the caller chose nothing, the tuned table's entry for this
    GPU and the nearest tuned shape (`wavefront tune`; 64x64 tiles for a causal launch of one
    wave, `ONE_WAVE_CAUSAL`), or the defaults. `levers`: the kernel levers by name, None where
    not chosen. `measure(configs)` -> `carry_over.CarryOverChoice` or None: how a measured
    carry-over times the candidates (`WAVEFRONT_CARRY_OVER=measure`, `_carried_over`)."""
    chosen = dict(schedule=schedule, tiles=tiles, occupancy=occupancy, **levers)
    if all(v is None for v in chosen.values()):
        dev = current_device()
        tuned = _carried_over(dev, q_shape, k_shape, causal, measure) if dev else None
        if tuned is not None:
            return tuned
    chosen["schedule"] = schedule or DEFAULT_SCHEDULE
    for name, default in KERNEL_LEVERS.items():
        if chosen.get(name) is None:
            chosen[name] = default
    return chosen


# Per (GPU, q shape, k shape, mask): what a measured carry-over timed and chose
# (`carry_over.CarryOverChoice`), kept for the process: later launchers of the same problem
# (another dtype, strides, options) take its choice without timing again.
_carry_over_choices: dict = {}


def carry_over_choices() -> dict:
    """{(GPU name, q shape, k shape, causal): CarryOverChoice} of this process's measured
    carry-overs (`WAVEFRONT_CARRY_OVER=measure`)."""
    return dict(_carry_over_choices)


def _carried_over(dev, q_shape, k_shape, causal: bool, measure) -> dict | None:
    """The tuned configuration for a call that chose nothing: the nearest entry's, or under
    `WAVEFRONT_CARRY_OVER=measure`, for a shape without an entry of its own, the fastest of
    the entries' distinct configurations timed on its first call (`measure`; None: not
    timed now, the nearest's then). None: no entry for this GPU, head dim and mask."""
    from wavefront.kernel.tuning import carry_over_configs, carry_over_mode

    def fitted(config):
        return _one_wave_causal(config, q_shape, k_shape, causal, sms=dev.sms,
                                l2_bytes=dev.l2_bytes)
    if carry_over_mode() == "measure":
        exact, configs = carry_over_configs(dev.name, q_shape, k_shape, causal)
        candidates = []
        for config in map(fitted, configs):  # as each would run: alike there, counted once
            if config not in candidates:
                candidates.append(config)
        if not exact and len(candidates) > 1:
            key = (dev.name, tuple(q_shape), tuple(k_shape), causal)
            choice = _carry_over_choices.get(key)
            if choice is None:
                choice = _stored_or_measured(key, candidates, measure)
            if choice is not None:
                return choice.config
    return nearest_config(q_shape, k_shape, causal, dev)


def _stored_or_measured(key, candidates, measure):
    """A choice for `key` from the choices file (`WAVEFRONT_CARRY_OVER_FILE`), else timed now
    (`measure`) and stored there; kept for the process either way. None: neither."""
    from wavefront.kernel import carry_over
    from wavefront.kernel.tuning import table_digest
    path = carry_over.choices_file()
    table = table_digest()
    choice = None if path is None else carry_over.stored_choice(path, *key, table, candidates)
    if choice is None and measure is not None:
        choice = measure(candidates)
        if choice is not None and path is not None:
            carry_over.store_choice(path, *key, table, choice)
    if choice is not None:
        _carry_over_choices[key] = choice
    return choice


def nearest_config(q_shape, k_shape, causal: bool, dev=None) -> dict | None:
    """The configuration a call that chose nothing takes by "nearest": the nearest tuned
    entry's (`ONE_WAVE_CAUSAL`'s tiles for a causal launch of one wave). None: no entry for
    this GPU (default: the current one), head dim and mask."""
    from wavefront.kernel.tuning import tuned_config
    dev = dev or current_device()
    tuned = tuned_config(dev.name, q_shape, k_shape, causal) if dev is not None else None
    if tuned is None:
        return None
    return _one_wave_causal(tuned, q_shape, k_shape, causal, sms=dev.sms,
                            l2_bytes=dev.l2_bytes)


def _measurer(q, k, v, vq: _ArrayView, *, causal, scale, return_lse, l2_bytes, ctas,
              chunk_tiles, stream=None):
    """`measure` for `resolve_config`: the candidates' launchers made with the call's own
    options and timed on its arrays, on its stream (`carry_over.choose`)."""
    def measure(configs):
        from wavefront.kernel import carry_over
        with (contextlib.nullcontext() if stream is None else _as_current_stream(vq, stream)):
            return carry_over.choose(
                configs, lambda config: _new_launcher(
                    vq, tuple(k.shape), causal=causal, scale=scale, return_lse=return_lse,
                    l2_bytes=l2_bytes, ctas=ctas, chunk_tiles=chunk_tiles, **config),
                q, k, v, current_stream(vq.library, _torch_device(vq.device)
                                        if vq.library == "torch" else None),
                (lambda: _empty(vq, vq.shape[:3], "float32")) if return_lse else None)
    return measure


def measure_carry_over(q, k, v, *, causal: bool = False):
    """Time the measured carry-over's candidates for this problem now (a bench does, before
    its rounds), as the first plain call would under `WAVEFRONT_CARRY_OVER=measure`.
    -> the CarryOverChoice, or None where there is nothing to choose (an entry of this very
    shape, one distinct configuration, no entry, another carry-over mode)."""
    vq, (q, k, v) = _check_inputs(q, k, v)
    dev = current_device()
    measure = _measurer(q, k, v, vq, causal=causal, scale=None, return_lse=False,
                        l2_bytes=None, ctas=None, chunk_tiles=None)
    resolve_config(vq.shape, tuple(k.shape), causal, None, None, None,
                   dict.fromkeys(KERNEL_LEVERS), measure)
    return _carry_over_choices.get((dev.name, tuple(vq.shape), tuple(k.shape), causal))


# Launchers kept by the public call: a bound launcher holds its binary, its work table on the
# GPU and its workspace, so it is worth keeping for the shapes a model calls step after step,
# and bounded so that a sweep over many shapes does not keep every table alive.
LAUNCHER_CACHE_SIZE = 64
_launchers: OrderedDict = OrderedDict()
_launchers_lock = threading.Lock()
_streams_lock = threading.Lock()  # a launcher's copies for other streams (on_stream)
# Packed batches are kept apart: a training or serving loop brings new lengths every call, and
# in one cache with the dense shapes a model calls every step they would push those out and
# keep dozens of stale work tables on the GPU.
VARLEN_LAUNCHER_CACHE_SIZE = 16
_varlen_launchers: OrderedDict = OrderedDict()
# Per packed problem (arrays, options, number of sequences; not the lengths): the first
# launcher built, whose binary, stand-ins and bound arguments a batch of new lengths reuses
# (`AttentionLauncher.for_lengths`). As bounded as the launchers.
_varlen_templates: OrderedDict = OrderedDict()


def release_graph_launchers() -> int:
    """Let go of the launchers the public call launched into CUDA-graph captures, which it
    otherwise keeps for good (`_in_graphs`: no one tells it when a graph is destroyed, and a
    graph replays on its launchers' buffers for as long as it lives), and of the table events
    such graphs wait on. Call it only once every graph that captured a wavefront call is
    destroyed (a server that re-captures for new shapes, say). Launchers still in the cache
    stay there; the others' buffers go once their queued launches are done. -> how many
    launchers were held."""
    with _launchers_lock:
        held = len(_in_graphs)
        _in_graphs.clear()
        _waited_on_in_graphs.clear()
    return held


def clear_launcher_cache() -> None:
    """Forget every cached launcher (after `wavefront tune --write`, say: cached calls keep the
    configuration they were made with)."""
    with _launchers_lock:
        _launchers.clear()
        _plain_launchers.clear()
        _varlen_launchers.clear()
        _varlen_templates.clear()
        _carry_over_choices.clear()  # chosen from the table of then


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


def _cached(key, cache=_launchers):
    """-> (key, the launcher cached under it or None); the key becomes None where it cannot
    be hashed (a list of tiles, say: no caching, same result). The hash is taken once, by the
    look-up itself: hashing a key of shapes and dtypes costs about a microsecond."""
    try:
        return key, cache.get(key)
    except TypeError:
        return None, None


def attention(q, k, v, *, causal: bool = False, schedule: str | None = None,
              tiles=None, occupancy: int | None = None, scale: float | None = None,
              return_lse: bool = False, out=None, stream=None, l2_bytes: int | None = None,
              ctas: int | None = None, chunk_tiles: int | None = None, **levers):
    """FlashAttention forward; see `wavefront.api.attention` for the arguments.

    The first call with a new combination of shapes, strides, dtype, device and options builds
    and validates its launcher (the work table included); later ones find it in a bounded
    cache and only launch. What a call must not share with the next (the output, the LSE) is
    allocated per call; the launcher's own state does not change between launches (the dynamic
    schedules' counter is reset by the kernel), so a call can be captured in a CUDA graph once
    its launcher exists. Each stream that calls gets buffers of its own where a launch writes
    any (`AttentionLauncher.on_stream`), so calls on two streams at once are safe."""
    if (schedule is None and tiles is None and occupancy is None and scale is None
            and return_lse is False and out is None and stream is None and l2_bytes is None
            and ctas is None and chunk_tiles is None and not levers):
        return attention_plain(q, k, v, causal)
    return attention_positional(q, k, v, causal, schedule, tiles, occupancy, scale, return_lse,
                                out, stream, l2_bytes, ctas, chunk_tiles,
                                *(lever_values(levers) if levers else NO_LEVER_VALUES))


def attention_positional(q, k, v, causal, schedule, tiles, occupancy, scale, return_lse, out,
                         stream, l2_bytes, ctas, chunk_tiles, *levers):
    """`attention` with every option in order, then the kernel levers' values in declaration
    order (`point.LEVERS`; None: not chosen): the public call's hot path, one tuple and one
    dictionary read before the launch. Keyword arguments cost microseconds per call here,
    which is what a short launch costs."""
    options = (causal, schedule, tiles, occupancy, scale, return_lse, l2_bytes, ctas,
               chunk_tiles, *levers)
    key, launcher = _cached(_call_key(q, k, v, options))
    if launcher is None:
        levers = dict(zip(KERNEL_LEVERS, levers))

        def build(vq, k_shape):
            measure = _measurer(q, k, v, vq, causal=causal, scale=scale, return_lse=return_lse,
                                l2_bytes=l2_bytes, ctas=ctas, chunk_tiles=chunk_tiles,
                                stream=stream)
            config = resolve_config(vq.shape, tuple(k_shape), causal, schedule, tiles,
                                    occupancy, levers, measure)
            return _new_launcher(vq, k_shape, causal=causal, scale=scale,
                                 return_lse=return_lse, l2_bytes=l2_bytes, ctas=ctas,
                                 chunk_tiles=chunk_tiles, **config)
        if key is None:  # arrays that need converting (DLPack): converted, checked once, uncached
            vq, (q, k, v) = _check_inputs(q, k, v)
            launcher = build(vq, k.shape)
        else:
            launcher = _cached_launcher(
                key, lambda: build(_check_inputs(q, k, v)[0], tuple(k.shape)))
    else:
        launcher.recently_used = True  # a hit (`_keep`)
    return _launch_call(launcher, q, k, v, out, stream)


# By mask, a call that names no option but the mask: `attention_positional`'s arguments after
# q, k, v (the options, out and stream, the levers), and the options tuple it keys on.
_PLAIN_ARGUMENTS = {causal: (causal, None, None, None, None, False, None, None, None, None,
                             None, *NO_LEVER_VALUES) for causal in (False, True)}
_PLAIN_OPTIONS = {causal: arguments[:6] + arguments[8:]  # without out and stream
                  for causal, arguments in _PLAIN_ARGUMENTS.items()}
# A plain call's key (`attention_plain`: q, k, v and the mask) -> its launcher, which
# the launcher cache holds under the full key; emptied whenever that cache lets one go.
_plain_launchers: dict = {}


def attention_plain(q, k, v, causal):
    """`attention_positional` for the call that names no option but the mask, the call a model
    makes (`wavefront.attention(q, k, v, causal=...)`). On torch tensors or CuPy arrays with a
    bool mask it keys by the arrays and the mask alone: building the full key's options tuple and their
    types (which tell True from 1), and passing them, cost 1.7-2.0 us a call on the H100 hosts
    (data/public_call/RUNS.md#a99b7fd). A miss takes the full path and remembers the launcher that
    path cached."""
    kind = type(q)
    if type(k) is not kind or type(v) is not kind or type(causal) is not bool:
        key = None
    elif kind.__module__ == "torch":
        key = (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype,
               k.get_device(), v.shape, v.stride(), v.dtype, v.get_device(), causal)
    elif kind.__module__.startswith("cupy"):
        key = (_cupy_key(q), _cupy_key(k), _cupy_key(v), causal)
    else:
        key = None
    if key is None:  # mixed or other arrays, or a mask that is not a bool: the full key
        return attention_positional(q, k, v, causal, *_PLAIN_ARGUMENTS[False][1:])
    launcher = _plain_launchers.get(key)
    if launcher is not None:
        launcher.recently_used = True  # a hit (`_keep`)
        if launcher.plain_ready:
            return launcher.launch_plain(q, k, v)
        return _launch_call(launcher, q, k, v, None, None)
    out = attention_positional(q, k, v, *_PLAIN_ARGUMENTS[causal])
    _, cached = _cached(_call_key(q, k, v, _PLAIN_OPTIONS[causal]))
    if cached is not None:
        _plain_launchers[key] = cached
    return out


def _launch_call(launcher, q, k, v, out, stream):
    """The public call's launch once it has its launcher: a new output (or the caller's,
    checked), on the caller's stream."""
    view = launcher.view
    # An output the caller gave goes through the prepared launch only where it is laid out as
    # the launcher's own would be and overlaps none of q, k and v (`AttentionLauncher.__call__`).
    prepared_ok = out is None
    if stream is None:  # the usual call: the same two lines, without entering a context
        stream = launcher.current_stream()
        out = launcher.new_output(q) if out is None else _checked_output(view, out)
        lse = _empty(view, view.shape[:3], "float32") if launcher.return_lse else None
    else:
        with _as_current_stream(view, stream):
            out = launcher.new_output(q) if out is None else _checked_output(view, out)
            lse = _empty(view, view.shape[:3], "float32") if launcher.return_lse else None
    if not prepared_ok:
        prepared_ok = _lays_out_as_own(view, out, (q, k, v))
    if launcher.capturing(stream if type(stream) is int else _stream_handle(stream)):
        _in_graphs[id(launcher)] = launcher
    return launcher(q, k, v, out, stream, lse, prepared_ok)


def _cached_launcher(key, build, varlen: bool = False) -> AttentionLauncher:
    """The launcher cached under `key` (None: not cacheable), marked used, else `build()`,
    then cached (packed batches in a cache of their own).

    A hit is one dictionary read (atomic under the interpreter lock, so no lock of ours on
    the hot path) and the mark; inserting and evicting take the lock (`_keep`)."""
    cache, size = ((_varlen_launchers, VARLEN_LAUNCHER_CACHE_SIZE) if varlen else
                   (_launchers, LAUNCHER_CACHE_SIZE))
    key, launcher = _cached(key, cache)
    if launcher is not None:
        launcher.recently_used = True
        return launcher
    return _keep(cache, key, build(), size)


def _keep(cache: OrderedDict, key, launcher, size: int) -> AttentionLauncher:
    """Cache `launcher` under `key` (None: not cacheable); -> the launcher cached under `key`
    (a racing thread's build wins).

    Past `size` entries, the oldest goes unless it was used since it last came up, which
    sends it to the back unmarked (a second chance: least-recently-used, near enough); the
    entry just kept is passed over once. A launcher a model calls every step so outlives any
    number of one-off shapes (a sweep, a server's new prompt lengths, host-lengths packed
    batches), where oldest-first would evict it and rebuild it on its next call (about a
    millisecond of host time). Exact LRU would cost every hit the lock and a second hash of
    its key, about a microsecond: more than the mark, one attribute written. A new entry
    starts unmarked: marked, one-offs would look used, and clearing them all would bring the
    model's launcher round unmarked."""
    if key is not None:
        with _launchers_lock:
            kept = cache.setdefault(key, launcher)
            if kept is not launcher:
                return kept
            launcher.recently_used = False
            passed_over = False
            while len(cache) > size:
                oldest_key, oldest = next(iter(cache.items()))
                if oldest.recently_used or (oldest is launcher and not passed_over):
                    passed_over = passed_over or oldest is launcher
                    oldest.recently_used = False
                    cache.move_to_end(oldest_key)
                else:
                    del cache[oldest_key]
                    _plain_launchers.clear()  # it may hold the launcher let go
    return launcher


def _host_bounds(name: str, cu_seqlens) -> tuple[int, ...]:
    """cu_seqlens as a tuple of host ints. A GPU tensor is copied to the host, which waits for
    the GPU: pass a list, a NumPy array or a CPU tensor to keep the call asynchronous."""
    if hasattr(cu_seqlens, "tolist"):
        cu_seqlens = cu_seqlens.tolist()  # torch, NumPy and CuPy alike
    try:
        return tuple(cu_seqlens)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of integers, got "
                         f"{type(cu_seqlens).__name__}") from None


def _packed_as_4d(name: str, x):
    """(total rows, heads, D) -> the kernel's (1, heads, total rows, D): a view, no copy."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 3:
        raise ValueError(f"{name} must be 3-D (total_rows, heads, head_dim) packed sequences, "
                         f"got shape {None if shape is None else tuple(shape)}")
    if type(x).__module__ == "torch":
        return x.unsqueeze(0).transpose(1, 2)
    _, x = _view(name, x)  # CuPy, or any DLPack GPU array as CuPy
    return x.reshape((1,) + tuple(shape)).transpose(0, 2, 1, 3)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                     max_seqlen_k=None, *, causal: bool = False, schedule: str | None = None,
                     tiles=None, occupancy: int | None = None, scale: float | None = None,
                     return_lse: bool = False, out=None, stream=None,
                     l2_bytes: int | None = None, ctas: int | None = None, **levers):
    """FlashAttention forward over packed sequences; see `wavefront.api.attention_varlen`."""
    if _lengths_on_gpu(q, cu_seqlens_q, cu_seqlens_k):
        return _attention_varlen_on_gpu(
            q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, schedule=schedule, tiles=tiles,
            occupancy=occupancy, scale=scale, return_lse=return_lse, out=out, stream=stream,
            l2_bytes=l2_bytes, ctas=ctas, levers=levers)
    bounds_q = _host_bounds("cu_seqlens_q", cu_seqlens_q)
    bounds_k = _host_bounds("cu_seqlens_k", cu_seqlens_k)
    problem_options = (causal, schedule, tiles, occupancy, scale, return_lse, l2_bytes, ctas,
                       len(bounds_q), *(x for item in levers.items() for x in item))
    key = _call_key(q, k, v, (*problem_options, bounds_q, bounds_k, max_seqlen_q, max_seqlen_k))
    q4, k4, v4 = (_packed_as_4d(n, x) for n, x in (("q", q), ("k", k), ("v", v)))

    def build():
        lengths_q = [b - a for a, b in zip(bounds_q, bounds_q[1:])]
        lengths_k = [b - a for a, b in zip(bounds_k, bounds_k[1:])]
        for name, given, lengths in (("max_seqlen_q", max_seqlen_q, lengths_q),
                                     ("max_seqlen_k", max_seqlen_k, lengths_k)):
            if given is not None and lengths and int(given) < max(lengths):
                raise ValueError(f"{name} must be at least the longest sequence "
                                 f"({max(lengths)}), got {given}")
        template_key, template = _cached(
            None if key is None else _call_key(q, k, v, problem_options), _varlen_templates)
        if template is not None:  # this problem with other lengths: only the table is new
            template.recently_used = True
            made = template.launch
            return template.for_lengths(plan_varlen(
                tuple(q.shape), tuple(k.shape), bounds_q, bounds_k, causal=causal,
                schedule=made.name, tiles=(made.problem.tile_m, made.problem.tile_n),
                occupancy=made.ctas_per_sm, sms=made.sms, l2_bytes=made.l2_bytes,
                ctas=made.ctas))
        launcher = _first_varlen_launcher()
        # (not what `_keep` hands back: a racing thread's template has other lengths)
        _keep(_varlen_templates, template_key, launcher, VARLEN_LAUNCHER_CACHE_SIZE)
        return launcher

    def _first_varlen_launcher():
        vq, _ = _check_inputs(q4, k4, v4)
        dev, config = _varlen_config(vq, k4.shape[1], len(bounds_q) - 1, causal, schedule,
                                     tiles, occupancy, levers)
        launch = plan_varlen(tuple(q.shape), tuple(k.shape), bounds_q, bounds_k,
                             causal=causal, schedule=config.pop("schedule"),
                             tiles=config.pop("tiles"), occupancy=config.pop("occupancy"),
                             sms=dev.sms, l2_bytes=l2_bytes or dev.l2_bytes, ctas=ctas)
        return AttentionLauncher(launch, vq, scale=scale, return_lse=return_lse, **config)
    launcher = _cached_launcher(key, build, varlen=True)
    return _launch_packed(launcher, q, q4, k4, v4, out, stream)


def _varlen_config(vq: _ArrayView, kv_heads: int, batch: int, causal, schedule, tiles,
                   occupancy, levers: dict) -> tuple:
    """-> (this GPU, the configuration of a packed batch of `batch` sequences): the caller's
    choices, where the caller chose nothing the tuned table's entry for the dense batch of the
    same size, its order with a linear scan where the entry is tiled."""
    dev = current_device()
    if dev is None:
        raise RuntimeError("wavefront.attention_varlen needs a CUDA GPU; none is visible")
    n = max(batch, 1)
    dense = (n, vq.shape[1], max(vq.shape[2] // n, 1), vq.shape[3])
    config = resolve_config(dense, (n, kv_heads) + dense[2:], causal, schedule, tiles,
                            occupancy, {**dict.fromkeys(KERNEL_LEVERS), **levers})
    cta, _, kv = config["schedule"].partition("+")
    if schedule is None and kv.startswith("tiled"):
        config["schedule"] = f"{cta}+linear"  # a tuned tiled entry: its order, linear scan
    return dev, config


def _launch_packed(launcher, q, q4, k4, v4, out, stream):
    """Launch a packed batch's launcher on q, k, v (and q4, k4, v4: them as the kernel's 4-D
    views) into `out` (None: a new one) on `stream` (None: the caller's current one)."""
    view = launcher.view
    total_q, heads, head_dim = tuple(q.shape)
    if out is not None:
        vo, out = _view("out", out)
        if vo.shape != (total_q, heads, head_dim) or vo.dtype != view.dtype:
            raise ValueError(f"out must have q's shape {(total_q, heads, head_dim)} and dtype "
                             f"{view.dtype}, got {vo.shape} {vo.dtype}")
    with contextlib.nullcontext() if stream is None else _as_current_stream(view, stream):
        if out is None:
            out = _empty(view, (total_q, heads, head_dim), view.dtype)
        lse = _empty(view, (1, heads, total_q), "float32") if launcher.return_lse else None
    if stream is None:
        stream = launcher.current_stream()
    if launcher.capturing(stream if type(stream) is int else _stream_handle(stream)):
        _in_graphs[id(launcher)] = launcher
    if launcher.launch.num_items:
        # Never through a prepared launch, which takes only addresses: a launcher whose
        # lengths are on the GPU serves every total of packed rows up to its bucket, so the
        # arrays' shapes change from call to call. (A launcher for lengths on the host would
        # keep its shapes, but a training or serving loop brings new lengths every step, and
        # preparing costs 0.4 ms: +0.45 ms a step of 96 layers on the H100 host,
        # data/public_call/ce9f560/.)
        launcher(q4, k4, v4, _packed_as_4d("out", out), stream, lse, False)
    return (out, lse[0]) if launcher.return_lse else out


def _lengths_on_gpu(q, cu_seqlens_q, cu_seqlens_k) -> bool:
    """Torch arrays with both cu_seqlens on the GPU: the table is written there, from them."""
    return all(type(x).__module__ == "torch" and x.is_cuda
               for x in (q, cu_seqlens_q, cu_seqlens_k))


def _attention_varlen_on_gpu(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal, schedule, tiles,
                             occupancy, scale, return_lse, out, stream, l2_bytes, ctas,
                             levers):
    """`attention_varlen` with cu_seqlens on the GPU, where the host never reads them: one
    launcher per packed problem, bucket of packed rows (`_rows_bucket`) and bucket of numbers
    of sequences (`_sequences_bucket`; `DeviceVarlenLaunch`), whose table each call writes on
    the launch's stream from the lengths there. No call waits for the GPU, and a CUDA graph of
    a call replays it for the lengths the tensors hold then."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if (cu.dim() != 1 or cu.shape[0] < 2 or str(cu.dtype) not in ("torch.int32",
                                                                      "torch.int64")
                or cu.device != q.device):
            raise ValueError(f"{name} on the GPU must be a 1-D int32 or int64 tensor of batch "
                             f"+ 1 (>= 2) entries on q's device ({q.device}), got "
                             f"{str(cu.dtype)} of shape {tuple(cu.shape)} on {cu.device}")
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of "
                         f"sequences, got {cu_seqlens_q.shape[0] - 1} and "
                         f"{cu_seqlens_k.shape[0] - 1}")
    q4, k4, v4 = (_packed_as_4d(n, x) for n, x in (("q", q), ("k", k), ("v", v)))
    if not (q.shape[0] and k.shape[0]) or v.shape != k.shape:
        _check_inputs(q4, k4, v4)  # names the empty one, or v's shape
    rows_q, rows_k = _rows_bucket(q.shape[0]), _rows_bucket(k.shape[0])
    batch = _sequences_bucket(cu_seqlens_q.shape[0] - 1)
    # `_call_key`'s key with the packed rows and the number of sequences only by their buckets
    # (a serving loop brings a new total and often a new count every call), the options'
    # types included as there.
    options = (rows_q, rows_k, causal, schedule, tiles, occupancy, scale, return_lse, l2_bytes,
               ctas, batch, "lengths on the GPU", *(x for item in levers.items() for x in item))
    key = (tuple(q.shape[1:]), q.stride(), q.dtype, q.get_device(), tuple(k.shape[1:]),
           k.stride(), k.dtype, k.get_device(), v.stride(), v.dtype, v.get_device(), options,
           tuple(map(type, options)))

    def build():
        vq, _ = _check_inputs(q4, k4, v4)
        vq = dataclasses.replace(vq, shape=(1, vq.shape[1], rows_q, vq.shape[3]))
        dev, config = _varlen_config(vq, k4.shape[1], batch, causal, schedule, tiles,
                                     occupancy, levers)
        launch = plan_varlen_on_device(
            (rows_q,) + tuple(q.shape[1:]), (rows_k,) + tuple(k.shape[1:]), batch,
            causal=causal, schedule=config.pop("schedule"), tiles=config.pop("tiles"),
            occupancy=config.pop("occupancy"), sms=dev.sms, l2_bytes=l2_bytes or dev.l2_bytes,
            ctas=ctas)
        return AttentionLauncher(launch, vq, scale=scale, return_lse=return_lse, **config)
    launcher = _cached_launcher(key, build, varlen=True)
    launcher = _write_table_from_lengths(
        launcher, cu_seqlens_q, cu_seqlens_k,
        launcher.current_stream() if stream is None else stream, q.shape[0], k.shape[0])
    return _launch_packed(launcher, q, q4, k4, v4, out, stream)


def _sequences_bucket(sequences: int) -> int:
    """A number of sequences rounded up to a power of two, at least 8: a launcher whose lengths
    are on the GPU serves every count up to its bucket, the sequences after a call's own
    empty (`_padded`), so that a serving loop whose batch changes call by call builds a few
    launchers, not one per count (a launcher's first call waits for the GPU once)."""
    return max(8, 1 << (sequences - 1).bit_length())


def _padded(cu_seqlens, entries: int):
    """cu_seqlens of fewer sequences than a launcher's bucket as the bucket's: the last bound
    repeated, making empty sequences, which have no work."""
    missing = entries - cu_seqlens.shape[0]
    if not missing:
        return cu_seqlens
    import torch
    return torch.cat((cu_seqlens, cu_seqlens[-1:].expand(missing)))


def _rows_bucket(rows: int) -> int:
    """Packed rows rounded up to a power of two, at least 1024: a launcher whose lengths are on
    the GPU serves every total up to its bucket (its table has rows for the bucket's most
    items), so that totals that change call by call share a few launchers."""
    return max(1024, 1 << (rows - 1).bit_length())


def _write_table_from_lengths(launcher, cu_seqlens_q, cu_seqlens_k, stream, rows_q: int,
                              rows_k: int) -> AttentionLauncher:
    """Write a `DeviceVarlenLaunch` launcher's table and item count from the lengths on the
    GPU and the packed rows of this call (`rows_q`, `rows_k`: the lengths are clamped to
    them), on `stream` (the launch's), with torch: nothing is read back. -> the launcher's
    copy for `stream` (`AttentionLauncher.on_stream`), whose table this wrote.

    The writing is a hundred to two hundred small torch operations (by the order), which run
    eagerly cost 1.3-1.4 ms of host time a call on the H100 host. So the launcher's first
    call outside a graph capture records them once in a CUDA graph of its own, reading
    buffers of the launcher's, and later calls copy the lengths and rows into those and
    replay it: a first call waits for the GPU once (the capture synchronises). Inside the
    caller's own capture the operations are recorded into the caller's graph instead. The
    table and those buffers are the stream's own copy's, made on that stream.

    A model calls attention once a layer with the same cu_seqlens tensors, and the writing
    costs more GPU time than the kernel itself on a small batch (0.26 of 0.43 ms at 8
    sequences of 4k tokens, H32 KV8 D128 causal, H100). So a call whose cu_seqlens are the
    very tensors the table was last written from, unmodified since (torch's version counter
    of each: an in-place write such as `copy_` bumps it), with the same packed rows, writes
    nothing. Not where torch keeps no version counter (inference tensors, made under
    `torch.inference_mode`: a serving loop may `copy_` new lengths into one static tensor),
    nor on a launcher copy whose table a captured graph writes (its replays would change the
    lengths unseen). Writes that torch's version counter does not see (a kernel of CuPy's or
    Triton's through the data pointer, the replay of a CUDA graph that writes the tensor)
    need a new tensor, or `REUSE_UNCHANGED_LENGTHS = False` here."""
    import torch

    import wavefront.kernel.torch_arrays  # noqa: F401  (the formulas' operations on torch)
    handle = _stream_handle(stream)
    entries = launcher.launch.batch + 1
    with (contextlib.nullcontext() if handle == launcher.current_stream() else
          _as_current_stream(launcher.view, handle)):
        launcher = launcher.on_stream(handle)
        if torch.cuda.is_current_stream_capturing():
            launcher._lengths_may_change_unseen = True
            launcher._lengths_written = None
            _table_from_lengths(launcher, _padded(cu_seqlens_q, entries),
                                _padded(cu_seqlens_k, entries), rows_q, rows_k)
            return launcher
        written = launcher._lengths_written
        if written is not None and REUSE_UNCHANGED_LENGTHS and _same_lengths(
                written, cu_seqlens_q, cu_seqlens_k, rows_q, rows_k):
            return launcher
        launcher._lengths_written = None  # until written
        if launcher._table_writer is None:
            view = launcher.view
            staged = tuple(_in_library(view, _owned(view, n, "int64"))
                           for n in (entries, entries, 2))
            _stage(staged, cu_seqlens_q, cu_seqlens_k, rows_q, rows_k)
            arguments = staged[0], staged[1], staged[2][0], staged[2][1]
            _table_from_lengths(launcher, *arguments)  # this call's table, and a warm-up
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                _table_from_lengths(launcher, *arguments)
            launcher._table_writer = graph, staged
            launcher._buffers.append(launcher._table_writer)
        else:
            graph, staged = launcher._table_writer
            _stage(staged, cu_seqlens_q, cu_seqlens_k, rows_q, rows_k)
            graph.replay()
        if not launcher._lengths_may_change_unseen:
            launcher._lengths_written = _lengths_stamp(cu_seqlens_q, cu_seqlens_k, rows_q,
                                                       rows_k)
    return launcher


# Whether a call with cu_seqlens on the GPU may keep the table its launcher last wrote from the
# same, unmodified tensors (`_write_table_from_lengths`). False: every call writes it.
REUSE_UNCHANGED_LENGTHS = True


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


def _lengths_stamp(cu_seqlens_q, cu_seqlens_k, rows_q: int, rows_k: int):
    """What identifies the lengths a table is written from: the cu_seqlens tensors'
    `tensors_stamp` and the packed rows; None where a tensor keeps no version counter."""
    stamp = tensors_stamp(cu_seqlens_q, cu_seqlens_k)
    return None if stamp is None else (stamp, rows_q, rows_k)


def _same_lengths(stamp, cu_seqlens_q, cu_seqlens_k, rows_q: int, rows_k: int) -> bool:
    """Whether these cu_seqlens and rows are those `stamp` (`_lengths_stamp`) was taken of,
    the tensors unmodified since."""
    tensors, stamped_q, stamped_k = stamp
    return (stamped_q == rows_q and stamped_k == rows_k
            and stamp_matches(tensors, cu_seqlens_q, cu_seqlens_k))


def _stage(staged, cu_seqlens_q, cu_seqlens_k, rows_q: int, rows_k: int) -> None:
    """Copy a call's lengths (`_padded` to the launcher's bucket) and packed rows into the
    writer graph's inputs, on the GPU (a fill takes its value as a kernel argument: no copy
    from the host, nothing waits)."""
    for buffer, cu_seqlens in zip(staged, (cu_seqlens_q, cu_seqlens_k)):
        buffer.copy_(_padded(cu_seqlens, buffer.shape[0]))
    staged[2][0].fill_(rows_q)
    staged[2][1].fill_(rows_k)


def _table_from_lengths(launcher, cu_seqlens_q, cu_seqlens_k, rows_q, rows_k) -> None:
    """The table's rows and count from the lengths and packed rows (ints, or 0-d tensors on
    the GPU), on torch's current stream."""
    import torch
    launch, table = launcher.launch, launcher._table
    items = launch.num_items
    columns, count = launch.table_columns(cu_seqlens_q, cu_seqlens_k, rows_q, rows_k)
    # One stack and one copy, not a strided copy per column: each is a kernel of its own,
    # and on a small batch the writing's kernels, not their work, take its time.
    like = next(values for values in columns if isinstance(values, torch.Tensor))
    table[:items, :len(columns)].copy_(torch.stack([
        values if isinstance(values, torch.Tensor) else like.new_full((items,), values)
        for values in columns], dim=1))
    table[items, 2:3] = count.reshape(1)


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


_table_streams: dict = {}
# cudaEventWaitExternal: a wait captured into a graph as an external event node.
_EVENT_WAIT_EXTERNAL = 1
# Table events that a captured graph waits on: never destroyed, since a graph can be replayed
# after its launcher is gone (one per launcher captured before its table was known done).
_waited_on_in_graphs: list = []
# (events, buffers): buffers kept until the GPU is done with them, which those events say. A
# varlen table's pinned host copy (CuPy's pinned pool would hand a freed buffer to the next
# copy while the GPU still reads it), and a dropped launcher's GPU buffers
# (`_release_when_done`). A deque, appended to by finalizers, which run inside whatever code
# drops a launcher: no lock.
_kept: deque = deque()
# Cached launchers that the public call launched into a CUDA graph capture, by id: kept for
# good. A graph replays its launches on the launcher's buffers for as long as it lives, and
# no one tells us when that ends; were the launcher evicted from the cache, its buffers would
# go (after its launches so far, `_release_when_done`) while later replays still read them.
# Checking each call for a capture costs 0.4 us on the H100 host (cudaStreamIsCapturing).
# `release_graph_launchers` lets them go once the caller's graphs are gone.
_in_graphs: dict = {}


def _table_stream(device: int):
    """The stream work tables are built on, one per device (CuPy's; the current device)."""
    import cupy
    stream = _table_streams.get(device)
    if stream is None:
        stream = _table_streams.setdefault(device, cupy.cuda.Stream(non_blocking=True))
    return stream


def _device_work_table(vq: _ArrayView, launch):
    """-> (the launch's work table on q's device followed by one row whose first two numbers
    are the dynamic schedules' item counter, zeroed; the CuPy event it is ready at).

    Built on a stream of its own, which every launch waits for on the GPU until the table is
    known to be ready: the host issues the work and never waits for the GPU. A dense launch's
    table is written on the GPU by one kernel printed from the schedule's own formulas
    (`table_kernel`), where building 100k rows on the host and copying them cost milliseconds
    (and building them with CuPy, operation by operation, ten to twenty launches). Packed
    variable-length batches build their table on the host (their rows come from the host's
    sequence lengths) and copy it from pinned memory: a copy from pageable memory waits for
    everything queued on the GPU before it, so each new batch of lengths would have stalled the
    caller's host until the GPU caught up. It is a CuPy array for torch callers too (cuTile
    takes either)."""
    import cupy
    # Entering a device costs microseconds on a first call; only another device needs it.
    on_device = (contextlib.nullcontext() if cupy.cuda.runtime.getDevice() == vq.device
                 else cupy.cuda.Device(vq.device))
    if getattr(launch, "lengths_on_device", False):
        # Written by each call, on its stream (`_write_table_from_lengths`).
        return _in_library(vq, _owned(vq, (launch.num_items + 1, WORK_COLUMNS), "int32",
                                      zeroed=True)), None
    with on_device:
        stream = _table_stream(vq.device)
        with stream:  # the table's memory too belongs to this stream (CuPy's pool)
            if launch.varlen:
                table, pinned = _copy_from_pinned(launch, stream)
            else:
                table = build_on_gpu(launch, vq.device)
        built = cupy.cuda.Event(disable_timing=True)  # an ordering point, never timed
        built.record(stream)
    if launch.varlen:
        _keep_until_done((built,), pinned)
    return table, built


def _copy_from_pinned(launch, stream):
    """-> (a varlen launch's work table and a zeroed counter row on the GPU, the pinned buffer
    the copy reads), the table written on the host straight into that buffer and its copy
    queued on `stream`."""
    import cupy
    shape = (launch.num_items + 1, WORK_COLUMNS)
    pinned = cupy.cuda.alloc_pinned_memory(shape[0] * WORK_COLUMNS * 4)
    staging = np.frombuffer(pinned, dtype=np.int32, count=shape[0] * WORK_COLUMNS)
    staging = staging.reshape(shape)
    launch.write_work_table(staging[:-1])
    staging[-1] = 0
    staging[-1, 2] = launch.num_items  # the kernel reads a packed batch's count here
    table = cupy.empty(shape, dtype=cupy.int32)
    table.set(staging, stream=stream)
    return table, pinned


def _keep_until_done(events, buffers) -> None:
    """Keep `buffers` until every one of `events` (CuPy events) is done, and let go of those
    kept whose events are."""
    for _ in range(len(_kept)):
        try:
            kept = _kept.popleft()
        except IndexError:  # another thread took the last
            break
        if not all(event.done for event in kept[0]):
            _kept.append(kept)
    _kept.append((events, buffers))


def _release_when_done(buffers, handles, device: int, last_launch_on: dict) -> None:
    """A launcher dropped (evicted from the cache, or made for one call that could not be
    cached): keep its GPU buffers until the launches it queued on each of its streams
    (`handles`) are done. Let go at once, a work table's memory went back to CuPy's pool of
    the table stream, and the next table built there took it while a launch still queued on
    the caller's stream had yet to read it: 9 of 12 calls came out wrong on the H100
    (`data/queued_calls/`). On a CuPy stream the event recorded after the last launch there
    (`last_launch_on`) stands for it: the stream may be gone (torch's streams come from a
    pool and live as long as the process; a raw handle must outlive the launches on it)."""
    if not handles:
        return  # it never launched: nothing queued reads its buffers
    import cupy
    events = []
    with cupy.cuda.Device(device):
        for handle in tuple(handles):
            event = last_launch_on.get(handle)
            if event is None:
                event = cupy.cuda.Event(disable_timing=True)
                cupy.cuda.runtime.eventRecord(event.ptr, handle)
            events.append(event)
    _keep_until_done(events, buffers)


def _stream_handle(stream) -> int:
    """A raw stream handle from a handle, a torch stream or a CuPy stream."""
    if isinstance(stream, int):
        return stream
    attribute = _handle_attributes.get(type(stream))
    if attribute is None:  # a stream type not seen yet: which attribute holds its handle
        attribute = next((a for a in ("cuda_stream", "ptr") if hasattr(stream, a)), None)
        if attribute is None:
            raise ValueError(f"stream must be a raw CUDA stream handle, a torch stream or a "
                             f"CuPy stream, got {type(stream).__name__}")
        _handle_attributes[type(stream)] = attribute
    return int(getattr(stream, attribute))


# Stream type -> the attribute that holds its raw handle ("cuda_stream": torch's, "ptr":
# CuPy's), found once per type: a failed `hasattr` costs about a microsecond, and a CuPy call
# asks for its stream's handle three times.
_handle_attributes: dict = {}


def _workspace(vq, n_chunks, output_dtype="float32"):
    """Partial states of the tiled schedule, as launch arguments: output (chunks x batch,
    heads, seqlen, head_dim) in `output_dtype`, fp32 row max and row sum (chunks x batch,
    heads, seqlen)."""
    b, h, s, d = vq.shape
    shapes = [(n_chunks * b, h, s, d), (n_chunks * b, h, s), (n_chunks * b, h, s)]
    dtypes = (output_dtype, "float32", "float32")
    return tuple(_described(_owned(vq, sh, dt), dt) for sh, dt in zip(shapes, dtypes))


class _StreamHandle:
    """A raw stream handle behind the CUDA stream protocol, as CuPy's `Stream.from_external`
    takes it."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def cupy_stream(handle: int):
    """A CuPy stream object for a raw handle (`ExternalStream` is deprecated from CuPy 14 on,
    and warns; older CuPy lacks `from_external`)."""
    import cupy
    if hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(_StreamHandle(handle))
    return cupy.cuda.ExternalStream(handle)


def _as_current_stream(vq: _ArrayView, stream):
    """A context in which `stream` (a handle, a torch or a CuPy stream) is q's library's
    current stream: its operations run there and its pool allocates there. For an output
    made for a call given `stream=`: both libraries' pools hand out memory per stream,
    ordered after that stream's frees only. Made on the current stream instead, an output
    could take memory that work still queued there reads, and the kernel on `stream` would
    overwrite it; torch would also hand it back to the current stream when the caller frees
    it. So the call behaves as the same call inside `with torch.cuda.stream(stream)` (or
    CuPy's `with stream`) does."""
    if vq.library == "torch":
        import torch
        if not isinstance(stream, torch.cuda.Stream):
            stream = torch.cuda.ExternalStream(_stream_handle(stream),
                                               device=_torch_device(vq.device))
        return torch.cuda.stream(stream)
    import cupy
    with cupy.cuda.Device(vq.device):
        return cupy_stream(_stream_handle(stream))


def current_stream(library, device=None):
    """The stream the caller's library would use now (on `device`, for torch)."""
    if library == "torch":
        import torch
        return torch.cuda.current_stream(device)
    import cupy
    return cupy.cuda.get_current_stream()


def _output_maker(vq: _ArrayView):
    """A function of q that returns a new contiguous output of q's shape, dtype and device,
    made once per launcher: for a contiguous torch q, `torch.empty_like` (2.1-3.3 us a call on
    the H100 hosts against 4.7-5.4 us for `new_empty` of a shape and 8.4-8.9 us for
    `torch.empty`: scripts/profile_call.py, data/public_call/RUNS.md#4448846)."""
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


def _stream_getter(library, device: int):
    """A function of no arguments that returns the raw handle of the caller's current stream
    on `device` (what a launch takes), made once per launcher: the per-call path neither
    imports nor branches. torch's without building a stream object (torch's costs
    microseconds); CuPy's read from its object, once: a handle goes through the launch's
    fast path, where the object was asked for its handle three times (and a CuPy launcher
    notes its launches on any stream but the null one, `_note_launch_on`)."""
    if library == "torch":
        import torch
        return functools.partial(torch._C._cuda_getCurrentRawStream, device)
    from cupy.cuda import get_current_stream
    return lambda: get_current_stream().ptr


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


