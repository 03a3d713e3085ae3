"""The timed cache model against the data: its calibration on the named training set, its
out-of-sample scores on every timed family, its time-resolved DRAM series against PM sampling,
its predictions for unmeasured GPUs and the schedule advisor's picks on held-out shapes.

Every table here is cached in data/model_cache (keyed by the data and the model's source):
a cold build simulates each measured point once (minutes on two cores).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from wavefront.model import presets as presets_module
from wavefront.model import timed as timed_module
from wavefront.model.counting import launch_counts
from wavefront.model.fits import ABOVE_KNEE, PAPER_LAUNCH, launch_of_row
from wavefront.model.presets import PRESETS, preset_for_device
from wavefront.model.timed import (
    NO_EXPOSURE, Calibration, Exposure, calibrate, memory_timing, no_cache_ns, projected_compute,
    simulate_timed)
from wavefront.point import SECTOR_BYTES, plan
from wavefront.schedules import Launch
from wavefront.report.analysis import VALIDATION_FAMILIES, cached_table, medians, short_gpu
from wavefront.results.store import results_path, with_timing

TRAINING = "step_time"  # the timed model's training set: launches whose K/V fits in the L2
# Every data set of today's kernel with DRAM counters and timing: all held out
TIMED_FAMILIES = (*VALIDATION_FAMILIES, "causal_gqa", "paper_launch")
# The targets: DRAM reads within 10% (median) and 25% (p90), time within 10% (median)
DRAM_MEDIAN_TARGET, DRAM_P90_TARGET, TIME_MEDIAN_TARGET = 0.10, 0.25, 0.10


def _model_files() -> list[Path]:
    from wavefront.model import pipeline, simulation
    return [Path(timed_module.__file__), Path(presets_module.__file__),
            Path(simulation.__file__), Path(pipeline.__file__), pipeline.PIPELINE_DATA]


def model_inputs(study) -> list[Path]:
    """The files a timed prediction depends on, for a cache key (`cached_table`): the
    calibration's training data and the model's code and presets."""
    return [results_path(study.data_dir / TRAINING), *_model_files()]


def _points(study, family: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per point: median DRAM reads and time over repeats, the point's first row)."""
    df = with_timing(study.load(family))
    df = df[df["status"] == "ok"]
    return medians(df), df.drop_duplicates(["gpu", "point"]).set_index(["gpu", "point"])


def _memory(gpu_name: str):
    preset = preset_for_device(gpu_name)
    if preset is None:
        raise ValueError(f"no GPU preset for {gpu_name!r}")
    return preset, memory_timing(preset)


def _calibration_table(study) -> pd.DataFrame:
    points, first = _points(study, TRAINING)
    rows = []
    for gpu, g in points.groupby("gpu"):
        g = g[g["dram_read_bytes"] <= ABOVE_KNEE * g["compulsory_read_bytes"]]
        launches = [launch_of_row(first.loc[(gpu, p)]) for p in g["point"]]
        preset, memory = _memory(gpu)
        cal = calibrate(gpu, launches, g["median_ms"].to_numpy(float) * 1e6, memory,
                        l2_bytes=int(first.loc[(gpu, g["point"].iloc[0])]["l2_bytes"]),
                        partitions=preset.l2_partitions, training=TRAINING)
        for (d, tm, tn, causal, per_sm), step in sorted(cal.step_ns.items()):
            rows.append({"gpu": gpu, "head_dim": d, "tile_m": tm, "tile_n": tn,
                         "causal": causal, "ctas_per_sm": per_sm, "step_ns": step,
                         "item_ns": cal.item_ns, "launch_ns": cal.launch_ns,
                         "points": cal.points, "in_sample_median_error": cal.errors["median"],
                         "in_sample_max_error": cal.errors["max"]})
    return pd.DataFrame(rows)


def calibrations(study) -> dict[str, Calibration]:
    """Per GPU: the compute timings fitted on the training set's launches that fit in the L2
    (DRAM reads within ABOVE_KNEE x compulsory), cached."""
    table = cached_table(study, "timed_calibration",
                         model_inputs(study),
                         lambda: _calibration_table(study))
    out = {}
    for gpu, g in table.groupby("gpu"):
        first = g.iloc[0]
        step = {(int(r.head_dim), int(r.tile_m), int(r.tile_n), bool(r.causal),
                 int(r.ctas_per_sm)): float(r.step_ns) for r in g.itertuples()}
        out[gpu] = Calibration(gpu, float(first["launch_ns"]), float(first["item_ns"]), step,
                               TRAINING, int(first["points"]),
                               {"median": float(first["in_sample_median_error"]),
                                "max": float(first["in_sample_max_error"])})
    return out


def _validation_rows(study, cals: dict | None = None, exposure=None) -> pd.DataFrame:
    """`validation_rows`, computed; `cals`: calibrations to simulate with instead of the fitted
    ones (nudged copies: `nudged_validation`); `exposure`: an `Exposure` every point is
    simulated with (e.g. measured CTA speeds; default: none)."""
    cals = calibrations(study) if cals is None else cals
    rows = []
    for family in TIMED_FAMILIES:
        points, first = _points(study, family)
        for _, r in points.iterrows():
            row = first.loc[(r["gpu"], r["point"])]
            launch = launch_of_row(row)
            preset, memory = _memory(r["gpu"])
            compute = cals[r["gpu"]].compute(launch)
            if compute is None:
                continue
            pred = simulate_timed(launch, memory, compute, l2_bytes=int(row["l2_bytes"]),
                                  partitions=preset.l2_partitions,
                                  exposure=NO_EXPOSURE if exposure is None else exposure)
            rows.append({
                "gpu": r["gpu"], "family": family, "point": r["point"],
                "causal": bool(row["causal"]), "schedule": f"{row['cta_schedule']}+"
                                                           f"{row['kv_schedule']}",
                "seqlen": int(row["seqlen"]), "compute": compute.source,
                "measured_dram_bytes": float(r["dram_read_bytes"]),
                "predicted_dram_bytes": pred.dram_read_bytes,
                "compulsory_bytes": float(r["compulsory_read_bytes"]),
                "measured_ms": float(r["median_ms"]), "predicted_ms": pred.kernel_ns * 1e-6,
                "predicted_far_hit_bytes": pred.far_hit_bytes,
                "predicted_fill_waits": pred.fill_waits})
    return pd.DataFrame(rows)


def validation_rows(study) -> pd.DataFrame:
    """Per measured point of every timed family: measured and predicted DRAM reads and
    kernel time (medians over repeats), cached."""
    return cached_table(study, "timed_validation", _validation_inputs(study) + _model_files(),
                        lambda: _validation_rows(study))


def _validation_inputs(study) -> list[Path]:
    return [results_path(study.data_dir / f) for f in (TRAINING, *TIMED_FAMILIES)]


def spread_validation_rows(study, speeds, seed: int, sources: list[Path]) -> pd.DataFrame:
    """`validation_rows` re-simulated with every point's CTAs at speeds drawn (with `seed`) from
    a measured sample `speeds` (`Exposure.cta_speed`), cached. The key is the files the speeds
    are computed from (`sources`: the records and the code that reads them) and the seed, not
    the speeds' digits, which another machine's numpy may round differently."""
    exposure = Exposure(cta_speed=tuple(float(x) for x in speeds), seed=seed)
    return cached_table(study, "timed_validation_spread",
                        _validation_inputs(study) + _model_files() + list(sources),
                        lambda: _validation_rows(study, exposure=exposure), values=f"seed {seed}")


