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
from typing import Callable, Iterable

import numpy as np

from wavefront.model.counting import launch_counts
from wavefront.model.presets import GPUSpec
from wavefront.model.simulation import (
    COLD,
    DriftModel,
    LruL2,
    RandomL2,
    MissCurve,
    ShardsSampler,
    access_trace,
    access_upper_bound,
    address_bound,
    reuse_distances,
    timed_trace,
    trace_blocks,
    Trace,
)
from wavefront.point import SECTOR_BYTES, GpuShape, Point
from wavefront.schedules import Launch

# Data that every SM reads (K/V) falls out of Hopper's L2 from about half its size (the knee
# experiment: ~30 MiB of 60 on the H200). The default until a fit says otherwise.
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
    counts = launch_counts(launch.problem, launch.n_chunks, launch.partial_row_bytes)
    return LaunchPrediction(
        schedule=launch.name, accesses=accesses, l2_read_sectors=sim.tex_read_sectors,
        read_miss_sectors=sim.dram_read_sectors,
        dram_read_bytes=sim.dram_read_sectors * SECTOR_BYTES,
        partitioned=asdict(split.result()) if split else None,
        reuse=_reuse_summary(sampler, capacity),
        compulsory_read_bytes=counts.compulsory_read_bytes)


def l2_models(gpu: GPUSpec) -> dict[str, Callable[[int], LruL2 | RandomL2]]:
    """The capacity and replacement models, each a factory of a cache for a launch's tile ids:
    - "half L2": one fully associative LRU of half the L2 (the old blanket default);
    - "partitions": the physical one, the L2's own size over its partitions (per-partition
      LRU, far reads leave a copy near the reader), so a one-partition chip (GB10) gets its
      whole L2 and Hopper's data read by every SM gets about half of it;
    - "random, half L2": half the L2 with random replacement, whose cliff is soft where LRU's
      is hard (the replacement policy tested at equal capacity)."""
    return {
        "half L2": lambda n_ids: LruL2(DEFAULT_EFFECTIVE_FRACTION * gpu.l2_bytes, n_ids),
        "partitions": lambda n_ids: LruL2(gpu.l2_bytes, n_ids, partitions=gpu.l2_partitions,
                                          sms=gpu.sms),
        "random, half L2": lambda n_ids: RandomL2(DEFAULT_EFFECTIVE_FRACTION * gpu.l2_bytes,
                                                  n_ids),
    }


def l2_predictions_by_model(launch: Launch, gpu: GPUSpec, blocks: Iterable[Trace],
                            capacities: dict[str, float] | None = None) -> dict:
    """Each of `l2_models` (and a fully associative LRU per named capacity in `capacities`)
    fed the same access stream in one pass -> {name: L2Prediction}."""
    n_ids = address_bound(launch)
    caches = {name: make(n_ids) for name, make in l2_models(gpu).items()}
    for name, capacity in (capacities or {}).items():
        caches[name] = LruL2(capacity, n_ids)
    for block in blocks:
        for cache in caches.values():
            cache.feed(block)
    return {name: cache.result() for name, cache in caches.items()}


def dram_reads_by_model(launch: Launch, gpu: GPUSpec, blocks: Iterable[Trace],
                        capacities: dict[str, float] | None = None) -> dict:
    """DRAM read bytes of one access stream under each model (see l2_predictions_by_model)."""
    return {name: pred.dram_read_sectors * SECTOR_BYTES for name, pred in
            l2_predictions_by_model(launch, gpu, blocks, capacities).items()}


