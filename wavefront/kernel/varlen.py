"""Packed variable-length batches (FlashAttention's varlen interface): q (total_q, heads, D),
k and v (total_k, kv_heads, D) and cu_seqlens, as the kernel's batch-1 views.

Lengths on the host get a work table built there, once per lengths (`VarlenLaunch`, a launcher
per problem whose binary later lengths reuse: `AttentionLauncher.for_lengths`); cu_seqlens on
the GPU (torch) get it written there on every call's stream (`DeviceVarlenLaunch`,
`_write_table_from_lengths`), nothing read back. Launchers are cached apart from the dense
call's Plans (`call._varlen_launchers`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

from wavefront.device import current_device
from wavefront.kernel.arrays import (_ArrayView, _call_key, _check_inputs, _empty, _in_library,
                                     _owned, _view, stamp_matches, tensors_stamp)
from wavefront.kernel.call import (VARLEN_LAUNCHER_CACHE_SIZE, _cached, _cached_or_built, _keep,
                                   _varlen_templates)
from wavefront.kernel.launcher import AttentionLauncher
from wavefront.kernel.streams import _as_current_stream, _in_graphs, _stream_handle
from wavefront.kernel.tuning import resolve_config
from wavefront.point import KERNEL_LEVERS, check_max_seqlen, plan_varlen, plan_varlen_on_device
from wavefront.schedules import check_causal_alignment, length_error_text


# WAVEFRONT_CHECK_LENGTHS=1: a call with cu_seqlens on the GPU waits for their check there
# (`DeviceVarlenLaunch.length_errors`) and raises before its launch; by default the check's
# result is read by a later call once it has arrived, and nothing waits.
CHECK_LENGTHS = os.environ.get("WAVEFRONT_CHECK_LENGTHS", "0") == "1"
# max_seqlen not given: no sequence is too long (the packed rows bound them anyway)
NO_MAX_SEQLEN = 1 << 62


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
                     l2_bytes: int | None = None, ctas: int | None = None,
                     causal_alignment: str = "top_left", **levers):
    """FlashAttention forward over packed sequences; see `wavefront.api.attention_varlen`."""
    check_causal_alignment(causal_alignment)
    if _lengths_on_gpu(q, cu_seqlens_q, cu_seqlens_k):
        return _attention_varlen_on_gpu(
            q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, schedule=schedule, tiles=tiles,
            occupancy=occupancy, scale=scale, return_lse=return_lse, out=out, stream=stream,
            l2_bytes=l2_bytes, ctas=ctas, levers=levers, causal_alignment=causal_alignment,
            max_seqlens=(max_seqlen_q, max_seqlen_k))
    bounds_q = _host_bounds("cu_seqlens_q", cu_seqlens_q)
    bounds_k = _host_bounds("cu_seqlens_k", cu_seqlens_k)
    problem_options = (causal, schedule, tiles, occupancy, scale, return_lse, l2_bytes, ctas,
                       len(bounds_q), causal_alignment,
                       *(x for item in levers.items() for x in item))
    key = _call_key(q, k, v, (*problem_options, bounds_q, bounds_k, max_seqlen_q, max_seqlen_k))
    q4, k4, v4 = (_packed_as_4d(n, x) for n, x in (("q", q), ("k", k), ("v", v)))

    def build():
        # (plan_varlen checks the lengths and max_seqlen_*, each error naming the argument)
        template_key, template = _cached(
            None if key is None else _call_key(q, k, v, problem_options), _varlen_templates)
        if template is not None:  # this problem with other lengths: only the table is new
            template.recently_used = True
            made = template.launch
            return template.for_lengths(plan_varlen(
                tuple(q.shape), tuple(k.shape), bounds_q, bounds_k, causal=causal,
                schedule=made.name, tiles=(made.problem.tile_m, made.problem.tile_n),
                occupancy=made.ctas_per_sm, sms=made.sms, l2_bytes=made.l2_bytes,
                ctas=made.ctas, causal_alignment=causal_alignment,
                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k))
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
                             sms=dev.sms, l2_bytes=l2_bytes or dev.l2_bytes, ctas=ctas,
                             causal_alignment=causal_alignment, max_seqlen_q=max_seqlen_q,
                             max_seqlen_k=max_seqlen_k)
        return AttentionLauncher(launch, vq, scale=scale, return_lse=return_lse, **config)
    launcher = _cached_or_built(key, build, varlen=True)
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
                             levers, causal_alignment="top_left", max_seqlens=(None, None)):
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
               ctas, batch, "lengths on the GPU", causal_alignment,
               *(x for item in levers.items() for x in item))
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
            ctas=ctas, causal_alignment=causal_alignment)
        return AttentionLauncher(launch, vq, scale=scale, return_lse=return_lse, **config)
    launcher = _cached_or_built(key, build, varlen=True)
    launcher = _write_table_from_lengths(
        launcher, cu_seqlens_q, cu_seqlens_k,
        launcher.current_stream() if stream is None else stream, q.shape[0], k.shape[0],
        _checked_max_seqlens(max_seqlens))
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
                              rows_k: int, max_seqlens=(NO_MAX_SEQLEN, NO_MAX_SEQLEN)
                              ) -> AttentionLauncher:
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
    need a new tensor, or `REUSE_UNCHANGED_LENGTHS = False` here.

    The lengths are checked on the GPU as the table is written (`DeviceVarlenLaunch.
    length_errors`: cu_seqlens start at 0, never decrease, end within the packed rows; no
    sequence longer than `max_seqlens`), into a flag beside the item count that stays set
    until the host reads it; the table is written from the clamped lengths regardless, so no
    launch reads or writes outside the arrays. The flag's copy to the host is queued after the
    writing and read by a later call once it has arrived (`_raise_on_bad_lengths`): nothing
    waits, and that call raises, naming the argument. `WAVEFRONT_CHECK_LENGTHS=1` waits for it
    instead and raises before the launch (`CHECK_LENGTHS`). Inside a capture the flag is set
    and read by the first call after it outside one that writes lengths."""
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
                                _padded(cu_seqlens_k, entries), rows_q, rows_k, *max_seqlens)
            return launcher
        if launcher._length_check is not None:
            _raise_on_bad_lengths(launcher, wait=False)
        written = launcher._lengths_written
        if written is not None and REUSE_UNCHANGED_LENGTHS and _same_lengths(
                written, cu_seqlens_q, cu_seqlens_k, rows_q, rows_k, max_seqlens):
            return launcher
        launcher._lengths_written = None  # until written
        if launcher._table_writer is None:
            view = launcher.view
            staged = tuple(_in_library(view, _owned(view, n, "int64"))
                           for n in (entries, entries, 4))
            _stage(staged, cu_seqlens_q, cu_seqlens_k, rows_q, rows_k, max_seqlens)
            arguments = staged[0], staged[1], *staged[2]
            _table_from_lengths(launcher, *arguments)  # this call's table, and a warm-up
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                _table_from_lengths(launcher, *arguments)
            launcher._table_writer = graph, staged
            launcher._buffers.append(launcher._table_writer)
        else:
            graph, staged = launcher._table_writer
            _stage(staged, cu_seqlens_q, cu_seqlens_k, rows_q, rows_k, max_seqlens)
            graph.replay()
        if CHECK_LENGTHS and launcher._length_check is not None:
            _raise_on_bad_lengths(launcher, wait=True)  # a copy from before this writing
        _queue_length_check(launcher)
        if CHECK_LENGTHS:
            _raise_on_bad_lengths(launcher, wait=True)
        if not launcher._lengths_may_change_unseen:
            launcher._lengths_written = _lengths_stamp(cu_seqlens_q, cu_seqlens_k, rows_q,
                                                       rows_k, max_seqlens)
    return launcher