VALIDATION_NUDGES = (-1, 1)  # the held-out rows re-simulated at item_ns x (1 + k x 1e-15)


def _nudged_validation_table(study) -> pd.DataFrame:
    base = validation_rows(study)
    scores0 = validation_table(study, base).set_index(["GPU", "family"])
    keys = ["gpu", "family", "point"]
    fitted = calibrations(study)
    out = []
    for k in VALIDATION_NUDGES:
        cals = {g: dataclasses.replace(c, item_ns=c.item_ns * (1 + k * CALIBRATION_NUDGE))
                for g, c in fitted.items()}
        rows = _validation_rows(study, cals)
        scores = validation_table(study, rows).set_index(["GPU", "family"])
        both = base.merge(rows, on=keys, suffixes=("", "_nudged"))
        for (gpu, family), g in both.groupby(["gpu", "family"], sort=False):
            change = {c: (g[f"{c}_nudged"] / g[c] - 1).abs()
                      for c in ("predicted_dram_bytes", "predicted_ms")}
            at = (short_gpu(gpu), family)
            out.append({"GPU": at[0], "family": family, "nudge": k, "n": len(g),
                        "points moved": int(((change["predicted_dram_bytes"] > 1e-9)
                                             | (change["predicted_ms"] > 1e-9)).sum()),
                        "largest DRAM change": float(change["predicted_dram_bytes"].max()),
                        "largest time change": float(change["predicted_ms"].max()),
                        **{f"{score} change": float(scores.loc[at, score] - scores0.loc[at, score])
                           for score in ("DRAM median", "DRAM p90", "time median")}})
    return pd.DataFrame(out)


def nudged_validation(study) -> pd.DataFrame:
    """Per GPU, held-out family and nudge k (VALIDATION_NUDGES): the validation re-simulated with
    every calibration's item_ns x (1 + k x CALIBRATION_NUDGE): how many points' predictions
    moved, by how much at most, and how far each score moved (cached; minutes to compute)."""
    return cached_table(study, "timed_validation_nudged",
                        _validation_inputs(study) + _model_files(),
                        lambda: _nudged_validation_table(study))


def _errors(predicted, measured) -> tuple[float, float]:
    e = np.abs(np.asarray(predicted, float) - np.asarray(measured, float)) / np.asarray(
        measured, float)
    return (float(np.median(e)), float(np.percentile(e, 90))) if len(e) else (np.nan, np.nan)


def validation_table(study, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per GPU and held-out family: |relative error| of DRAM reads and of kernel time (median
    and 90th percentile) over every point, and of DRAM reads over the points above the knee
    (measured reads > ABOVE_KNEE x compulsory), against the issue's targets. `rows`: other
    validation rows to score (default: `validation_rows`)."""
    rows = validation_rows(study) if rows is None else rows
    out = []
    for (gpu, family), g in rows.groupby(["gpu", "family"], sort=False):
        dram = _errors(g["predicted_dram_bytes"], g["measured_dram_bytes"])
        time = _errors(g["predicted_ms"], g["measured_ms"])
        above = g[g["measured_dram_bytes"] > ABOVE_KNEE * g["compulsory_bytes"]]
        dram_above = _errors(above["predicted_dram_bytes"], above["measured_dram_bytes"])
        out.append({"GPU": short_gpu(gpu), "family": family, "n": len(g),
                    "DRAM median": dram[0], "DRAM p90": dram[1],
                    "time median": time[0], "time p90": time[1],
                    "time bias": float(np.median(g["predicted_ms"] / g["measured_ms"] - 1)),
                    "n above knee": len(above), "DRAM median above knee": dram_above[0],
                    "DRAM p90 above knee": dram_above[1],
                    "meets targets": bool(dram[0] <= DRAM_MEDIAN_TARGET
                                          and dram[1] <= DRAM_P90_TARGET
                                          and time[0] <= TIME_MEDIAN_TARGET)})
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------------------------
# Honest scores: above the knee only, beside the two baselines a clock must beat
# ---------------------------------------------------------------------------------------------

def _lockstep_table(study) -> pd.DataFrame:
    """Per validation point: the lock-step partition model's DRAM reads (from the capacity
    validation where it scored the point, simulated here otherwise)."""
    from wavefront.model.fits import l2_predictions_by_model
    from wavefront.model.simulation import trace_blocks
    from wavefront.point import SECTOR_BYTES
    from wavefront.report.analysis import validation_rows as capacity_rows
    lockstep = capacity_rows(study).set_index(["gpu", "family", "point"])["partitions"]
    out = []
    for family in TIMED_FAMILIES:
        points, first = _points(study, family)
        for r in points.itertuples():
            key = (r.gpu, family, r.point)
            if key in lockstep.index:
                lock = float(lockstep.loc[key])
            else:
                launch = launch_of_row(first.loc[(r.gpu, r.point)])
                res = l2_predictions_by_model(launch, preset_for_device(r.gpu),
                                              trace_blocks(launch))
                lock = float(res["partitions"].dram_read_sectors * SECTOR_BYTES)
            out.append({"gpu": r.gpu, "family": family, "point": r.point,
                        "lockstep_dram_bytes": lock})
    return pd.DataFrame(out)


def _fit_no_cache(launches, measured_ns, gpu: str, rounds: int = 3) -> Calibration:
    """The no-cache model's own compute costs (per-variant step, one item cost, one launch
    cost), by the timed calibration's non-negative least squares on relative error, its
    kernel time linearised by finite differences (the busiest CTA can change with the costs)."""
    from wavefront.model.timed import fit_compute_costs
    measured = np.asarray(measured_ns, np.float64)
    step, item, launch_ns, fitted = fit_compute_costs(no_cache_ns, launches, measured, rounds)
    err = np.abs(fitted - measured) / measured
    return Calibration(gpu, launch_ns, item, step, f"{TRAINING} (no-cache model)", len(launches),
                       {"median": float(np.median(err)), "max": float(err.max())})


def no_cache_calibrations(study) -> dict[str, Calibration]:
    """Per GPU: the no-cache model fitted on the timed model's training launches (the same
    points, the same least squares), so the baseline is as well calibrated as the clock."""
    points, first = _points(study, TRAINING)
    out = {}
    for gpu, g in points.groupby("gpu"):
        g = g[g["dram_read_bytes"] <= ABOVE_KNEE * g["compulsory_read_bytes"]]
        launches = [launch_of_row(first.loc[(gpu, p)]) for p in g["point"]]
        out[gpu] = _fit_no_cache(launches, g["median_ms"].to_numpy(float) * 1e6, gpu)
    return out


def baseline_rows(study) -> pd.DataFrame:
    """`validation_rows` with the two baselines' predictions beside the timed model's:
    `lockstep_dram_bytes` (lock-step rounds, partition LRU; cached, keyed by the data and the
    lock-step model's source) and `no_cache_ms` (the no-cache model, fitted on the same
    training set: `no_cache_calibrations`)."""
    from wavefront.model import fits as fits_module
    from wavefront.model import simulation as simulation_module
    inputs = [results_path(study.data_dir / f) for f in TIMED_FAMILIES]
    lock = cached_table(study, "lockstep_baselines",
                        inputs + [Path(simulation_module.__file__), Path(fits_module.__file__),
                                  Path(presets_module.__file__)],
                        lambda: _lockstep_table(study))
    rows = validation_rows(study).merge(lock, on=["gpu", "family", "point"], how="left")
    cals = no_cache_calibrations(study)
    firsts = {f: _points(study, f)[1] for f in TIMED_FAMILIES}
    rows["no_cache_ms"] = [
        no_cache_ns(launch, cals[g].compute(launch)) * 1e-6 for launch, g in
        ((launch_of_row(firsts[f].loc[(g, p)]), g) for g, f, p in
         zip(rows["gpu"], rows["family"], rows["point"]))]
    return rows


KNEE_SPLITS = ("above knee", "at compulsory")
# The clock beats the no-cache model on time where its median |error| is lower by at least
# this (half a percentage point: the time medians' own run-to-run spread is larger)
CLOCK_MARGIN = 0.005  # the headline line, and the line beside it


def _split_of(rows: pd.DataFrame) -> pd.Series:
    above = rows["measured_dram_bytes"] > ABOVE_KNEE * rows["compulsory_bytes"]
    return above.map({True: KNEE_SPLITS[0], False: KNEE_SPLITS[1]})


def honest_scores(study, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per GPU, family and split (above the knee: measured reads > ABOVE_KNEE x compulsory;
    at compulsory: the rest, where every cache model is near exact): |relative error| medians
    and MAPE of DRAM reads (timed vs lock-step) and of time (timed vs no-cache), and whether the
    clock beats the no-cache model on time (a median |error| lower by CLOCK_MARGIN or more)."""
    rows = baseline_rows(study) if rows is None else rows
    rows = rows.assign(split=_split_of(rows))
    out = []
    for (gpu, family, split), g in rows.groupby(["gpu", "family", "split"], sort=False):
        e = {name: ((g[col] - g[ref]) / g[ref]).abs() for name, col, ref in (
            ("timed DRAM", "predicted_dram_bytes", "measured_dram_bytes"),
            ("lock-step DRAM", "lockstep_dram_bytes", "measured_dram_bytes"),
            ("timed time", "predicted_ms", "measured_ms"),
            ("no-cache time", "no_cache_ms", "measured_ms"))}
        row = {"GPU": short_gpu(gpu), "family": family, "points": split, "n": len(g)}
        for name, v in e.items():
            row[f"{name} median"] = float(v.median())
            row[f"{name} MAPE"] = float(v.mean())
        gain = row["no-cache time median"] - row["timed time median"]
        row["clock vs no-cache on time"] = ("beats" if gain >= CLOCK_MARGIN else
                                            "loses" if gain <= -CLOCK_MARGIN else "ties")
        out.append(row)
    table = pd.DataFrame(out)
    order = {s: i for i, s in enumerate(KNEE_SPLITS)}
    return table.sort_values(["points", "GPU", "family"], key=lambda c: c.map(order)
                             if c.name == "points" else c, kind="stable").reset_index(drop=True)


