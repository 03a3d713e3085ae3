"""Check one point against the reference, time it, time the peers in the same process.

Peers are torch SDPA's flash backend (FlashAttention-2) and its cuDNN backend, when torch is
present. Every speed figure is reported next to theirs, as a ratio.
"""
from __future__ import annotations

import math

from wavefront.device import current_device
from wavefront.kernel.launcher import kernel_arrays, launcher_for, launcher_for_launch
from wavefront.kernel.streams import current_stream
from wavefront.measure.reference import reference_attention
from wavefront.measure.timing import input_sets_needed, time_gpu
from wavefront.model.counting import launch_counts
from wavefront.point import Point
from wavefront.results.measurement import CORRECTNESS_TOLERANCE, Timing


class IncorrectResult(RuntimeError):
    """The kernel's output failed the check against the reference: the point is not timed."""


def random_inputs(cfg: Point, seed: int):
    """Fresh N(0, 1) inputs: never zeros, which hide unwritten outputs and time faster."""
    import cupy
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy/CuPy)
    rng = cupy.random.default_rng(seed)
    dtype = ml_dtypes.bfloat16 if cfg.dtype == "bfloat16" else cupy.float16
    shape_q = (cfg.batch, cfg.heads, cfg.seqlen, cfg.head_dim)
    shape_kv = (cfg.batch, cfg.kv_heads_, cfg.seqlen, cfg.head_dim)
    return tuple(rng.standard_normal(s, dtype=cupy.float32).astype(dtype)
                 for s in (shape_q, shape_kv, shape_kv))


CHECK_ROW_LIMIT = 1024


def check_rows(seqlen: int, tile_m: int, limit: int = CHECK_ROW_LIMIT):
    """Query rows to check: all of them when small, else a spread including both ends."""
    import cupy
    if seqlen <= limit:
        return None
    head = cupy.arange(0, min(tile_m * 2, seqlen))
    tail = cupy.arange(max(0, seqlen - tile_m * 2), seqlen)
    middle = cupy.linspace(0, seqlen - 1, limit - head.size - tail.size).astype(cupy.int64)
    return cupy.unique(cupy.concatenate([head, middle, tail]))


def check_tickets(start, end, per_cta: bool = False) -> None:
    """A recorded order must be one event per ticket: every ticket 0..2N-1 once, each work item
    starting before it ends. Anything else means the counter did not count what we think.
    `per_cta`: tickets from a counter per CTA, which order no launch: each item starts before
    it ends."""
    import numpy as np
    tickets = np.sort(np.concatenate([start, end]))
    if not ((per_cta or np.array_equal(tickets, np.arange(len(tickets))))
            and (start < end).all()):
        raise IncorrectResult(f"work-item tickets are not one per event: {len(tickets)} events, "
                              f"tickets {tickets.min()}..{tickets.max()}, "
                              f"{int((start >= end).sum())} items end before they start")


def _checked_heads(cfg: Point) -> tuple[slice, slice]:
    """The query and K/V heads `relative_error` checks: at most a few at long lengths, where
    the reference is seqlen x rows per head."""
    if cfg.seqlen * cfg.heads <= 1 << 17:
        return slice(None), slice(None)
    return slice(0, 2), slice(0, 1 if cfg.kv_heads_ < cfg.heads else 2)


def check_bytes(cfg: Point) -> int:
    """About the GPU memory `relative_error` holds at its peak: the bf16 inputs and output,
    and the float32 reference's score matrices (scores, shifted, exponentials and their
    quotient alive together: four of rows x keys per checked head). Measured on the H100:
    7.4 GB of CuPy pool for B4 H32 KV8 S4k D128, estimated here 8.9 GB."""
    heads = cfg.heads if _checked_heads(cfg)[0] == slice(None) else 2
    rows = min(cfg.seqlen, CHECK_ROW_LIMIT)
    arrays = 2 * cfg.batch * cfg.seqlen * cfg.head_dim * (2 * cfg.heads + 2 * cfg.kv_heads_)
    return arrays + 4 * 4 * cfg.batch * heads * rows * cfg.seqlen


