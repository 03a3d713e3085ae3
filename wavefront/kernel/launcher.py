"""The bound launcher: one launch configuration bound to its kernel and buffers, then launched.

`AttentionLauncher` binds the variant, the kernel object, the work table on the GPU and the
tiled schedule's workspace for one shape, so a timing loop measures the launch and nothing
else; after a few launches it launches through a prepared launch (`prepared.PreparedLaunch`).
The public call (`wavefront.kernel.call`) keeps launchers in a bounded cache and launches them
through `launch_call` / `launch_plain`; the arrays' rules are in `arrays`, streams and
lifetimes in `streams`, packed batches in `varlen`.
"""
from __future__ import annotations

import copy
import functools
import math
import os
import threading
import weakref

import cuda.tile as ct
import numpy as np

from wavefront.device import current_device
from wavefront.kernel.arrays import (
    _address_reader,
    _array_layout,
    _array_of,
    _ArrayView,
    _byte_range,
    _check_inputs,
    _checked_output,
    _described,
    _empty,
    _in_library,
    _lays_out_as_own,
    _layout,
    _output_maker,
    _overlaps_an_input,
    _owned,
    _stand_in,
    _workspace,
)
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
from wavefront.kernel.prepared import PreparedLaunch, record_jit_binaries
from wavefront.kernel.streams import (
    _EVENT_WAIT_EXTERNAL,
    _as_current_stream,
    _device_work_table,
    _in_graphs,
    _release_when_done,
    _stream_getter,
    _stream_handle,
    _waited_on_in_graphs,
)
from wavefront.point import KERNEL_LEVERS, ORDER_COUNTERS, check_levers, plan
from wavefront.schedules import WORK_COLUMNS, Launch


# The kernel's parameters that change from call to call lead its parameter list, so a launch
# is the per-call arrays followed by the launcher's bound arguments.
PER_CALL_PARAMS = ("Q", "K", "V", "Out", "Lse")
assert tuple(prm.name for prm in ATTENTION_PARAMS[:len(PER_CALL_PARAMS)]) == PER_CALL_PARAMS
# Where a bound argument sits in a launcher's bound tuple (the parameters after the per-call ones).
BOUND_INDEX = {prm.name: i - len(PER_CALL_PARAMS) for i, prm in enumerate(ATTENTION_PARAMS)
               if i >= len(PER_CALL_PARAMS)}
_streams_lock = threading.Lock()  # a launcher's copies for other streams (on_stream)