def sawtooth_pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """Every measured linear/sawtooth pair of the validation rows (same GPU, family, point but
    for the scan): measured and predicted sawtooth/linear time and DRAM ratios (medians over
    repeats, not paired by round)."""
    rows = rows.assign(key=_scan_key(rows["point"]),
                       scan=np.where(rows["point"].str.contains("kv_schedule=sawtooth"),
                                     "sawtooth", np.where(rows["point"].str.contains(
                                         "kv_schedule=linear"), "linear", "")))
    keys = ["gpu", "family", "key"]
    both = rows[rows["scan"] == "linear"].merge(rows[rows["scan"] == "sawtooth"], on=keys,
                                                suffixes=("_lin", "_saw")).set_index(keys)
    out = pd.DataFrame({
        "measured_time_ratio": both["measured_ms_saw"] / both["measured_ms_lin"],
        "predicted_time_ratio": both["predicted_ms_saw"] / both["predicted_ms_lin"],
        "measured_dram_ratio": both["measured_dram_bytes_saw"] / both["measured_dram_bytes_lin"],
        "predicted_dram_ratio": (both["predicted_dram_bytes_saw"]
                                 / both["predicted_dram_bytes_lin"]),
        "causal": both["causal_lin"], "seqlen": both["seqlen_lin"],
        "schedule": both["schedule_lin"]}).reset_index()
    return out


def ratio_skill(pairs: pd.DataFrame) -> dict:
    """The time-ratio skill: Pearson and Spearman correlation of predicted vs measured
    sawtooth/linear time ratio over every pair, how many predicted ratios sit within 1% of 1,
    and the DRAM-ratio correlation beside it."""
    from scipy.stats import pearsonr, spearmanr
    m, p = pairs["measured_time_ratio"], pairs["predicted_time_ratio"]
    return {"pairs": len(pairs), "time pearson": float(pearsonr(m, p)[0]),
            "time spearman": float(spearmanr(m, p)[0]),
            "predicted within 1% of 1": int(((p - 1).abs() < 0.01).sum()),
            "measured within 1% of 1": int(((m - 1).abs() < 0.01).sum()),
            "DRAM pearson": float(pearsonr(pairs["measured_dram_ratio"],
                                           pairs["predicted_dram_ratio"])[0])}


def _scan_key(points: pd.Series) -> pd.Series:
    return points.str.replace("kv_schedule=sawtooth", "kv_schedule=@").str.replace(
        "kv_schedule=linear", "kv_schedule=@")


def _measured_pair_repeats(study) -> pd.DataFrame:
    """Per linear/sawtooth pair of the timed families and timing repeat: log(sawtooth/linear)
    of that repeat's kernel times (a sweep's repeat times both scans in one pass), with the
    pair's measured DRAM and ncu-duration ratios (medians of the counter repeats)."""
    out = []
    for family in TIMED_FAMILIES:
        df = study.load(family)
        df = df[(df["status"] == "ok") & df["kv_schedule"].isin(["linear", "sawtooth"])]
        df = df.assign(key=_scan_key(df["point"]))
        timing = df[df["measurement"] == "timing"]
        per = timing.pivot_table(index=["gpu", "key", "repeat"], columns="kv_schedule",
                                 values="median_ms").dropna()
        counters = df[df["measurement"] == "counters"].groupby(["gpu", "key", "kv_schedule"])[
            ["dram_read_bytes", "ncu_duration_ns"]].median().unstack("kv_schedule")
        ratios = pd.DataFrame({
            "dram_ratio": counters[("dram_read_bytes", "sawtooth")]
            / counters[("dram_read_bytes", "linear")],
            "ncu_duration_ratio": counters[("ncu_duration_ns", "sawtooth")]
            / counters[("ncu_duration_ns", "linear")]})
        log_ratio = np.log(per["sawtooth"] / per["linear"]).rename("log_time_ratio")
        out.append(log_ratio.reset_index().join(ratios, on=["gpu", "key"])
                   .assign(family=family))
    return pd.concat(out, ignore_index=True)


CEILING_RESAMPLES, CEILING_SEED = 1000, 0


