"""A bench you can believe: every contender of a shape (our schedules, cuDNN, FA2) timed in
interleaved rounds, so drifting clocks or a neighbour's load touch them all alike.

Each round visits the contenders in a fresh random order and times `per_round` back-to-back
launches of each between one pair of CUDA events; a contender's sample is that round's mean.
Reported per contender: the median over rounds and a distribution-free 95% interval for it
(order statistics of the rounds), each round's NVML clocks and throttle reasons, and the L2
state: every contender rotates among input sets large enough that a launch's inputs were last
touched at least 4 x L2 bytes of other inputs ago ("cold by rotation").
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from wavefront.point import KERNEL_LEVERS
from wavefront.results.measurement import PEER_NAMES, median_ci95, paired_ratio

L2_STATE = "cold by rotation (>= 4x L2 of other inputs between reuses)"
# What may differ between the contenders of one shape besides the schedule.
LEVER_FIELDS = ("tiles", "occupancy", "ctas", *KERNEL_LEVERS)


@dataclass
class Contender:
    name: str
    run: Callable[[int], object]  # launch number i (rotating inputs)
    useful_flops: float


@dataclass
class RoundsResult:
    name: str
    samples_ms: list[float]
    median_ms: float
    ci95_ms: tuple[float, float]
    tflops: float
    tflops_ci95: tuple[float, float]
    throttled_rounds: int
    rounds: int
    l2_state: str = L2_STATE
    sm_clock_mhz: list[float] = field(default_factory=list)
    # Host time per launch call (median over rounds): from the first call of a round's batch to
    # the return of its last, launches being asynchronous, what the call costs the CPU.
    host_us: float | None = None
    # The same for a round's first call alone (median over rounds): the call made right after
    # another contender's burst and a synchronisation, where a host-bound call costs most.
    host_first_us: float | None = None
    per_round: int | None = None  # calls between one pair of events (the burst a sample is)
    # Each round's host speed (`host_probe_us`, the same for every contender of the round): a
    # host-bound call's ratio is read against it, the GPU hosts' CPUs running ~1.5x slower in
    # some spells than in others (data/public_call/RUNS.md.gz#aec4edd, #f597be2).
    host_probe_us: list[float] = field(default_factory=list)
    # Each round's [stolen, all] CPU time of the host in jiffies (/proc/stat, every CPU; empty
    # where unreadable): how much of the round the hypervisor ran something else on the
    # host's virtual CPUs, to tell a slow spell of stolen time from one of slower CPUs.
    host_cpu_jiffies: list[list[int]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def paired_speedup(reference: RoundsResult, other: RoundsResult) -> tuple[float, float, float]:
    """Speed of `other` relative to `reference` (> 1: faster), paired by round (see
    `results.measurement.paired_ratio`): (median ratio, 95% interval)."""
    return paired_ratio(reference.samples_ms, other.samples_ms)


def _probe_task(table: dict, keys: tuple) -> int:
    # Lookups, calls and small tuples: the kind of work a launch call does on the host.
    total = 0
    for key in keys:
        total += len((table[key], key))
    return total


_PROBE_TABLE = {i: str(i) for i in range(64)}
_PROBE_KEYS = tuple(range(64))


def cpu_jiffies(stat_path: str = "/proc/stat") -> tuple[int, int] | None:
    """(stolen, all) CPU time of the host so far, in jiffies, over every CPU: the steal field
    of /proc/stat's "cpu" line and the sum of its first eight (user, nice, system, idle,
    iowait, irq, softirq, steal). None where it cannot be read (not Linux)."""
    try:
        with open(stat_path) as f:
            fields = f.readline().split()
        values = [int(x) for x in fields[1:9]]
    except (OSError, ValueError):
        return None
    if fields[:1] != ["cpu"] or len(values) < 8:
        return None
    return values[7], sum(values)


def host_probe_us(batches: int = 5, calls: int = 20) -> float:
    """How fast the host runs Python now: the fastest of `batches` batches of `calls` runs of
    a fixed task, in us per run (2.7-3.0 us on the H100 hosts at their usual speed, 4-32 in
    their slow spells: data/public_call/RUNS.md.gz#c0ad489, #96d7c1a). The fastest, so that an
    interrupt in one batch does not count; a slow spell slows them all."""
    best = float("inf")
    for _ in range(batches):
        began = time.perf_counter()
        for _ in range(calls):
            _probe_task(_PROBE_TABLE, _PROBE_KEYS)
        best = min(best, time.perf_counter() - began)
    return best / calls * 1e6


# A round ran on a slow host where its probe read this many times the fastest probe of the
# bench (the GPU hosts' slow spells: 1.4-2.5x, data/public_call/RUNS.md.gz#c0ad489, #96d7c1a).
SLOW_HOST = 1.4


def slow_host_rounds(records: list[dict]) -> list[dict]:
    """Per shape of one bench's records (each contender of a shape shares its rounds'
    probes), for the shapes with any round whose host probe read SLOW_HOST times the bench's
    fastest or more: {"shape", "slow" (such rounds), "rounds", "api_vs_bound_usual" (the
    public call against its bound launch, median of the paired ratios over the other rounds;
    None without them or without the call)}. A bench that ran slow throughout has no fast
    probe to compare with, and shows nothing."""
    by_shape: dict = {}
    for r in records:
        if r.get("host_probe_us"):
            by_shape.setdefault(repr(r["shape"]), []).append(r)
    probes = [p for rows in by_shape.values() for p in rows[0]["host_probe_us"]]
    if not probes:
        return []
    limit = SLOW_HOST * min(probes)
    out = []
    for rows in by_shape.values():
        shape_probes = rows[0]["host_probe_us"]
        slow = [p >= limit for p in shape_probes]
        if not any(slow):
            continue
        named = {r.get("contender"): r for r in rows}
        api = named.get(API_CONTENDER)
        bound = named.get(api.get("bound")) if api else None
        usual = ([b / a for a, b, s in zip(api["samples_ms"], bound["samples_ms"], slow)
                  if not s] if bound else [])
        out.append({"shape": rows[0]["shape"], "slow": sum(slow), "rounds": len(slow),
                    "api_vs_bound_usual": statistics.median(usual) if usual else None})
    return out


def run_rounds(contenders: list[Contender], *, rounds: int = 15, per_round: int = 5,
               warmup: int = 3, seed: int = 0, stream=None) -> list[RoundsResult]:
    import cupy
    import numpy as np

    from wavefront.measure.conditions import ConditionsSampler
    if rounds < 6 or per_round < 1 or warmup < 0:
        raise ValueError(f"rounds must be >= 6, per_round >= 1, warmup >= 0; got {rounds}, "
                         f"{per_round}, {warmup}")
    stream = stream or cupy.cuda.get_current_stream()
    launches = {c.name: 0 for c in contenders}
    for c in contenders:
        for _ in range(warmup):
            c.run(launches[c.name])
            launches[c.name] += 1
    stream.synchronize()
    rng = np.random.default_rng(seed)
    samples = {c.name: [] for c in contenders}
    host = {c.name: [] for c in contenders}
    host_first = {c.name: [] for c in contenders}
    clocks = {c.name: [] for c in contenders}
    throttled = {c.name: 0 for c in contenders}
    probes, jiffies = [], []
    for _ in range(rounds):
        at_start = cpu_jiffies()
        # One NVML sampler per round: its clocks and throttle reasons are the round's, shared
        # by every contender timed in it (the round is the unit the interleaving protects).
        # It samples once, after the round, from this thread, with NVML set up once per
        # process: setting NVML up every round and sampling from a thread during the round
        # made the next burst of public calls 3.3x slower on a fresh H100 host
        # (data/public_call/RUNS.md.gz#90b37ae).
        with ConditionsSampler(period_s=None) as sampler:
            for idx in rng.permutation(len(contenders)):
                c = contenders[idx]
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                began = time.perf_counter()
                c.run(launches[c.name])
                first_done = time.perf_counter()
                for i in range(1, per_round):
                    c.run(launches[c.name] + i)
                host[c.name].append((time.perf_counter() - began) / per_round * 1e6)
                launches[c.name] += per_round
                host_first[c.name].append((first_done - began) * 1e6)
                stop.record(stream)
                stop.synchronize()
                samples[c.name].append(cupy.cuda.get_elapsed_time(start, stop) / per_round)
            sampler.sample()
        at_end = cpu_jiffies()
        jiffies.append(None if at_start is None or at_end is None else
                       [at_end[0] - at_start[0], at_end[1] - at_start[1]])
        probes.append(host_probe_us())  # after the round: nothing timed waits on it
        cond = sampler.conditions()
        for c in contenders:
            if cond.sm_clock_mhz is not None:
                clocks[c.name].append(cond.sm_clock_mhz)
            throttled[c.name] += bool(cond.throttled)
    out = []
    for c in contenders:
        ms = samples[c.name]
        lo, hi = median_ci95(ms)
        med = statistics.median(ms)
        rate = (lambda t: c.useful_flops / (t * 1e-3) / 1e12)
        out.append(RoundsResult(c.name, ms, med, (lo, hi), rate(med), (rate(hi), rate(lo)),
                                throttled[c.name], rounds, sm_clock_mhz=clocks[c.name],
                                host_us=statistics.median(host[c.name]),
                                host_first_us=statistics.median(host_first[c.name]),
                                per_round=per_round, host_probe_us=list(probes),
                                # every round's or none: a list is read beside the rounds
                                host_cpu_jiffies=([] if None in jiffies else
                                                  [list(j) for j in jiffies])))
    return out


def contender_name(point, shape) -> str:
    """The schedule, plus what else differs from the shape's first point (tiles, occupancy)."""
    extra = [f"{k}={getattr(point, k)}" for k in LEVER_FIELDS
             if getattr(point, k) != getattr(shape, k)]
    return point.schedule + (f" [{' '.join(extra)}]" if extra else "")


