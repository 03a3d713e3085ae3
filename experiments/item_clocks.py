"""Do a launch's CTAs run at one speed, and do they spread along K/V as the timed model says?

The timed model misses most at two launches, and both misses were put down to what it lacks,
CTA-to-CTA variation in speed: B1 H1 S256k D128 non-causal (128x64 tiles, 264 persistent
CTAs) reads 6-19 GB where it predicts 1.1 GB, and B1 H1 S128k D128 causal (64x64 tiles, 264
persistent CTAs) reads 1.2-2.0 GB where it predicts 11-17 GB. Here the kernel clocks its own
work items: the RECORD_ORDER binary's tickets read the host's clock, copied into the ticket
counter through the copy engine while the launch runs (`wavefront.measure.item_clocks`).
Static persistent CTAs take items c, c + 264, ..., so each CTA's speed (ns per K/V step over
its items) is measured, and where every CTA is along K/V at any moment follows from its items'
start and end times. The same launches' DRAM reads come from Nsight Compute in the same run,
of the plain binary and of the clocked one (its tickets counting: the clock cannot run under
Nsight Compute), in interleaved rounds; the clocked binary is timed beside the plain one.

Three predictions of each launch's DRAM reads are set against them: the timed model as it is
(every CTA at the calibrated speed), the timed model given each CTA's measured speed
(`Exposure.cta_speed`), and the measured item timeline itself replayed through the same
partitioned LRU (`simulation.timed_trace`: each item's K/V steps evenly spaced between its
measured start and end). Held out: every point of the timed model's validation re-simulated
with CTA speeds drawn from all the clocked launches' (`held_out`).

    python experiments/item_clocks.py run            # on a GPU: data/item_clocks/
    python experiments/item_clocks.py plot --out DIR # anywhere: figure, table
"""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from wavefront.report.draft import Section, md_table, span
from wavefront.report.experiments import run_as_script
from wavefront.report.exposure import measured

DATASETS = ()
RECORDS = ("item_clocks",)
REPEATS = 3
# Nsight Compute rounds per point, one launch of each binary per round
NCU_ROUNDS = 6
# the binaries profiled: the plain one, and the one whose tickets carry the clock, its
# tickets from the launch's one counter or (since 2026-11-28) from a counter per CTA
BINARIES = ("plain", "clocked", "clocked_per_cta")
# the clocked binary's ticket counters (`point.ORDER_COUNTERS`), by binary
COUNTERS = {"clocked": "shared", "clocked_per_cta": "per_cta"}
SEED = 5
# the rounds of work items in whose middle the CTAs' spread along K/V is read (shares of the
# launch's full rounds)
MOMENTS = (0.25, 0.5, 0.75)


def points():
    from wavefront.point import Point
    return {
        "S256k 128x64 non-causal": Point(batch=1, heads=1, seqlen=262144, head_dim=128,
                                         tiles="128x64", occupancy=2,
                                         schedule="persistent+linear"),
        "S128k 64x64 causal": Point(batch=1, heads=1, seqlen=131072, head_dim=128, causal=True,
                                    tiles="64x64", occupancy=2, schedule="persistent+linear"),
    }


def measure(out_dir) -> int:
    """Per point: checked against the float32 reference (tickets included), outputs of the
    plain and clocked binaries (each counter kind) compared, then REPEATS interleaved rounds
    (plain, each clocked binary without the clock, then each with it), then Nsight Compute's
    DRAM reads of every binary; appended to <out_dir>/clocks.jsonl. -> failures."""
    import click
    import cupy

    from wavefront.device import current_device
    from wavefront.kernel.launcher import launcher_for
    from wavefront.measure.bench import IncorrectResult, random_inputs, relative_error
    from wavefront.measure.item_clocks import ItemClock
    from wavefront.measure.sink import JsonlSink
    from wavefront.results.measurement import CORRECTNESS_TOLERANCE
    from wavefront.results.records import EXPOSURE_RECORDS
    dev = current_device()
    clock = ItemClock()
    stream = cupy.cuda.Stream(non_blocking=True)
    failures = 0
    with JsonlSink(out_dir, "clocks.jsonl") as sink:
        def write(row):
            sink.write(EXPOSURE_RECORDS.stamp({"gpu": dev.name, "sms": dev.sms,
                                               "l2_bytes": dev.l2_bytes, **row}))
        with click.progressbar(list(points().items()), label="clocked launches") as bar:
            for name, point in bar:
                try:
                    q, k, v = random_inputs(point, SEED)
                    launchers = {"plain": launcher_for(q, k, v, **point.attention_kwargs())[0]}
                    equal = {}
                    outs = [cupy.full(q.shape, cupy.nan, dtype=q.dtype) for _ in range(2)]
                    launchers["plain"](q, k, v, outs[0], stream.ptr)
                    for binary, counters in COUNTERS.items():
                        lau, _ = launcher_for(q, k, v, record_order=counters,
                                              **point.attention_kwargs())
                        err = relative_error(point, SEED + 1, record_order=counters,
                                             launcher=lau)
                        if not err < CORRECTNESS_TOLERANCE:
                            raise IncorrectResult(f"{name}, {binary}: relative error {err:.3g}")
                        outs[1].fill(cupy.nan)
                        clock.record(lau, q, k, v, outs[1], stream)  # outputs compared
                        equal[binary] = bool(cupy.array_equal(outs[0], outs[1]))
                        launchers[binary] = lau
                    for r in range(REPEATS):
                        ms = {}
                        for label, lau in launchers.items():
                            t0, t1 = cupy.cuda.Event(), cupy.cuda.Event()
                            t0.record(stream)
                            lau(q, k, v, outs[0], stream.ptr)
                            t1.record(stream)
                            t1.synchronize()
                            ms[label] = cupy.cuda.get_elapsed_time(t0, t1)
                        for binary, counters in COUNTERS.items():
                            c = clock.record(launchers[binary], q, k, v, outs[1], stream)
                            write({"kind": "clocks", "point": name, "repeat": r,
                                   "counters": counters, "plain_ms": ms["plain"],
                                   "clocked_ms": ms[binary], "timed_ms": c.launch_ms,
                                   "outputs_equal": equal[binary], "clock_copies": c.copies,
                                   "clock_step_ns": c.step_ns, "start_ns": c.start_ns.tolist(),
                                   "end_ns": c.end_ns.tolist()})
                except Exception as exc:  # recorded, the rest goes on
                    failures += 1
                    write({"kind": "clocks", "point": name, "error": str(exc)[:300]})
        failures += _profile(write)
    return failures