def _ceiling(split_half_r: float) -> float:
    """A perfect predictor's largest correlation with a measurement whose halves correlate at
    `split_half_r`: the square root of the whole's reliability (Spearman-Brown, which assumes
    halves of equal size; with 3 repeats a pair's halves hold 2 and 1)."""
    whole = 2 * split_half_r / (1 + split_half_r) if split_half_r > -1 else 0.0
    return float(np.sqrt(whole)) if whole > 0 else 0.0


def measurement_ceiling(study) -> dict:
    """How well any model could track the measured sawtooth/linear time ratio, from the
    measurements alone: the split-half reliability of the ratio (each pair's even-numbered
    repeats against its odd-numbered ones, Spearman-Brown corrected to the whole median; its
    square root bounds a perfect predictor's correlation, Pearson and by ranks), and how far the
    ratio moves with the pair's own measured DRAM ratio and with its duration ratio under ncu
    (a second instrument timing the same two launches)."""
    from scipy.stats import pearsonr, spearmanr
    reps = _measured_pair_repeats(study)
    keys = ["gpu", "family", "key"]
    halves = reps.sort_values("repeat").groupby(keys).agg(
        repeats=("log_time_ratio", "size"),
        even=("log_time_ratio", lambda s: s.iloc[0::2].mean()),
        odd=("log_time_ratio", lambda s: s.iloc[1::2].mean()),
        median=("log_time_ratio", "median"),
        dram_ratio=("dram_ratio", "first"), ncu_duration_ratio=("ncu_duration_ratio", "first"))
    halves = halves[halves["repeats"] >= 2]
    out = {"pairs": len(halves), "repeats median": float(halves["repeats"].median())}
    rng = np.random.default_rng(CEILING_SEED)
    draws = [rng.integers(0, len(halves), len(halves)) for _ in range(CEILING_RESAMPLES)]
    even, odd = halves["even"].to_numpy(), halves["odd"].to_numpy()
    for name, corr in (("pearson", pearsonr), ("spearman", spearmanr)):
        r = float(corr(even, odd)[0])
        out[f"split-half {name}"] = r
        out[f"ceiling {name}"] = _ceiling(r)
        # over pairs resampled with replacement: the ceiling's own 95% interval
        spread = [_ceiling(float(corr(even[i], odd[i])[0])) for i in draws]
        out[f"ceiling {name} 95%"] = [float(np.percentile(spread, 2.5)),
                                      float(np.percentile(spread, 97.5))]
    both = halves.dropna(subset=["dram_ratio", "ncu_duration_ratio"])
    out["time vs DRAM ratio pearson"] = float(pearsonr(both["median"],
                                                       np.log(both["dram_ratio"]))[0])
    out["time vs ncu duration ratio pearson"] = float(pearsonr(
        both["median"], np.log(both["ncu_duration_ratio"]))[0])
    out["ncu duration vs DRAM ratio pearson"] = float(pearsonr(
        np.log(both["ncu_duration_ratio"]), np.log(both["dram_ratio"]))[0])
    out["pairs with counters"] = len(both)
    return out


# ---------------------------------------------------------------------------------------------
# Time-resolved: PM sampling's DRAM series against the simulated one
# ---------------------------------------------------------------------------------------------

# The four launches of the issue, as `wavefront timeline` labelled them
SAMPLED_LAUNCHES = ("today-linear-r0", "causal-longest-first", "grouped-dynamic",
                    "paper-launch-48ctas")
SAMPLED_SERIES = "pmsampling:dram__bytes_read.sum"
SERIES_POINTS = 50  # both series resampled to this many points of the launch's duration


def _sampled_records(study) -> list[dict]:
    from wavefront.results.records import TIMELINE_RECORDS
    records = [r for rs in study.records(TIMELINE_RECORDS, "kernel_drift_timeline",
                                         "timeline.jsonl").values() for r in rs]
    return [r for r in records if r["launch"].get("label") in SAMPLED_LAUNCHES
            and SAMPLED_SERIES in r["series"] and r["package"].endswith("/wavefront")]


def _cumulative(t, values, points: int) -> np.ndarray:
    """The fraction of the launch's DRAM reads done by each of `points` equal fractions of
    its duration."""
    t = np.asarray(t, float)
    c = np.cumsum(np.asarray(values, float))
    if c[-1] <= 0:
        return np.zeros(points)
    grid = np.linspace(0, 1, points + 1)[1:] * (t[-1] if t[-1] > 0 else 1)
    return np.interp(grid, t, c / c[-1])


def _series_table(study) -> pd.DataFrame:
    cals = calibrations(study)
    rows = []
    for rec in _sampled_records(study):
        L = rec["launch"]
        preset, memory = _memory(rec["gpu"])
        cal = cals.get(rec["gpu"])
        if cal is None:
            continue
        sms = preset.sms
        launch = plan((L["batch"], L["heads"], L["seqlen"], L["head_dim"]),
                      (L["batch"], L["kv_heads"], L["seqlen"], L["head_dim"]), sms=sms,
                      l2_bytes=preset.l2_bytes, causal=L["causal"], schedule=L["schedule"],
                      tiles=L["tiles"], occupancy=L["occupancy"], ctas=L["ctas"])
        compute = cal.compute(launch)
        pred = simulate_timed(launch, memory, compute, l2_bytes=preset.l2_bytes,
                              partitions=preset.l2_partitions)
        s = rec["series"][SAMPLED_SERIES]
        start, rate = pred.dram_rate_series(pred.bin_ns)
        measured = _cumulative(s["t"], s["values"], SERIES_POINTS)
        predicted = _cumulative(start + pred.bin_ns, rate * pred.bin_ns, SERIES_POINTS)
        for k in range(SERIES_POINTS):
            rows.append({"gpu": rec["gpu"], "launch": L["label"],
                         "fraction of launch": (k + 1) / SERIES_POINTS,
                         "measured": measured[k], "predicted": predicted[k],
                         "measured_total_bytes": float(rec["totals"]["dram__bytes_read.sum"]),
                         "predicted_total_bytes": pred.dram_read_bytes})
    return pd.DataFrame(rows)


def series_comparison(study) -> pd.DataFrame:
    """For the four sampled launches on each GPU: the cumulative fraction of DRAM reads over
    the launch's duration, measured (PM sampling, cold L2, ncu's locked clocks) and
    simulated, at SERIES_POINTS fractions of the duration, with both totals (cached)."""
    inputs = [study.data_dir / "kernel_drift_timeline" / "timeline.jsonl.gz",
              results_path(study.data_dir / TRAINING), *_model_files()]
    return cached_table(study, "timed_series", inputs, lambda: _series_table(study))


# ---------------------------------------------------------------------------------------------
# Predictions for unmeasured GPUs, and the advisor on held-out shapes
# ---------------------------------------------------------------------------------------------

# The fast end of a projected step time's interval: the fraction of peak FA2 reaches on GB10
# (93-95 of 125 TFLOP/s, FlashInfer PR 3897). The slow end (the point prediction) is the
# fraction our kernel reaches on the H100 at the same variant.
FA2_FRACTION_OF_PEAK = 0.75

