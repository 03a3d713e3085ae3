"""The backward's host side: check the arrays, build (once per shape) the work tables, launch.

`attention_backward(q, k, v, out, lse, dout)` runs, on the caller's current stream:
1. `backward_preprocess`: Delta = rowsum(dO * O) (float32);
2. `flash_attention_bwd_kv`: dK, dV (and, atomic mode, dQ into a zeroed float32 accumulator:
   row-major as dQ, or tile-major with column-major tiles where the config's dq_coalesced);
3. atomic mode: `convert_dq` (`convert_dq_tiles`) casts the accumulator to the input dtype;
   deterministic mode: `flash_attention_bwd_dq` computes dQ Q-major instead.
The work tables of a shape and schedule are uploaded once and kept (`_tables`, bounded), as
CuPy arrays of their own (not torch's, whose CUDA-graph pools must not own them; see
`wavefront.kernel.arrays._owned`).
"""
from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict

import cuda.tile as ct

from wavefront.argument_checks import backward_shapes
from wavefront.backward_schedules import (
    BACKWARD_TILE_SHAPES,
    BackwardConfig,
    DEFAULT_BACKWARD_SCHEDULE,
    DEFAULT_BACKWARD_TILES,
    DEFAULT_VARLEN_BACKWARD_TILES,
    BackwardLaunch,
    VarlenBackwardLaunch,
    backward_config,
    backward_schedule,
)
from wavefront.kernel.arrays import _check_inputs, _view
from wavefront.kernel.backward import (
    LOG2_E,
    ROWS_TILE,
    BackwardDqVariant,
    BackwardKvVariant,
    RowsVariant,
)
from wavefront.kernel.streams import _stream_handle, current_stream
from wavefront.schedules import AttentionProblem, check_causal_alignment

TABLE_CACHE_SIZE = 64
_tables: OrderedDict = OrderedDict()
_tables_lock = threading.Lock()
_gpu_shapes: dict = {}


def backward_tiles(tiles, head_dim: int, varlen: bool = False) -> tuple[int, int]:
    """'MxN' or (M, N) (Q tile rows, K/V tile rows), one of BACKWARD_TILE_SHAPES; None: the
    default for the head dim (and packed batches)."""
    if tiles is None:
        return (DEFAULT_VARLEN_BACKWARD_TILES if varlen else DEFAULT_BACKWARD_TILES)[head_dim]
    if isinstance(tiles, str):
        try:
            tiles = tuple(int(x) for x in tiles.lower().split("x"))
        except ValueError:
            tiles = None
    if tiles is None or tuple(tiles) not in BACKWARD_TILE_SHAPES:
        raise ValueError(f"tiles must be one of "
                         f"{['%dx%d' % t for t in BACKWARD_TILE_SHAPES]}, got {tiles!r}")
    return tuple(tiles)


def _gpu_shape(device: int) -> tuple[int, int]:
    if device not in _gpu_shapes:
        import cupy
        with cupy.cuda.Device(device):
            props = cupy.cuda.runtime.getDeviceProperties(device)
        _gpu_shapes[device] = (props["multiProcessorCount"], props["l2CacheSize"])
    return _gpu_shapes[device]


def _check_like(name, view, expected_shape, expected_dtype, library, device):
    if view.library != library:
        raise ValueError(f"{name} must come from the same library as q ({library}), "
                         f"got {view.library}")
    if view.shape != tuple(expected_shape):
        raise ValueError(f"{name} must have shape {tuple(expected_shape)}, got {view.shape}")
    if view.dtype != expected_dtype:
        raise ValueError(f"{name} dtype must be {expected_dtype}, got {view.dtype}")
    if view.device != device:
        raise ValueError(f"{name} must be on q's device ({device}), got {view.device}")
    if view.strides[-1] != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides "
                         f"{view.strides}")


def _zeros(library: str, device: int, shape, dtype: str):
    if library == "torch":
        import torch
        return torch.zeros(shape, dtype=getattr(torch, dtype), device=f"cuda:{device}")
    import cupy
    import ml_dtypes  # noqa: F401  (bfloat16 for CuPy)
    with cupy.cuda.Device(device):
        return cupy.zeros(shape, dtype=dtype)


