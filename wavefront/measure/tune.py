"""`wavefront tune`: search the kernel's levers on this GPU and keep the fastest per shape.

The levers (cuTile's and ours): tile shape, CTAs per SM (`occupancy`), consumer warps
(`worker_warps`: 8 gives two consumer warpgroups, FlashAttention-3's layout), CTAs per cluster
(`cluster`), the K/V loads' latency hint (`kv_latency`), the next tile's QK^T issued before
this tile's softmax (`qk_ahead`, FlashAttention-3's intra-warpgroup overlap) and the CTA
schedule (static grid-stride or dynamic); then, on the winner, FlashAttention-4's two softmax
levers (`rescale_threshold`, `exp2_poly`) in a second set of rounds against the winner itself.
Each search has three steps:

1. Screen on the CPU side: compile every candidate ahead of time (parallel processes) and read
   its SASS. A candidate that fails to compile, spills registers to local memory or serialises
   its warpgroup MMAs is recorded with the reason and not timed: those were the slow ones.
2. Warm the JIT cache in parallel processes (compiling, not running, dominates otherwise).
3. Time the survivors and cuDNN / FA2 in interleaved rounds (`rounds.run_rounds`), each first
   checked against the float32 reference.

Every candidate's row (levers, SASS facts, median TFLOP/s with its 95% interval, ratios to the
peers of the same rounds) goes to the record; the fastest goes to the tuned table
(`wavefront.kernel.tuning`), which `wavefront.attention` uses by default.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from concurrent.futures import ProcessPoolExecutor

from wavefront.device import usable_cpus
from wavefront.point import LEVERS as KERNEL_LEVER_DECLARATIONS
from wavefront.point import Point
from wavefront.results.records import LEVER_RECORDS, TUNE_RECORDS

# The searched values of each lever (tiles first: the others are read against it). The first
# search on the H100 (data/tune) also had 64x64 tiles (never within 14% of the best) and the
# `dynamic` schedule, whose heads-fastest order the model shows losing the L2 at large
# batch x heads (B8 H16 S16k causal: 21x the compulsory DRAM reads, grouped_dynamic 1.0x) while
# it ran no faster than grouped_dynamic at B1 H32 S8k: the table should not pick it.
LEVERS = {
    "tiles": ("128x64", "128x128", "128x256"),
    "occupancy": (1, 2),
    **{lever.name: lever.searched for lever in KERNEL_LEVER_DECLARATIONS
       if lever.stage == "levers"},
    "schedule": ("persistent+linear", "grouped_dynamic+linear"),
}


# Searched on the first stage's winner (coordinate search: they change the softmax, not the
# pipeline shape, and the product with LEVERS would be 6x the candidates).
SOFTMAX_LEVERS = {lever.name: lever.searched for lever in KERNEL_LEVER_DECLARATIONS
                  if lever.stage == "softmax"}
ALL_LEVERS = (*LEVERS, *SOFTMAX_LEVERS)


def restricted(only, levers: dict = LEVERS) -> dict:
    """`levers` with some levers held to a subset of their searched values. `only`: texts
    "LEVER=V[,V]" (`tune --only tiles=128x128 --only qk_ahead=1`: a search around known
    winners, a fraction of the candidates); values are matched as text against the searched
    ones."""
    out = dict(levers)
    for item in only:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise ValueError(f"expected LEVER=V[,V], got {item!r}")
        if name not in levers:
            raise ValueError(f"no searched lever {name!r}; expected one of "
                             f"{', '.join(levers)}")
        by_text = {str(v).lower(): v for v in levers[name]}
        wanted = [t.strip().lower() for t in text.split(",") if t.strip()]
        unknown = [t for t in wanted if t not in by_text]
        if not wanted or unknown:
            raise ValueError(f"{name}: expected values among "
                             f"{', '.join(map(str, levers[name]))}, got {text!r}")
        out[name] = tuple(by_text[t] for t in wanted)
    return out


def held_to(levers: dict) -> str:
    """What a `restricted` search held its levers to ("tiles=128x128 worker_warps=8"), "" for
    the whole space."""
    return " ".join(f"{name}={','.join(map(str, values))}"
                    for name, values in levers.items() if tuple(values) != LEVERS[name])


def lever_space(shape: Point, levers: dict = LEVERS) -> list[Point]:
    """Every combination of the lever values on `shape` (batch, heads, length, D, mask)."""
    names = list(levers)
    return [shape.replace(**dict(zip(names, values)))
            for values in itertools.product(*(levers[n] for n in names))]


def _variant(point: Point, gpu, dtype: str):
    from wavefront.kernel.attention import KernelVariant
    return KernelVariant.for_launch(point.launch(gpu), dtype, **point.levers)


def _screen_one(args):
    """(variant label, SASS facts or None, reason it is not timed or None)."""
    variant, arch = args
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.sass import find_cuobjdump, sass_summary
    try:
        cubin = compile_variant(variant, arch)
    except Exception as exc:  # the reason is the record
        return variant.label, None, f"does not compile: {type(exc).__name__}: {str(exc)[:120]}"
    if find_cuobjdump() is None:
        return variant.label, None, None
    facts = sass_summary(cubin)
    if facts.local_loads or facts.local_stores:
        return variant.label, facts, f"spills ({facts.local_loads} LDL, {facts.local_stores} STL)"
    if not facts.wgmma_pipelined:
        return variant.label, facts, f"wgmma serialised ({facts.depbar} waits, {facts.hgmma} HGMMA)"
    return variant.label, facts, None


def screen(points: list[Point], gpu, dtype: str = "bfloat16", arch: str = "sm_90",
           jobs: int | None = None) -> dict[Point, tuple]:
    """Compile each candidate's binary once (shared binaries once) and read its SASS:
    {point: (label, facts, reason not to time or None)}."""
    variants = {p: _variant(p, gpu, dtype) for p in points}
    unique = list(dict.fromkeys(variants.values()))
    with ProcessPoolExecutor(max_workers=min(jobs or usable_cpus(), len(unique))) as pool:
        results = dict(zip(unique, pool.map(_screen_one, [(v, arch) for v in unique])))
    return {p: results[v] for p, v in variants.items()}


def _warm_one(point: Point):
    """JIT-compile (and run once, checked) one candidate in this process."""
    from wavefront.measure.bench import relative_error
    try:
        return relative_error(point, seed=3), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc)[:160]}"


def warm(points: list[Point], jobs: int | None = None) -> dict[Point, str | None]:
    """Fill the JIT compile cache in parallel processes (each compiles, launches and checks its
    candidates once): {point: error or None}.

    Each process holds a CUDA context and its check's arrays, so the processes are at most as
    many as the GPU's free memory holds: the check of B4 H32 KV8 S4k D128 took 7.4 GB, and 16
    processes on an 80 GB H100 lost 47 of 64 candidates, then 115 of 128, to out-of-memory
    errors. A candidate that still runs out of memory is warmed again here, alone, before it is
    recorded as failed."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")  # CUDA does not survive fork
    workers = min(jobs or usable_cpus(), len(points), _processes_the_gpu_holds(points[0]))
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        outcomes = dict(zip(points, pool.map(_warm_one, points)))
    for p, (_, exc) in outcomes.items():
        if exc is not None and exc.startswith("OutOfMemoryError"):
            outcomes[p] = _warm_one(p)
    return {p: _warm_verdict(*outcome) for p, outcome in outcomes.items()}


