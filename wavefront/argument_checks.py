"""Checks of the cache call's and the backward's arguments that need no array and no GPU: run
first (before the GPU stack is looked for, before any array is read), so a bad option is named
on any machine, and a value Python would take (True as a scale, "no" as a flag, 10**30 as a
length) is refused rather than used. Each error names the argument and what was expected.

`wavefront.api` calls `kvcache_options` and `backward_options` before launching; the
backward's shape checks (`backward_shapes`) serve its launch planner, which the model calls
with shapes too."""
from __future__ import annotations

import math
import numbers

from wavefront.backward_schedules import (BACKWARD_CTA_SCHEDULES, BACKWARD_SCANS,
                                          BACKWARD_TILE_SHAPES, DEFAULT_BACKWARD_TILES)
from wavefront.decode_schedules import CTA_ORDERS, MAX_SPLITS
from wavefront.schedules import check_causal_alignment

# Lengths reach the kernels as int32
MAX_LENGTH = 2 ** 31 - 1


def flag(name: str, value, *, numpy_ok: bool = True) -> bool:
    """True or False (NumPy's bool too, where `numpy_ok`), else a ValueError naming it."""
    if isinstance(value, bool) or (numpy_ok and type(value).__name__ == "bool_"):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def scale_or_none(value) -> float | None:
    """None, or a finite real number above 0 (NumPy's too) as a float."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"scale must be a finite number above 0 (or None: 1/sqrt(head_dim)), "
                         f"got {value!r}")
    return float(value)


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and (
        type(value).__name__ != "bool_")


def stream_or_none(stream):
    """None, a raw stream handle (an int >= 0: 0, 1 and 2 are CUDA's default, legacy and
    per-thread streams, others are pointers), or a stream object holding one (torch's
    `cuda_stream`, CuPy's `ptr`)."""
    if stream is None or hasattr(stream, "cuda_stream") or hasattr(stream, "ptr"):
        return stream
    if not _whole(stream) or stream < 0:
        raise ValueError(f"stream must be a raw CUDA stream handle (an int >= 0), a torch "
                         f"stream or a CuPy stream, got {stream!r}")
    return int(stream)


def kvcache_options(cache_seqlens, *, causal, scale, num_splits, cta_order,
                    return_lse) -> dict:
    """`attention_with_kvcache`'s options, checked; -> the ones to pass on, normalised (a
    float scale, an int num_splits, bool flags). `cache_seqlens` is checked here where it is a
    number; arrays of lengths are checked against the cache by the call."""
    if cache_seqlens is None or isinstance(cache_seqlens, (bool, float, complex, str, bytes)) \
            or type(cache_seqlens).__name__ == "bool_":
        raise ValueError(f"cache_seqlens must be an int or one length per sequence (a list, a "
                         f"NumPy array or a tensor of integers), got {cache_seqlens!r}")
    if _whole(cache_seqlens) and not 0 <= int(cache_seqlens) <= MAX_LENGTH:
        raise ValueError(f"cache_seqlens must be 0 to {MAX_LENGTH} (keys already in the "
                         f"cache), got {cache_seqlens!r}")
    if num_splits is not None and not (_whole(num_splits) and 1 <= num_splits <= MAX_SPLITS):
        raise ValueError(f"num_splits must be an integer 1 to {MAX_SPLITS} or None (chosen "
                         f"from the shape), got {num_splits!r}")
    if cta_order is not None and not (isinstance(cta_order, str) and cta_order in CTA_ORDERS):
        raise ValueError(f"cta_order must be one of {CTA_ORDERS} or None, got {cta_order!r}")
    return {"causal": flag("causal", causal), "scale": scale_or_none(scale),
            "num_splits": None if num_splits is None else int(num_splits),
            "cta_order": cta_order, "return_lse": flag("return_lse", return_lse)}


def backward_schedule(schedule) -> None:
    """None, or '<cta>+<scan>' of the backward's CTA schedules and Q scans."""
    if schedule is None:
        return
    parts = schedule.split("+") if isinstance(schedule, str) else ()
    if len(parts) != 2 or parts[0] not in BACKWARD_CTA_SCHEDULES or parts[1] not in BACKWARD_SCANS:
        raise ValueError(f"schedule must be '<cta>+<scan>' with cta one of "
                         f"{list(BACKWARD_CTA_SCHEDULES)} and scan one of "
                         f"{list(BACKWARD_SCANS)}, got {schedule!r}")


def backward_tiles_or_none(tiles) -> tuple[int, int] | None:
    """None, or 'MxN' / (M, N) of BACKWARD_TILE_SHAPES as a pair of ints."""
    if tiles is None:
        return None
    pair = None
    if isinstance(tiles, str):
        sizes = tiles.lower().split("x")
        if len(sizes) == 2 and all(s.isdigit() for s in sizes):
            pair = (int(sizes[0]), int(sizes[1]))
    elif isinstance(tiles, (tuple, list)) and len(tiles) == 2 and all(_whole(t) for t in tiles):
        pair = (int(tiles[0]), int(tiles[1]))
    if pair not in BACKWARD_TILE_SHAPES:
        raise ValueError(f"tiles must be one of {['%dx%d' % t for t in BACKWARD_TILE_SHAPES]} "
                         f"(Q tile rows x K/V tile rows) or None, got {tiles!r}")
    return pair


def backward_options(*, causal, scale, schedule, deterministic, tiles,
                     causal_alignment="top_left") -> dict:
    """`attention_backward`'s options, checked; -> them normalised (float scale)."""
    flag("causal", causal, numpy_ok=False)
    flag("deterministic", deterministic, numpy_ok=False)
    backward_schedule(schedule)
    backward_tiles_or_none(tiles)
    check_causal_alignment(causal_alignment)
    return {"causal": causal, "scale": scale_or_none(scale), "schedule": schedule,
            "deterministic": deterministic, "tiles": tiles,
            "causal_alignment": causal_alignment}


def backward_shapes(q_shape, k_shape) -> None:
    """q (batch, heads, seqlen_q, head_dim) and k (batch, kv_heads, seqlen_kv, head_dim) as the
    backward takes them."""
    for name, shape in (("q", q_shape), ("k", k_shape)):
        if not isinstance(shape, (tuple, list)) or len(shape) != 4:
            raise ValueError(f"{name} shape must be 4 sizes (batch, heads, seqlen, head_dim), "
                             f"got {shape!r}")
        for axis, size in zip(("batch", "heads", "seqlen", "head_dim"), shape):
            if not _whole(size) or size < 1:
                raise ValueError(f"{name} {axis} must be a positive integer, got {size!r}")
    if k_shape[0] != q_shape[0]:
        raise ValueError(f"k batch must equal q batch ({q_shape[0]}), got {k_shape[0]}")
    if q_shape[3] not in DEFAULT_BACKWARD_TILES:
        raise ValueError(f"q head_dim must be one of {sorted(DEFAULT_BACKWARD_TILES)}, got "
                         f"{q_shape[3]}")
    if k_shape[3] != q_shape[3]:
        raise ValueError(f"k head_dim must equal q head_dim ({q_shape[3]}), got {k_shape[3]}")
