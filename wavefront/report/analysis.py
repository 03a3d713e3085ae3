"""The models against the measured data: what the figures, the tables and the draft are made of.

`Study` loads `data/` (a directory given to it, not found from this file) and computes each
expensive result once (miss curves, capacity and throughput fits), so the paper and every
experiment's `plot` draw from the same numbers.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from wavefront import files
from wavefront.model.fits import (
    CapacityFit,
    schedule_of,
    above_knee,
    l2_predictions_by_model,
    validation_errors,
    MissCurves,
    ThroughputFit,
    error_table,
    fit_capacity,
    fit_throughput,
    knee,
    launch_of_row,
    predict,
)
from wavefront.model.presets import gpu_preset, preset_for_device
from wavefront.model.simulation import trace_blocks
from wavefront.point import SECTOR_BYTES
from wavefront.report.figures import short_gpu
from wavefront.results.measurement import SPREAD_FLAG, SPREAD_FLAG_TEXT, spread
from wavefront.results.records import RecordKind
from wavefront.results.store import (SchemaError, load_results, read_manifest,
                                     read_results_bytes, results_path, with_timing,
                                     write_csv_gz)

# Experiments with counters and timing for the same points: the throughput model's data. Only
# data measured with today's (table-driven) kernel: the first kernel's data sets
# stay out of every current fit and score (a test checks the manifests).
TIMED_EXPERIMENTS = ("schedules_vs_seqlen", "knee", "ablation", "tile_size", "dram_bound",
                     "headline")


def counters(df):
    return df[df["measurement"] == "counters"].copy()


def medians(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (GPU, point): the median over its repeats of every numeric column."""
    numeric = [c for c in rows.columns if pd.api.types.is_float_dtype(rows[c])]
    first = rows.drop_duplicates(["gpu", "point"]).set_index(["gpu", "point"])
    med = rows.groupby(["gpu", "point"])[numeric].median()
    return first.drop(columns=numeric).join(med).reset_index()