API_CONTENDER = "api"


def shape_contenders(points, *, peers: bool = True, seed: int = 1,
                     api_call=None) -> list[Contender]:
    """Our schedules for one shape (each checked against the reference first; a wrong one
    raises IncorrectResult) and, with `peers`, torch SDPA's cuDNN and FA2 on the same shape.
    Points that differ in more than the schedule (tiles, occupancy) are named by their label.

    `api_call` (the public `wavefront.attention`) adds the contender "api": that function
    called per launch as a user calls it, `attention(q, k, v, causal=...)` on torch tensors
    (CuPy arrays without torch), a new output each call, host work included."""
    import cupy

    from wavefront.device import current_device
    from wavefront.kernel.launcher import PREPARE_AFTER_LAUNCHES, launcher_for_launch
    from wavefront.kernel.streams import current_stream
    from wavefront.measure.bench import (
        IncorrectResult,
        peer_runners,
        random_inputs,
        relative_error,
    )
    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    from wavefront.measure.timing import input_sets_needed
    from wavefront.model.counting import launch_counts
    dev = current_device()
    first = points[0]
    launches = [point.launch(dev) for point in points]  # once each: checked, then timed
    counts = launch_counts(launches[0].problem)  # one problem: the shape's
    n_sets = input_sets_needed(2 * counts.compulsory_read_bytes, dev.l2_bytes)
    sets = [random_inputs(first, seed + 100 + i) for i in range(n_sets)]
    outs = [cupy.empty_like(s[0]) for s in sets]
    stream = current_stream("cupy")
    contenders = []
    for point, launch in zip(points, launches):
        launcher, _ = launcher_for_launch(launch, *sets[0], **point.levers)
        err = relative_error(point, seed, launcher=launcher)
        if not err < CORRECTNESS_TOLERANCE:
            raise IncorrectResult(f"{point.schedule}: relative error {err:.3g}")

        def run(i, launcher=launcher):
            q, k, v = sets[i % n_sets]
            # the sets the launcher was made from: the prepared launch needs no check
            launcher(q, k, v, outs[i % n_sets], stream, None, True)
        contenders.append(Contender(contender_name(point, first), run, counts.useful_flops))
    if api_call is not None:
        contenders.append(Contender(API_CONTENDER, _api_runner(api_call, first, sets),
                                    counts.useful_flops))
    # Ours launched into their steady state before any round: a launcher launches through a
    # prepared launch once launched PREPARE_AFTER_LAUNCHES times (the launcher module).
    for contender in contenders:
        for i in range(PREPARE_AFTER_LAUNCHES):
            contender.run(i)
    stream.synchronize()
    for name, run in (peer_runners(first, sets, tilegym=True) if peers else {}).items():
        try:
            out = run(0)
        except Exception:  # a backend that refuses the shape is left out, not a crash
            continue
        err = _rows_error(first, *sets[0], out)
        if not err < CORRECTNESS_TOLERANCE:  # a wrong peer is not timed, and says so
            print(f"peer {name} left out: relative error {err:.3g}", file=sys.stderr)
            continue
        contenders.append(Contender(name, run, counts.useful_flops))
    return contenders