def output_error(cfg: Point, q, k, v, out, tile_m: int) -> float:
    """||out - ref|| / ||ref|| of an output some binary wrote for q, k, v (poisoned with NaN
    before, by the caller): inf where any element is not finite."""
    return _output_error(cfg, q, k, v, out, tile_m)[0]


def _output_error(cfg: Point, q, k, v, out, tile_m: int):
    """-> (relative error, the rows and heads compared, the reference LSE of those)."""
    import cupy
    if not bool(cupy.isfinite(out).all()):  # every element written, even where not compared
        return math.inf, None, None, None
    rows = check_rows(cfg.seqlen, tile_m)
    heads, kv_heads = _checked_heads(cfg)
    ref, ref_lse = reference_attention(q[:, heads], k[:, kv_heads], v[:, kv_heads],
                                       causal=cfg.causal, rows=rows)
    got = out[:, heads] if rows is None else out[:, heads][:, :, rows]
    got = got.astype(cupy.float32)
    if not bool(cupy.isfinite(got).all()):
        return math.inf, rows, heads, ref_lse
    return float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref)), rows, heads, ref_lse


def relative_error(cfg: Point, seed: int = 0, check_lse: bool = False,
                   record_order: bool | str = False, launcher=None) -> float:
    """||out - ref|| / ||ref|| on fresh random inputs; the output is poisoned with NaN first, so
    an unwritten element fails the check instead of passing as a stale value. With
    `record_order` the tickets are checked too (IncorrectResult if they are not one per event).
    `launcher`: the point's own (bound once by the caller, the one it then times)."""
    import cupy
    q, k, v = random_inputs(cfg, seed)
    out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
    if launcher is None:
        launcher, (q, k, v) = launcher_for(q, k, v, return_lse=check_lse,
                                           record_order=record_order, **cfg.attention_kwargs())
    else:
        if check_lse and not launcher.return_lse:
            raise ValueError("check_lse needs a launcher made with return_lse=True")
        q, k, v = kernel_arrays(q, k, v)
    result = launcher(q, k, v, out, current_stream("cupy"))
    cupy.cuda.get_current_stream().synchronize()
    if record_order:
        check_tickets(*launcher.tickets(), per_cta=launcher.order_counters == "per_cta")
    err, rows, heads, ref_lse = _output_error(cfg, q, k, v, out,
                                              launcher.launch.problem.tile_m)
    if check_lse and math.isfinite(err):
        lse = result[1][:, heads] if rows is None else result[1][:, heads][:, :, rows]
        if not bool(cupy.isfinite(lse).all()):
            return math.inf
        err = max(err, float(cupy.linalg.norm(lse - ref_lse) / cupy.linalg.norm(ref_lse)))
    return err


def measure(cfg: Point, *, warmup: int = 5, reps: int = 30, check: bool = True,
            seed: int = 1, record_order: bool | str = False) -> Timing:
    """Correct first, then time the launch alone (a launcher bound once, rotating input sets).

    Raises IncorrectResult when the output fails the reference check: a wrong kernel is not
    timed, and a sweep records the point as failed with the error."""
    import cupy
    dev = current_device()
    launch = cfg.launch(dev)  # once: the check and the timing run this launcher
    counts = launch_counts(launch.problem, launch.n_chunks, launch.partial_row_bytes)
    sets = [random_inputs(cfg, seed + 100 + i)
            for i in range(input_sets_needed(2 * counts.compulsory_read_bytes, dev.l2_bytes))]
    outs = [cupy.empty_like(s[0]) for s in sets]
    launcher, _ = launcher_for_launch(launch, *sets[0], record_order=record_order, **cfg.levers)
    err = (relative_error(cfg, seed, record_order=record_order, launcher=launcher) if check
           else float("nan"))
    if check and not err < CORRECTNESS_TOLERANCE:
        raise IncorrectResult(f"relative error {err:.3g} against float32 is not below "
                              f"{CORRECTNESS_TOLERANCE:g}")
    stream = current_stream("cupy")

    def run(i):
        q, k, v = sets[i % len(sets)]
        # the sets the launcher was made from: the prepared launch needs no check
        launcher(q, k, v, outs[i % len(sets)], stream, None, True)

    t = time_gpu(run, warmup=warmup, reps=reps, stream=stream)
    return Timing(rel_error=err, median_ms=t.median_ms, p10_ms=t.p10_ms, p90_ms=t.p90_ms,
                  reps=t.reps, tflops=t.tflops(counts.useful_flops),
                  useful_flops=counts.useful_flops, executed_flops=counts.executed_flops)