def _profile(write) -> int:
    """Nsight Compute's DRAM reads of each point's plain binary and of the clocked binary, each
    counter kind (`wavefront profile`, cold L2), NCU_ROUNDS interleaved rounds of one launch
    each, the binaries' order reversed from round to round; the clock itself cannot run under
    ncu (it serialises the host's copies behind the launch), so the clocked binary's tickets
    count. Each row is written as a record."""
    from wavefront.measure.profiling import profile_records
    failures = 0
    for name, p in points().items():
        for r in range(NCU_ROUNDS):
            for binary in BINARIES if r % 2 == 0 else BINARIES[::-1]:
                failures += profile_records(
                    write, [p], {"kind": "ncu", "point": name, "binary": binary, "repeat": r},
                    repeats=1, record_order=COUNTERS.get(binary, False))
    return failures


# ---- analysis (anywhere) ----------------------------------------------------------------------

def _records(study, kind: str) -> pd.DataFrame:
    return measured(study, "item_clocks", kind)


def _clocks(study, counters: str = "shared") -> pd.DataFrame:
    """The clocked launches whose tickets came from `counters` (runs before per-CTA counters
    existed: the shared one)."""
    c = _records(study, "clocks")
    kind = (c["counters"].fillna("shared") if "counters" in c
            else pd.Series("shared", index=c.index))
    return c[kind == counters]


def _ncu(study, binary: str | None = "plain") -> pd.DataFrame:
    """Nsight Compute's rows of one binary (runs before the clocked binary was profiled too
    profiled the plain one only); None: both, with a `binary` column."""
    n = _records(study, "ncu")
    n = n[n["status"] == "ok"].assign(
        binary=n["binary"].fillna("plain") if "binary" in n else "plain")
    return n if binary is None else n[n["binary"] == binary]


def binary_dram(study) -> pd.DataFrame:
    """Per GPU, point and run that profiled both binaries there: DRAM reads of the plain and the
    clocked binary (median, range, launches), whether the ranges overlap, and whether the
    binaries took turns (one run profiled each binary's launches in a row)."""
    n = _ncu(study, None)
    n = n[n["binary"].isin(("plain", "clocked"))]
    keys = ["GPU", "point", "run"]
    n = n[n.groupby(keys)["binary"].transform("nunique") == 2]
    if n.empty:
        return pd.DataFrame()
    t = n.groupby([*keys, "binary"])["dram_read_bytes"].agg(
        ["median", "min", "max", "count"]).unstack("binary")
    out = pd.DataFrame(index=t.index)
    for b in ("plain", "clocked"):
        for col in ("median", "min", "max"):
            out[f"{b} GB {col}"] = t[(col, b)] / 1e9
        out[f"{b} launches"] = t[("count", b)]
    out["ranges overlap"] = ((out["clocked GB min"] <= out["plain GB max"])
                             & (out["plain GB min"] <= out["clocked GB max"]))
    out["interleaved"] = n.groupby(keys, sort=True)["binary"].agg(
        lambda x: int((x.to_numpy()[1:] != x.to_numpy()[:-1]).sum()) > 1)
    return out.reset_index()


# a replayed timeline "comes close" to the reads it replays within this factor either way
REPLAY_CLOSE = 1.1


def binary_gaps(study) -> pd.DataFrame:
    """`binary_dram` with, per run, the clocked binary's share of the plain binary's reads
    (medians) and that run's clocked item timelines replayed through the partitioned LRU
    (`table`, median over its launches) against the clocked binary's median reads."""
    b, t = binary_dram(study), table(study)
    if b.empty or t.empty:
        return pd.DataFrame()
    replay = t.groupby(["GPU", "point", "run"])["replayed timeline GB"].median().rename(
        "replayed GB").reset_index()
    g = b.merge(replay, on=["GPU", "point", "run"], how="left")
    g["clocked share"] = g["clocked GB median"] / g["plain GB median"]
    g["replay over clocked"] = g["replayed GB"] / g["clocked GB median"]
    g["replay close"] = np.abs(np.log(g["replay over clocked"])) < np.log(REPLAY_CLOSE)
    return g


