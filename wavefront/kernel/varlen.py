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

from wavefront.device import current_device
from wavefront.kernel.arrays import (_ArrayView, _call_key, _check_inputs, _empty, _in_library,
                                     _owned, _view, stamp_matches, tensors_stamp)
from wavefront.kernel.call import (VARLEN_LAUNCHER_CACHE_SIZE, _cached, _cached_or_built, _keep,
                                   _varlen_templates)
from wavefront.kernel.launcher import AttentionLauncher
from wavefront.kernel.streams import _as_current_stream, _in_graphs, _stream_handle
from wavefront.kernel.tuning import resolve_config
from wavefront.point import KERNEL_LEVERS, plan_varlen, plan_varlen_on_device


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
    launcher = _cached_or_built(key, build, varlen=True)
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