class AttentionLauncher:
    """One launch configuration bound to its kernel and buffers: call it with q, k, v, out.

    Everything that does not depend on the data (the binary, the kernel object, the work table
    on the GPU, the tiled schedule's fp32 partial states, the LSE buffer, the scalar arguments)
    is made once here; `__call__` only launches.
    """

    def __init__(self, launch: Launch, q_view: _ArrayView, *, scale: float | None = None,
                 return_lse: bool = False, record_order: bool | str = False, **levers):
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
        if record_order not in (False, True, *ORDER_COUNTERS):
            raise ValueError(f"record_order must be False, True or one of {ORDER_COUNTERS}, got "
                             f"{record_order!r}")
        self.record_order = bool(record_order)
        # whose counter the tickets come from (`attention._take_ticket`)
        self.order_counters = ((record_order if isinstance(record_order, str) else "shared")
                               if record_order else None)
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
        self.cluster = cluster
        self.grid = _grid(launch, cluster)
        # [shared counter, (start, end) ticket per work item, per-CTA flag, a counter per CTA];
        # zeroed once, never reset (see tickets).
        if record_order:
            flag = 1 + 2 * items
            own = _owned(q_view, flag + 1 + self.grid[0], "int32", zeroed=True)
            import cupy
            device = cupy.cuda.Device(q_view.device)
            with device:
                own[flag:flag + 1] = int(self.order_counters == "per_cta")
            device.synchronize()  # a launch on any stream reads it
            order = _described(own, "int32")
        else:
            order = _stand_in(q_view, "Order", (1,), "int32")
        self.order = _array_of(order)
        scalars = {"qk_scale_log2": float(scale * LOG2_E), "num_items": launch.num_items,
                   "alternate": launch.alternate}
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
        self._length_check = None  # (event, pinned flag) of the lengths' check on the GPU
        self._length_buffers = None  # the event and pinned flag, made on first use
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

    @classmethod
    def planned(cls, vq: _ArrayView, k_shape, *, causal=False, schedule="persistent+linear",
                tiles=None, occupancy=None, scale=None, return_lse=False, l2_bytes=None,
                ctas=None, chunk_tiles=None, record_order=False, causal_alignment="top_left",
                **levers) -> "AttentionLauncher":
        """A launcher for q (described by `vq`) and k of `k_shape` on the current GPU, its
        launch planned here from the configuration given (`l2_bytes`: the L2 the grouped
        schedule budgets for, default the GPU's)."""
        dev = current_device()
        if dev is None:
            raise RuntimeError("wavefront.attention needs a CUDA GPU; none is visible")
        launch = plan(vq.shape, tuple(k_shape), causal=causal, schedule=schedule, tiles=tiles,
                      occupancy=occupancy, sms=dev.sms,
                      l2_bytes=l2_bytes if l2_bytes is not None else dev.l2_bytes, ctas=ctas,
                      chunk_tiles=chunk_tiles, causal_alignment=causal_alignment)
        return cls(launch, vq, scale=scale, return_lse=return_lse, record_order=record_order,
                   **levers)

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

    def prepared_for(self, q, k, v, out, free_shapes: bool = False) -> PreparedLaunch:
        """A prepared launch of this launcher for these arrays (launched as
        `.launch(stream handle, self.addresses(q, k, v, out))`), its binary the JIT's or, with
        `free_shapes`, one compiled without the shapes the JIT bakes in of q, k, v and out (a
        batch or head count of 1): an experiment's handle on the binary itself (`.cubin`).
        The launcher's own launches are not changed."""
        if self._table_built is not None:  # its launches do not wait for the table: be built
            self._table_built.synchronize()
        return PreparedLaunch(self.kernel, flash_attention_fwd.__name__,
                              (q, k, v, out, self._lse_argument) + self._bound_args,
                              len(PER_CALL_PARAMS), self.grid, self.view.device,
                              free_shapes=tuple(range(4)) if free_shapes else ())

    def addresses(self, q, k, v, out) -> tuple:
        """The per-call arrays' addresses, as a prepared launch takes them."""
        return self._addresses(q, k, v, out, self._lse_argument)

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
        output, the caller's current stream, no LSE) once `plain_ready`: `launch_call` and
        `__call__` in one frame, less what `plain_ready` rules out. Anything else this call
        may meet (a stream this launcher has not launched on, a work table still being built,
        a capture) goes the whole way."""
        stream = self.current_stream()
        if (stream not in self._launched_on or self._table_built is not None
                or self.capturing(stream)):
            return self.launch_call(q, k, v, None, None)
        out = self.new_output(q)
        if not self._prepared.launch(stream, self._addresses(q, k, v, out, self._lse_argument)):
            ct.launch(stream, self.grid, self.kernel,
                      (q, k, v, out, self._lse_argument) + self._bound_args)
        if stream and self._notes_launches:  # a CuPy launcher's, as `__call__` notes them
            self._note_launch_on(stream)
        return out

    def launch_call(self, q, k, v, out=None, stream=None, vouched: bool = True):
        """The public call's launch (and `Plan.run`'s): a new output (or the caller's,
        checked), on the caller's stream (None: the current one). `vouched`: q, k and v are
        laid out as those this launcher was made from (the public call's cache key holds their
        layout); False (`Plan.run` given arrays of other strides): `ct.launch`, which reads
        any layout, counting nothing towards preparing: a launcher prepared from such arrays
        would launch the public call's vouched arrays with their strides."""
        view = self.view
        # An output the caller gave goes through the prepared launch only where it is laid out
        # as the launcher's own would be and overlaps none of q, k and v (`__call__`).
        prepared_ok = out is None
        if stream is None:  # the usual call: the same two lines, without entering a context
            stream = self.current_stream()
            out = self.new_output(q) if out is None else _checked_output(view, out)
            lse = _empty(view, view.shape[:3], "float32") if self.return_lse else None
        else:
            with _as_current_stream(view, stream):
                out = self.new_output(q) if out is None else _checked_output(view, out)
                lse = _empty(view, view.shape[:3], "float32") if self.return_lse else None
        if not vouched:
            prepared_ok = False
        elif not prepared_ok:
            prepared_ok = _lays_out_as_own(view, out, (q, k, v))
        if self.capturing(stream if type(stream) is int else _stream_handle(stream)):
            _in_graphs[id(self)] = self
        return self(q, k, v, out, stream, lse, prepared_ok)

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
        other._length_check = other._length_buffers = None
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

    def ticket_words(self):
        """The device words the tickets are written to: (start, end) per work item."""
        if not self.record_order:
            raise ValueError("tickets need a launcher made with record_order=True")
        return self.order[1:1 + 2 * self.launch.num_items]

    def counter_words(self):
        """The device words the tickets are taken from: Order[0] (shared), or one per CTA."""
        if not self.record_order:
            raise ValueError("counters need a launcher made with record_order=True")
        return (self.order[:1] if self.order_counters == "shared"
                else self.order[2 + 2 * self.launch.num_items:])

    def tickets(self):
        """(start, end) ticket of every work item of the last launch, as NumPy int64 arrays
        counted from the launch's first event (0 .. 2 x items - 1). Synchronise first."""
        order = self.ticket_words()
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
                 chunk_tiles=None, record_order=False, causal_alignment="top_left",
                 **levers) -> tuple[AttentionLauncher, tuple]:
    """-> (launcher for these arrays' shapes, the arrays as cuTile takes them)."""
    vq, arrays = _check_inputs(q, k, v)
    return AttentionLauncher.planned(
        vq, arrays[1].shape, causal=causal, schedule=schedule, tiles=tiles, occupancy=occupancy,
        scale=scale, return_lse=return_lse, l2_bytes=l2_bytes, ctas=ctas,
        chunk_tiles=chunk_tiles, record_order=record_order,
        causal_alignment=causal_alignment, **levers), arrays


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