def _launch(row):
    from wavefront.point import GpuShape
    return points()[row["point"]].launch(GpuShape.of(row))


def spread_mb(launch, steps, start, end, moment: float) -> float:
    """Where the running items are along K/V in the middle of the round of work items at
    `moment` of the launch (0: its first round of P items, 1: its last full round; the middle:
    the median of that round's items' midpoints): the distance between the 10th and 90th
    percentile of their positions (K/V tiles scanned so far, each item at a constant pace
    between its start and end; `steps`: each item's K/V steps), in MB of K and V. Read
    mid-round, not at a fixed time: at a round's end the CTAs that started their next item sit
    at tile 0, the rest near the last."""
    start, end = np.asarray(start, float), np.asarray(end, float)
    ctas = launch.num_ctas
    rounds = max(1, launch.num_items // ctas)
    first = min(int(moment * rounds), rounds - 1) * ctas
    mine = slice(first, min(first + ctas, launch.num_items))
    t = np.median((start[mine] + end[mine]) / 2)
    running = (start <= t) & (end > t)
    if running.sum() < 2:
        return float("nan")
    pos = (t - start[running]) / (end[running] - start[running]) * steps[running]
    p = launch.problem
    tile_bytes = 2 * p.tile_n * p.head_dim * p.element_bytes
    lo, hi = np.percentile(pos, [10, 90])
    return float((hi - lo) * tile_bytes / 1e6)


def cta_speeds(clocks, slot_of_item, steps) -> np.ndarray:
    """Per CTA: its speed, the median CTA's ns per K/V step over its own (> 1: faster than the
    median CTA)."""
    ns = clocks.ns_per_step(slot_of_item, steps)
    return np.median(ns) / ns


def _model(study, gpu: str):
    from wavefront.model.presets import preset_for_device
    from wavefront.model.timed import memory_timing
    from wavefront.report.timed import calibrations
    preset = preset_for_device(gpu)
    return preset, memory_timing(preset), calibrations(study)[gpu]


def _replayed_dram_bytes(launch, preset, start, end) -> float:
    """The measured item timeline through the partitioned LRU (`fits.l2_models`' physical
    one), each item's K/V steps evenly spaced between its start and end."""
    from wavefront.model.fits import l2_models
    from wavefront.model.simulation import address_bound, timed_trace
    from wavefront.point import SECTOR_BYTES
    cache = l2_models(preset)["partitions"](address_bound(launch))
    cache.feed(timed_trace(launch, start, end))
    return cache.result().dram_read_sectors * SECTOR_BYTES


def _item_clocks(r):
    """A clocks record's item times as `ItemClocks`."""
    from wavefront.measure.item_clocks import ItemClocks
    return ItemClocks(np.asarray(r["start_ns"], np.int64), np.asarray(r["end_ns"], np.int64),
                      int(r["clock_copies"]), float(r["clock_step_ns"]), float(r["timed_ms"]))


def _static_slots(launch) -> np.ndarray:
    """The CTA that runs each work item under static persistent CTAs: c runs c, c + P, ..."""
    return np.arange(launch.num_items) % launch.num_ctas


def _rows(study, counters: str = "shared") -> pd.DataFrame:
    from wavefront.model.simulation import item_steps
    from wavefront.model.timed import Exposure, simulate_timed
    c = _clocks(study, counters)
    rows = []
    for (gpu, name), g in c.groupby(["gpu", "point"]):
        first = g.iloc[0]
        launch = _launch(first)
        preset, memory, cal = _model(study, gpu)
        compute = cal.compute(launch)
        if compute is None:
            continue
        kw = dict(l2_bytes=int(first["l2_bytes"]), partitions=preset.l2_partitions)
        base = simulate_timed(launch, memory, compute, **kw)
        steps = item_steps(launch)
        # the slot that ran each item, as the model assigned them (what Exposure.cta_speed
        # indexes): the static persistent rule `pooled_speeds` uses too
        if not np.array_equal(base.item_slot, _static_slots(launch)):
            raise ValueError(f"{name}: the model's CTA of each item is not static persistent")
        for _, r in g.iterrows():
            clocks = _item_clocks(r)
            start, end = clocks.start_ns.astype(float), clocks.end_ns.astype(float)
            speeds = cta_speeds(clocks, base.item_slot, steps)
            fed = simulate_timed(launch, memory, compute, **kw,
                                 exposure=Exposure(cta_speed=tuple(speeds)))
            # the control: the same speeds given to other CTAs (does the spread alone do it?)
            shuffled = simulate_timed(launch, memory, compute, **kw, exposure=Exposure(
                cta_speed=tuple(np.random.default_rng(int(r["repeat"])).permutation(speeds))))
            replay = _replayed_dram_bytes(launch, preset, start, end)
            row = {"GPU": r["GPU"], "gpu": gpu, "point": name, "run": r["run"],
                   "repeat": int(r["repeat"]),
                   "plain ms": r["plain_ms"], "clocked ms": r["clocked_ms"],
                   "clocked, clock on ms": r["timed_ms"], "outputs equal": r["outputs_equal"],
                   "clock step ns": r["clock_step_ns"],
                   "first wave": clocks.first_wave(), "ctas": launch.num_ctas,
                   "CTA speed p5": np.percentile(speeds, 5),
                   "CTA speed p95": np.percentile(speeds, 95),
                   "CTA speed CV": float(np.std(speeds) / np.mean(speeds)),
                   "model GB": base.dram_read_bytes / 1e9,
                   "model, measured speeds GB": fed.dram_read_bytes / 1e9,
                   "model, speeds shuffled GB": shuffled.dram_read_bytes / 1e9,
                   "replayed timeline GB": replay / 1e9,
                   "model ms": base.kernel_ns * 1e-6,
                   "model, measured speeds ms": fed.kernel_ns * 1e-6}
            for m in MOMENTS:
                row[f"spread at {m:.0%}, MB"] = spread_mb(launch, steps, start, end, m)
                row[f"model spread at {m:.0%}, MB"] = spread_mb(
                    launch, steps, base.item_start_ns, base.item_end_ns, m)
                row[f"fed spread at {m:.0%}, MB"] = spread_mb(
                    launch, steps, fed.item_start_ns, fed.item_end_ns, m)
            rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    own = next(b for b, c in COUNTERS.items() if c == counters)
    for binary, prefix in (("plain", "measured GB"), (own, "clocked binary GB")):
        n = _ncu(study, binary)
        dram = n.groupby(["gpu", "point"])["dram_read_bytes"].agg(["median", "min", "max"])
        for col in ("median", "min", "max"):
            out[f"{prefix} {col}"] = [dram[col].get((g, p), np.nan) / 1e9
                                      for g, p in zip(out["gpu"], out["point"])]
    return out


def pooled_speeds(study) -> pd.DataFrame:
    """Every clocked launch's CTA speeds (each against its launch's median CTA), pooled, with
    the GPU that ran it: the measured sample a held-out launch's CTAs are drawn from."""
    from wavefront.model.simulation import item_steps

    def pooled():
        out = []
        for _, r in _clocks(study).iterrows():
            launch = _launch(r)
            speeds = cta_speeds(_item_clocks(r), _static_slots(launch), item_steps(launch))
            out.append(pd.DataFrame({"GPU": r["GPU"], "speed": speeds}))
        return (pd.concat(out, ignore_index=True) if out
                else pd.DataFrame(columns=["GPU", "speed"]))
    return study.once("item_clocks.speeds", pooled).copy()


def held_out(study) -> pd.DataFrame:
    """Per GPU, validation family and split (above the knee, at compulsory): the timed model's
    validation as it is and re-simulated with every CTA's speed drawn from `pooled_speeds`
    (`report.timed.spread_validation_rows`): median |relative error| and median
    predicted/measured ratio of DRAM reads, median |relative error| of time. Points whose launch
    is one of the clocked launches are left out (not held out)."""
    from pathlib import Path

    from wavefront.model.fits import ABOVE_KNEE
    from wavefront.point import GpuShape
    from wavefront.report.analysis import short_gpu
    from wavefront.report.timed import spread_validation_rows, validation_rows
    speeds = pooled_speeds(study)["speed"]
    if not len(speeds):
        return pd.DataFrame()
    records = sorted((study.data_dir / "item_clocks").glob("*.jsonl*"))
    drawn = spread_validation_rows(study, speeds.to_numpy(), SEED, [*records, Path(__file__)])
    keys = ["gpu", "family", "point"]
    rows = validation_rows(study).merge(drawn, on=keys, suffixes=("", " drawn"))
    # H100 and H200 both have 132 SMs: one key per clocked launch
    clocked = {p.key(GpuShape(132, 50 << 20)) for p in points().values()}
    rows = rows[~rows["point"].isin(clocked)]
    rows["split"] = np.where(rows["measured_dram_bytes"] > ABOVE_KNEE * rows["compulsory_bytes"],
                             "above the knee", "at compulsory")
    out = []
    for (split, gpu, family), g in rows.groupby(["split", "gpu", "family"]):
        out.append({"points": split, "GPU": short_gpu(gpu), "family": family, **_scores(g)})
    for split, g in rows.groupby("split"):
        out.append({"points": split, "GPU": "both", "family": "all", **_scores(g)})
    return pd.DataFrame(out)


def _scores(g) -> dict:
    row = {"n": len(g)}
    for label, suffix in (("model", ""), ("drawn speeds", " drawn")):
        dram = g[f"predicted_dram_bytes{suffix}"] / g["measured_dram_bytes"]
        row[f"DRAM |err| ({label})"] = float((dram - 1).abs().median())
        row[f"DRAM pred/meas ({label})"] = float(dram.median())
    for label, suffix in (("model", ""), ("drawn speeds", " drawn")):
        row[f"time |err| ({label})"] = float(
            (g[f"predicted_ms{suffix}"] / g["measured_ms"] - 1).abs().median())
    return row


def table(study, counters: str = "shared") -> pd.DataFrame:
    """Per GPU, point and repeat: the launch clocked through `counters`, its CTA speeds and
    spreads along K/V, the model's, and the DRAM reads measured (its own binary's: "clocked
    binary GB") and predicted three ways; cached with the model's other predictions
    (`data/model_cache`), keyed on the records, the model and this file."""
    from pathlib import Path

    from wavefront.report.analysis import cached_table
    from wavefront.report.timed import model_inputs
    name = "item_clocks" if counters == "shared" else f"item_clocks_{counters}"

    def cached():
        records = sorted((study.data_dir / "item_clocks").glob("*.jsonl*"))
        return cached_table(study, name, [*records, *model_inputs(study), Path(__file__)],
                            lambda: _rows(study, counters))
    return study.once(f"{name}.rows", cached).copy()


def per_cta_gaps(study) -> pd.DataFrame:
    """Per GPU, point and run that profiled the binary with a ticket counter per CTA: its DRAM
    reads (median, range) beside the plain binary's and the shared counter's, its share of the
    plain binary's, whether their ranges overlap, each clocked binary's time over the plain
    one's (medians of the run's rounds, the clock off), and its own clocked item timelines
    replayed through the partitioned LRU against its reads."""
    n = _ncu(study, None)
    keys = ["GPU", "point", "run"]
    n = n[n.groupby(keys)["binary"].transform(lambda b: set(BINARIES) <= set(b))]
    t = table(study, "per_cta")
    if n.empty or t.empty:
        return pd.DataFrame()
    d = n.groupby([*keys, "binary"])["dram_read_bytes"].agg(["median", "min", "max"]).unstack()
    out = pd.DataFrame(index=d.index)
    for b in BINARIES:
        for col in ("median", "min", "max"):
            out[f"{b} GB {col}"] = d[(col, b)] / 1e9
    out["per-CTA share"] = out["clocked_per_cta GB median"] / out["plain GB median"]
    out["shared share"] = out["clocked GB median"] / out["plain GB median"]
    out["overlaps plain"] = ((out["clocked_per_cta GB min"] <= out["plain GB max"])
                             & (out["plain GB min"] <= out["clocked_per_cta GB max"]))
    shared = table(study).groupby(keys).apply(
        lambda g: (g["clocked ms"] / g["plain ms"]).median(), include_groups=False)
    mine = t.groupby(keys)
    out["per-CTA time"] = mine.apply(lambda g: (g["clocked ms"] / g["plain ms"]).median(),
                                     include_groups=False)
    out["shared time"] = shared.reindex(out.index)
    out["rounds"] = mine.size()
    out["replay over per-CTA"] = (mine["replayed timeline GB"].median()
                                  / out["clocked_per_cta GB median"])
    return out.reset_index()


def figure(study):
    t = table(study)
    moments = [f"{m:.0%}" for m in MOMENTS]
    long = []
    for _, r in t.iterrows():
        for m in moments:
            for source, col in (("measured", f"spread at {m}, MB"),
                                ("model", f"model spread at {m}, MB"),
                                ("model, measured speeds", f"fed spread at {m}, MB")):
                long.append({"GPU": r["GPU"], "point": r["point"], "moment": m,
                             "source": source, "MB": r[col]})
    d = pd.DataFrame(long)
    g = sns.catplot(data=d, x="moment", y="MB", hue="source", col="point", kind="bar",
                    errorbar=("pi", 100), height=3.2, aspect=1.2, sharey=False)
    g.set_axis_labels("round of work items (share of full rounds)",
                      "CTAs' spread along K/V (MB)")
    gpus = ", ".join(sorted(t["GPU"].unique()))
    g.figure.suptitle(f"Where the running CTAs are along K/V, mid-round: 10th-90th percentile "
                      f"distance\n({gpus}, B1 H1 D128 bf16, 264 persistent CTAs; bars: medians "
                      f"of {len(t) // max(1, t['point'].nunique())} launches, whiskers their "
                      "range)", fontsize=9, y=1.08)
    return g.figure


def _binaries_paragraph(s: Section, gaps: pd.DataFrame, t: pd.DataFrame,
                        per_cta: pd.DataFrame) -> str:
    """Where the two binaries' DRAM reads are apart in every run that counted both: how far,
    at what time, how close each run's replayed item timelines come to the clocked binary's
    own reads, and what a ticket counter per CTA (`per_cta`: `per_cta_gaps`) changes (claims
    added to `s`)."""
    if gaps.empty:
        return ""
    apart = gaps.groupby(["GPU", "point"])["ranges overlap"].agg(lambda x: not x.any())
    if not apart.any():
        return ("**The clocked binary reads what the plain one reads** at every point: their "
                "ranges overlap in every run that counted both.\n")
    texts = []
    for gpu, name in apart[apart].index:
        runs = gaps[(gaps["GPU"] == gpu) & (gaps["point"] == name)]
        mine = t[(t["GPU"] == gpu) & (t["point"] == name)]
        times = mine.groupby("run").apply(lambda g: (g["clocked ms"] / g["plain ms"]).median(),
                                          include_groups=False)
        first = len(s.claims)
        s.claim(f"At {name} ({gpu}) the clocked binary read "
                f"{span(runs['clocked share'], '.2f')}x the plain binary's DRAM bytes (medians, "
                f"{len(runs)} runs) and took {span(times, '.3f')}x its time (each run's median "
                f"of {REPEATS} rounds, the clock off); each run's clocked "
                "item timelines, replayed through the partitioned LRU, read "
                f"{span(runs['replay over clocked'], '.2f')}x that run's clocked-binary reads",
                bool(runs["replay over clocked"].notna().all() and len(times)),
                {"runs": runs[["run", "clocked share", "replay over clocked"]].round(3)
                 .to_dict("records"), "time": times.round(4).to_dict()})
        claim = s.claims[first].text
        flagged = set(per_cta["run"]) if len(per_cta) else set()
        split = ""
        if flagged and set(runs["run"]) - flagged:
            old, new = runs[~runs["run"].isin(flagged)], runs[runs["run"].isin(flagged)]
            s.claim(f"The runs before the flag read (" + ", ".join(
                        r.split("_")[-1] for r in old["run"]) + f") read "
                    f"{span(old['clocked share'], '.2f')}x and took "
                    f"{span(times[old['run']], '.3f')}x; those after it ("
                    + ", ".join(r.split("_")[-1] for r in new["run"]) + f") "
                    f"{span(new['clocked share'], '.2f')}x and "
                    f"{span(times[new['run']], '.3f')}x", True,
                    {"old": old["run"].tolist(), "new": new["run"].tolist()})
            split = " " + s.claims[-1].text + "."
        texts.append(f"""**The clocked binary is not the plain one at {name}.** {claim}.
Its code differs from the plain code only at the work items' boundaries: two atomic tickets per
item, and from run 9e446e7 a flag read (one load per ticket) that says which counter to count
on. So do the binaries compiled for the general signature (`compile_variant`: the same K/V loop
mix and rings, and only those atomics; `tests/test_item_clocks.py` checks both). The binaries
the JIT compiled for this launch, which ran, differ in more: at one head the plain one spills
registers and the ticket-taking one of run 9e446e7 does not (Appendix F counts both; the
earlier ticket binary's spills were not counted on a GPU).{split} The speeds and item timelines
above are those of the clocked launches, of both ticket binaries; their DRAM reads come from
other launches of the same binary, with its tickets counting.""")
        texts.append(_per_cta_text(s, per_cta[(per_cta["GPU"] == gpu)
                                              & (per_cta["point"] == name)] if len(per_cta)
                                   else per_cta, name))
    return "\n\n".join(texts) + "\n"


def _per_cta_text(s: Section, g: pd.DataFrame, name: str) -> str:
    """The test of the one-counter hypothesis at one point: the binary with a counter per CTA
    against the plain one and the shared counter, run by run (claims added to `s`)."""
    if g.empty:
        return ("Whether the CTAs' queue on the one counter regroups them was not tested at "
                f"{name}: no run profiled the binary with a counter per CTA.")
    first = len(s.claims)
    s.claim(f"At {name}, with a ticket counter per CTA (no counter shared by two CTAs) the "
            f"clocked binary read {span(g['per-CTA share'], '.2f')}x the plain binary's DRAM "
            f"bytes (the shared counter, same runs: {span(g['shared share'], '.2f')}x; ranges "
            + ("apart from" if not g["overlaps plain"].any() else "overlapping")
            + " the plain binary's) and took "
            f"{span(g['per-CTA time'], '.3f')}x its time ({span(g['shared time'], '.3f')}x; "
            f"medians of {int(g['rounds'].min())} rounds, the clock off); its own clocked item "
            f"timelines, replayed, read {span(g['replay over per-CTA'], '.2f')}x its reads",
            bool(g["per-CTA share"].notna().all()),
            g.drop(columns=["GPU", "point"]).round(4).to_dict("records"))
    return (f"**Not the queue on one counter.** {s.claims[first].text} "
            f"({len(g)} run{'s' if len(g) > 1 else ''}: "
            + ", ".join(r.split("_")[-1] for r in g["run"]) + "). "
            + ("So a queue on one word is not what moves the reads. "
               if not g["overlaps plain"].any() and (
                   g["clocked_per_cta GB min"] <= g["clocked GB max"]).all() and (
                   g["clocked GB min"] <= g["clocked_per_cta GB max"]).all() else
               "With no counter shared the reads are the plain binary's again: the queue on one "
               "word is what moves them. ")
            + "Appendix F compares the binaries as the JIT compiled them: at one head the "
            "plain binary spills registers and this ticket-taking one does not, and it sets "
            "the ticket binary (clock off) against the plain code compiled without spills "
            "(its `binary_spills` section).")


def section(study) -> Section:
    s = Section()
    t = table(study)
    if t.empty:
        s.text = "## Per-CTA clocks\n\nNo clocked launch is in `data/item_clocks` yet."
        return s
    s.claim("The clocked binary's outputs equal the plain binary's bit for bit in every "
            "launch", bool(t["outputs equal"].all()), t["outputs equal"].tolist())
    step = t["clock step ns"].max()
    s.claim(f"The host's clock reached the counter every {step / 1e3:.1f} us or more often "
            "(the copies' mean interval: the clocks' resolution)",
            bool(step <= 50e3), t["clock step ns"].tolist())
    s.claim("Every CTA started in the launch's first wave",
            bool((t["first wave"] >= t["ctas"]).all()), t["first wave"].tolist())
    over = (t["clocked, clock on ms"] / t["plain ms"] - 1)
    plain = t.groupby("point")["plain ms"].agg(lambda x: x.max() / x.min() - 1)
    s.claim(f"With the clock on, a launch took {over.min():+.1%} to {over.max():+.1%} (median "
            f"{over.median():+.1%}) more time than the plain launch of its round, while the "
            f"plain launches of one point differed by up to {plain.max():.1%} among themselves",
            bool(abs(over.median()) < 0.1), {"over": over.tolist(), "plain": plain.to_dict()})
    b = binary_dram(study)
    if b.empty:
        s.claim("The clocked binary's DRAM reads were not counted", True, [])
    for _, r in b.iterrows():
        s.claim(f"{r['point']} ({r['GPU']}, run {r['run'].split('_')[-1]}): under Nsight "
                "Compute, " + ("in interleaved rounds" if r["interleaved"] else
                              "each binary's launches in a row")
                + ", the clocked binary read "
                f"{r['clocked GB median']:.2f} GB of DRAM (median of {r['clocked launches']}; "
                f"{r['clocked GB min']:.2f}-{r['clocked GB max']:.2f}), the plain one "
                f"{r['plain GB median']:.2f} ({r['plain GB min']:.2f}-{r['plain GB max']:.2f}): "
                "the ranges " + ("overlap" if r["ranges overlap"] else "do not overlap"),
                bool(np.isfinite(r["clocked GB median"]) and np.isfinite(r["plain GB median"])),
                r.to_dict())
    per = t.groupby(["GPU", "point"])
    cv = per["CTA speed CV"].agg(["min", "max"])
    s.claim("CTA speeds (each CTA's ns per K/V step over its items, against the median CTA's) "
            "vary with a coefficient of variation of " + "; ".join(
                f"{p} {g} {r['min']:.1%}-{r['max']:.1%}" for (g, p), r in cv.iterrows()),
            bool((cv["max"] < 1).all()), cv.to_dict())
    shown = per.agg(**{
        "launches": ("repeat", "count"),
        "CTA speed p5-p95": ("CTA speed p5", lambda x: f"{x.min():.3f}"),
        "_hi": ("CTA speed p95", "max"),
        "spread at 50%, MB (measured)": ("spread at 50%, MB", "median"),
        "spread at 50%, MB (model)": ("model spread at 50%, MB", "median"),
        "DRAM GB, plain binary (ncu)": ("measured GB median", "median"),
        "DRAM GB, clocked binary (ncu)": ("clocked binary GB median", "median"),
        "model": ("model GB", "median"),
        "model, measured speeds": ("model, measured speeds GB", "median"),
        "same speeds, shuffled": ("model, speeds shuffled GB", "median"),
        "replayed timeline": ("replayed timeline GB", "median")}).reset_index()
    shown["CTA speed p5-p95"] = [f"{a}-{b:.3f}" for a, b in
                                 zip(shown["CTA speed p5-p95"], shown.pop("_hi"))]
    for col in shown.columns[4:]:
        shown[col] = shown[col].astype(float).round(2)
    for _, r in shown.iterrows():
        plain, own = r["DRAM GB, plain binary (ncu)"], r["DRAM GB, clocked binary (ncu)"]
        # first against the binary whose CTAs were clocked, where its reads were counted
        ref, whose = (own, "clocked") if np.isfinite(own) else (plain, "plain")
        gap, fed = r["model"] / ref, r["model, measured speeds"] / ref
        closes = abs(np.log(fed)) < 0.5 * abs(np.log(gap))
        s.claim(f"{r['point']} ({r['GPU']}): against the {whose} binary's {ref:.2f} GB the "
                f"model predicts {r['model']:.2f} GB ({gap:.2f}x); given each CTA's measured "
                f"speed, {r['model, measured speeds']:.2f} GB ({fed:.2f}x): "
                + ("more than half the gap closed (on a log scale)" if closes else
                   "not half the gap closed (on a log scale)")
                + (", the error changing sign" if (gap - 1) * (fed - 1) < 0 else "")
                + (f"; against the plain binary's {plain:.2f} GB, {r['model'] / plain:.2f}x and "
                   f"{r['model, measured speeds'] / plain:.2f}x" if whose == "clocked" else ""),
                bool(np.isfinite(gap) and np.isfinite(fed)), r.to_dict())
        sh = r["same speeds, shuffled"] / ref
        s.claim(f"The same speeds given to other CTAs (shuffled): {r['same speeds, shuffled']:.2f} "
                f"GB ({sh:.2f}x the {whose} binary's)", bool(np.isfinite(sh)), r.to_dict())
        rep = r["replayed timeline"] / ref
        s.claim(f"The measured item timeline replayed through the same LRU reads "
                f"{r['replayed timeline']:.2f} GB ({rep:.2f}x the {whose} binary's)",
                bool(np.isfinite(rep)), r.to_dict())
    main_claims = len(s.claims)
    binaries = _binaries_paragraph(s, binary_gaps(study), t, per_cta_gaps(study))
    point_claims = len(s.claims)
    h = held_out(study)
    if not h.empty:
        both = h[h["GPU"] == "both"].set_index("points")
        above = both.loc["above the knee"]
        at = both.loc["at compulsory"] if "at compulsory" in both.index else None
        speeds = pooled_speeds(study)
        gpus = " and ".join(sorted(h.loc[h["GPU"] != "both", "GPU"].unique()))
        s.claim(f"Held out: every point of the timed validation simulated with each CTA's speed "
                f"drawn from the {len(speeds)} measured ones ("
                + ", ".join(sorted(speeds["GPU"].unique())) + " only; the clocked "
                f"launches' own points left out): above the knee ({above['n']} points, {gpus}) "
                f"the median |error| of DRAM reads goes from "
                f"{above['DRAM |err| (model)']:.1%} to {above['DRAM |err| (drawn speeds)']:.1%} "
                f"(median predicted/measured {above['DRAM pred/meas (model)']:.2f} to "
                f"{above['DRAM pred/meas (drawn speeds)']:.2f}), of time from "
                f"{above['time |err| (model)']:.1%} to {above['time |err| (drawn speeds)']:.1%}"
                + ("" if at is None else f"; at the compulsory bytes ({at['n']} points) of time "
                   f"from {at['time |err| (model)']:.1%} to "
                   f"{at['time |err| (drawn speeds)']:.1%}"),
                bool(np.isfinite(above["DRAM |err| (drawn speeds)"])), above.to_dict())
        fam = h[(h["points"] == "above the knee") & (h["GPU"] != "both")]
        better = fam["DRAM |err| (drawn speeds)"] < fam["DRAM |err| (model)"]
        worse = fam["DRAM |err| (drawn speeds)"] > fam["DRAM |err| (model)"]
        worst = fam.loc[fam["DRAM pred/meas (drawn speeds)"].idxmax()]
        s.claim(f"The drawn speeds lower the median DRAM error above the knee in {better.sum()} "
                f"of {len(fam)} GPU-families and raise it in {worse.sum()}; the largest "
                f"over-prediction is {worst['family']} on the {worst['GPU']} "
                f"({worst['DRAM pred/meas (drawn speeds)']:.1f}x, against "
                f"{worst['DRAM pred/meas (model)']:.2f}x without them)", bool(len(fam)),
                fam[["GPU", "family", "DRAM |err| (model)",
                     "DRAM |err| (drawn speeds)"]].to_dict("records"))
        shown_h = h[(h["points"] == "above the knee") | (h["GPU"] == "both")].copy()
        for col in shown_h.columns[4:]:
            shown_h[col] = [f"{x:.2f}" if "pred/meas" in col else f"{x:.1%}"
                            for x in shown_h[col]]
        held = f"""
**Held out: the measured spread given to every launch.** Is the spread an input the model lacks
everywhere? Each point of the timed validation (this appendix's first section) re-simulated
with every CTA's speed drawn at random from the pooled measured speeds, all other inputs
unchanged; the points of the {len(points())} clocked launches are left out.

{md_table(shown_h)}

{' '.join(c.text + '.' for c in s.claims[point_claims:])}
"""
    else:
        held = ""
    runs, counted = t["run"].nunique(), b["run"].nunique() if len(b) else 0
    interleaved = int(b.groupby("run")["interleaved"].all().sum()) if len(b) else 0
    s.text = f"""## Per-CTA clocks: do the CTAs run at one speed?

The {len(points())} launches the timed model misses most, clocked by the kernel itself: the
RECORD_ORDER binary's work-item tickets read the host's clock, copied into the ticket counter
through the copy engine while the launch runs (`experiments/item_clocks.py`,
`wavefront.measure.item_clocks`). {REPEATS} clocked launches per point and run, each round
beside a plain and a clocked launch without the clock; DRAM reads by Nsight Compute in the same
run (cold L2): of the plain binary in all {runs} runs, and of the clocked one too in
{counted} (interleaved in {interleaved}). "Spread": the distance along K/V
between the 10th and 90th percentile of the running CTAs' positions in the middle of the
launch's middle round of work items (each item at a constant pace between its measured start
and end). Predictions: the timed model (every CTA at the calibrated speed), the same given
each CTA's measured speed, the same speeds given to other CTAs (shuffled), and the measured
item timeline replayed through the same partitioned LRU.

{md_table(shown)}

{' '.join(c.text + '.' for c in s.claims[:main_claims])}

{binaries}
What the measured speeds are, and are not: each is a CTA's time per K/V step in the launch as it
ran, misses included, so a CTA that missed more is slower in them. Fed back, they are not an
independent cause; what the run shows is that the simulated convoy breaks, and the reads
follow, at the measured spread of speeds (a few percent), and whether it needs the CTAs that
were slow to be the slow ones (the shuffled control). Why the CTAs differ by a few percent (SM
clocks, distance to the L2 slices, the partner CTA on the SM) is not measured here.
{held}
![item_clocks](figures/item_clocks.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
