"""What one measured repeat of a point is: typed timing, counters and the GPU's conditions.

A results row is `Point.to_record(gpu)` plus a `Measurement`'s columns; the schema
(`wavefront.results.store.SCHEMA`) is built from these dataclasses and `METRICS`, so a new
column is one field here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, make_dataclass

from wavefront.point import SECTOR_BYTES

# ||out - ref|| / ||ref|| against float32 that bf16/fp16 operands must stay under (bf16
# against a float32 reference lands between 1e-3 and 1e-2). The one copy: the measurement, the tests and the draft.
CORRECTNESS_TOLERANCE = 1e-2

# Nsight Compute metric -> column. The only list of metrics: ncu is asked for these, the schema
# has these columns, the parsers fill them.
METRICS = {
    "lts__t_sectors_srcunit_tex_op_read.sum": "l2_tex_read_sectors",
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum": "l2_tex_read_hit_sectors",
    "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum": "l2_tex_read_miss_sectors",
    "lts__t_sectors_srcunit_tex_op_write.sum": "l2_tex_write_sectors",
    "lts__t_sectors_srcunit_ltcfabric_op_read.sum": "l2_fabric_read_sectors",
    "lts__t_sectors_srcunit_ltcfabric_op_read_lookup_hit.sum": "l2_fabric_read_hit_sectors",
    "lts__t_sectors_srcunit_ltcfabric_op_read_lookup_miss.sum": "l2_fabric_read_miss_sectors",
    "l1tex__t_sector_hit_rate.pct": "l1_hit_rate_pct",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "l1_global_load_sectors",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_hit.sum": "l1_global_load_hit_sectors",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "gpu__time_duration.sum": "ncu_duration_ns",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active": "tensor_active_pct",
}
# A metric added after schema v4 names here the schema version that added its column (the
# current version + 1); the store then upgrades every older results file, on load and before
# a row is appended, the new column empty. Adding a metric: one METRICS entry, one entry here.
METRIC_SINCE: dict[str, int] = {}
# Which metrics a counters measurement collects. "full" needs several replay passes of the
# launch; "dram" fits in one pass, so its numbers all come from the same execution.
METRIC_SETS = {
    "full": tuple(METRICS),
    "dram": ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum"),
}

# Metrics that are rates, not counts: combined over a point's kernels weighted by duration.
RATE_COLUMNS = frozenset({"l1_hit_rate_pct", "sm_throughput_pct", "tensor_active_pct"})
METRIC_NOTES = {
    "l1_hit_rate_pct": " (LSU traffic only: TMA bypasses L1)",
    "ncu_duration_ns": " under ncu (not a timing)",
}
# Columns derived from the metrics and the closed-form counts.
DERIVED = {
    "dram_read_sectors": "dram_read_bytes / sector: reads that left L2, the primary miss metric",
    "sm_hit_rate": "1 - l2_read_miss_sectors / tex read lookups (secondary: L2-side)",
    "l2_read_miss_sectors": "tex read misses - fabric read hits (secondary: L2-side, can fall "
                            "below compulsory on Hopper)",
    "closed_form_read_sectors": "Q + K/V reads the kernel issues, from the tiles visited",
    "read_sectors_ratio": "l2_tex_read_sectors / closed_form_read_sectors",
    "compulsory_read_bytes": "Q, K, V once (+ partial states, tiled)",
}


@dataclass(frozen=True)
class Timing:
    """CUDA-event timing of one point, checked against the reference first. Fields a runner
    did not report stay None (blank in the results file)."""

    rel_error: float | None = None  # ||out - ref|| / ||ref|| against float32
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    reps: int | None = None
    tflops: float | None = None  # useful FLOPs / median time
    useful_flops: float | None = None
    executed_flops: float | None = None
    fa2_ms: float | None = None  # torch SDPA flash (FA2), same shapes, same run
    cudnn_ms: float | None = None  # torch SDPA cuDNN, same shapes, same run


Counters = make_dataclass(
    "Counters", [(column, "float | None", None) for column in (*METRICS.values(), *DERIVED)],
    frozen=True)
Counters.__doc__ = "Nsight Compute counters of one launch (all its kernels), and derived columns."


@dataclass(frozen=True)
class Conditions:
    """The GPU while a point was measured (NVML), and where it ran."""

    host: str | None = None
    gpu_uuid: str | None = None
    sm_clock_mhz: float | None = None  # median over the point's measurement
    mem_clock_mhz: float | None = None
    throttle_reasons: str | None = None  # NVML clock-event reasons seen, '|'-joined
    throttled: bool | None = None  # a reason other than idle / application clocks was seen


@dataclass(frozen=True)
class Measurement:
    """One repeat of one point: what was measured and how it ended."""

    measurement: str  # "timing" | "counters"
    status: str  # "ok" | "failed"
    error: str = ""
    repeat: int = 0
    timing: Timing | None = None
    counters: Counters | None = None
    conditions: Conditions | None = None

    @classmethod
    def of(cls, measurement: str, repeat: int, result: dict | None,
           error: str | None) -> "Measurement":
        """A runner's answer for one task, typed: the result's fields sorted into timing,
        counters and conditions (anything else it carries is not a column and is dropped)."""
        if error is not None or result is None:
            return cls(measurement, "failed", (error or "no result")[:500], repeat)

        def pick(part):
            return part(**{k: result[k] for k in field_names(part) if k in result})
        conditions = pick(Conditions)
        return cls(measurement, "ok", "", repeat,
                   timing=pick(Timing) if measurement == "timing" else None,
                   counters=pick(Counters) if measurement == "counters" else None,
                   conditions=conditions if conditions != Conditions() else None)

    def columns(self) -> dict:
        """This measurement's columns of a results row."""
        row = {"measurement": self.measurement, "status": self.status, "error": self.error,
               "repeat": self.repeat}
        for part in (self.timing, self.counters, self.conditions):
            if part is not None:
                row.update(asdict(part))
        return row