# Each prediction is also simulated with the calibration's per-item cost moved by a few parts
# in 10^15 (k x this, for k in CALIBRATION_NUDGES): event times that tie decide which CTA's
# request reaches the L2 first, so a prediction can move with digits no fit can claim. The
# spread is printed beside the prediction (scripts/timed_sensitivity.py sweeps further).
CALIBRATION_NUDGE = 1e-15
CALIBRATION_NUDGES = (-2, -1, 1, 2)


# GB10 is calibrated on the paper's own linear baseline instead (gb10_postdiction)
PREDICTED_PRESETS = ("b200",)
PREDICTED_SCHEDULES = ("persistent+linear", "persistent+sawtooth")


def h100_calibration(study) -> Calibration:
    """The H100's compute calibration, from which the predictions are projected."""
    return next(c for g, c in calibrations(study).items()
                if preset_for_device(g) == PRESETS["h100"])


def paper_launch_on(gpu, causal: bool, schedule: str) -> Launch:
    """The paper's launch (PAPER_LAUNCH, one persistent CTA per SM) on preset `gpu`."""
    shape = (PAPER_LAUNCH["batch"], PAPER_LAUNCH["heads"], PAPER_LAUNCH["seqlen"],
             PAPER_LAUNCH["head_dim"])
    return plan(shape, shape, sms=gpu.sms, l2_bytes=gpu.l2_bytes, causal=causal,
                schedule=schedule, tiles=PAPER_LAUNCH["tiles"], occupancy=1, ctas=gpu.sms)


def nudged_prediction(calibration: Calibration, gpu, launch: Launch, fraction, k: int = 0,
                      nudge: float = CALIBRATION_NUDGE):
    """-> (the timed simulation of `launch` on preset `gpu`, its compute timing): compute
    projected from `calibration` (at `fraction` of `gpu`'s peak, or at the calibration's own
    fraction where None), its item_ns x (1 + k x nudge)."""
    nudged = dataclasses.replace(calibration, item_ns=calibration.item_ns * (1 + k * nudge))
    compute = projected_compute(nudged, PRESETS["h100"], gpu, launch, fraction)
    return simulate_timed(launch, memory_timing(gpu), compute, l2_bytes=gpu.l2_bytes,
                          partitions=gpu.l2_partitions), compute


def _prediction_rows(study) -> pd.DataFrame:
    h100 = h100_calibration(study)
    rows = []
    for key in PREDICTED_PRESETS:
        gpu = PRESETS[key]
        for causal in (False, True):
            for schedule in PREDICTED_SCHEDULES:
                launch = paper_launch_on(gpu, causal, schedule)
                flops = launch_counts(launch.problem).useful_flops
                row = {"preset": key, "gpu": gpu.name, "causal": causal,
                       "schedule": schedule, "ctas": gpu.sms}
                for suffix, fraction in (("", None), ("_fast", FA2_FRACTION_OF_PEAK)):
                    reads, tflops = [], []
                    for k in (0, *CALIBRATION_NUDGES):
                        pred, compute = nudged_prediction(h100, gpu, launch, fraction, k)
                        reads.append(pred.dram_read_bytes / 1e9)
                        tflops.append(flops / pred.kernel_ns * 1e-3)
                        if k == 0 and not suffix:
                            row.update(step_ns=compute.step_ns, compute=compute.source)
                    row.update({f"dram_read_gb{suffix}": reads[0], f"tflops{suffix}": tflops[0],
                                f"dram_read_gb{suffix}_min": min(reads),
                                f"dram_read_gb{suffix}_max": max(reads),
                                f"tflops{suffix}_min": min(tflops),
                                f"tflops{suffix}_max": max(tflops)})
                rows.append(row)
    return pd.DataFrame(rows)


def predictions(study) -> pd.DataFrame:
    """The paper's launch (B8 H1 S128k D64, 64x64 tiles, one persistent CTA per SM) on the
    PREDICTED_PRESETS (B200), causal and not, linear and sawtooth: DRAM reads and TFLOP/s from the timed
    model, the compute projected from the H100's calibration at its own fraction of peak (the
    point prediction), and at FA2_FRACTION_OF_PEAK (the interval's fast end; columns `_fast`),
    each with its range over the calibration's nudges (`_min`, `_max`) (cached)."""
    inputs = [*model_inputs(study), Path(__file__)]
    return cached_table(study, "timed_predictions", inputs, lambda: _prediction_rows(study))


ADVISED_FAMILY = "ablation"  # its shapes each ran every schedule and tile shape: held out


def advisor_check(study) -> pd.DataFrame:
    """Per GPU and ablation shape (held out: not in the training set): the configuration the
    timed model ranks fastest, the measured fastest, and the pick's measured time against the
    best's (1.0: the model picked the best)."""
    rows = validation_rows(study)
    rows = rows[rows["family"] == ADVISED_FAMILY]
    _, first = _points(study, ADVISED_FAMILY)
    out = []
    for gpu, g in rows.groupby("gpu"):
        keys = [first.loc[(gpu, p)] for p in g["point"]]
        shape = [f"B{int(r['batch'])} H{int(r['heads'])} S{int(r['seqlen']) // 1024}k "
                 f"D{int(r['head_dim'])} {'causal' if r['causal'] else 'non-causal'}"
                 for r in keys]
        tiles = [f"{int(r['tile_m'])}x{int(r['tile_n'])}" for r in keys]
        g = g.assign(shape=shape, config=[f"{s} {t}" for s, t in zip(g["schedule"], tiles)])
        for sh, s in g.groupby("shape", sort=False):
            pick = s.loc[s["predicted_ms"].idxmin()]
            best = s.loc[s["measured_ms"].idxmin()]
            out.append({"GPU": short_gpu(gpu), "shape": sh, "configurations": len(s),
                        "advised": pick["config"], "measured best": best["config"],
                        "advised / best, measured time": pick["measured_ms"]
                        / best["measured_ms"]})
    return pd.DataFrame(out)


# `wavefront tune`'s searches measured every lever-free configuration (schedule x tiles x CTAs
# per SM) of their shapes in one interleaved bench: a measured best the model never saw
TUNE_DATASET, TUNE_FOLDED, TUNE_LOOSE = "tune", "tune_runs.jsonl", "*/tune.jsonl"


def _lever_free(levers: dict) -> bool:
    from wavefront.point import KERNEL_LEVERS
    return all(levers.get(name, default) == default for name, default in KERNEL_LEVERS.items())


def _tuned_candidates(study) -> pd.DataFrame:
    from wavefront.results.records import TUNE_RECORDS
    rows = []
    for source, records in study.folded_records(TUNE_RECORDS, TUNE_DATASET, TUNE_FOLDED,
                                                TUNE_LOOSE).items():
        for r in records:
            lev, sh = r.get("levers") or {}, r["shape"]
            if r.get("not_timed") or not r.get("tflops") or not lev.get("tiles"):
                continue
            rows.append({"search": source.split("/")[0], "gpu": r["gpu"],
                         "batch": int(sh["batch"]), "heads": int(sh["heads"]),
                         "kv_heads": int(sh.get("kv_heads") or sh["heads"]),
                         "seqlen": int(sh["seqlen"]), "head_dim": int(sh["head_dim"]),
                         "causal": bool(sh["causal"]), "schedule": lev["schedule"],
                         "tiles": lev["tiles"], "occupancy": lev.get("occupancy"),
                         "lever_free": _lever_free(lev), "tflops": float(r["tflops"])})
    return pd.DataFrame(rows)