def _checked_max_seqlens(max_seqlens) -> tuple[int, int]:
    """max_seqlen_q and max_seqlen_k as the GPU check takes them: ints (NO_MAX_SEQLEN where
    not given), checked to be integers."""
    checked = []
    for name, given in zip(("max_seqlen_q", "max_seqlen_k"), max_seqlens):
        check_max_seqlen(name, given, ())
        checked.append(NO_MAX_SEQLEN if given is None else int(given))
    return tuple(checked)


def _length_flag(launcher):
    """The flag of what the lengths' check on the GPU found, beside the table's item count."""
    return launcher._table[launcher.launch.num_items, 3:4]


def _queue_length_check(launcher) -> None:
    """Queue the flag's copy to the host after the table's writing, unless a copy is still on
    its way (the flag stays set until read: that copy, or the next, sees it)."""
    import torch
    if launcher._length_check is not None:
        return
    if launcher._length_buffers is None:  # made once per launcher (and stream copy)
        launcher._length_buffers = (torch.cuda.Event(),
                                    torch.empty(1, dtype=torch.int32, pin_memory=True))
    arrived, pinned = launcher._length_buffers
    pinned.copy_(_length_flag(launcher), non_blocking=True)
    arrived.record()
    launcher._length_check = arrived, pinned