# A point whose repeats disagree by more than this (max - min over the median) is flagged.
SPREAD_FLAG = 0.10
SPREAD_FLAG_TEXT = "repeats disagree > 10%"


def spread(values) -> float:
    """(max - min) / median over a point's repeats; 0 for fewer than two finite values."""
    import numpy as np
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return 0.0
    return float((v.max() - v.min()) / np.median(v))


def median_ci95(samples) -> tuple[float, float]:
    """Distribution-free 95% interval of the median: order statistics (j, k) with
    P(j <= rank of the median < k) >= 0.95 under Binomial(n, 1/2). Needs n >= 6."""
    xs = sorted(samples)
    n = len(xs)
    if n < 6:
        raise ValueError(f"a 95% interval of the median needs at least 6 rounds, got {n}")
    j, k = median_ci95_ranks(n)
    return xs[max(j - 1, 0)], xs[min(k - 1, n - 1)]


def median_ci95_ranks(n: int) -> tuple[int, int]:
    """The order statistics (1-based j, k) `median_ci95` takes from n samples."""
    from scipy.stats import binom
    j = int(binom.ppf(0.025, n, 0.5))
    k = n - j
    while binom.cdf(k - 1, n, 0.5) - binom.cdf(j - 1, n, 0.5) < 0.95 and j > 0:
        j -= 1
        k += 1
    return j, k


def paired_ratio(reference_ms, other_ms) -> tuple[float, float, float]:
    """Speed of `other` relative to `reference` (> 1: faster), paired by round: both were timed
    in every round, so each round gives one ratio and drifts common to the round cancel.
    -> (median ratio, 95% interval)."""
    import statistics
    if len(reference_ms) != len(other_ms):
        raise ValueError("paired ratios need contenders timed in the same rounds")
    ratios = [a / b for a, b in zip(reference_ms, other_ms)]
    lo, hi = median_ci95(ratios)
    return statistics.median(ratios), lo, hi


def paired_references(contender: str) -> dict[str, str]:
    """The contenders a bench contender is compared with, round by round: the same CTA schedule
    scanning linearly, and grid+linear, both with the same levers (the "[...]" suffix)."""
    cta, _, rest = contender.partition("+")
    levers = rest[rest.index(" "):] if " " in rest else ""
    return {"linear": f"{cta}+linear{levers}", "grid": f"grid+linear{levers}"}


def field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def derive(metrics: dict, closed_form_read_sectors: float | None,
           compulsory_read_bytes: float | None) -> dict:
    """Derived columns from raw metrics (the metrics `measure.profiling` collects).

    The primary miss metric is DRAM read sectors: from one cold launch, the bytes that really
    left L2. The L2-side metric `tex read misses - fabric read hits` stays as a secondary: a
    read that misses in the SM's own partition is either homed there (DRAM) or looked up again
    at its home partition over the fabric, but on Hopper the SM-side miss counter also counts
    requests merged or retried, so this difference fell below the compulsory minimum in 31
    committed rows. `lts__t_sector_hit_rate` double-counts the second lookup and is not used.
    """
    tex = metrics.get("l2_tex_read_sectors")
    miss = metrics.get("l2_tex_read_miss_sectors")
    fabric_hit = metrics.get("l2_fabric_read_hit_sectors")
    out = {}
    if metrics.get("dram_read_bytes") is not None:
        out["dram_read_sectors"] = metrics["dram_read_bytes"] / SECTOR_BYTES
    if tex and miss is not None and fabric_hit is not None:
        out["l2_read_miss_sectors"] = max(0.0, miss - fabric_hit)
        out["sm_hit_rate"] = 1.0 - out["l2_read_miss_sectors"] / tex
    if closed_form_read_sectors:
        out["closed_form_read_sectors"] = closed_form_read_sectors
        if tex:
            out["read_sectors_ratio"] = tex / closed_form_read_sectors
    if compulsory_read_bytes:
        out["compulsory_read_bytes"] = compulsory_read_bytes
    return out

# A bench contender timed from the SCHEDULE_AT_RUN_TIME binary is named '<schedule>' + this.
ONE_BINARY = " (one binary)"
# The peers a bench may time beside our schedules, by contender name: torch SDPA's FlashAttention-2
# and cuDNN backends, and NVIDIA's cuTile attention (TileGym).
PEER_NAMES = ("fa2", "cudnn", "tilegym")