def _advisor_tuned_rows(study) -> pd.DataFrame:
    cands = _tuned_candidates(study)
    cals = calibrations(study)
    trained = {(int(r["batch"]), int(r["heads"]), int(r["seqlen"]), int(r["head_dim"]))
               for _, r in _points(study, TRAINING)[1].iterrows()}
    shape_cols = ["gpu", "batch", "heads", "kv_heads", "seqlen", "head_dim", "causal"]
    out = []
    for key, g in cands.groupby(shape_cols):
        gpu, b, h, kv, sq, d, causal = key
        # a configuration measured by several searches: the median of their TFLOP/s
        free = (g[g["lever_free"]].fillna({"occupancy": 0})
                .groupby(["schedule", "tiles", "occupancy"], as_index=False)["tflops"].median()
                .sort_values("tflops", ascending=False))
        if len(free) < 2 or gpu not in cals:
            continue
        preset, memory = _memory(gpu)
        predicted, names = [], []
        for r in free.itertuples():
            occ = int(r.occupancy) or None  # 0: the tile's default
            try:
                launch = plan((b, h, sq, d), (b, kv, sq, d), sms=preset.sms,
                              l2_bytes=preset.l2_bytes, causal=causal, schedule=r.schedule,
                              tiles=r.tiles, occupancy=occ)
            except ValueError:
                predicted.append(np.nan)
                names.append("")
                continue
            compute = cals[gpu].compute(launch)
            pred = (simulate_timed(launch, memory, compute, l2_bytes=preset.l2_bytes,
                                   partitions=preset.l2_partitions).kernel_ns
                    if compute is not None else np.nan)
            predicted.append(pred)
            names.append(f"{r.schedule} {r.tiles} {launch.ctas_per_sm}/SM"
                         + (" (projected)" if compute is not None
                            and compute.source.startswith("PROJECTED") else ""))
        free = free.assign(predicted_ns=predicted, config=names).dropna(subset=["predicted_ns"])
        if len(free) < 2:
            continue
        pick = free.loc[free["predicted_ns"].idxmin()]
        best = free.iloc[0]
        out.append({"gpu": gpu, "shape": f"B{b} {'H' + str(h) if kv == h else f'H{h}/KV{kv}'} "
                    f"S{sq // 1024}k D{d} {'causal' if causal else 'non-causal'}",
                    "in_training_shapes": (b, h, sq, d) in trained,
                    "configurations": len(free), "advised": pick["config"],
                    "measured_best": best["config"],
                    "advised_of_best": pick["tflops"] / best["tflops"],
                    # what a pick at random would reach on average: the bar the model must clear
                    "random_of_best": float((free["tflops"] / best["tflops"]).mean()),
                    "lever_free_of_best_with_levers": best["tflops"] / g["tflops"].max()})
    return pd.DataFrame(out)


def advisor_tuned_check(study) -> pd.DataFrame:
    """Per GPU and shape `wavefront tune` searched: among its measured lever-free
    configurations, the one the timed model ranks fastest against the measured fastest
    (advised_of_best: the pick's measured TFLOP/s over the best's); and how much of the search's
    best (with levers) the best lever-free configuration reached. Shapes of the training set
    (step_time: B1 H32 S2k/S8k) are flagged: the launches differ but the shape was seen
    (cached)."""
    inputs = [results_path(study.data_dir / TRAINING), *_model_files(), Path(__file__),
              *sorted((study.data_dir / TUNE_DATASET).glob("*.jsonl*")),
              *sorted((study.data_dir / TUNE_DATASET).glob(TUNE_LOOSE + "*"))]
    return cached_table(study, "advisor_tuned", inputs, lambda: _advisor_tuned_rows(study))


# ---------------------------------------------------------------------------------------------
# Predictions for issue 49's exposure regimes, written before they are measured
# ---------------------------------------------------------------------------------------------

MiB = 1 << 20
# (a) the L2 left to the attention (MiB) when a co-runner holds the rest with persisting lines
L2_LEFT_MIB = {"h100": (50, 40, 32, 24, 16), "h200": (60, 48, 32, 24)}
# (b) a co-runner's DRAM traffic (reads + writes), its lines allocating normally (1) or
# streaming past the L2 (0: evict-first / no-allocate)
CORUNNER_TB_S = (0.5, 1.0, 2.0, 2.5)
CORUNNER_L2_FRACTIONS = (1.0, 0.0)
# (c) the K/V pipeline depth
DEPTHS = (1, 2)
# The paper launch's binary (D64 64x64 non-causal, occupancy 1): its K/V rings as tileiras
# 13.4 compiled them (data/kv_pipeline), 6 K stages and 3 V stages: 3 steps ahead
PAPER_LAUNCH_DEPTH = 3


def exposure_regimes(gpu_key: str) -> list[dict]:
    """Issue 49's regimes on one GPU preset: name, parameters, as `exposure_prediction` takes."""
    gpu = PRESETS[gpu_key]
    full = gpu.l2_bytes // MiB
    out = [{"regime": "baseline", "value": "", "depth": PAPER_LAUNCH_DEPTH,
            "exposure": timed_module.NO_EXPOSURE}]
    for left in L2_LEFT_MIB[gpu_key]:
        if left >= full:
            continue
        out.append({"regime": "a: L2 left (MiB)", "value": left, "depth": PAPER_LAUNCH_DEPTH,
                    "exposure": timed_module.Exposure(l2_bytes_taken=(full - left) * MiB)})
    for fraction in CORUNNER_L2_FRACTIONS:
        for tb in (CORUNNER_TB_S if fraction == 1 else CORUNNER_TB_S[-1:]):
            out.append({"regime": f"b: co-runner DRAM (TB/s), L2 fraction {fraction:g}",
                        "value": tb, "depth": PAPER_LAUNCH_DEPTH,
                        "exposure": timed_module.Exposure(corunner_dram_bytes_per_s=tb * 1e12,
                                                          corunner_l2_fraction=fraction)})
    for depth in DEPTHS:
        out.append({"regime": "c: K/V steps in flight", "value": depth, "depth": depth,
                    "exposure": timed_module.NO_EXPOSURE})
    return out


