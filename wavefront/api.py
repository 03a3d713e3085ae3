"""`wavefront.attention`: validate, pick the specialisation, launch."""
from __future__ import annotations

import math
from dataclasses import dataclass

from wavefront.schedules import (
    KV_TILED,
    AttentionProblem,
    Launch,
    TiledScan,
    cta_schedule,
    kv_schedule,
)

SUPPORTED_DTYPES = ("bfloat16", "float16")


def parse_schedule(schedule: str) -> tuple[str, str]:
    """'persistent+sawtooth' -> ('persistent', 'sawtooth'); a bare CTA name scans linearly."""
    if not isinstance(schedule, str) or not schedule:
        raise ValueError(f"schedule must be a string like 'persistent+sawtooth', got {schedule!r}")
    cta, _, kv = schedule.partition("+")
    cta_schedule(cta)
    kv_schedule(kv or "linear")
    return cta, kv or "linear"


def parse_tiles(tiles) -> tuple[int, int]:
    from wavefront.kernels import TILE_SHAPES
    if isinstance(tiles, str):
        try:
            m, n = (int(x) for x in tiles.lower().split("x"))
        except ValueError:
            raise ValueError(f"tiles must look like '128x64', got {tiles!r}") from None
        tiles = (m, n)
    tiles = tuple(tiles)
    if tiles not in TILE_SHAPES:
        raise ValueError(f"tiles must be one of {['%dx%d' % t for t in TILE_SHAPES]}, "
                         f"got {tiles!r}")
    return tiles


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
    from wavefront.kernels import HEAD_DIMS
    for name, view in (("q", vq), ("k", vk), ("v", vv)):
        if len(view.shape) != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seqlen, head_dim), "
                             f"got shape {view.shape}")
        if any(d == 0 for d in view.shape):
            raise ValueError(f"{name} must have no zero-size dimension, got shape {view.shape}")
        if view.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name} dtype must be one of {SUPPORTED_DTYPES}, got {view.dtype}")
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


def plan(q_shape, k_shape, *, causal=False, schedule="persistent+linear", tiles=None,
         occupancy=None, sms=132, l2_bytes=50 * 1024 * 1024, element_bytes=2,
         ctas=None, chunk_tiles=None) -> Launch:
    """The `Launch` the kernel will run for these shapes (no GPU needed)."""
    from wavefront.kernels import DEFAULT_OCCUPANCY, DEFAULT_TILES
    b, h, sq, d = q_shape
    _, hkv, skv, _ = k_shape
    tile_m, tile_n = parse_tiles(tiles) if tiles is not None else DEFAULT_TILES.get(d, (128, 64))
    if occupancy is None:
        occupancy = DEFAULT_OCCUPANCY[(tile_m, tile_n)]
    if isinstance(occupancy, bool) or not isinstance(occupancy, int) or not 1 <= occupancy <= 32:
        raise ValueError(f"occupancy must be an integer in [1, 32], got {occupancy!r}")
    cta, kv = parse_schedule(schedule)
    problem = AttentionProblem(b, h, hkv, sq, skv, d, bool(causal), tile_m, tile_n, element_bytes)
    kv_sched = kv_schedule(kv)
    if chunk_tiles is not None:
        if kv != "tiled":
            raise ValueError(f"chunk_tiles applies to the tiled schedule only, got schedule "
                             f"{schedule!r}")
        kv_sched = TiledScan(tiles_per_chunk=chunk_tiles)
    return Launch(problem, cta_schedule(cta), kv_sched, sms, occupancy, l2_bytes, ctas)