# The torch SDPA backend of each SDPA peer (results.measurement.PEER_NAMES adds TileGym).
PEERS = {"fa2": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}
# TileGym's autotuner drops every configuration whose compile takes over 5 s (cuTile's
# compiler_timeout), which on a cold compile cache can be all of its large tiles. Its one
# autotuning call runs with this limit instead, so it chooses among all its configurations.
TILEGYM_COMPILE_TIMEOUT_S = 300


def _tilegym_fmha():
    """TileGym's cuTile FMHA (`tilegym.ops.cutile.attention.tile_fmha`, autotuned over its
    tile configurations on first use of a shape), or None where TileGym is not installed."""
    try:
        from tilegym.ops.cutile import attention as tilegym_attention
    except Exception:  # not installed, or its import fails on this stack: no such peer
        return None
    import cuda.tile as ct

    def run(q, k, v, is_causal):
        original = ct.compiler_timeout
        ct.compiler_timeout = lambda seconds: original(max(seconds, TILEGYM_COMPILE_TIMEOUT_S))
        try:
            return tilegym_attention.tile_fmha(q, k, v, is_causal=is_causal)
        finally:
            ct.compiler_timeout = original
    return run


def peer_runners(cfg: Point, sets, *, tilegym: bool = False) -> dict:
    """{peer: run(i)} launching torch SDPA's FA2 and cuDNN backends, and with `tilegym`
    TileGym's cuTile FMHA where installed, on input set i (of `sets`, CuPy or torch arrays);
    {} without torch. The one place that says how a peer is called. (Sweeps' results tables
    have columns for the SDPA peers only; the bench takes TileGym too.)"""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention
    except ImportError:
        return {}
    tsets = [tuple(torch.from_dlpack(x) for x in s) for s in sets]
    gqa = cfg.kv_heads_ != cfg.heads

    def runner(backend):
        def run(i):
            q, k, v = tsets[i % len(tsets)]
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return scaled_dot_product_attention(q, k, v, is_causal=cfg.causal,
                                                    enable_gqa=gqa)
        return run
    runners = {name: runner(backend) for name, backend in PEERS.items()}
    fmha = _tilegym_fmha() if tilegym else None
    if fmha is not None:
        def run_tilegym(i):
            q, k, v = tsets[i % len(tsets)]
            return fmha(q, k, v, cfg.causal)
        runners["tilegym"] = run_tilegym
    return runners


def measure_peers(cfg: Point, *, warmup: int = 5, reps: int = 30, seed: int = 1) -> dict:
    """torch SDPA flash (FA2) and cuDNN on the same shapes, same FLOP count. {} without torch."""
    dev = current_device()
    counts = launch_counts(cfg.launch(dev).problem)
    sets = [random_inputs(cfg, seed + 200 + i)
            for i in range(input_sets_needed(2 * counts.compulsory_read_bytes, dev.l2_bytes))]
    results = {}
    for name, run in peer_runners(cfg, sets).items():
        try:
            t = time_gpu(run, warmup=warmup, reps=reps)
        except Exception as exc:  # a backend that refuses the shape is a result, not a crash
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        results[name] = {**t.as_dict(), "tflops": t.tflops(counts.useful_flops)}
    return results