def exposure_prediction(study, gpu_key: str, regime: dict, causal: bool = False) -> dict:
    """One regime on one GPU: linear and sawtooth at the paper's launch (48 persistent CTAs,
    occupancy 1; the regime's "tiles" where it names them) with the GPU's own calibration -> the
    prediction row."""
    gpu = PRESETS[gpu_key]
    cal = next(c for g, c in calibrations(study).items() if preset_for_device(g) == gpu)
    memory = memory_timing(gpu)
    shape_rest = (PAPER_LAUNCH["heads"], PAPER_LAUNCH["seqlen"], PAPER_LAUNCH["head_dim"])
    row = {"gpu": gpu_key, "causal": causal, "regime": regime["regime"],
           "value": regime["value"], "kv_steps_in_flight": regime["depth"]}
    e = regime["exposure"]
    row.update(l2_left_mib=(gpu.l2_bytes - e.l2_bytes_taken) / MiB,
               corunner_dram_tb_s=e.corunner_dram_bytes_per_s / 1e12,
               corunner_l2_fraction=e.corunner_l2_fraction if e.corunner_dram_bytes_per_s
               else np.nan, loaded_dram_ns=e.loaded_dram_ns(memory))
    for schedule in PREDICTED_SCHEDULES:
        # The 48 CTAs sweep the batch's heads one after the other, each head like the last
        # once the first has warmed the L2: B=8 is extrapolated from B=1 and B=2 (X8 = X2 +
        # 6 (X2 - X1)), a third of the simulation (checked against B=8 in the tests)
        at = {}
        for batch in (1, 2):
            shape = (batch, *shape_rest)
            launch = plan(shape, shape, sms=gpu.sms, l2_bytes=gpu.l2_bytes, causal=causal,
                          schedule=schedule, tiles=regime.get("tiles", PAPER_LAUNCH["tiles"]),
                          occupancy=1,
                          ctas=PAPER_LAUNCH_CTAS)
            # a measured binary's K and V rings where the regime names them; else the
            # joint pipeline `depth` steps ahead (the depth regimes sweep it)
            pipeline = ({"kv_stages": regime["stages"]} if regime.get("stages") else
                        {"loads_ahead": regime["depth"]})
            pred = simulate_timed(launch, memory, cal.compute(launch), l2_bytes=gpu.l2_bytes,
                                  partitions=gpu.l2_partitions, exposure=e, **pipeline)
            at[batch] = (pred.kernel_ns * 1e-6, pred.dram_read_bytes / 1e9)
        scan = schedule.split("+")[1]
        extra = PAPER_LAUNCH["batch"] - 2
        row[f"{scan}_ms"] = at[2][0] + extra * (at[2][0] - at[1][0])
        row[f"{scan}_dram_read_gb"] = at[2][1] + extra * (at[2][1] - at[1][1])
    row["time_ratio"] = row["sawtooth_ms"] / row["linear_ms"]
    row["speedup"] = row["linear_ms"] / row["sawtooth_ms"] - 1
    row["dram_ratio"] = row["sawtooth_dram_read_gb"] / row["linear_dram_read_gb"]
    return row


# ---------------------------------------------------------------------------------------------
# Skill over the regimes: every configuration of experiments/regimes.py with a prediction
# ---------------------------------------------------------------------------------------------

REGIME_DIRS = ("exposure_corunners", "exposure_small_l2", "exposure_latency")
# PTX cache policies whose lines allocate in the L2 like any (the co-runner's bytes then stream
# through the attention's LRU); the others (cs, evict_first, no_allocate, cg, wt) are treated
# as passing by
ALLOCATING = ("wb", "ca", "evict_last")
PAPER_VARIANT = "64x64 (paper)"


def _corunner_exposure(rates: pd.DataFrame, gpu: str, mask: str, environment: str):
    """The timed model's Exposure for a measured co-runner: its DRAM bytes/s as counted (and
    checked against ncu), allocating in the L2 where its loads or stores do."""
    from wavefront.model.timed import Exposure
    r = rates[(rates["GPU"] == gpu) & (rates["mask"] == mask)
              & (rates["environment"] == environment)]
    if not len(r) or not bool(r["trusted"].iloc[0]):
        return None
    policies = [t.split(".", 1)[1] for t in environment.split() if t[:3] in ("ld.", "st.")]
    allocates = any(p in ALLOCATING for p in policies)
    return Exposure(corunner_dram_bytes_per_s=float(r["co-runner GB/s"].iloc[0]) * 1e9,
                    corunner_l2_fraction=1.0 if allocates else 0.0)


def _regime_rows(study, conf: pd.DataFrame, rates: pd.DataFrame) -> pd.DataFrame:
    """Every configuration of regimes f, g, h (co-runners, L2 held, K/V depth) the timed model
    can be set up for, predicted with the same calibration (K and V rings per variant read
    from its SASS, data/exposure_latency/pipeline.json), beside its measured speed-up and interval;
    and every configuration of regimes c, d, e (today's validation families) from the held-out
    validation's linear/sawtooth pairs."""
    import re

    from wavefront.files import read_json
    from wavefront.model.timed import Exposure
    pairs = sawtooth_pairs(validation_rows(study))
    pairs = pairs.assign(GPU=pairs["gpu"].map(short_gpu))
    # regimes c-e are families of the held-out validation: their pairs' predictions
    family = {"c": "dram_bound", "d": "causal_gqa", "e": "ctas_in_flight"}
    variants = read_json(study.data_dir / "exposure_latency" / "pipeline.json",
                         "pipeline record")["variants"]
    depth = {k: v["loads_ahead"] for k, v in variants.items()}
    stages = {k: (int(v["k_stages"]), int(v["v_stages"])) for k, v in variants.items()}
    out = []
    for r in conf.itertuples():
        gpu_key = r.GPU.lower()
        variant, env, mask = PAPER_VARIANT, None, "non-causal"
        if r.regime in ("f", "g"):
            mask, env = (x.strip() for x in r.configuration.split(",", 1))
        elif r.regime == "h":
            variant, env = (x.strip() for x in r.configuration.rsplit(",", 1))
        elif r.regime in family:
            p = pairs[(pairs["family"] == family[r.regime]) & (pairs["GPU"] == r.GPU)]
            if r.regime == "c":
                heads, cta = r.configuration.split(", ")
                p = p[p["key"].str.contains(f"heads={heads[1:]},", regex=False)
                      & p["key"].str.contains(f"cta_schedule={cta},", regex=False)]
            elif r.regime == "d":
                p = p[p["key"].str.contains(f"cta_schedule={r.configuration},", regex=False)]
            else:
                p = p[p["key"].str.endswith(f"resident_ctas={r.configuration.split()[0]}")]
            if len(p) == 1:
                out.append({"source": f"regime {r.regime}: held-out validation",
                            "regime": r.regime, "GPU": r.GPU, "configuration": r.configuration,
                            "measured": r.ratio - 1, "lo": r.lo - 1, "hi": r.hi - 1,
                            "predicted": 1 / p["predicted_time_ratio"].iloc[0] - 1,
                            "kv_steps_in_flight": np.nan})
            continue
        else:
            continue
        if variant not in depth or gpu_key not in ("h100", "h200"):
            continue
        held = re.match(r"held ([\d.]+) MiB|([\d.]+) MiB held", env)  # (h's and g's words)
        if env in ("alone", "none"):
            exposure = Exposure()
        elif held:
            exposure = Exposure(l2_bytes_taken=int(float(held.group(1) or held.group(2)) * MiB))
        else:
            exposure = _corunner_exposure(rates, r.GPU, mask, env)
        if exposure is None:
            continue
        tiles = variant.split()[0]
        regime = {"regime": r.regime, "value": r.configuration, "depth": depth[variant],
                  "stages": stages[variant], "exposure": exposure, "tiles": tiles}
        pred = exposure_prediction(study, gpu_key, regime, causal=mask == "causal")
        out.append({"source": "regimes f-h (simulated)", "regime": r.regime, "GPU": r.GPU,
                    "configuration": r.configuration, "measured": r.ratio - 1,
                    "lo": r.lo - 1, "hi": r.hi - 1, "predicted": pred["speedup"],
                    "kv_steps_in_flight": depth[variant]})
    return pd.DataFrame(out)