def attention(q, k, v, *, causal: bool = False, schedule: str = "persistent+linear",
              tiles=None, occupancy: int | None = None, scale: float | None = None,
              return_lse: bool = False, out=None, stream=None, l2_bytes: int | None = None,
              ctas: int | None = None, chunk_tiles: int | None = None):
    """FlashAttention forward: softmax(q k^T * scale) v, per (batch, head).

    q: (batch, heads, seqlen_q, head_dim); k, v: (batch, kv_heads, seqlen_kv, head_dim) with
    heads a multiple of kv_heads (GQA). bfloat16 or float16, head_dim 64 or 128, CuPy arrays,
    torch tensors or any DLPack GPU array. `schedule` is "<cta>+<kv>" with cta in
    {grid, persistent, grouped} and kv in {linear, sawtooth, tiled}. `tiles` is "MxN" or (M, N).
    `tiled` splits K/V into L2-sized chunks (`chunk_tiles` K/V tiles each, default from the L2)
    and merges the chunks' partial states in a second kernel.
    Returns the output (and the natural-log LSE, float32 (batch, heads, seqlen_q), if asked)
    as arrays of q's library on q's device. `ctas` caps the persistent grid (default: every
    SM x occupancy); `l2_bytes` overrides the L2 size the grouped schedule budgets for.
    """
    import cuda.tile as ct

    from wavefront.device import current_device
    from wavefront.kernels import LOG2_E, KernelVariant, kernel_for_occupancy

    vq, (q, k, v) = _check_inputs(q, k, v)
    dev = current_device()
    if dev is None:
        raise RuntimeError("wavefront.attention needs a CUDA GPU; none is visible")
    launch = plan(vq.shape, tuple(k.shape), causal=causal, schedule=schedule, tiles=tiles,
                  occupancy=occupancy, sms=dev.sms,
                  l2_bytes=l2_bytes if l2_bytes is not None else dev.l2_bytes, ctas=ctas,
                  chunk_tiles=chunk_tiles)
    p = launch.problem
    if scale is None:
        scale = 1.0 / math.sqrt(p.head_dim)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")

    variant = KernelVariant(vq.dtype, p.head_dim, p.tile_m, p.tile_n, p.causal,
                            launch.cta.code, launch.kv.code, launch.ctas_per_sm,
                            bool(return_lse) and launch.kv.code != KV_TILED)
    out, lse = _allocate(vq, out, return_lse)
    tiled = launch.kv.code == KV_TILED
    part_o, part_m, part_l = _workspace(vq, launch.n_chunks if tiled else 0)
    stream = stream if stream is not None else _current_stream(vq.library)
    args = (q, k, v, out, lse, part_o, part_m, part_l, float(scale * LOG2_E),
            launch.resident_ctas, launch.group_units, launch.n_chunks, launch.chunk_tiles,
            *variant.constants)
    ct.launch(stream, (launch.num_ctas, 1, 1), kernel_for_occupancy(variant.occupancy), args)
    if tiled:
        from wavefront.kernels import COMBINE_TILE_M, combine_partials
        grid = (-(-p.seqlen_q // COMBINE_TILE_M), p.batch * p.heads, 1)
        ct.launch(stream, grid, combine_partials,
                  (part_o, part_m, part_l, out, lse, launch.n_chunks, p.head_dim,
                   COMBINE_TILE_M, bool(return_lse)))
    return (out, lse) if return_lse else out


def _empty(vq: _ArrayView, shape, dtype: str):
    """An uninitialised array of q's library on q's device."""
    if vq.library == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{vq.device}")
    import cupy
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy/CuPy)
    with cupy.cuda.Device(vq.device):
        return cupy.empty(shape, dtype=dtype)


def _workspace(vq, n_chunks):
    """fp32 partial states of the tiled schedule: (chunks x batch, heads, seqlen[, head_dim]).

    Other schedules get one-element stand-ins: cuTile needs an array for every parameter."""
    b, h, s, d = vq.shape
    shapes = ([(n_chunks * b, h, s, d), (n_chunks * b, h, s), (n_chunks * b, h, s)] if n_chunks
              else [(1, 1, 1, 1), (1, 1, 1), (1, 1, 1)])
    return tuple(_empty(vq, sh, "float32") for sh in shapes)


def _current_stream(library):
    if library == "torch":
        import torch
        return torch.cuda.current_stream()
    import cupy
    return cupy.cuda.get_current_stream()


def _allocate(vq, out, return_lse):
    """The output (given, and checked, or new) and the LSE (a one-element stand-in when not
    asked for: cuTile needs an array argument even when LSE is not written)."""
    b, h, s, d = vq.shape
    if out is None:
        out = _empty(vq, vq.shape, vq.dtype)
    else:
        vo, out = _view("out", out)
        if (vo.library, vo.device, vo.shape, vo.dtype) != (vq.library, vq.device, vq.shape,
                                                          vq.dtype) or vo.strides[-1] != 1:
            raise ValueError(f"out must be a {vq.library} array on q's device with q's shape "
                             f"{vq.shape} and dtype {vq.dtype}, contiguous in its last "
                             f"dimension; got {vo.library} {vo.shape} {vo.dtype} on device "
                             f"{vo.device}")
    lse = _empty(vq, (b, h, s) if return_lse else (1, 1, 1), "float32")
    return out, lse


def reference_attention(q, k, v, causal=False, scale=None, dtype="float32", rows=None):
    """Attention in float32 (or float64) with CuPy: the correctness reference. -> (out, lse)

    `rows` (query row indices) restricts the reference to those rows, so long sequences can be
    checked without materialising a seqlen x seqlen score matrix.
    """
    import cupy
    q = cupy.asarray(q)
    if rows is not None:
        rows = cupy.asarray(rows)
        q = q[:, :, rows]
    q = q.astype(dtype)
    k = cupy.asarray(k).astype(dtype)
    v = cupy.asarray(v).astype(dtype)
    b, h, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    rep = h // hkv
    k = cupy.repeat(k, rep, axis=1)
    v = cupy.repeat(v, rep, axis=1)
    s = cupy.matmul(q, k.transpose(0, 1, 3, 2)) * scale
    if causal:
        q_pos = (rows if rows is not None else cupy.arange(sq))[:, None]
        s = cupy.where(cupy.arange(skv)[None, :] <= q_pos, s, -cupy.inf)
    row_max = s.max(axis=-1, keepdims=True)
    p = cupy.exp(s - row_max)
    row_sum = p.sum(axis=-1, keepdims=True)
    out = cupy.matmul(p / row_sum, v)
    lse = (row_max + cupy.log(row_sum))[..., 0]
    return out, lse
