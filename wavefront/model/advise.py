"""The advisor: every configuration the kernel offers for one shape, ranked by the timed model.

Candidates are every CTA x K/V schedule, every tile shape the kernel compiles (`TILE_SHAPES`)
at every CTAs-per-SM count up to its default, each with its compute timing: calibrated where `step_time` measured
the variant, projected (and marked so) where it did not (`Calibration.compute`). The kernel's
other levers (2-CTA clusters, worker warps, load latency hints, softmax levers) change code
generation, which the model does not see: they are listed as not modelled, for `wavefront tune`.

For head-grouped CTA orders the group size is the L2 budget production kernels fix
(FlashAttention-3: 32 MB dense, 8 MB varlen; cuDNN, TileGym: 50 MB): `group_budgets` predicts the
best budget for the shape against those fixed ones.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from wavefront.point import DEFAULT_OCCUPANCY, LEVERS, TILE_SHAPES

# The fixed budgets of production kernels (MB = 1e6 bytes as their sources state them)
FIXED_BUDGETS_MB = {"FlashAttention-3 varlen": 8, "FlashAttention-3 dense": 32,
                    "cuDNN / TileGym": 50}
# The CTA x K/V schedules the advisor ranks by default (`wavefront advise --schedule`)
SCHEDULES = ("grid+linear", "persistent+linear", "persistent+sawtooth", "grouped+linear",
             "grouped+sawtooth", "longest_first+linear", "dynamic+linear",
             "grouped_dynamic+linear")
# Work the advisor takes on without being asked: K/V steps over every candidate (the timed
# model runs about 12 M steps a second here; past this a shape takes minutes)
MAX_STEPS = 1_500_000_000


def head_label(heads: int, kv_heads: int | None) -> str:
    """'H24' for multi-head attention, 'H32/KV8' where K/V heads are shared (GQA)."""
    kv = kv_heads or heads
    return f"H{heads}" if kv == heads else f"H{heads}/KV{kv}"


def tile_label(tiles) -> str:
    return f"{tiles[0]}x{tiles[1]}"


@dataclass(frozen=True)
class Ranked:
    schedule: str
    tiles: str
    occupancy: int
    time_ms: float
    dram_mb: float
    compute: str  # where the step time comes from

    @property
    def projected(self) -> bool:
        return self.compute.startswith("PROJECTED")


def not_modelled_levers() -> list[str]:
    """The kernel levers the timed model cannot rank (they act through code generation)."""
    return [lever.name for lever in LEVERS]


def candidate_points(point, schedules: list[str]) -> list:
    """Every schedule x tile shape x CTAs per SM the kernel compiles for the point (1 up to the
    tile's default occupancy: more does not fit the shared memory)."""
    out = []
    for schedule in schedules:
        for tiles in TILE_SHAPES:
            for occupancy in range(DEFAULT_OCCUPANCY[tiles], 0, -1):
                out.append(dataclasses.replace(point, schedule=schedule, tiles=tile_label(tiles),
                                               occupancy=occupancy))
    return out


def total_steps(launch) -> int:
    """The K/V steps a candidate's simulation takes: a dense launch's counted from its problem
    (`timed.dense_steps`: its work table is not built to be refused), a packed batch's from
    its table."""
    from wavefront.model.simulation import item_steps
    from wavefront.model.timed import dense_steps
    steps = dense_steps(launch)
    return int(item_steps(launch).sum()) if steps is None else steps


def rank(point, gpu, memory, compute_of: Callable, schedules: list[str], *,
         progress: Callable | None = None, max_steps: int = MAX_STEPS) -> list[Ranked]:
    """Every candidate that builds on the preset, simulated and sorted by predicted time.
    Refuses (ValueError) a shape whose candidates together exceed `max_steps` K/V steps."""
    from wavefront.model.timed import simulate_timed
    launches = []
    for p in candidate_points(point, schedules):
        try:
            launches.append((p, p.launch(gpu)))
        except ValueError:
            continue  # a schedule this tile or head dim does not take
    steps = sum(total_steps(launch) for _, launch in launches)
    if steps > max_steps:
        raise ValueError(f"advise: {len(launches)} candidates of {steps / 1e6:.0f} M K/V steps "
                         f"in all exceed the {max_steps / 1e6:.0f} M the advisor simulates "
                         "(minutes here): narrow --schedule or the shape")
    rows = []
    for p, launch in (progress(launches) if progress else launches):
        compute = compute_of(launch)
        pred = simulate_timed(launch, memory, compute, l2_bytes=gpu.l2_bytes,
                              partitions=gpu.l2_partitions)
        rows.append(Ranked(launch.name, p.tiles, launch.ctas_per_sm, pred.kernel_ns * 1e-6,
                           pred.dram_read_bytes / 1e6, compute.source))
    return sorted(rows, key=lambda r: r.time_ms)


def group_budgets(point, gpu, memory, compute_of: Callable, *, schedule: str = "grouped+linear",
                  tiles: str | None = None) -> list[dict]:
    """For a head-grouped order: each distinct group size (powers of two of (batch, K/V head)
    units) with the smallest L2 budget that picks it, the fixed budgets beside them, each with
    its predicted time; the row with the least time is the advised budget."""
    from wavefront.model.timed import simulate_timed
    from wavefront.schedules import GroupedSchedule
    base = dataclasses.replace(point, schedule=schedule, tiles=tiles or point.tiles)
    launch = base.launch(gpu)
    problem = launch.problem
    if not isinstance(launch.cta, GroupedSchedule):
        raise ValueError(f"group budgets need a grouped CTA order, got {launch.cta.name!r}")
    unit = problem.kv_bytes_per_unit
    budgets = {}
    units = 1
    while units <= problem.kv_units:  # the smallest budget that picks each group size
        budgets[f"{units} unit(s)"] = units * unit
        units *= 2
    for name, mb in FIXED_BUDGETS_MB.items():
        budgets[f"{name} ({mb} MB)"] = mb * 1e6
    rows = []
    for label, budget in budgets.items():
        cta = GroupedSchedule(l2_fraction=min(4.0, max(budget, 1.0) / gpu.l2_bytes))
        grouped = dataclasses.replace(launch, cta=cta)
        pred = simulate_timed(grouped, memory, compute_of(grouped), l2_bytes=gpu.l2_bytes,
                              partitions=gpu.l2_partitions)
        rows.append({"budget": label, "budget_mb": budget / 1e6,
                     "group_units": cta.group_units(problem, gpu.l2_bytes),
                     "time_ms": pred.kernel_ns * 1e-6,
                     "dram_mb": pred.dram_read_bytes / 1e6})
    best = min(r["time_ms"] for r in rows)
    for r in rows:
        r["vs_best"] = r["time_ms"] / best
    return rows