def regime_predictions(study, conf: pd.DataFrame, rates: pd.DataFrame) -> pd.DataFrame:
    """`_regime_rows` for the regimes' configurations (`conf`: experiments/regimes.py's
    `configurations`) and the co-runners' rates (`rates`: exposure_corunners' table), cached
    (keyed by the regimes' data, the validation's, the model and this file)."""
    inputs = [p for d in REGIME_DIRS for p in sorted((study.data_dir / d).glob("*"))
              if p.is_file()]
    inputs += [results_path(study.data_dir / f) for f in (TRAINING, *TIMED_FAMILIES)]
    return cached_table(study, "regime_predictions",
                        inputs + [*_model_files(), Path(__file__)],
                        lambda: _regime_rows(study, conf, rates))


PAPER_LAUNCH_CTAS = 48  # the paper's GB10 launch: one persistent CTA per SM of its 48


# ---------------------------------------------------------------------------------------------
# GB10 from the paper's own baseline: its linear throughput calibrates the step, sawtooth's
# gain is then a postdiction
# ---------------------------------------------------------------------------------------------

# Zhu et al.'s cuTile results at their launch (B8 H1 S128k D64, 64x64 tiles, one static
# persistent CTA per SM, 48 CTAs), TFLOP/s, linear -> sawtooth, per mask (causal: True)
PAPER_GB10_TFLOPS = {False: (61.0, 69.0), True: (41.0, 66.0)}
PAPER_GB10_SOURCE = ("arXiv 2601.16032v1, section 4 (cuTile, static persistent schedule), as "
                     "quoted by two independent reading notes of the full paper (public GitHub "
                     "notes; one cites the paper's lines); the paper's own text is stored here "
                     "only up to its introduction, so the four numbers are not checked against "
                     "it")
# The same launch's non-causal L2 misses, linear -> sawtooth (32-byte sectors), from one of the
# two notes; 1 - 120/370 = 68% is the abstract's "up to 67%" (cuTile). Causal: not given.
PAPER_GB10_MISS_SECTORS = {False: (370e6, 120e6), True: None}
# The K/V steps in flight of the GB10 binary. The sm_121 cubin of the paper's variant compiles
# here (tileiras 13.4) but is not the warp-specialised form `model.pipeline` reads: one loop
# issues the TMA loads and the mma.sync (HMMA) itself, software-pipelined over two-stage
# barrier rings. So the depth is our sm_90 binary's (3 non-causal, 2 causal); the postdiction
# is the same at 2 and 3 (checked: gb10_postdiction(depth=2)), and one step in flight is
# bounded out by the chip's peak (`gb10_postdictions`' step_ns_one_in_flight).
GB10_DEPTH = {False: 3, True: 2}


def _gb10_run(study, causal: bool, schedule: str, step_ns: float, depth: int | None = None):
    gpu = PRESETS["gb10"]
    launch = paper_launch_on(gpu, causal, schedule)
    base = projected_compute(h100_calibration(study), PRESETS["h100"], gpu, launch)
    compute = dataclasses.replace(base, step_ns=step_ns, source="calibrated on the paper's "
                                  "linear throughput")
    pred = simulate_timed(launch, memory_timing(gpu), compute, l2_bytes=gpu.l2_bytes,
                          partitions=gpu.l2_partitions,
                          loads_ahead=depth or GB10_DEPTH[causal])
    return pred, launch_counts(launch.problem).useful_flops / pred.kernel_ns * 1e-3


def gb10_postdiction(study, causal: bool, *, tolerance: float = 0.005, max_runs: int = 8,
                     progress=None, depth: int | None = None) -> dict:
    """The GB10 step time at which the simulated linear launch reaches the paper's linear
    TFLOP/s (secant on the step time, within `tolerance`), then sawtooth at that step:
    predicted against the paper's sawtooth TFLOP/s and gain."""
    linear_tflops, saw_tflops = PAPER_GB10_TFLOPS[causal]
    depth = depth or GB10_DEPTH[causal]
    steps, tf = [], []
    step = 1500.0
    for _ in range(max_runs):
        _, t = _gb10_run(study, causal, "persistent+linear", step, depth)
        steps.append(step)
        tf.append(t)
        if progress:
            progress(f"GB10 {'causal' if causal else 'non-causal'} step {step:.0f} ns -> "
                     f"{t:.1f} TFLOP/s (paper {linear_tflops:.0f})")
        if abs(t / linear_tflops - 1) < tolerance:
            break
        if len(steps) == 1:  # time ~ step: scale the step by the throughput ratio
            step = step * t / linear_tflops
        else:  # secant on 1/TFLOP/s (the time), which is near affine in the step
            y0, y1 = 1 / tf[-2] - 1 / linear_tflops, 1 / tf[-1] - 1 / linear_tflops
            step = steps[-1] - y1 * (steps[-1] - steps[-2]) / (y1 - y0) if y1 != y0 else step
            step = max(step, 1.0)
    linear_pred, _ = _gb10_run(study, causal, "persistent+linear", steps[-1], depth)
    saw_pred, saw_t = _gb10_run(study, causal, "persistent+sawtooth", steps[-1], depth)
    misses = PAPER_GB10_MISS_SECTORS[causal]
    gpu = PRESETS["gb10"]
    p = paper_launch_on(gpu, causal, "persistent+linear").problem
    return {"causal": causal, "step_ns": steps[-1], "calibration_runs": len(steps),
            "linear_tflops_paper": linear_tflops, "linear_tflops_model": tf[-1],
            "sawtooth_tflops_paper": saw_tflops, "sawtooth_tflops_model": saw_t,
            "gain_paper": saw_tflops / linear_tflops - 1, "gain_model": saw_t / tf[-1] - 1,
            "linear_dram_gb": linear_pred.dram_read_bytes / 1e9,
            "sawtooth_dram_gb": saw_pred.dram_read_bytes / 1e9,
            "linear_dram_gb_paper": misses[0] * SECTOR_BYTES / 1e9 if misses else np.nan,
            "sawtooth_dram_gb_paper": misses[1] * SECTOR_BYTES / 1e9 if misses else np.nan,
            # the step at the chip's peak: no calibration can honestly go below it
            "step_ns_at_peak": 4.0 * p.tile_m * p.tile_n * p.head_dim / (
                gpu.peak_bf16_flops / gpu.sms) * 1e9,
            "kv_steps_in_flight": depth, "source": PAPER_GB10_SOURCE}


def _gb10_rows(study) -> pd.DataFrame:
    rows = []
    for causal in (False, True):
        row = gb10_postdiction(study, causal)
        one = gb10_postdiction(study, causal, depth=1)  # a bound, not a second prediction
        row.update(step_ns_one_in_flight=one["step_ns"], gain_one_in_flight=one["gain_model"])
        rows.append(row)
    return pd.DataFrame(rows)


def gb10_postdictions(study) -> pd.DataFrame:
    """`gb10_postdiction` for both masks, each with the step the calibration would need with
    one K/V step in flight (against `step_ns_at_peak`: below it, that depth cannot give the
    paper's linear throughput) (cached in data/model_cache, keyed by the training set and the
    model's source)."""
    inputs = [*model_inputs(study), Path(__file__)]
    return cached_table(study, "gb10_postdiction", inputs, lambda: _gb10_rows(study))