def order_predictions(launch: Launch, gpu: GPUSpec, orders: dict[int, tuple],
                      ) -> list[dict]:
    """Per measured repeat: DRAM reads predicted from lock-step rounds, from that launch's own
    measured order (tickets), and from a drift model fitted to the *other* repeats' orders
    (held out), each under both capacity models."""
    lock = dram_reads_by_model(launch, gpu, trace_blocks(launch))
    rows = []
    for repeat, (start, end) in sorted(orders.items()):
        others = [o for r, o in orders.items() if r != repeat] or [orders[repeat]]
        drift = DriftModel.fit(launch, others)
        row = {"repeat": repeat, "drift_rate_spread": drift.rate_spread,
               "drift_start_skew": drift.start_skew}
        for order, res in (
                ("lock-step", lock),
                ("measured order", dram_reads_by_model(
                    launch, gpu, [timed_trace(launch, start, end)])),
                ("drift model", dram_reads_by_model(
                    launch, gpu, [timed_trace(launch, *drift.item_times(launch, repeat))]))):
            for model, value in res.items():
                row[f"{order}, {model}"] = value
        rows.append(row)
    return rows


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
    """Effective LRU capacity minimising the mean squared log error of read misses. Fitted on
    one sequence length it is one knee point, not a curve: that warns (UserWarning)."""
    import warnings

    from scipy.optimize import minimize_scalar
    if counter_rows is not None and "seqlen" in getattr(counter_rows, "columns", ()):
        lengths = counter_rows["seqlen"].nunique()
        if lengths < 2:
            warnings.warn(f"{gpu_name}: the L2 capacity is fitted on {lengths} sequence length "
                          "only; a capacity needs points on both sides of the knee (several "
                          "lengths) to mean anything", UserWarning, stacklevel=2)
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


def occupancy_fraction(rows) -> np.ndarray:
    """Work items per CTA slot in flight, capped at 1: below 1 some SMs idle (short or
    few-headed launches), which no cache term explains."""
    items = np.asarray([launch_of_row(r).num_items for _, r in rows.iterrows()], dtype=float)
    return np.minimum(1.0, items / rows["resident_ctas"].to_numpy(float))


def schedule_of(rows) -> np.ndarray:
    return (rows["cta_schedule"] + "+" + rows["kv_schedule"]).to_numpy()


# Bootstrap resamples of the points for the parameters' 95% intervals.
BOOTSTRAP = 200


@dataclass
class ThroughputFit:
    """time = max(FLOPs / (R_flop x e_schedule x u^gamma), DRAM bytes / R_dram) + t0.

    R_flop is the reference schedule's compute rate; e_schedule the other specialisations'
    rate relative to it (code generation, measured where misses are equal); u the occupancy
    fraction (`occupancy_fraction`) and gamma how much an idle slot costs; R_dram the DRAM rate
    the kernel reaches when it binds. Intervals are bootstrap percentiles over the points;
    `dram_bound_points` says how many fitted points the DRAM term decides (zero: R_dram is
    not identified by this data, only bounded below).
    """

    gpu: str
    flop_rate: float  # FLOP/s
    dram_rate: float  # B/s
    overhead_s: float
    occupancy_exponent: float
    schedule_efficiency: dict
    reference_schedule: str
    intervals: dict  # parameter -> [2.5%, 97.5%]
    dram_bound_points: int
    errors: dict
    points: list[str] = field(default_factory=list)
    predicted_ms: list[float] = field(default_factory=list)
    measured_ms: list[float] = field(default_factory=list)

    def compute_rate(self, schedules, occupancy):
        e = np.asarray([self.schedule_efficiency.get(s, 1.0) for s in schedules])
        return self.flop_rate * e * np.asarray(occupancy, dtype=float) ** self.occupancy_exponent

    def predict_s(self, flops, dram_bytes, schedules=None, occupancy=1.0):
        schedules = (schedules if schedules is not None
                     else [self.reference_schedule] * np.size(flops))
        rate = self.compute_rate(schedules, np.broadcast_to(occupancy, np.shape(schedules)))
        return roofline_s(flops, dram_bytes, rate, self.dram_rate) + self.overhead_s

    def predict_rows_s(self, rows):
        return self.predict_s(rows["executed_flops"].to_numpy(float),
                              (rows["dram_read_bytes"] + rows["dram_write_bytes"]).to_numpy(float),
                              schedule_of(rows), occupancy_fraction(rows))

    def dram_bound(self, flops, dram_bytes):
        """True where the DRAM term of the bound is the larger one (reference schedule)."""
        return np.asarray(dram_bytes) / self.dram_rate > np.asarray(flops) / self.flop_rate

    @property
    def balance_flop_per_byte(self) -> float:
        """The machine balance the kernel sees: above this many FLOPs per DRAM byte, compute."""
        return self.flop_rate / self.dram_rate

    def roof_tflops(self, bytes_per_flop):
        """The bound as a rate: TFLOP/s at a given DRAM bytes per FLOP (no overhead)."""
        return 1.0 / roofline_s(1.0, np.asarray(bytes_per_flop), self.flop_rate,
                                self.dram_rate) / 1e12

    def as_dict(self) -> dict:
        return asdict(self)