def _warm_verdict(err, exc) -> str | None:
    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    if exc is not None:
        return exc
    if not err < CORRECTNESS_TOLERANCE:
        return f"relative error {err:.3g} against float32"
    return None


# What one warming process holds beside its check's arrays: a CUDA context, cuTile's and
# CuPy's modules (about 0.6 GB on the H100), with room to spare.
WARM_PROCESS_BYTES = 1 << 30


def _processes_the_gpu_holds(point: Point) -> int:
    """How many warming processes the GPU's free memory holds: each a context and a check's
    arrays (`check_bytes`)."""
    import cupy

    from wavefront.measure.bench import check_bytes
    free, _ = cupy.cuda.runtime.memGetInfo()
    return max(1, int(0.8 * free) // (WARM_PROCESS_BYTES + check_bytes(point)))


def search(candidates: list[Point], gpu, gpu_name: str, dtype: str, *, rounds: int,
           per_round: int, jobs: int | None = None, log=print) -> tuple[list[dict], bool]:
    """Screen, warm and time `candidates` (one shape) with the peers in interleaved rounds.
    -> (one row per candidate and per peer, whether the timing ran). A candidate that is not
    timed keeps its row with the reason."""
    from wavefront.measure.rounds import contender_name, run_rounds, shape_contenders
    shape = candidates[0]
    log(f"screening {len(candidates)} candidates (compile + SASS)")
    screened = screen(candidates, gpu, dtype, jobs=jobs)
    survivors = [p for p in candidates if screened[p][2] is None]
    log(f"warming {len(survivors)} candidates")
    errors = warm(survivors, jobs=jobs) if survivors else {}
    timed = [p for p in survivors if errors[p] is None]
    results, ran = {}, True
    if timed:
        try:
            for r in run_rounds(shape_contenders(timed, peers=True), rounds=rounds,
                                per_round=per_round):
                results[r.name] = r
        except Exception as exc:  # the screened record still stands
            log(f"timing failed: {type(exc).__name__}: {exc}")
            ran = False
    peers = {k: results[k] for k in ("cudnn", "fa2") if k in results}
    rows = []
    for p in candidates:
        label, facts, reason = screened[p]
        # shape_contenders names each candidate against the first timed one
        r = results.get(contender_name(p, timed[0])) if timed else None
        row = {"gpu": gpu_name, "shape": p.problem_only().as_dict(), "label": label,
               "levers": {k: getattr(p, k) for k in ALL_LEVERS},
               "sass": facts.as_dict() if facts else None,
               "not_timed": reason or errors.get(p), "tflops": r.tflops if r else None,
               "tflops_ci95": r.tflops_ci95 if r else None,
               "throttled_rounds": r.throttled_rounds if r else None}
        for peer, pr in peers.items():
            if r:
                row[f"x_{peer}"] = pr.median_ms / r.median_ms
        rows.append(row)
    for peer, pr in peers.items():
        rows.append({"gpu": gpu_name, "shape": shape.problem_only().as_dict(), "label": peer,
                     "tflops": pr.tflops, "tflops_ci95": pr.tflops_ci95, "peer": True})
    return rows, ran and bool(timed)


def best_row(rows: list[dict]) -> dict | None:
    timed = [r for r in rows if not r.get("peer") and r.get("tflops")]
    return max(timed, key=lambda r: r["tflops"]) if timed else None


def softmax_space(winner: Point) -> list[Point]:
    """The second stage: the winner (first, so it names the others) and every combination of
    the softmax levers on it."""
    points = lever_space(winner, SOFTMAX_LEVERS)
    return [winner] + [p for p in points if p != winner]


def lever_record(rows: list[dict], levers: dict | None = None) -> list[dict]:
    """What each lever did: per lever value, the best timed candidate with that value, and
    its ratio to the best candidate of the shape (in the same rounds)."""
    levers = LEVERS if levers is None else levers
    timed = [r for r in rows if not r.get("peer") and r.get("tflops")]
    if not timed:
        return []
    best = max(r["tflops"] for r in timed)
    out = []
    for lever, values in levers.items():
        for value in values:
            with_value = [r for r in timed if r["levers"][lever] == value]
            top = max(with_value, key=lambda r: r["tflops"], default=None)
            out.append({"lever": lever, "value": str(value),
                        "candidates": sum(r["levers"][lever] == value for r in rows),
                        "timed": len(with_value),
                        "best_tflops": top["tflops"] if top else None,
                        "of_best": top["tflops"] / best if top else None,
                        "best_label": top["label"] if top else None})
    return out



def candidate_records(rows: list[dict], stage: str) -> list[dict]:
    """The tune records of one stage's candidates and peers, as `--out` appends them."""
    return [TUNE_RECORDS.stamp({**row, "stage": stage}) for row in rows]


def lever_records(gpu_name: str, shape: Point, stage: str, record: list[dict]) -> list[dict]:
    """The lever records of one stage (`lever_record`), as `--out` appends them."""
    return [LEVER_RECORDS.stamp({"gpu": gpu_name, "shape": shape.as_dict(), "stage": stage,
                                 **row}) for row in record]


# A winner under this fraction of the speed the table recorded for the same GPU, head dim,
# mask and shape was timed on a slowed GPU, not found faster: one lent H100 ran a whole call
# 4.4x slow (123-148 TFLOP/s at B1 H32 S8k D128), and its ratios to cuDNN looked normal
# because cuDNN slowed as much. `wavefront tune --write` does not write such a winner.
SLOWED_GPU = 0.5


def slowed_gpu(best: dict, previous: dict | None) -> str | None:
    """Why the search's winner `best` must not replace `previous` (the table's entry it would
    overwrite), or None."""
    from wavefront.kernel.table_schema import MAX_TFLOPS, plausible
    recorded = (previous or {}).get("tflops")
    if recorded is not None and not plausible(recorded, MAX_TFLOPS):
        return (f"the table's entry here records {recorded!r} TFLOP/s, not a measured speed "
                f"(a finite number above 0 and at most {MAX_TFLOPS:g}): fix or remove that "
                "entry of wavefront/kernel/tuned.json; not written")
    if not plausible(best.get("tflops"), MAX_TFLOPS):
        return (f"the winner's speed {best.get('tflops')!r} TFLOP/s is not a measurement; "
                "not written")
    if recorded and best["tflops"] < SLOWED_GPU * recorded:
        return (f"the winner ran {best['tflops']:.0f} TFLOP/s, under {SLOWED_GPU:.0%} of the "
                f"{recorded:.0f} the table recorded here: a slowed GPU, not a better "
                "configuration; not written")
    return None


def tuned_entry(best: dict, dims: tuple[int, int, int, int], dtype: str,
                searched: dict = LEVERS) -> dict:
    """The tuned table's entry for a shape's winner (`wavefront tune --write`): its
    configuration, speed, when, the shape it was measured on and, for a search held to some
    values (`searched`, from `restricted`), which."""
    import datetime

    from wavefront.kernel.tuning import CONFIG_FIELDS, shape_text
    held = held_to(searched)
    return {**{k: best["levers"][k] for k in CONFIG_FIELDS},
            "tflops": round(best["tflops"], 1),
            # None, not NaN, where cuDNN did not run: the table is strict JSON
            "x_cudnn": round(best["x_cudnn"], 3) if best.get("x_cudnn") is not None
            and math.isfinite(best["x_cudnn"]) else None,
            "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "shape": f"{shape_text(dims)} {dtype}",
            **({"search held to": held} if held else {})}


@dataclass
class StageResult:
    """One search stage of one shape (`run`): the lever record (what each lever did) and the
    stage's fastest timed candidate (None: none was timed)."""

    shape: Point
    stage: str  # "levers" | "softmax"
    record: list[dict]
    best: dict | None


@dataclass
class TuneResult:
    """What `run` found: each shape's fastest candidate, the tuned-table keys written, the
    winners refused (a slowed GPU), and how many searches or shapes failed."""

    best: dict = field(default_factory=dict)  # Point -> row
    written: dict = field(default_factory=dict)  # Point -> table key
    refused: dict = field(default_factory=dict)  # Point -> why
    failed: int = 0


def run(shapes: list[Point], gpu, dtype: str, *, rounds: int, per_round: int,
        jobs: int | None = None, levers: dict = LEVERS, softmax_levers: bool = True,
        write_dims: tuple[int, int, int, int] | None = None, sink=None, levers_sink=None,
        log=print, on_stage=None) -> TuneResult:
    """The two-stage search of every shape (`wavefront tune`): the levers (`levers`, from
    `restricted`) first, then, where `softmax_levers`, FlashAttention-4's softmax levers around
    the first stage's winner. Every candidate's row goes to `sink` and each stage's lever
    record to `levers_sink` (`JsonlSink`s, or None); `on_stage(StageResult)` sees each stage as
    it ends. With `write_dims` (batch, heads, K/V heads, length), each shape's winner becomes
    its tuned-table entry unless it ran under half the speed the entry recorded
    (`slowed_gpu`)."""
    from wavefront.kernel.tuning import entry_key, load_table, write_entry
    result = TuneResult()
    for shape in shapes:
        what = f"D={shape.head_dim} {'causal' if shape.causal else 'non-causal'}"
        stages = [("levers", lever_space(shape, levers), levers)]
        if softmax_levers:
            stages.append(("softmax", None, SOFTMAX_LEVERS))
        best = None
        for stage, candidates, searched in stages:
            if candidates is None:  # the second stage searches around the first's winner
                candidates = softmax_space(shape.replace(**best["levers"]))
            rows, ran = search(candidates, gpu, gpu.name, dtype, rounds=rounds,
                               per_round=per_round, jobs=jobs,
                               log=lambda m: log(f"{what}, {stage}: {m}"))
            result.failed += not ran
            record = lever_record([r for r in rows if not r.get("peer")], searched)
            for row in candidate_records(rows, stage):
                if sink:
                    sink.write(row)
            for row in lever_records(gpu.name, shape, stage, record):
                if levers_sink:
                    levers_sink.write(row)
            stage_best = best_row(rows)
            if on_stage:
                on_stage(StageResult(shape, stage, record, stage_best))
            if stage_best is None:
                break
            best = stage_best
        if best is None:
            result.failed += 1
            continue
        result.best[shape] = best
        if write_dims is None:
            continue
        try:  # a table that does not load, or a write refused: named, the table untouched
            previous = load_table().get(gpu.name, {}).get(
                entry_key(shape.head_dim, shape.causal, write_dims))
            refused = slowed_gpu(best, previous)
            if not refused:
                key = write_entry(gpu.name, shape.head_dim, shape.causal,
                                  tuned_entry(best, write_dims, dtype, levers))
        except ValueError as exc:
            refused = str(exc)
        except OSError as exc:
            refused = (f"{exc.filename or 'the tuned table'}: {exc.strerror or exc} (the tuned "
                       "table is unchanged)")
        if refused:
            log(f"{what}: {refused}")
            result.refused[shape] = refused
            result.failed += 1
            continue
        log(f"{what}: wrote {gpu.name} {key}")
        result.written[shape] = key
    return result