def _api_runner(api_call, point, sets):
    """run(i): the public call on input set i, in the library a user would hand it."""
    try:
        import torch
        arrays = [tuple(torch.from_dlpack(x) for x in s) for s in sets]
    except ImportError:
        arrays = sets
    causal = point.causal
    for q, k, v in arrays[:1]:  # checked once like every contender, on a poisoned output
        _check_public_call(api_call, point, q, k, v)

    def run(i):
        q, k, v = arrays[i % len(arrays)]
        api_call(q, k, v, causal=causal)
    return run


def _check_public_call(api_call, point, q, k, v):
    """The public call's output against the reference (the first rows of two heads), written
    into an output poisoned with NaN, every element checked to be written."""
    import cupy

    from wavefront.measure.bench import IncorrectResult
    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    if type(q).__module__ == "torch":
        import torch
        out = torch.full_like(q, float("nan"))
    else:
        out = cupy.full(q.shape, cupy.nan, dtype=q.dtype)
    api_call(q, k, v, causal=point.causal, out=out)
    err = _rows_error(point, q, k, v, out)
    if not err < CORRECTNESS_TOLERANCE:
        raise IncorrectResult(f"{API_CONTENDER}: relative error {err:.3g}, or output elements "
                              "left unwritten")


def _rows_error(point, q, k, v, out) -> float:
    """Relative error of `out` against the float32 reference on the first rows of two heads
    (inf where any output element is not finite). Arrays of any DLPack library."""
    import cupy

    from wavefront.measure.reference import reference_attention
    q, k, v, out = (cupy.from_dlpack(x) for x in (q, k, v, out))
    if not bool(cupy.isfinite(out).all()):
        return float("inf")
    kv = slice(0, 1 if point.kv_heads_ < point.heads else 2)
    rows = cupy.arange(min(point.seqlen, 512))
    ref, _ = reference_attention(q[:1, :2], k[:1, kv], v[:1, kv], causal=point.causal,
                                 rows=rows)
    got = out[:1, :2][:, :, rows].astype(cupy.float32)
    return float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref))