def paired_repeat_ratios(df: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Sawtooth's TFLOP/s over linear's per `keys` and sweep repeat: a sweep's repeat times
    every point once, in one pass, so the two scans of one repeat ran side by side (NaN where
    a configuration has only one of the scans)."""
    t = timing(df)
    per = t.pivot_table(index=[*keys, "repeat"], columns="kv_schedule", values="tflops")
    return per["sawtooth"] / per["linear"]


def sawtooth_vs_linear_by_repeat(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Sawtooth's TFLOP/s over linear's per `keys` (say GPU and heads), paired by repeat
    (`paired_repeat_ratios`). -> per `keys`: the median, min and max of the per-repeat
    ratios, and how many."""
    return paired_repeat_ratios(df, keys).groupby(keys).agg(["median", "min", "max", "count"])


def speed_change(r) -> dict:
    """One row of `sawtooth_vs_linear_by_repeat` as a table's columns: the median change
    (ratio - 1), its range over the repeats, and how many repeats."""
    return {"TFLOP/s, sawtooth vs linear": r["median"] - 1, "lo": r["min"] - 1,
            "hi": r["max"] - 1, "repeats": int(r["count"])}


def timing(df):
    return df[df["measurement"] == "timing"].copy()


@dataclass
class GpuCapacity:
    """The effective LRU capacity fitted on one GPU's rows, and how well the same fraction of
    the L2 predicts each other GPU's rows."""

    gpu: str
    fit: CapacityFit
    l2_bytes: int
    cross: dict[str, dict] = field(default_factory=dict)  # other short GPU name -> errors

    @property
    def capacity_mib(self) -> float:
        return self.fit.capacity_bytes / 2**20

    @property
    def fraction_of_l2(self) -> float:
        return self.fit.capacity_bytes / self.l2_bytes

    @property
    def errors(self) -> dict:
        return self.fit.errors

    def summary(self) -> dict:
        return {"capacity_mib": self.capacity_mib, "fraction_of_l2": self.fraction_of_l2,
                **self.errors, "cross_gpu": self.cross}


def miss_curves(c: pd.DataFrame) -> dict:
    """Per GPU: the simulated miss curves of its counter rows (the expensive part of a fit)."""
    return {gpu: MissCurves(rows) for gpu, rows in c.groupby("gpu")}


def capacity_fits(c: pd.DataFrame, curves: dict | None = None) -> dict[str, GpuCapacity]:
    """Per GPU: fitted effective capacity, its errors, and the cross-GPU prediction error
    (the capacity as a fraction of one GPU's L2, applied to the other's). `curves` (from
    `miss_curves`, possibly for more points than `c`) saves simulating again."""
    curves = {gpu: cv.subset(c[c["gpu"] == gpu]["point"])
              for gpu, cv in (curves or miss_curves(c)).items() if gpu in set(c["gpu"])}
    l2 = {gpu: int(rows["l2_bytes"].iloc[0]) for gpu, rows in c.groupby("gpu")}
    out = {gpu: GpuCapacity(gpu, fit_capacity(rows, gpu, curves=curves[gpu]), l2[gpu])
           for gpu, rows in c.groupby("gpu")}
    for gpu, entry in out.items():
        for other, other_curves in curves.items():
            if other != gpu:
                pred = other_curves.misses(entry.fraction_of_l2 * l2[other])
                entry.cross[short_gpu(other)] = error_table(pred,
                                                            np.asarray(other_curves.measured))
    return out


def capacity_fits_table(fits: dict[str, GpuCapacity]) -> pd.DataFrame:
    """Capacity fits as rows (one per GPU and fitted point), for the model cache."""
    rows = []
    for gpu, entry in fits.items():
        for point, predicted, measured in zip(entry.fit.points, entry.fit.predicted,
                                              entry.fit.measured):
            rows.append({"gpu": gpu, "capacity_bytes": entry.fit.capacity_bytes,
                         "l2_bytes": entry.l2_bytes, "cross": json.dumps(entry.cross),
                         "point": point, "predicted": predicted, "measured": measured})
    return pd.DataFrame(rows)


def capacity_fits_from_table(table: pd.DataFrame) -> dict[str, GpuCapacity]:
    """`capacity_fits_table` read back: the same fits, the errors scored again."""
    out = {}
    for gpu, rows in table.groupby("gpu", sort=False):
        first = rows.iloc[0]
        predicted, measured = list(rows["predicted"]), list(rows["measured"])
        fit = CapacityFit(gpu, float(first["capacity_bytes"]), error_table(predicted, measured),
                          list(rows["point"]), predicted, measured)
        out[gpu] = GpuCapacity(gpu, fit, int(first["l2_bytes"]), json.loads(first["cross"]))
    return out


def knees(c: pd.DataFrame, predicted: dict) -> pd.DataFrame:
    """Measured vs predicted knee per (GPU, D, schedule): the first S with misses > 1.5 x
    compulsory. `predicted`: (gpu, point) -> predicted DRAM read bytes."""
    rows = []
    c = medians(c)
    for (gpu, hd, kv), sub in c.groupby(["gpu", "head_dim", "kv_schedule"]):
        sub = sub.sort_values("seqlen")
        pred = [predicted[gpu, p] for p in sub["point"]]
        seqlens = list(sub["seqlen"])
        measured_knee = knee(seqlens, list(sub["dram_read_sectors"] * SECTOR_BYTES),
                             list(sub["compulsory_read_bytes"]))
        predicted_knee = knee(seqlens, pred, list(sub["compulsory_read_bytes"]))
        step = (abs(seqlens.index(measured_knee) - seqlens.index(predicted_knee))
                if measured_knee and predicted_knee else None)
        rows.append({"GPU": short_gpu(gpu), "D": hd, "K/V schedule": kv,
                     "measured knee": measured_knee, "predicted knee": predicted_knee,
                     "steps apart": step})
    return pd.DataFrame(rows)


PAIR_KEYS = ["gpu", "sms", "l2_bytes", "batch", "heads", "kv_heads", "seqlen", "head_dim",
             "dtype", "causal", "tile_m", "tile_n", "occupancy", "cta_schedule",
             "resident_ctas"]


def headline_pairs(df: pd.DataFrame) -> pd.DataFrame:
    """Sawtooth against linear per configuration, from repeated measurements: DRAM reads (the
    primary miss metric) and TFLOP/s, medians over repeats, the range of the ratio over every
    pair of repeats, the spread of each side, and a flag where repeats disagree by > 10%."""
    ok = df[df["status"] == "ok"]
    c = ok[ok["measurement"] == "counters"]
    t = ok[ok["measurement"] == "timing"]
    keys = [k for k in PAIR_KEYS if k != "resident_ctas"]
    rows = []
    for key, sub in c.groupby(keys):
        by = {kv: g for kv, g in sub.groupby("kv_schedule")}
        if not {"linear", "sawtooth"} <= set(by):
            continue
        lin, saw = (by[k]["dram_read_bytes"].to_numpy(float) for k in ("linear", "sawtooth"))
        ratios = (saw[:, None] / lin[None, :]).ravel()
        r = dict(zip(keys, key))
        tt = t.merge(sub[["gpu", "point"]].drop_duplicates(), on=["gpu", "point"])
        tf = {kv: g["tflops"].to_numpy(float) for kv, g in tt.groupby("kv_schedule")}
        speed = (np.median(tf["sawtooth"]) / np.median(tf["linear"]) - 1
                 if {"linear", "sawtooth"} <= set(tf) else np.nan)
        spreads = [spread(lin), spread(saw)] + [spread(v) for v in tf.values()]
        rows.append({
            **r, "compulsory_read_bytes": float(sub["compulsory_read_bytes"].iloc[0]),
            "GPU": short_gpu(r["gpu"]),
            "configuration": (f"B{r['batch']} H{r['heads']} S{r['seqlen'] // 1024}k "
                              f"D{r['head_dim']} {r['tile_m']}x{r['tile_n']} {r['cta_schedule']}"
                              + (" causal" if r["causal"] else "")),
            "repeats": f"{len(lin)}+{len(saw)}",
            "linear DRAM / min": round(float(np.median(lin)) / sub["compulsory_read_bytes"].iloc[0], 2),
            "DRAM reads, sawtooth vs linear": float(np.median(saw) / np.median(lin) - 1),
            "range lo": float(ratios.min() - 1), "range hi": float(ratios.max() - 1),
            "TFLOP/s, sawtooth vs linear": speed,
            "largest spread": max(spreads),
            "flag": SPREAD_FLAG_TEXT if max(spreads) > SPREAD_FLAG else "",
        })
    out = pd.DataFrame(rows)
    return out.sort_values(["GPU", "DRAM reads, sawtooth vs linear"]) if len(out) else out


def throughput_fits(frames: dict[str, pd.DataFrame]) -> tuple[dict[str, ThroughputFit],
                                                             pd.DataFrame]:
    joined = pd.concat([with_timing(df) for df in frames.values()], ignore_index=True)
    return ({short_gpu(gpu): fit_throughput(rows, gpu) for gpu, rows in joined.groupby("gpu")},
            joined)


def dram_bound_share(tfits: dict[str, ThroughputFit], joined: pd.DataFrame) -> dict:
    """Share of measured points the fitted throughput model puts on the DRAM side."""
    joined = joined.assign(GPU=joined["gpu"].map(short_gpu))
    out = {}
    for d in (64, 128):
        sub = joined[joined["head_dim"] == d]
        bound = []
        for gpu, rows in sub.groupby("GPU"):
            bound += list(tfits[gpu].dram_bound(rows["executed_flops"],
                                                rows["dram_read_bytes"] + rows["dram_write_bytes"]))
        out[f"D{d}"] = float(np.mean(bound)) if bound else float("nan")
    return out


class Study:
    """The committed data of a repository, and everything computed from it, each once."""

    def __init__(self, data_dir):
        self.data_dir = Path(data_dir)
        self._frames: dict[str, pd.DataFrame] = {}
        self._summaries: dict[str, pd.DataFrame] = {}
        self._records: dict[tuple, dict] = {}
        self._computed: dict[str, object] = {}

    def once(self, name: str, compute):
        """`compute()` the first time `name` is asked for, its result after (for a number
        several sections state, computed from this study once)."""
        if name not in self._computed:
            self._computed[name] = compute()
        return self._computed[name]

    def load(self, experiment: str) -> pd.DataFrame:
        """A data set's `ok` rows (all repeats)."""
        if experiment not in self._frames:
            df = load_results(results_path(self.data_dir / experiment), strict=True)
            self._frames[experiment] = df[df["status"] == "ok"].copy()
        return self._frames[experiment].copy()

    def counters(self, experiment: str) -> pd.DataFrame:
        return counters(self.load(experiment))

    def manifest(self, dataset: str) -> dict:
        """The runs of data/<dataset>/manifest.json, checked (`results.store.read_manifest`)."""
        return read_manifest(self.data_dir / dataset)

    def records(self, kind: RecordKind, dataset: str, pattern: str = "*.jsonl") -> dict:
        """Every `kind` record file of data/<dataset>/ matching `pattern`, read and upgraded,
        by its path there without the suffix (`run1`, `h100_run1/tune`), in name order; a
        data set with none fails with its name. A gzip-compressed file (`run1.jsonl.gz`)
        matches its plain name's pattern."""
        key = (kind.name, dataset, pattern)
        if key not in self._records:  # read once per study; each caller gets its own rows
            directory = self.data_dir / dataset
            paths = sorted(set(directory.glob(pattern)) | set(directory.glob(pattern + ".gz")))
            if not paths:
                raise SchemaError(f"{directory}: no {kind.name} records ({pattern})")
            self._records[key] = {str(p.relative_to(directory)).split(".")[0]: kind.read(p)
                                  for p in paths}
        return {name: [dict(r) for r in rows] for name, rows in self._records[key].items()}

    def folded_records(self, kind: RecordKind, dataset: str, folded: str,
                       loose: str) -> dict:
        """{'<folder>/<file name without .jsonl>': records} of a data set whose runs are
        folded into one file (`folded`, each record's `source`: `wavefront fold`), and any
        run still in a folder of its own (`loose`, e.g. '*/bench*.jsonl'), in name order. A
        source in both is refused, and a data set with neither fails with its name."""
        files: dict = {}
        try:
            for r in self.records(kind, dataset, pattern=folded)[folded.split(".")[0]]:
                files.setdefault(r["source"], []).append(r)
        except SchemaError:  # nothing folded yet
            pass
        try:
            loose_files = self.records(kind, dataset, pattern=loose)
        except SchemaError:
            loose_files = {}
        for source, records in loose_files.items():
            if source in files:
                raise ValueError(f"data/{dataset}: {source} is both in {folded} and a file of "
                                 "its own; keep one")
            files[source] = records
        if not files:
            raise SchemaError(f"{self.data_dir / dataset}: no {kind.name} records ({folded} "
                              f"or {loose})")
        return dict(sorted(files.items()))

    @cached_property
    def knee_counters(self) -> pd.DataFrame:
        return self.counters("knee")

    @cached_property
    def knee_fits(self) -> dict[str, GpuCapacity]:
        # Simulating every knee point takes a minute: the fits are kept in the model cache.
        table = cached_table(self, "knee_fits", [results_path(self.data_dir / "knee")],
                             lambda: capacity_fits_table(capacity_fits(self.knee_counters)))
        return capacity_fits_from_table(table)

    @cached_property
    def sweep_counters(self) -> pd.DataFrame:
        return self.counters("schedules_vs_seqlen")

    @cached_property
    def sweep_curves(self) -> dict:
        return miss_curves(self.sweep_counters)

    @cached_property
    def sweep_fits(self) -> dict[str, GpuCapacity]:
        return capacity_fits(self.sweep_counters, self.sweep_curves)

    @cached_property
    def noncausal_fits(self) -> dict[str, GpuCapacity]:
        c = self.sweep_counters
        return capacity_fits(c[~c["causal"].astype(bool)], self.sweep_curves)

    @cached_property
    def timed_frames(self) -> dict[str, pd.DataFrame]:
        return {name: self.load(name) for name in TIMED_EXPERIMENTS}

    @cached_property
    def throughput(self) -> tuple[dict[str, ThroughputFit], pd.DataFrame]:
        return throughput_fits(self.timed_frames)

    @cached_property
    def headline(self) -> pd.DataFrame:
        """The headline configurations (repeated), sawtooth vs linear, with the model's
        prediction at the GPU's fitted capacity beside the measurement."""
        h = headline_pairs(self.load("headline"))
        predicted = []
        for _, r in h.iterrows():
            gpu = preset_for_device(r["gpu"]) or gpu_preset("h100")
            fit = self.knee_fits.get(r["gpu"])
            cap = fit.fit.capacity_bytes if fit else 0.5 * gpu.l2_bytes
            res = {kv: predict(launch_of_row({**r, "kv_schedule": kv,
                                              "resident_ctas": r["sms"] * r["occupancy"]}),
                               gpu, capacity_bytes=cap).dram_read_bytes
                   for kv in ("linear", "sawtooth")}
            predicted.append(res["sawtooth"] / max(1, res["linear"]) - 1)
        return h.assign(**{"model: sawtooth vs linear": predicted})

    @cached_property
    def capacity_validation(self) -> pd.DataFrame:
        return capacity_validation(self)

    @cached_property
    def throughput_validation(self) -> pd.DataFrame:
        return throughput_validation(self)

    @cached_property
    def predictions(self) -> pd.DataFrame:
        return prediction_table(self)

    def summary(self, dataset: str) -> pd.DataFrame:
        """Per (GPU, point, measurement): median, min, max and spread over the repeats of the
        key metric (DRAM reads for counters, TFLOP/s for timing), flagged above 10%."""
        if dataset not in self._summaries:
            self._summaries[dataset] = self._summary(dataset)
        return self._summaries[dataset].copy()

    def _summary(self, dataset: str) -> pd.DataFrame:
        df = self.load(dataset)
        rows = []
        for (gpu, point, kind), reps in df.groupby(["gpu", "point", "measurement"]):
            col = "dram_read_bytes" if kind == "counters" else "tflops"
            v = reps[col].to_numpy(float)
            s = spread(v)
            rows.append({"gpu": gpu, "point": point, "measurement": kind, "metric": col,
                         "repeats": len(v), "median": float(np.median(v)),
                         "min": float(v.min()), "max": float(v.max()), "spread": s,
                         "flag": SPREAD_FLAG_TEXT if s > SPREAD_FLAG else "",
                         "throttled": bool(reps["throttled"].fillna(False).any())})
        return pd.DataFrame(rows)


# Simulating every measured point takes minutes on two cores. Such tables are kept in
# data/model_cache/, keyed by a hash of everything they are computed from (the data files,
# the model's source), and recomputed whenever any of them changes; delete one to recompute.
# A change to the model's sources (wavefront/schedules.py included) re-simulates every table:
# 15 minutes on a 2-core machine, which CI would spend on every clone. Run `wavefront paper`
# and commit data/model_cache/ with the change.
MODEL_CACHE = "model_cache"


def _inputs_key(paths) -> str:
    """The data files' bytes and the model's source files' bytes (fits, simulation,
    schedules): byte hashes are the same on every platform and Python version, so a clone
    finds the committed cache valid."""
    import hashlib

    import wavefront.model.fits as fits_module
    import wavefront.model.simulation as simulation_module
    import wavefront.schedules as schedules_module
    h = hashlib.sha256()
    for path in paths:
        # A results table counts by its rows, compressed or not (`read_results_bytes`).
        h.update(Path(path).name.removesuffix(".gz").encode())
        # (other files by their bytes as stored: the committed caches' keys depend on it)
        h.update(read_results_bytes(path) if str(path).endswith(".csv.gz")
                 else files.read_file(path, "a model input"))
    for module in (fits_module, simulation_module, schedules_module):
        h.update(Path(module.__file__).name.encode())
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()[:16]


def cached_table(study, name: str, inputs, compute, values: str = "") -> pd.DataFrame:
    """`compute()` once per distinct `inputs` (files) and `values` (the text of any argument
    not read from those files), kept in data/model_cache/<name>.csv.gz (compressed: the cache
    travels with every GPU call)."""
    key = _inputs_key(inputs)
    if values:
        import hashlib
        key = hashlib.sha256((key + values).encode()).hexdigest()[:len(key)]
    cache = study.data_dir / MODEL_CACHE / f"{name}.csv.gz"
    if cache.exists():
        try:  # a cache that does not read (cut, foreign) is computed again, not trusted
            cached = pd.read_csv(io.BytesIO(read_results_bytes(cache, "a model cache")))
        except (SchemaError, ValueError, pd.errors.ParserError):
            cached = pd.DataFrame()
        if len(cached) and "inputs_key" in cached and (cached["inputs_key"] == key).all():
            return cached.drop(columns="inputs_key")
    table = compute()
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_csv_gz(table.assign(inputs_key=key), cache)
    return table


# ---------------------------------------------------------------------------------------------
# Out-of-sample validation of the capacity models
# ---------------------------------------------------------------------------------------------

# Every data set with DRAM counters, and the family the capacity is fitted on. The fit uses
# the knee sweep up to FIT_MAX_SEQLEN; its longer lengths are held out as extrapolation.
VALIDATION_FAMILIES = ("knee", "schedules_vs_seqlen", "ablation", "tile_size", "ctas_in_flight",
                       "headline", "dram_bound")  # today's kernel only, as TIMED_EXPERIMENTS
FIT_FAMILY = "knee"
FIT_MAX_SEQLEN = 65536
CAPACITY_MODELS = ("fitted LRU", "other GPU's fraction", "half L2", "partitions",
                   "random, half L2")


def _validation_points(study) -> pd.DataFrame:
    frames = []
    for family in VALIDATION_FAMILIES:
        c = study.counters(family)
        frames.append(medians(c).assign(family=family))
    return pd.concat(frames, ignore_index=True)


def _validation_rows(study) -> pd.DataFrame:
    points = _validation_points(study)
    knee_c = study.counters(FIT_FAMILY)
    fitted = {gpu: fit_capacity(rows[rows["seqlen"] <= FIT_MAX_SEQLEN], gpu)
              for gpu, rows in knee_c.groupby("gpu")}
    l2 = {gpu: int(rows["l2_bytes"].iloc[0]) for gpu, rows in points.groupby("gpu")}
    rows = []
    for _, r in points.iterrows():
        gpu = r["gpu"]
        preset = preset_for_device(gpu)
        others = [g for g in fitted if g != gpu]
        capacities = {"fitted LRU": fitted[gpu].capacity_bytes}
        if others:
            capacities["other GPU's fraction"] = (fitted[others[0]].capacity_bytes
                                                  / l2[others[0]] * l2[gpu])
        launch = launch_of_row(r)
        res = l2_predictions_by_model(launch, preset, trace_blocks(launch), capacities)
        split = res["partitions"]
        rows.append({"gpu": gpu, "family": r["family"], "point": r["point"],
                     "seqlen": int(r["seqlen"]), "causal": bool(r["causal"]),
                     "measured": float(r["dram_read_sectors"]) * SECTOR_BYTES,
                     "compulsory": float(r["compulsory_read_bytes"]),
                     "fitted_capacity": capacities["fitted LRU"],
                     # the duplication hypothesis, counted: reads that cross the fabric (the
                     # reader's partition lacks the line) and those the home partition serves
                     "fabric reads, measured": _sectors_bytes(r, "l2_fabric_read_sectors"),
                     "fabric hits, measured": _sectors_bytes(r, "l2_fabric_read_hit_sectors"),
                     "fabric reads, partitions": split.fabric_read_sectors * SECTOR_BYTES,
                     "fabric hits, partitions": split.fabric_read_hit_sectors * SECTOR_BYTES,
                     **{m: float(res[m].dram_read_sectors * SECTOR_BYTES)
                        for m in CAPACITY_MODELS if m in res}})
    return pd.DataFrame(rows)


def _sectors_bytes(row, column: str) -> float:
    value = row.get(column)
    return float(value) * SECTOR_BYTES if value is not None and pd.notna(value) else np.nan


def fabric_check(study) -> pd.DataFrame:
    """The duplication hypothesis against the fabric counters: per GPU and family, the
    partition model's fabric read and fabric hit bytes against the measured ones (points with
    the full metric set), as median and 10th-90th percentile of predicted / measured."""
    rows = validation_rows(study)
    out = []
    for (gpu, family), sub in rows.groupby(["gpu", "family"], sort=False):
        for what in ("fabric reads", "fabric hits"):
            m = sub[f"{what}, measured"].to_numpy(float)
            p = sub[f"{what}, partitions"].to_numpy(float)
            ok = np.isfinite(m) & (m > 0)
            if ok.sum() < 3:
                continue
            ratio = p[ok] / m[ok]
            out.append({"GPU": short_gpu(gpu), "family": family, "counter": what,
                        "points": int(ok.sum()), "predicted / measured, median":
                        float(np.median(ratio)), "p10": float(np.percentile(ratio, 10)),
                        "p90": float(np.percentile(ratio, 90))})
    return pd.DataFrame(out)


def validation_rows(study) -> pd.DataFrame:
    """Per measured point of every family: its median DRAM reads and each capacity model's
    prediction (cached, see `cached_table`)."""
    inputs = [results_path(study.data_dir / f) for f in VALIDATION_FAMILIES]
    return cached_table(study, "capacity_validation", inputs, lambda: _validation_rows(study))


def capacity_held_out_by_length(counters, gpu: str) -> dict:
    """Capacity fitted on the points with S up to the median length, scored on the longer
    points above the knee: out of sample by S range."""
    cut = float(counters["seqlen"].median())
    short, long_ = counters[counters["seqlen"] <= cut], counters[counters["seqlen"] > cut]
    split = f"S <= {int(cut)} / S > {int(cut)}"
    if short.empty or long_.empty:
        return {"split": split, "n": 0}
    fit = fit_capacity(short, gpu)
    curves = MissCurves(long_)
    predicted = curves.misses(fit.capacity_bytes)
    measured = np.asarray(curves.measured)
    compulsory = long_.groupby("point", sort=False)["compulsory_read_bytes"].first()
    keep = above_knee(measured, compulsory.loc[curves.keys].to_numpy())
    return {"split": split, "capacity_bytes": fit.capacity_bytes,
            **validation_errors(predicted[keep], measured[keep])}


def held_out_sets(rows: pd.DataFrame):
    """(name, rows) of every held-out set: the fit family past its fitted lengths, each other
    family, and for the other GPU's fraction every point of the GPU it was not fitted on."""
    fit = rows["family"] == FIT_FAMILY
    yield f"{FIT_FAMILY}, S > {FIT_MAX_SEQLEN // 1024}k (beyond the fit)", rows[
        fit & (rows["seqlen"] > FIT_MAX_SEQLEN)]
    for family, sub in rows[~fit].groupby("family", sort=False):
        yield family, sub
    yield "all held-out points", rows[~fit | (rows["seqlen"] > FIT_MAX_SEQLEN)]


def unfitted_predictions(study, family: str, model: str = "partitions") -> dict:
    """(gpu, point) -> DRAM read bytes an unfitted capacity model predicts for a family."""
    rows = validation_rows(study)
    rows = rows[rows["family"] == family]
    return {(g, p): v for g, p, v in zip(rows["gpu"], rows["point"], rows[model])}


def capacity_validation(study) -> pd.DataFrame:
    """Out-of-sample errors per GPU, held-out set and capacity model, counting only points
    above the knee (measured DRAM reads > ABOVE_KNEE x compulsory). The fitted LRU is fitted on
    the knee sweep up to FIT_MAX_SEQLEN; "other GPU's fraction" uses the other GPU's fit; "half
    L2" and "partitions" are not fitted at all."""
    rows = validation_rows(study)
    rows = rows[above_knee(rows["measured"], rows["compulsory"])]
    out = []
    for gpu, g in rows.groupby("gpu"):
        for name, sub in held_out_sets(g):
            for model in CAPACITY_MODELS:
                if model not in sub or sub[model].isna().all():
                    continue
                e = validation_errors(sub[model], sub["measured"])
                if e["n"]:
                    out.append({"GPU": short_gpu(gpu), "held out": name, "model": model, **e})
    return pd.DataFrame(out)


def throughput_validation(study) -> pd.DataFrame:
    """Leave one experiment out: the throughput model fitted on the GPU's other timed data
    sets, scored on the held-out one (points of schedules it never saw are skipped), with the
    DRAM rate that fit found (unidentified where no fitted point is DRAM-bound)."""
    frames = {name: with_timing(df).assign(experiment=name)
              for name, df in study.timed_frames.items()}
    joined = pd.concat(frames.values(), ignore_index=True)
    out = []
    for gpu, rows in joined.groupby("gpu"):
        for name in rows["experiment"].unique():
            train, test = rows[rows["experiment"] != name], rows[rows["experiment"] == name]
            fit = fit_throughput(train, gpu, bootstrap=0)
            known = test[[s in fit.schedule_efficiency for s in schedule_of(test)]]
            if len(known) < 2:
                continue
            e = validation_errors(fit.predict_rows_s(known), known["median_ms"] * 1e-3)
            out.append({"GPU": short_gpu(gpu), "held out": name, **e,
                        # a rate no fitted point constrains is the optimiser's leftover (it moved
                        # from 3 to 729 TB/s between machines): not reported
                        "R_dram of the fit (TB/s)": (fit.dram_rate / 1e12
                                                     if fit.dram_bound_points else None),
                        "DRAM-bound points in the fit": fit.dram_bound_points})
    return pd.DataFrame(out)


def prediction_table(study) -> pd.DataFrame:
    """The committed predictions (GB10, B200, and the H100/H200 for reference) at the paper's launch,
    from the H100's fitted throughput model (see `preset_predictions`)."""
    from wavefront.model.fits import preset_predictions
    from wavefront.model.presets import PRESETS
    tfits, _ = study.throughput
    presets = {k: PRESETS[k] for k in ("gb10", "b200", "h100", "h200")}
    return pd.DataFrame(preset_predictions(presets, tfits["H100"], PRESETS["h100"]))


# --------------------------------------------------------------------------------------------
# The table-driven kernel: what a schedule costs by itself (experiments/schedule_cost.py)
# --------------------------------------------------------------------------------------------


def fit_results(df: pd.DataFrame, source: str) -> dict:
    """`wavefront fit`'s JSON: per GPU of a results table, the effective L2 capacity (in sample,
    and fitted on the shorter lengths, scored on the longer) and the throughput model."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        raise ValueError(f"{source}: no measured (ok) rows to fit")
    fits = {"results": source, "gpus": {}}
    for gpu, rows in ok.groupby("gpu"):
        entry = {}
        counters = rows[rows["measurement"] == "counters"].dropna(subset=["dram_read_sectors"])
        if len(counters):
            entry["capacity"] = fit_capacity(counters, gpu).as_dict()
            entry["capacity_out_of_sample"] = capacity_held_out_by_length(counters, gpu)
        joined = with_timing(rows)
        if len(joined) >= 4:
            entry["throughput"] = fit_throughput(joined, gpu).as_dict()
        if not entry:
            raise ValueError(f"{source}: {gpu} has no counter rows and fewer than 4 timed "
                             "counter rows: nothing to fit")
        fits["gpus"][gpu] = entry
    return fits
