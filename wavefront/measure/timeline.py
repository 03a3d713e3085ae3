"""What one launch does over its duration: Nsight Compute's PM sampling around the public call.

Totals (DRAM bytes, L2 hit rate) say how much a launch read, not when. PM sampling reads the
GPU's performance monitors every few microseconds during one launch (ncu's `PmSampling` and
`PmSampling_WarpStates` sections), which shows whether DRAM traffic is spread evenly over a
launch, rises as its CTAs drift apart, or comes in bursts where rounds of work items begin.

The launched program is deliberately small and version-neutral (`LAUNCH_PROGRAM`): random bf16
inputs, two warm-up calls of `wavefront.attention` (compilation, the launcher's cache), then one
call between cudaProfilerStart/Stop. It only uses what every version of the package offers, so
the same program profiles an older kernel too (a `git archive` of it first on PYTHONPATH).
Kernel replay from a cold L2 (`--cache-control all`), clocks left alone.
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from wavefront.device import find_ncu
from wavefront.measure.profiling import COLD_REPLAY, find_ncu_report

SECTIONS = ("PmSampling", "PmSampling_WarpStates")
# Launch totals beside the series: what the series should add up to.
TOTALS = ("dram__bytes_read.sum", "gpu__time_duration.sum", "lts__t_sector_hit_rate.pct",
          "lts__t_sectors_srcunit_tex_op_read.sum",
          "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum",
          "lts__t_sectors_srcunit_tex_op_write.sum", "launch__grid_size",
          "sm__cycles_elapsed.avg.per_second")
# Sampled metrics asked for by name where `ncu --query-metrics-collection pmsampling` lists
# them (the sections' own choice varies with the ncu version): DRAM reads and L2 lookups.
WISHED_SAMPLED = ("dram__bytes_read.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
                  "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum",
                  "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum",
                  "lts__t_sectors_lookup_hit.sum", "lts__t_sectors_lookup_miss.sum")
KERNEL_FILTER = "regex:flash_attention_fwd"

LAUNCH_PROGRAM = r"""
import json, os, torch, wavefront
spec = json.loads(os.environ["WF_TIMELINE_LAUNCH"])
shapes = [(spec["batch"], h, spec["seqlen"], spec["head_dim"])
          for h in (spec["heads"], spec["kv_heads"], spec["kv_heads"])]
kwargs = dict(causal=spec["causal"], schedule=spec["schedule"], tiles=spec["tiles"])
if spec.get("inputs", "torch") == "torch":
    g = torch.Generator(device="cuda").manual_seed(spec.get("seed", 0))
    q, k, v = (torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g) for s in shapes)
else:  # as the sweeps' workers make them: CuPy N(0, 1) in float32, cast to bf16, `out` given
    import cupy, ml_dtypes
    rng = cupy.random.default_rng(spec.get("seed", 0))
    q, k, v = (rng.standard_normal(s, dtype=cupy.float32).astype(ml_dtypes.bfloat16)
               for s in shapes)
    kwargs["out"] = cupy.empty_like(q)
if spec.get("ctas"):
    kwargs["ctas"] = spec["ctas"]
if spec.get("occupancy"):
    kwargs["occupancy"] = spec["occupancy"]
for _ in range(2):
    out = wavefront.attention(q, k, v, **kwargs)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
out = wavefront.attention(q, k, v, **kwargs)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
finite = (bool(torch.isfinite(out).all().item()) if isinstance(out, torch.Tensor) else
          bool(torch.isfinite(torch.from_dlpack(out)).all().item()))
print("@@timeline", json.dumps({"finite": finite,
                                "package": os.path.dirname(wavefront.__file__)}))