def _solve_throughput(flops, dram, occ, sched_index, n_sched, t):
    from scipy.optimize import least_squares

    def model(x):
        rf, rd, t0 = np.exp(x[:3])
        gamma = x[3]
        eff = np.exp(np.concatenate([[0.0], x[4:]]))[sched_index]
        return roofline_s(flops, dram, rf * eff * occ ** gamma, rd) + t0

    x0 = np.concatenate([np.log([5e14, 3e12, 5e-6]), [0.5], np.zeros(n_sched - 1)])
    lower = np.concatenate([np.log([1e12, 1e10, 1e-8]), [0.0], np.full(n_sched - 1, -2.0)])
    upper = np.concatenate([np.log([1e16, 1e15, 1e-2]), [3.0], np.full(n_sched - 1, 1.0)])
    res = least_squares(lambda x: np.log(model(x)) - np.log(t), x0, bounds=(lower, upper),
                        method="trf")
    return res.x, model(res.x)


def fit_throughput(rows, gpu_name: str, *, reference_schedule: str = "persistent+linear",
                   bootstrap: int = BOOTSTRAP, seed: int = 0) -> ThroughputFit:
    """rows: timing joined with counters (columns executed_flops, dram_read_bytes,
    dram_write_bytes, median_ms, point, the schedule and launch columns). Least squares on
    log time; 95% intervals from `bootstrap` resamples of the points."""
    flops = rows["executed_flops"].to_numpy(float)
    dram = (rows["dram_read_bytes"] + rows["dram_write_bytes"]).to_numpy(float)
    t = rows["median_ms"].to_numpy(float) * 1e-3
    occ = occupancy_fraction(rows)
    scheds = schedule_of(rows)
    names = sorted(set(scheds))
    ref = reference_schedule if reference_schedule in names else names[0]
    names = [ref] + [s for s in names if s != ref]
    index = np.asarray([names.index(s) for s in scheds])
    x, pred = _solve_throughput(flops, dram, occ, index, len(names), t)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(bootstrap):
        pick = rng.integers(0, len(t), len(t))
        present = np.unique(index[pick])
        if 0 not in present:
            continue
        remap = {old: new for new, old in enumerate(present)}
        xb, _ = _solve_throughput(flops[pick], dram[pick], occ[pick],
                                  np.asarray([remap[i] for i in index[pick]]), len(present),
                                  t[pick])
        draws.append([*np.exp(xb[:3]), xb[3]])
    draws = np.asarray(draws) if draws else np.full((1, 4), np.nan)
    lo, hi = np.percentile(draws, [2.5, 97.5], axis=0)
    rf, rd, t0 = np.exp(x[:3])
    eff = dict(zip(names, np.exp(np.concatenate([[0.0], x[4:]])).tolist()))
    bound = int((dram / rd > flops / (rf * np.asarray([eff[s] for s in scheds])
                                      * occ ** x[3])).sum())
    return ThroughputFit(
        gpu_name, float(rf), float(rd), float(t0), float(x[3]), eff, ref,
        {name: [float(lo[i]), float(hi[i])] for i, name in
         enumerate(("flop_rate", "dram_rate", "overhead_s", "occupancy_exponent"))},
        bound, error_table(pred, t), list(rows["point"]), (pred * 1e3).tolist(),
        (t * 1e3).tolist())