def _raise_on_bad_lengths(launcher, wait: bool) -> None:
    """Raise if the flag's copy has arrived (`wait`: wait for it) and says the lengths were
    malformed, naming the argument; the flag is then cleared on the GPU."""
    arrived, pinned = launcher._length_check
    if not wait and not arrived.query():
        return
    arrived.synchronize()
    launcher._length_check = None
    errors = int(pinned[0])
    if errors:
        _length_flag(launcher).zero_()
        launcher._lengths_written = None  # written again, and checked, by the next call
        when = ("" if wait else "; by an earlier call: WAVEFRONT_CHECK_LENGTHS=1 raises in "
                "the call that passes them")
        raise ValueError(f"{length_error_text(errors)} (found on the GPU, where the launch "
                         f"ran on them clamped to the arrays{when})")


# Whether a call with cu_seqlens on the GPU may keep the table its launcher last wrote from the
# same, unmodified tensors (`_write_table_from_lengths`). False: every call writes it.
REUSE_UNCHANGED_LENGTHS = True


def _lengths_stamp(cu_seqlens_q, cu_seqlens_k, rows_q: int, rows_k: int,
                   max_seqlens=(NO_MAX_SEQLEN, NO_MAX_SEQLEN)):
    """What identifies the lengths a table is written from: the cu_seqlens tensors'
    `tensors_stamp`, the packed rows and the max_seqlens; None where a tensor keeps no
    version counter."""
    stamp = tensors_stamp(cu_seqlens_q, cu_seqlens_k)
    return None if stamp is None else (stamp, rows_q, rows_k, max_seqlens)


def _same_lengths(stamp, cu_seqlens_q, cu_seqlens_k, rows_q: int, rows_k: int,
                  max_seqlens=(NO_MAX_SEQLEN, NO_MAX_SEQLEN)) -> bool:
    """Whether these cu_seqlens, rows and max_seqlens are those `stamp` (`_lengths_stamp`)
    was taken of, the tensors unmodified since."""
    tensors, stamped_q, stamped_k, stamped_max = stamp
    return (stamped_q == rows_q and stamped_k == rows_k and stamped_max == max_seqlens
            and stamp_matches(tensors, cu_seqlens_q, cu_seqlens_k))


def _stage(staged, cu_seqlens_q, cu_seqlens_k, rows_q: int, rows_k: int,
           max_seqlens) -> None:
    """Copy a call's lengths (`_padded` to the launcher's bucket), packed rows and
    max_seqlens into the writer graph's inputs, on the GPU (a fill takes its value as a
    kernel argument: no copy from the host, nothing waits)."""
    for buffer, cu_seqlens in zip(staged, (cu_seqlens_q, cu_seqlens_k)):
        buffer.copy_(_padded(cu_seqlens, buffer.shape[0]))
    for i, value in enumerate((rows_q, rows_k, *max_seqlens)):
        staged[2][i].fill_(value)


def _table_from_lengths(launcher, cu_seqlens_q, cu_seqlens_k, rows_q, rows_k,
                        max_seqlen_q=NO_MAX_SEQLEN, max_seqlen_k=NO_MAX_SEQLEN) -> None:
    """The table's rows and count from the lengths and packed rows (ints, or 0-d tensors on
    the GPU), on torch's current stream; what the lengths' check finds is or-ed into the
    flag (`_length_flag`), which stays set until the host reads it."""
    import torch
    launch, table = launcher.launch, launcher._table
    errors = launch.length_errors(cu_seqlens_q, cu_seqlens_k, rows_q, rows_k, max_seqlen_q,
                                  max_seqlen_k)
    _length_flag(launcher).bitwise_or_(errors.to(torch.int32).reshape(1))
    items = launch.num_items
    columns, count = launch.table_columns(cu_seqlens_q, cu_seqlens_k, rows_q, rows_k)
    # One stack and one copy, not a strided copy per column: each is a kernel of its own,
    # and on a small batch the writing's kernels, not their work, take its time.
    like = next(values for values in columns if isinstance(values, torch.Tensor))
    table[:items, :len(columns)].copy_(torch.stack([
        values if isinstance(values, torch.Tensor) else like.new_full((items,), values)
        for values in columns], dim=1))
    table[items, 2:3] = count.reshape(1)