def bench_shapes(points, gpu_name: str, *, tuned: bool, api: bool, log=print):
    """The contenders of `wavefront bench`, grouped by shape (the problem alone): the points
    asked for, plus with `tuned` the shape's tuned configuration and with `api` the bound
    launcher of the configuration the public call resolves to. Under a measured carry-over
    (`WAVEFRONT_CARRY_OVER=measure`) the call's choice is timed first, and the configuration
    "nearest" would have taken joins the contenders. -> ({shape: [points]},
    {shape: the api contender's bound reference})."""
    from wavefront.kernel.call import measure_carry_over
    from wavefront.kernel.tuning import (carry_over_mode, nearest_config, resolve_config,
                                         tuned_config)
    shapes: dict = {}
    for point in points:
        shapes.setdefault(point.problem_only(), []).append(point)
    bound_of_api = {}
    for shape, members in shapes.items():
        q = (shape.batch, shape.heads, shape.seqlen, shape.head_dim)
        kv = (shape.batch, shape.kv_heads_, shape.seqlen, shape.head_dim)
        extra = []
        if tuned:
            config = tuned_config(gpu_name, q, kv, shape.causal)
            if config is None:
                log(f"no tuned entry for {gpu_name} D={shape.head_dim} causal={shape.causal}: "
                    "run `wavefront tune --write`")
            else:
                extra.append(shape.replace(**config))
        if api:
            if carry_over_mode() == "measure":
                # Chosen now, on inputs of the shape, as the call's first launch would: the
                # bound launcher below is then the configuration the call will take.
                from wavefront.measure.bench import random_inputs
                choice = measure_carry_over(*random_inputs(shape, seed=7), causal=shape.causal)
                nearest = nearest_config(q, kv, shape.causal)
                if nearest is not None:  # what "nearest" would have run, in the same rounds
                    extra.append(shape.replace(**nearest))
                if choice is not None:
                    log(f"carry-over measured at B{shape.batch} H{shape.heads} KV{shape.kv_heads_}"
                        f" S{shape.seqlen} D{shape.head_dim} causal={shape.causal}: "
                        + ", ".join(f"{_config_text(c)} {ms:.4f} ms" for c, ms, _ in choice.timed)
                        + f" -> {_config_text(choice.config)}")
            # The public call's own cost is its ratio to this launcher in the same rounds.
            candidate = shape.replace(**resolve_config(q, kv, shape.causal, None, None, None,
                                                       dict.fromkeys(KERNEL_LEVERS)))
            extra.append(candidate)
            bound_of_api[shape] = contender_name(candidate, members[0])
        members.extend(p for p in dict.fromkeys(extra) if p not in members)
    return shapes, bound_of_api