def _empty(library: str, device: int, shape, dtype: str):
    if library == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{device}")
    import cupy
    import ml_dtypes  # noqa: F401
    with cupy.cuda.Device(device):
        return cupy.empty(shape, dtype=dtype)


def _uploaded(launch: BackwardLaunch, dq_launch, deterministic: bool, device: int):
    """(K/V-major table, dQ table or None, 1-element float32 stand-in) on `device`, kept."""
    key = (launch, dq_launch if deterministic else None, device)
    with _tables_lock:
        found = _tables.get(key)
        if found is not None:
            _tables.move_to_end(key)
            return found
    import cupy
    with cupy.cuda.Device(device):
        kv_table = cupy.asarray(launch.work_table)
        dq_table = cupy.asarray(dq_launch.work_table) if deterministic else None
        stand_in = cupy.zeros((1, 1, 1, 1), dtype="float32")
        # Uploaded on CuPy's stream: the caller's stream may not wait for it.
        cupy.cuda.get_current_stream().synchronize()
    found = (kv_table, dq_table, stand_in)
    with _tables_lock:
        _tables[key] = found
        while len(_tables) > TABLE_CACHE_SIZE:
            _tables.popitem(last=False)
    return found


def config_for(tiles, config, head_dim: int) -> BackwardConfig:
    """The call's `BackwardConfig`: `tiles` ('MxN', both kernels, the compiler's warps) or
    `config` (a name of BACKWARD_CONFIGS or a BackwardConfig), not both; neither: default."""
    if tiles is not None and config is not None:
        raise ValueError(f"give tiles or config, not both (got tiles={tiles!r}, "
                         f"config={config!r})")
    if tiles is not None:
        tiles = backward_tiles(tiles, head_dim)
        return BackwardConfig(tiles, tiles)
    return backward_config(config, head_dim)


def dq_launch_of(launch: BackwardLaunch, config: BackwardConfig):
    """The deterministic dQ pass's launch, cut at the config's dQ tiles (its own work table)."""
    dq_launch = launch.dq_launch
    if tuple(config.dq_tiles) == (dq_launch.problem.tile_m, dq_launch.problem.tile_n):
        return dq_launch
    tile_m, tile_n = config.dq_tiles
    return dataclasses.replace(dq_launch, problem=dataclasses.replace(
        dq_launch.problem, tile_m=tile_m, tile_n=tile_n))


def backward_launch(q_shape, k_shape, *, causal=False, schedule=None, tiles=None, sms=132,
                    l2_bytes=50 << 20, dtype_bytes=2, ctas=None, config=None,
                    causal_alignment="top_left") -> BackwardLaunch:
    """The `BackwardLaunch` the call runs for these shapes (also for the model, on any
    machine): the K/V-major kernel's, at `tiles` or the config's K/V tiles; the causal mask
    aligned as `causal_alignment` says (`wavefront.schedules.causal_diagonal`)."""
    backward_shapes(q_shape, k_shape)  # (wavefront.argument_checks: named, not unpacked)
    batch, heads, seqlen_q, head_dim = q_shape
    _, kv_heads, seqlen_kv, _ = k_shape
    tile_m, tile_n = config_for(tiles, config, head_dim).kv_tiles
    problem = AttentionProblem(batch, heads, kv_heads, seqlen_q, seqlen_kv, head_dim, causal,
                               tile_m, tile_n, dtype_bytes, causal_alignment)
    return BackwardLaunch.of(problem, schedule or DEFAULT_BACKWARD_SCHEDULE, sms, 1, l2_bytes,
                             ctas)


def _checked_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    return float(scale)


def _check_flags(causal, deterministic, causal_alignment):
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    check_causal_alignment(causal_alignment)


