"""Models of L2 misses and throughput, and their fits to measured data.

- `predict`: simulate one launch (trace -> reuse distances -> LRU) at an effective capacity.
- `analytic_misses`: compulsory plus capacity misses per K/V schedule in closed form, as a
  function of S, the effective L2 and the CTAs in flight.
- `fit_capacity`: the effective L2 capacity that best explains measured read misses.
- `fit_throughput`: time = max(FLOPs / R_flop, DRAM bytes / R_dram) + t0 fitted to timings.
Every fit reports MAPE and R^2 and carries the keys of the points it used.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from wavefront.model.counting import launch_counts
from wavefront.model.presets import GPUSpec
from wavefront.model.simulation import (
    COLD,
    LruL2,
    MissCurve,
    ShardsSampler,
    access_trace,
    access_upper_bound,
    address_bound,
    reuse_distances,
    trace_blocks,
)
from wavefront.point import SECTOR_BYTES, GpuShape, Point
from wavefront.schedules import Launch

# Data that every SM reads (K/V) falls out of Hopper's L2 from about half its size (BRIEF
# section 3: ~30 MiB of 60 on the H200). The default until a fit says otherwise.
DEFAULT_EFFECTIVE_FRACTION = 0.5


def error_table(predicted, measured) -> dict:
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    ok = np.isfinite(p) & np.isfinite(m) & (m > 0)
    p, m = p[ok], m[ok]
    if len(m) == 0:
        return {"n": 0, "mape": math.nan, "r2": math.nan, "worst_ape": math.nan}
    ape = np.abs(p - m) / m
    ss_res = float(((m - p) ** 2).sum())
    ss_tot = float(((m - m.mean()) ** 2).sum())
    return {"n": int(len(m)), "mape": float(ape.mean()), "worst_ape": float(ape.max()),
            "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan}


@dataclass
class LaunchPrediction:
    schedule: str
    accesses: int
    l2_read_sectors: int  # closed-form reads the kernel issues (= simulated tex reads)
    read_miss_sectors: int  # fully associative LRU at the effective capacity
    dram_read_bytes: int
    partitioned: dict | None  # two-partition model's counters, when asked
    reuse: dict  # summary of reuse distances (MiB)
    compulsory_read_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


# Accesses kept for the reuse-distance summary: launches up to this size are summarised
# exactly, larger ones by SHARDS at the matching rate (its error: tests/test_simulation.py).
SUMMARY_SAMPLE_ACCESSES = 1 << 21


def _reuse_summary(sampler: ShardsSampler, capacity: float) -> dict:
    distances, nbytes, reads = sampler.sample()
    d = distances[reads & (distances != COLD)]
    if len(d) == 0:
        return {"reuses": 0}
    q = np.quantile(d, [0.5, 0.9, 0.99]) / 2**20
    return {"reuses": int(len(d) * sampler.scale),
            "cold": int((distances[reads] == COLD).sum() * sampler.scale),
            "median_mib": float(q[0]), "p90_mib": float(q[1]), "p99_mib": float(q[2]),
            "within_capacity": float((d < capacity).mean()),
            "sample_rate": 1.0 / sampler.scale}


def predict(launch: Launch, gpu: GPUSpec, *, capacity_bytes: float | None = None,
            partitions: int | None = None, jitter: float = 0.0) -> LaunchPrediction:
    """One launch streamed once through a fully associative LRU at the effective capacity
    (and the two-partition model when asked): linear time, memory independent of its length."""
    capacity = capacity_bytes or DEFAULT_EFFECTIVE_FRACTION * gpu.l2_bytes
    n_ids = address_bound(launch)
    whole = LruL2(capacity, n_ids)
    # Each partition holds copies of what its SMs read; the model's capacity is per
    # partition, so the whole L2 holds `partitions` x capacity of lines.
    split = (LruL2(capacity * partitions, n_ids, partitions=partitions, sms=gpu.sms)
             if partitions and partitions > 1 else None)
    sampler = ShardsSampler(min(1.0, SUMMARY_SAMPLE_ACCESSES / access_upper_bound(launch)))
    accesses = 0
    for block in trace_blocks(launch, jitter=jitter):
        accesses += len(block)
        whole.feed(block)
        sampler.feed(block)
        if split:
            split.feed(block)
    sim = whole.result()
    counts = launch_counts(launch.problem, launch.n_chunks)
    return LaunchPrediction(
        schedule=launch.name, accesses=accesses, l2_read_sectors=sim.tex_read_sectors,
        read_miss_sectors=sim.dram_read_sectors,
        dram_read_bytes=sim.dram_read_sectors * SECTOR_BYTES,
        partitioned=asdict(split.result()) if split else None,
        reuse=_reuse_summary(sampler, capacity),
        compulsory_read_bytes=counts.compulsory_read_bytes)


def analytic_misses(launch: Launch, capacity_bytes: float) -> float:
    """Closed-form read-miss bytes: compulsory + capacity, per K/V schedule.

    A (batch, K/V head) unit's K/V (bytes KV) is swept once per round of the CTAs in flight
    that work on it: R = ceil(items of the unit / CTAs in flight) passes. Linear: every pass
    re-reads all of it once KV exceeds the capacity (a cyclic scan under LRU hits nothing);
    sawtooth: each pass after the first re-reads only what the capacity could not keep.
    Q is read once. Causal shortens later passes; this form ignores that (an upper bound).
    """
    p = launch.problem
    kv = p.kv_bytes_per_unit
    items_per_unit = p.qheads_per_kv * p.q_tiles
    in_flight = min(launch.resident_ctas, p.num_items)
    passes = math.ceil(items_per_unit / in_flight) if in_flight < items_per_unit else 1
    if kv <= capacity_bytes:
        per_unit = kv
    elif launch.kv.name == "sawtooth":
        per_unit = kv + (passes - 1) * (kv - capacity_bytes)
    else:
        per_unit = kv * passes
    q_bytes = p.batch * p.heads * p.seqlen_q * p.head_dim * p.element_bytes
    return per_unit * p.kv_units + q_bytes


# ---------------------------------------------------------------------------------------------
# Fits
# ---------------------------------------------------------------------------------------------

@dataclass
class CapacityFit:
    gpu: str
    capacity_bytes: float
    errors: dict
    points: list[str] = field(default_factory=list)
    predicted: list[float] = field(default_factory=list)
    measured: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def launch_of_row(row) -> Launch:
    """The launch a results row measured, rebuilt on the GPU it was measured on."""
    return Point.from_record(row).launch(GpuShape.of(row))


# The measured miss count every fit is scored against: DRAM read sectors of one cold launch
# (the L2-side difference of counters can fall below the compulsory minimum on Hopper).
MEASURED_MISSES = "dram_read_sectors"


class MissCurves:
    """Per measured point: read-miss bytes as a function of capacity (from reuse distances),
    computed once so a fit can evaluate many capacities cheaply. A point measured several times
    is simulated once and scored against the median of its repeats."""

    def __init__(self, rows=None):
        self.keys, self.measured, self._curves = [], [], []
        if rows is None or len(rows) == 0:
            return
        for point, reps in rows.groupby("point", sort=False):
            trace = access_trace(launch_of_row(reps.iloc[0]))
            reads = trace.is_read
            self._curves.append(MissCurve(reuse_distances(trace)[reads], trace.nbytes[reads]))
            self.keys.append(point)
            self.measured.append(float(reps[MEASURED_MISSES].median()) * SECTOR_BYTES)

    def subset(self, keys) -> "MissCurves":
        """The curves of some of the points, without simulating them again."""
        keys = set(keys)
        out = MissCurves()
        for key, measured, curve in zip(self.keys, self.measured, self._curves):
            if key in keys:
                out.keys.append(key)
                out.measured.append(measured)
                out._curves.append(curve)
        return out

    def misses(self, capacity: float) -> np.ndarray:
        return np.asarray([c.miss_bytes(capacity) for c in self._curves], dtype=float)


def fit_capacity(counter_rows, gpu_name: str, *, lo_mib: float = 1.0,
                 hi_mib: float = 256.0, curves: MissCurves | None = None) -> CapacityFit:
    """Effective LRU capacity minimising the mean squared log error of read misses."""
    from scipy.optimize import minimize_scalar
    curves = curves or MissCurves(counter_rows)
    measured = np.asarray(curves.measured)

    def loss(log_cap):
        pred = curves.misses(math.exp(log_cap))
        return float(np.mean((np.log(pred + 1.0) - np.log(measured + 1.0)) ** 2))

    # The loss is a step function of capacity: scan a grid, then polish inside the best cell.
    grid = np.linspace(math.log(lo_mib * 2**20), math.log(hi_mib * 2**20), 161)
    losses = [loss(g) for g in grid]
    best = int(np.argmin(losses))
    lo, hi = grid[max(0, best - 1)], grid[min(len(grid) - 1, best + 1)]
    res = minimize_scalar(loss, bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-4})
    cap = math.exp(res.x) if res.fun <= losses[best] else math.exp(grid[best])
    pred = curves.misses(cap)
    return CapacityFit(gpu_name, cap, error_table(pred, measured), list(curves.keys),
                       pred.tolist(), measured.tolist())


def roofline_s(flops, dram_bytes, flop_rate, dram_rate):
    """time = max(FLOPs / R_flop, DRAM bytes / R_dram): the one copy of the bound."""
    return np.maximum(np.asarray(flops) / flop_rate, np.asarray(dram_bytes) / dram_rate)


@dataclass
class ThroughputFit:
    gpu: str
    flop_rate: float  # FLOP/s
    dram_rate: float  # B/s
    overhead_s: float
    errors: dict
    points: list[str] = field(default_factory=list)
    predicted_ms: list[float] = field(default_factory=list)
    measured_ms: list[float] = field(default_factory=list)

    def predict_s(self, flops, dram_bytes):
        return roofline_s(flops, dram_bytes, self.flop_rate, self.dram_rate) + self.overhead_s

    def dram_bound(self, flops, dram_bytes):
        """True where the DRAM term of the bound is the larger one."""
        return np.asarray(dram_bytes) / self.dram_rate > np.asarray(flops) / self.flop_rate

    def roof_tflops(self, bytes_per_flop):
        """The bound as a rate: TFLOP/s at a given DRAM bytes per FLOP (no overhead)."""
        return 1.0 / roofline_s(1.0, np.asarray(bytes_per_flop), self.flop_rate,
                                self.dram_rate) / 1e12

    def as_dict(self) -> dict:
        return asdict(self)


def fit_throughput(rows, gpu_name: str) -> ThroughputFit:
    """rows: timing joined with counters (columns executed_flops, dram_read_bytes,
    dram_write_bytes, median_ms, point). Least squares on log time."""
    from scipy.optimize import least_squares
    flops = rows["executed_flops"].to_numpy(float)
    dram = (rows["dram_read_bytes"] + rows["dram_write_bytes"]).to_numpy(float)
    t = rows["median_ms"].to_numpy(float) * 1e-3

    def model(x):
        rf, rd, t0 = np.exp(x)
        return roofline_s(flops, dram, rf, rd) + t0

    x0 = np.log([5e14, 3e12, 5e-6])
    res = least_squares(lambda x: np.log(model(x)) - np.log(t), x0, method="trf")
    rf, rd, t0 = np.exp(res.x)
    pred = model(res.x)
    return ThroughputFit(gpu_name, float(rf), float(rd), float(t0), error_table(pred, t),
                         list(rows["point"]), (pred * 1e3).tolist(), (t * 1e3).tolist())


def knee(seqlens, misses, compulsory, factor: float = 1.5):
    """The first S at which misses exceed `factor` x the compulsory level (None if never)."""
    for s, m, c in sorted(zip(seqlens, misses, compulsory)):
        if m > factor * c:
            return s
    return None