def _config_text(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items() if v is not None)


def carry_over_record(gpu_name: str, shape, members) -> dict | None:
    """What the measured carry-over timed and chose for this shape in this process
    (`CarryOverChoice.as_dict`) and `nearest`: the contender of the configuration "nearest"
    resolves to (`bench_shapes` times it), None where it timed nothing."""
    from wavefront.kernel.tuning import carry_over_choices, nearest_config
    q = (shape.batch, shape.heads, shape.seqlen, shape.head_dim)
    kv = (shape.batch, shape.kv_heads_, shape.seqlen, shape.head_dim)
    choice = carry_over_choices().get((gpu_name, q, kv, shape.causal))
    if choice is None:
        return None
    nearest = nearest_config(q, kv, shape.causal)
    return {**choice.as_dict(),
            "nearest": contender_name(shape.replace(**nearest), members[0])}


def bench_records(gpu_name: str, shape, results: list[RoundsResult],
                  bound_reference: str | None = None, members=()) -> list[dict]:
    """The bench records of one shape's rounds: each contender with its ratios to the peers of
    the same rounds and, paired by round, to its references (its own linear scan, grid+linear;
    the public call: the bound launcher it resolves to). `members`: the shape's points, whose
    whole configuration each of ours carries as `config` (the public call: the one it resolved
    to), where `shape` is the problem alone and a name shows only what differs from the first
    point (levers given on the command line are in neither)."""
    from wavefront.results.measurement import paired_references
    from wavefront.results.records import BENCH_RECORDS
    by = {r.name: r for r in results}
    config_of = {contender_name(p, members[0]): p.as_dict() for p in members}
    out = []
    for r in results:
        row = {"gpu": gpu_name, "shape": shape.as_dict(), "contender": r.name, **r.as_dict()}
        config = config_of.get(bound_reference if r.name == API_CONTENDER else r.name)
        if config is not None:
            row["config"] = config
        if r.name not in PEER_NAMES:
            for peer in PEER_NAMES:
                if peer in by:
                    row[f"x_{peer}"] = by[peer].median_ms / r.median_ms
            if r.name == API_CONTENDER:
                references = {"bound": bound_reference}
                if bound_reference is not None:
                    row["bound"] = bound_reference  # which configuration the call resolved to
            else:
                references = paired_references(r.name)
            for key, ref in references.items():
                if ref in by:
                    row[f"x_{key}"], *row[f"x_{key}_ci95"] = paired_speedup(by[ref], r)
        out.append(BENCH_RECORDS.stamp(row))
    return out