# The paper's own launch (Zhu et al.): B=8, H=1, S=131072, D=64, 64x64 tiles, persistent with
# one CTA per SM (48 on the GB10).
PAPER_LAUNCH = dict(batch=8, heads=1, seqlen=131072, head_dim=64, tiles="64x64")


def preset_predictions(presets: dict[str, GPUSpec], fit: ThroughputFit,
                       measured_on: GPUSpec) -> list[dict]:
    """Predictions before measurements, per preset, causal and not, linear and sawtooth at the
    paper's launch: DRAM reads under both capacity models, and TFLOP/s from the throughput
    model carried over by efficiency: the fitted compute and DRAM rates as fractions of
    `measured_on`'s nominal peak and bandwidth, applied to each preset's nominal figures (an
    assumption: the kernel reaches the same fractions there), with schedule-neutral code and
    no overhead. The machine balance is the carried-over compute rate over the DRAM rate."""
    flop_eff = fit.flop_rate / measured_on.peak_bf16_flops
    dram_eff = fit.dram_rate / measured_on.dram_bytes_per_s
    rows = []
    for key, gpu in presets.items():
        rate_f, rate_d = gpu.peak_bf16_flops * flop_eff, gpu.dram_bytes_per_s * dram_eff
        for causal in (False, True):
            for kv in ("linear", "sawtooth"):
                point = Point(**PAPER_LAUNCH, causal=causal, schedule=f"persistent+{kv}",
                              occupancy=1, ctas=gpu.sms)
                launch = point.launch(GpuShape(gpu.sms, gpu.l2_bytes))
                counts = launch_counts(launch.problem, launch.n_chunks, launch.partial_row_bytes)
                dram = dram_reads_by_model(launch, gpu, trace_blocks(launch))
                moved = dram["partitions"] + counts.compulsory_write_bytes
                seconds = float(roofline_s(counts.executed_flops, moved, rate_f, rate_d))
                rows.append({
                    "preset": key, "gpu": gpu.name, "causal": causal, "schedule": launch.name,
                    "ctas": launch.num_ctas, "l2_mib": gpu.l2_bytes / 2**20,
                    "partitions": gpu.l2_partitions,
                    "dram_read_gb": dram["partitions"] / 1e9,
                    "dram_read_gb_half_l2": dram["half L2"] / 1e9,
                    "x_compulsory": dram["partitions"] / counts.compulsory_read_bytes,
                    "l2_read_sectors": counts.read_sectors,
                    "balance_flop_per_byte": rate_f / rate_d,
                    "flop_per_dram_byte": counts.executed_flops / moved,
                    "dram_bound": moved / rate_d > counts.executed_flops / rate_f,
                    "tflops": counts.useful_flops / seconds / 1e12,
                    "compute_rate_tflops": rate_f / 1e12, "dram_rate_tb_s": rate_d / 1e12})
    return rows


# A point counts for validation only above the knee: below it every capacity model predicts
# the compulsory misses and is right by construction.
ABOVE_KNEE = 1.5


def above_knee(measured_bytes, compulsory_bytes) -> np.ndarray:
    return np.asarray(measured_bytes, float) > ABOVE_KNEE * np.asarray(compulsory_bytes, float)


def validation_errors(predicted, measured) -> dict:
    """`error_table` plus the spread of the signed relative error (10th, 50th, 90th
    percentiles): what an out-of-sample score reports."""
    p = np.asarray(predicted, float)
    m = np.asarray(measured, float)
    out = error_table(p, m)
    if out["n"]:
        signed = (p - m) / m
        out.update({f"error_p{q}": float(np.percentile(signed, q)) for q in (10, 50, 90)})
    return out


def knee(seqlens, misses, compulsory, factor: float = 1.5):
    """The first S at which misses exceed `factor` x the compulsory level (None if never)."""
    for s, m, c in sorted(zip(seqlens, misses, compulsory)):
        if m > factor * c:
            return s
    return None