"""


@dataclass(frozen=True)
class TimelineLaunch:
    """One launch to sample: its shape, schedule and tiles, and a label for the figure."""

    label: str
    batch: int = 1
    heads: int = 1
    kv_heads: int = 1
    seqlen: int = 262144
    head_dim: int = 128
    causal: bool = False
    schedule: str = "persistent+linear"
    tiles: str = "128x64"
    ctas: int | None = None
    occupancy: int | None = None
    seed: int = 0
    inputs: str = "torch"

    def __post_init__(self):
        for name in ("batch", "heads", "kv_heads", "seqlen", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")
        if self.inputs not in ("torch", "cupy"):
            raise ValueError(f"inputs must be 'torch' or 'cupy', got {self.inputs!r}")
        if "+" not in self.schedule:
            raise ValueError(f"schedule must be '<cta>+<kv>', got {self.schedule!r}")


@functools.cache
def sampled_metric_names(ncu: str) -> tuple[str, ...]:
    """The metrics of `WISHED_SAMPLED` that this ncu can sample on this GPU (by their base
    names in `--query-metrics-collection pmsampling`, asked once per process); () where the
    query fails."""
    try:
        out = subprocess.run([ncu, "--query-metrics-collection", "pmsampling"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    listed = set(re.findall(r"\b([a-z0-9]+__[a-z0-9_]+)\b", out.stdout))
    return tuple(m for m in WISHED_SAMPLED if m.rsplit(".", 1)[0] in listed)


def ncu_command(ncu: str, report: str, sampled: list[str]) -> list[str]:
    metrics = list(TOTALS) + [f"pmsampling:{m}" for m in sampled]
    cmd = [ncu, *COLD_REPLAY, "--kernel-name", KERNEL_FILTER, "--launch-count", "1"]
    for section in SECTIONS:
        cmd += ["--section", section]
    return cmd + ["--metrics", ",".join(metrics), "--export", report, "--force-overwrite",
                  sys.executable, "-c", LAUNCH_PROGRAM]


def _instances(metric) -> tuple[list[float], list[float] | None]:
    """A sampled metric's values, and its samples' timestamps where the report has them."""
    n = metric.num_instances()
    values = [float(metric.as_double(i)) for i in range(n)]
    stamps = None
    try:
        if metric.has_correlation_ids():
            ids = metric.correlation_ids()
            stamps = [float(ids.as_double(i)) for i in range(ids.num_instances())]
    except Exception:  # an ncu_report without correlation ids: positions only
        stamps = None
    return values, stamps


def read_series(report: str, ncu: str) -> tuple[dict, dict]:
    """-> ({sampled metric: {"values": [...], "t": [...] or None}}, {total metric: value})
    of the one kernel in `report`, through NVIDIA's `ncu_report`."""
    module = find_ncu_report(ncu)
    if module is None:
        raise RuntimeError("ncu_report (Nsight Compute's Python report interface) not found")
    ctx = module.load_report(report)
    actions = [ctx.range_by_idx(r).action_by_idx(a) for r in range(ctx.num_ranges())
               for a in range(ctx.range_by_idx(r).num_actions())]
    if len(actions) != 1:
        raise RuntimeError(f"{report}: {len(actions)} kernels profiled, expected 1")
    action = actions[0]
    series, totals = {}, {}
    for name in action.metric_names():
        metric = action.metric_by_name(name)
        if metric is None:
            continue
        if name.startswith("pmsampling:"):
            if metric.num_instances() > 0:
                values, stamps = _instances(metric)
                series[name] = {"values": values, "t": stamps}
        elif name in TOTALS:
            totals[name] = float(metric.as_double())
    return series, totals


def sample_launch(launch: TimelineLaunch, work_dir: str, package_dir: str | None = None,
                  timeout_s: float = 300, keep_failed_in: str | None = None) -> dict:
    """Profile one launch with PM sampling; -> a record: the launch, how it was collected, its
    totals and every sampled series. `package_dir`: a directory holding another version of the
    `wavefront` package to launch instead of this one (the launch program imports it);
    `keep_failed_in`: where a report that cannot be read is moved instead of deleted."""
    ncu = find_ncu()
    if ncu is None:
        raise RuntimeError("ncu (Nsight Compute) not found on PATH")
    report = str(Path(work_dir) / f"timeline-{os.getpid()}-{launch.label}.ncu-rep")
    env = dict(os.environ, WF_TIMELINE_LAUNCH=json.dumps(asdict(launch)))
    if package_dir:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_dir,
                                                          env.get("PYTHONPATH")]))
    sampled = sampled_metric_names(ncu)
    attempts = [list(sampled), []] if sampled else [[]]
    last = None
    for wished in attempts:  # the named metrics are extras: without them if ncu refuses them
        last = subprocess.run(ncu_command(ncu, report, wished), env=env, capture_output=True,
                              text=True, timeout=timeout_s)
        if last.returncode == 0 and Path(report).exists():
            break
    else:
        raise RuntimeError(f"ncu failed ({last.returncode}): {(last.stderr or last.stdout)[-600:]}")
    marks = [ln for ln in last.stdout.splitlines() if ln.startswith("@@timeline ")]
    launched = json.loads(marks[-1].split(" ", 1)[1]) if marks else {}
    if not launched.get("finite", False):
        raise RuntimeError(f"{launch.label}: the profiled call's output is not finite "
                           f"({launched or last.stdout[-300:]})")
    try:
        series, totals = read_series(report, ncu)
    except Exception:
        if keep_failed_in:  # the report is the measurement: kept for another reader
            Path(keep_failed_in).mkdir(parents=True, exist_ok=True)
            os.replace(report, Path(keep_failed_in) / Path(report).name)
        raise
    os.remove(report)
    return {"launch": asdict(launch), "package": launched.get("package"),
            "named_sampled_metrics": wished, "totals": totals, "series": series}
