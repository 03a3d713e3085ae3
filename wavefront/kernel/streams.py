"""Streams and lifetimes: the stream each device's work tables are built on (and the pinned
host copies packed batches' tables come from), the caller's stream in every form it comes in
(a raw handle, a torch or a CuPy stream), and how long GPU memory lives: a dropped launcher's
buffers and a pinned copy are kept until the GPU is done with them, and launchers launched
into a CUDA-graph capture are kept for good (`_in_graphs`).
"""
from __future__ import annotations

import contextlib
import functools
from collections import deque

import numpy as np

from wavefront.kernel.arrays import _ArrayView, _in_library, _owned, _torch_device
from wavefront.kernel.table_kernel import build_on_gpu
from wavefront.schedules import WORK_COLUMNS


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