def _run(launch: BackwardLaunch, config: BackwardConfig, library, device, dtype, arrays,
         grads, scale: float, deterministic: bool, varlen: bool) -> None:
    """The three launches on the caller's current stream. `arrays`: (q, k, v, out, lse, dout)
    and `grads`: (dq, dk, dv) as the kernels see them, (batch, heads, rows, D) and (batch,
    heads, rows)."""
    q, k, v, out, lse, dout = arrays
    dq, dk, dv = grads
    p = launch.problem
    dq_launch = dq_launch_of(launch, config)
    kv_table, dq_table, stand_in = _uploaded(launch, dq_launch, deterministic, device)
    delta = _empty(library, device, tuple(lse.shape), "float32")
    stream = _stream_handle(current_stream(library, device))
    rows_grid = (-(-p.seqlen_q // ROWS_TILE), p.batch * p.heads, 1)
    qk_scale_log2 = scale * LOG2_E
    ct.launch(stream, rows_grid, RowsVariant("preprocess", dtype, p.head_dim).kernel(),
              (out, dout, delta, p.head_dim, ROWS_TILE))
    atomic = not deterministic
    coalesced = atomic and config.dq_coalesced and not varlen
    dq_acc = stand_in
    if coalesced:  # every Q tile whole (the last one padded): the adds need no bounds check
        dq_acc = _zeros(library, device, (p.batch, p.heads, p.q_tiles, p.tile_m * p.head_dim),
                        "float32")
    elif atomic:
        dq_acc = _zeros(library, device, tuple(q.shape), "float32")
    kv_variant = BackwardKvVariant(dtype, p.head_dim, p.tile_m, p.tile_n, p.causal, atomic,
                                   varlen=varlen, worker_warps=config.kv_worker_warps,
                                   q_latency=config.q_latency, dq_coalesced=coalesced)
    ct.launch(stream, (launch.num_ctas, 1, 1), kv_variant.kernel(),
              (q, k, v, dout, lse, delta, dk, dv, dq_acc, kv_table, qk_scale_log2, scale,
               launch.num_items, 1, p.head_dim, p.tile_m, p.tile_n, p.causal, atomic, varlen,
               config.q_latency, coalesced))
    if coalesced:
        ct.launch(stream, (p.q_tiles, p.batch * p.heads, 1),
                  RowsVariant("convert_dq_tiles", dtype, p.head_dim, p.tile_m).kernel(),
                  (dq_acc, dq, p.head_dim, p.tile_m))
        return
    if atomic:
        ct.launch(stream, rows_grid, RowsVariant("convert_dq", dtype, p.head_dim).kernel(),
                  (dq_acc, dq, p.head_dim, ROWS_TILE))
        return
    dq_m, dq_n = dq_launch.problem.tile_m, dq_launch.problem.tile_n
    dq_variant = BackwardDqVariant(dtype, p.head_dim, dq_m, dq_n, p.causal, varlen=varlen,
                                   worker_warps=config.dq_worker_warps,
                                   masked_first=config.dq_masked_first)
    ct.launch(stream, (dq_launch.num_ctas, 1, 1), dq_variant.kernel(),
              (q, k, v, dout, lse, delta, dq, dq_table, qk_scale_log2, scale,
               dq_launch.num_items, p.head_dim, dq_m, dq_n, p.causal, varlen,
               config.dq_masked_first))


def attention_backward(q, k, v, out, lse, dout, *, causal: bool = False,
                       scale: float | None = None, schedule: str | None = None,
                       deterministic: bool = True, tiles=None, ctas: int | None = None,
                       config=None, causal_alignment: str = "top_left"):
    """Gradients of FlashAttention: -> (dq, dk, dv) of q's, k's and v's shapes and dtype.

    q (B, H, S_q, D), k and v (B, H_kv, S_kv, D), `out` and `dout` of q's shape, `lse` the
    forward's natural-log LSE (B, H, S_q) float32 (`wavefront.attention(..., return_lse=True)`).
    `schedule`: '<cta>+<scan>' with cta one of grid, persistent, grouped, longest_first and
    scan linear or sawtooth (the Q scan of each K/V tile); `tiles`: 'MxN' (Q rows x K/V rows).
    `deterministic`: dQ from a second, Q-major kernel instead of float atomics, so the three
    gradients are bit-identical across runs. `config`: a name of
    `wavefront.backward_schedules.BACKWARD_CONFIGS` or a `BackwardConfig` (each kernel's tiles
    and warps; instead of `tiles`). `causal_alignment`: the forward's ("top_left", query row i
    sees keys j <= i, or "bottom_right", j <= i + seqlen_kv - seqlen_q); rows that saw no key
    get dq = 0."""
    _check_flags(causal, deterministic, causal_alignment)
    vq, (aq, ak, av) = _check_inputs(q, k, v)
    library, device = vq.library, vq.device
    vo, ao = _view("out", out)
    vdo, ado = _view("dout", dout)
    vl, al = _view("lse", lse)
    _check_like("out", vo, vq.shape, vq.dtype, library, device)
    _check_like("dout", vdo, vq.shape, vq.dtype, library, device)
    _check_like("lse", vl, vq.shape[:3], "float32", library, device)
    k_shape = tuple(ak.shape)
    scale = _checked_scale(scale, vq.shape[3])
    chosen = config_for(tiles, config, vq.shape[3])
    sms, l2_bytes = _gpu_shape(device)
    launch = backward_launch(vq.shape, k_shape, causal=causal, schedule=schedule,
                             sms=sms, l2_bytes=l2_bytes, ctas=ctas, config=chosen,
                             causal_alignment=causal_alignment)
    grads = (_empty(library, device, vq.shape, vq.dtype),
             _empty(library, device, k_shape, vq.dtype),
             _empty(library, device, k_shape, vq.dtype))
    _run(launch, chosen, library, device, vq.dtype, (aq, ak, av, ao, al, ado), grads, scale,
         deterministic, varlen=False)
    return grads


def attention_backward_varlen(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, *,
                              causal: bool = False, scale: float | None = None,
                              schedule: str | None = None, deterministic: bool = True,
                              tiles=None, ctas: int | None = None,
                              causal_alignment: str = "top_left"):
    """Gradients of `attention_varlen`: packed q, out, dout (total_q, H, D), k, v (total_k,
    H_kv, D), its LSE (H, total_q) float32, cu_seqlens as it takes them (read on the host: a
    GPU tensor is copied, which waits for the GPU). -> (dq, dk, dv), packed as q, k, v.
    Schedules: grid, persistent or longest_first, with the linear or sawtooth Q scan.
    `causal_alignment` per sequence, as the forward's."""
    from wavefront.kernel.varlen import _host_bounds, _packed_as_4d
    _check_flags(causal, deterministic, causal_alignment)
    vq, (aq, ak, av) = _check_inputs(*(_packed_as_4d(n, x) for n, x in
                                       (("q", q), ("k", k), ("v", v))))
    library, device = vq.library, vq.device
    _, total_q, heads, head_dim = (1, vq.shape[2], vq.shape[1], vq.shape[3])
    total_k, kv_heads = ak.shape[2], ak.shape[1]
    for name, x in (("out", out), ("dout", dout)):
        view, _ = _view(name, x)
        _check_like(name, view, (total_q, heads, head_dim), vq.dtype, library, device)
    vl, _ = _view("lse", lse)
    _check_like("lse", vl, (heads, total_q), "float32", library, device)
    bounds_q = _host_bounds("cu_seqlens_q", cu_seqlens_q)
    bounds_k = _host_bounds("cu_seqlens_k", cu_seqlens_k)
    for name, bounds, total in (("cu_seqlens_q", bounds_q, total_q),
                                ("cu_seqlens_k", bounds_k, total_k)):
        if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != total:
            raise ValueError(f"{name} must run from 0 to the packed rows ({total}), got "
                             f"{list(bounds)}")
    scale = _checked_scale(scale, head_dim)
    tile_m, tile_n = backward_tiles(tiles, head_dim, varlen=True)
    sms, l2_bytes = _gpu_shape(device)
    problem = AttentionProblem(1, heads, kv_heads, total_q, total_k, head_dim, causal, tile_m,
                               tile_n, 2, causal_alignment)
    cta, scan = backward_schedule(schedule or DEFAULT_BACKWARD_SCHEDULE)
    launch = VarlenBackwardLaunch(
        problem, cta, scan, sms, 1, l2_bytes, ctas,
        tuple(b - a for a, b in zip(bounds_q, bounds_q[1:])),
        tuple(b - a for a, b in zip(bounds_k, bounds_k[1:])))
    packed = [_empty(library, device, tuple(x.shape), vq.dtype) for x in (q, k, v)]
    grads = [_packed_as_4d(n, x) for n, x in zip(("dq", "dk", "dv"), packed)]
    lse4 = lse.reshape((1,) + tuple(lse.shape))
    arrays = (aq, ak, av, _packed_as_4d("out", out), lse4, _packed_as_4d("dout", dout))
    _run(launch, BackwardConfig((tile_m, tile_n), (tile_m, tile_n)), library, device,
         vq.dtype, arrays, grads, scale, deterministic, varlen=True)
    return tuple(packed)
