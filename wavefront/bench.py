"""Check one configuration against the reference, time it, time the peers in the same process.

Peers are torch SDPA's flash backend (FlashAttention-2) and its cuDNN backend, when torch is
present. Every speed figure is reported next to theirs, as a ratio.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from wavefront.api import attention, plan, reference_attention
from wavefront.counting import launch_counts
from wavefront.timing import Timing, input_sets_needed, time_gpu

DTYPE_BYTES = {"bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Config:
    batch: int = 1
    heads: int = 32
    kv_heads: int | None = None
    seqlen: int = 8192
    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    schedule: str = "persistent+linear"
    tiles: str | None = None
    occupancy: int | None = None
    ctas: int | None = None
    chunk_tiles: int | None = None  # tiled schedule: K/V tiles per chunk (default from L2)

    @property
    def kv_heads_(self) -> int:
        return self.kv_heads or self.heads

    @classmethod
    def from_record(cls, rec) -> "Config":
        """The configuration of a sweep point or a results row (they share the parameter
        columns). `ctas` is set only where the CTAs in flight differ from SMs x occupancy."""
        sms, occupancy, resident = int(rec["sms"]), int(rec["occupancy"]), int(rec["resident_ctas"])
        return cls(batch=int(rec["batch"]), heads=int(rec["heads"]), kv_heads=int(rec["kv_heads"]),
                   seqlen=int(rec["seqlen"]), head_dim=int(rec["head_dim"]),
                   dtype=str(rec["dtype"]), causal=bool(rec["causal"]),
                   schedule=f"{rec['cta_schedule']}+{rec['kv_schedule']}",
                   tiles=f"{int(rec['tile_m'])}x{int(rec['tile_n'])}", occupancy=occupancy,
                   ctas=None if resident == sms * occupancy else resident)

    def attention_kwargs(self) -> dict:
        """Everything `wavefront.attention` takes from a configuration (no arrays)."""
        return dict(causal=self.causal, schedule=self.schedule, tiles=self.tiles,
                    occupancy=self.occupancy, ctas=self.ctas, chunk_tiles=self.chunk_tiles)

    def launch(self, sms=132, l2_bytes=50 * 2**20):
        return plan((self.batch, self.heads, self.seqlen, self.head_dim),
                    (self.batch, self.kv_heads_, self.seqlen, self.head_dim),
                    causal=self.causal, schedule=self.schedule, tiles=self.tiles,
                    occupancy=self.occupancy, sms=sms, l2_bytes=l2_bytes,
                    element_bytes=DTYPE_BYTES[self.dtype], ctas=self.ctas,
                    chunk_tiles=self.chunk_tiles)


def random_inputs(cfg: Config, seed: int):
    """Fresh N(0, 1) inputs: never zeros, which hide unwritten outputs and time faster."""
    import cupy
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy/CuPy)
    rng = cupy.random.default_rng(seed)
    dtype = ml_dtypes.bfloat16 if cfg.dtype == "bfloat16" else cupy.float16
    shape_q = (cfg.batch, cfg.heads, cfg.seqlen, cfg.head_dim)
    shape_kv = (cfg.batch, cfg.kv_heads_, cfg.seqlen, cfg.head_dim)
    return tuple(rng.standard_normal(s, dtype=cupy.float32).astype(dtype)
                 for s in (shape_q, shape_kv, shape_kv))


def check_rows(seqlen: int, tile_m: int, limit: int = 1024):
    """Query rows to check: all of them when small, else a spread including both ends."""
    import cupy
    if seqlen <= limit:
        return None
    head = cupy.arange(0, min(tile_m * 2, seqlen))
    tail = cupy.arange(max(0, seqlen - tile_m * 2), seqlen)
    middle = cupy.linspace(0, seqlen - 1, limit - head.size - tail.size).astype(cupy.int64)
    return cupy.unique(cupy.concatenate([head, middle, tail]))


def relative_error(cfg: Config, seed: int = 0, check_lse: bool = False) -> float:
    """||out - ref|| / ||ref|| on fresh random inputs; the output is poisoned with NaN first, so
    an unwritten element fails the check instead of passing as a stale value."""
    import cupy
    q, k, v = random_inputs(cfg, seed)
    out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
    result = attention(q, k, v, out=out, return_lse=check_lse, **cfg.attention_kwargs())
    cupy.cuda.get_current_stream().synchronize()
    if not bool(cupy.isfinite(out).all()):  # every element written, even where not compared
        return math.inf
    rows = check_rows(cfg.seqlen, cfg.launch().problem.tile_m)
    # Check at most a few heads at long lengths: the reference is seqlen x rows per head.
    heads = slice(None) if cfg.seqlen * cfg.heads <= 1 << 17 else slice(0, 2)
    kv_heads = slice(None) if heads == slice(None) else slice(0, 1 if cfg.kv_heads_ < cfg.heads
                                                              else 2)
    ref, ref_lse = reference_attention(q[:, heads], k[:, kv_heads], v[:, kv_heads],
                                       causal=cfg.causal, rows=rows)
    got = out[:, heads] if rows is None else out[:, heads][:, :, rows]
    got = got.astype(cupy.float32)
    if not bool(cupy.isfinite(got).all()):
        return math.inf
    err = float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref))
    if check_lse:
        lse = result[1][:, heads] if rows is None else result[1][:, heads][:, :, rows]
        if not bool(cupy.isfinite(lse).all()):
            return math.inf
        err = max(err, float(cupy.linalg.norm(lse - ref_lse) / cupy.linalg.norm(ref_lse)))
    return err


@dataclass
class Measurement:
    config: dict
    num_ctas: int
    group_units: int
    timing: dict
    tflops: float
    useful_flops: float
    executed_flops: float
    rel_error: float
    peers: dict = field(default_factory=dict)  # name -> {"median_ms":..., "tflops":...}

    def as_dict(self) -> dict:
        return asdict(self)


def measure(cfg: Config, *, warmup: int = 5, reps: int = 30, check: bool = True,
            seed: int = 1) -> Measurement:
    """Correct first, then time with rotating input sets."""
    from wavefront.device import current_device
    dev = current_device()
    launch = cfg.launch(dev.sms, dev.l2_bytes)
    counts = launch_counts(launch.problem, launch.n_chunks)
    err = relative_error(cfg, seed) if check else float("nan")
    bytes_per_set = 2 * counts.compulsory_read_bytes
    sets = [random_inputs(cfg, seed + 100 + i)
            for i in range(input_sets_needed(bytes_per_set, dev.l2_bytes))]
    import cupy
    outs = [cupy.empty_like(s[0]) for s in sets]

    def run(i):
        q, k, v = sets[i % len(sets)]
        attention(q, k, v, out=outs[i % len(sets)], **cfg.attention_kwargs())

    t = time_gpu(run, warmup=warmup, reps=reps)
    return Measurement(asdict(cfg), launch.num_ctas, launch.group_units, t.as_dict(),
                       t.tflops(counts.useful_flops), counts.useful_flops,
                       counts.executed_flops, err)


PEERS = {"fa2": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def measure_peers(cfg: Config, *, warmup: int = 5, reps: int = 30, seed: int = 1) -> dict:
    """torch SDPA flash (FA2) and cuDNN on the same shapes, same FLOP count. {} without torch."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention
    except ImportError:
        return {}
    from wavefront.device import current_device
    dev = current_device()
    counts = launch_counts(cfg.launch(dev.sms, dev.l2_bytes).problem)
    sets = [tuple(torch.from_dlpack(x) for x in random_inputs(cfg, seed + 200 + i))
            for i in range(input_sets_needed(2 * counts.compulsory_read_bytes, dev.l2_bytes))]
    gqa = cfg.kv_heads_ != cfg.heads
    results = {}
    for name, backend in PEERS.items():
        def run(i, backend=backend):
            q, k, v = sets[i % len(sets)]
            with sdpa_kernel(getattr(SDPBackend, backend)):
                scaled_dot_product_attention(q, k, v, is_causal=cfg.causal, enable_gqa=gqa)
        try:
            t: Timing = time_gpu(run, warmup=warmup, reps=reps)
        except Exception as exc:  # a backend that refuses the shape is a result, not a crash
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        results[name] = {**t.as_dict(), "tflops": t.tflops(counts.useful_flops)}
    return results
