"""Does a sweep on two GPUs give the same rows as on one, in about half the time?

The knee spec (36 points, timing and counters, 3 repeats: 216 tasks) measured on one H200 of a
two-GPU host (`data/scaling_1gpu`) and on both through Dask (`--gpus 2`, `data/scaling_2gpu`:
the H200 rows of that day's knee sweep, kept here when the knee was re-measured with today's
kernel). Both runs used the same (first) kernel: the question is the sweep engine's. Wall times
come from the runs' manifests.

    wavefront sweep experiments/knee.py --out data/scaling_1gpu              # one GPU
    wavefront sweep experiments/knee.py --out data/scaling_2gpu --gpus 2     # every GPU
    python experiments/scaling.py plot --out DIR                  # anywhere: the figure
"""
import matplotlib.pyplot as plt
import pandas as pd

from wavefront.report.draft import Section, md_table
from wavefront.report.experiments import run_as_script
from wavefront.report.analysis import medians
from wavefront.results.measurement import spread

DATASETS = ("scaling_1gpu", "scaling_2gpu")


def _wall(study, dataset: str, gpus: int) -> float:
    runs = study.manifest(dataset).values()
    walls = [r["wall_s"] for r in runs if r.get("wall_s") and ("x2" in r.get("note", ""))
             and (("--gpus" in r["command"]) == (gpus > 1))]
    return float(walls[0]) if walls else float("nan")


def paired(study) -> pd.DataFrame:
    one = study.load("scaling_1gpu")
    two = study.load("scaling_2gpu")
    out = []
    for kind, col in (("counters", "dram_read_bytes"), ("timing", "tflops")):
        a = medians(one[one["measurement"] == kind]).set_index("point")[col]
        b = medians(two[two["measurement"] == kind]).set_index("point")[col]
        sa = one[one["measurement"] == kind].groupby("point")[col].agg(spread)
        sb = two[two["measurement"] == kind].groupby("point")[col].agg(spread)
        j = pd.DataFrame({"one": a, "two": b, "spread_one": sa, "spread_two": sb}).dropna()
        j["metric"] = "DRAM read bytes" if kind == "counters" else "TFLOP/s"
        j["difference"] = j["two"] / j["one"] - 1
        j["GPUs on the 2-GPU run"] = two[two["measurement"] == kind]["gpu_uuid"].nunique()
        out.append(j.reset_index())
    return pd.concat(out, ignore_index=True)


def _draw(p: pd.DataFrame, wall_one: float, wall_two: float):
    """`p`: per point, the median on one GPU and on two (`experiments/scaling.py`)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, (metric, sub) in zip(axes, p.groupby("metric")):
        ax.scatter(sub["one"], sub["two"], s=18)
        lo, hi = min(sub["one"].min(), sub["two"].min()), max(sub["one"].max(), sub["two"].max())
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
        scale = "log" if metric.startswith("DRAM") else "linear"
        ax.set(xscale=scale, yscale=scale, xlabel=f"{metric}, one GPU (median of 3)",
               ylabel=f"{metric}, two GPUs (median of 3)")
    fig.suptitle(f"H200 x2: knee sweep (216 tasks) on one GPU in {wall_one:.0f} s and on two "
                 f"in {wall_two:.0f} s ({wall_two / wall_one:.2f}x); a dot per point ({len(p) // 2})")
    fig.tight_layout()
    return fig


def figure(study):
    return _draw(paired(study), _wall(study, "scaling_1gpu", 1),
                           _wall(study, "scaling_2gpu", 2))


def table(study):
    p = paired(study)
    rows = []
    for metric, sub in p.groupby("metric"):
        within = (sub["difference"].abs()
                  <= sub[["spread_one", "spread_two"]].max(axis=1) + 0.01)
        rows.append({"metric": metric, "points": len(sub),
                     "median difference, 2 GPUs vs 1": f"{sub['difference'].abs().median():.2%}",
                     "largest": f"{sub['difference'].abs().max():.1%}",
                     "within the repeats' spread (+1 point)": f"{int(within.sum())} of {len(sub)}",
                     "GPU UUIDs in the 2-GPU rows": int(sub["GPUs on the 2-GPU run"].iloc[0])})
    return pd.DataFrame(rows).assign(**{
        "wall time, 1 GPU (s)": _wall(study, "scaling_1gpu", 1),
        "wall time, 2 GPUs (s)": _wall(study, "scaling_2gpu", 2)})


def section(study) -> Section:
    s = Section()
    scaling = table(study)
    ratio = float(scaling["wall time, 2 GPUs (s)"].iloc[0] / scaling["wall time, 1 GPU (s)"].iloc[0])
    s.claim("two GPUs take at most 0.6x the wall time and agree with one", ratio <= 0.6 and all(
        a == f"{b} of {b}" for a, b in zip(scaling["within the repeats' spread (+1 point)"],
                                          scaling["points"])), f"ratio {ratio:.2f}",
            listed=False)
    s.text = f"""## Sweeps on two GPUs

The knee sweep measured on one H200 and on both GPUs of the same host through Dask
(`experiments/scaling.py`; every row carries the GPU's UUID):

{md_table(scaling)}

![scaling](figures/scaling.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
