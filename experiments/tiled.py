"""The tiled K/V schedule vs linear and sawtooth at 64k-256k: DRAM reads and throughput.

    python experiments/tiled.py run            # on a GPU: measure what the figure needs
    python experiments/tiled.py plot --out DIR # anywhere: the paper's figure, from data/
"""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from wavefront.report.draft import Section, md_table, pct
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu
from wavefront.results.store import with_timing

SPEC = """
name = "tiled"
measure = ["timing", "counters"]
repeats = 3
timeout_s = 180
reps = 10
batch_points = 12

[[grid]]
batch = [1]
heads = [1]
seqlen = [65536, 131072, 262144]
head_dim = [64]
causal = [false, true]
tiles = ["64x64"]
schedule = ["persistent+linear", "persistent+sawtooth", "persistent+tiled"]

[[grid]]
batch = [1]
heads = [1]
seqlen = [65536, 131072, 262144]
head_dim = [128]
causal = [false, true]
tiles = ["128x64"]
schedule = ["persistent+linear", "persistent+sawtooth", "persistent+tiled"]
"""


CAPTION = ("The tiled K/V scan against linear and sawtooth at 64k-256k on each GPU (B=1 H=1 "
           "bf16, persistent, 64x64 tiles at D=64 and 128x64 at D=128, the table-driven kernel): DRAM "
           "reads over the minimum (log) and TFLOP/s; bars median, whiskers the range over "
           "repeats.")

def tiled_table(df: pd.DataFrame) -> pd.DataFrame:
    d = with_timing(df)
    d["GPU"] = d["gpu"].map(short_gpu)
    out = []
    for k, sub in d.groupby(["GPU", "head_dim", "causal", "seqlen"]):
        # medians over repeats, counters and timing rows each
        by = sub.groupby("kv_schedule")[["dram_read_bytes", "compulsory_read_bytes",
                                          "tflops"]].median()
        if not {"linear", "sawtooth", "tiled"} <= set(by.index):
            continue
        row = dict(zip(["GPU", "D", "causal", "S"], k))
        for kv in ("linear", "sawtooth", "tiled"):
            row[f"{kv} DRAM/min"] = round(by.loc[kv, "dram_read_bytes"]
                                          / by.loc[kv, "compulsory_read_bytes"], 2)
        row["tiled speed"] = by.loc["tiled", "tflops"] / by.loc["linear", "tflops"] - 1
        row["tiled TFLOP/s vs linear"] = pct(row["tiled speed"])
        row["sawtooth TFLOP/s vs linear"] = pct(by.loc["sawtooth", "tflops"]
                                                 / by.loc["linear", "tflops"] - 1)
        out.append(row)
    return pd.DataFrame(out)


def _draw(joined: pd.DataFrame):
    """`joined`: counter rows with their timing (`records.with_timing`)."""
    d = joined.copy()
    d["GPU"] = d["gpu"].map(short_gpu)
    d["x min"] = d["dram_read_bytes"] / d["compulsory_read_bytes"]
    d["config"] = ("D" + d["head_dim"].astype(str) + np.where(d["causal"], " causal", "")
                   + " S" + (d["seqlen"] // 1024).astype(str) + "k")
    fig, axes = plt.subplots(2, 2, figsize=(12, 6.5), sharey="row")
    for col, gpu in enumerate(sorted(d["GPU"].unique())):
        sub = d[d["GPU"] == gpu]
        sns.barplot(data=sub, x="config", y="x min", hue="kv_schedule", ax=axes[0, col],
                    estimator="median", errorbar=("pi", 100))
        axes[0, col].set(yscale="log", ylabel="DRAM reads / minimum (log)", xlabel="",
                         title=f"{gpu}: DRAM reads / (Q, K, V once + partial states)")
        sns.barplot(data=sub, x="config", y="tflops", hue="kv_schedule", ax=axes[1, col],
                    estimator="median", errorbar=("pi", 100), legend=False)
        axes[1, col].set(ylabel="TFLOP/s", xlabel="configuration (B=1 H=1 bf16, persistent)")
        for ax in axes[:, col]:
            plt.setp(ax.get_xticklabels(), rotation=40, ha="right", rotation_mode="anchor")
    repeats = int(d.groupby("point")["repeat"].nunique().min()) if "repeat" in d else 1
    fig.suptitle("Tiled K/V vs linear and sawtooth at long lengths (64x64 tiles at D=64, "
                 f"128x64 at D=128); bars median, whiskers range over {repeats} repeats")
    fig.tight_layout()
    return fig


def figure(study):
    return _draw(with_timing(study.load("tiled")))


def table(study):
    return tiled_table(study.load("tiled"))


def section(study) -> Section:
    s = Section()
    df = study.load("tiled")
    t = tiled_table(df)
    reps = int(df[df["measurement"] == "counters"].groupby(["gpu", "point"])["repeat"]
               .nunique().min())
    worst_linear = t["linear DRAM/min"].max()
    more = t[t["tiled DRAM/min"] > t["linear DRAM/min"]]
    s.claim(f"The tiled schedule keeps DRAM reads within {t['tiled DRAM/min'].max():.1f}x the "
            f"minimum at every length, mask and head dimension on both GPUs, where linear reads "
            f"up to {worst_linear:.0f}x and sawtooth up to {t['sawtooth DRAM/min'].max():.0f}x "
            f"(in {len(more)} of {len(t)} configurations, where the scans already stay near the "
            f"minimum, it reads a little more than linear: at most "
            f"{more['tiled DRAM/min'].max() if len(more) else 0:.1f}x). Its TFLOP/s against "
            f"linear's ranges from {t['tiled speed'].min():+.0%} to "
            f"{t['tiled speed'].max():+.0%} (medians, not paired): the bytes it saves buy no "
            "consistent speed either.",
            t["GPU"].nunique() == 2 and t["tiled DRAM/min"].max() * 10 < worst_linear
            and (more["tiled DRAM/min"] <= 2.5).all() and (more["linear DRAM/min"] <= 2).all()
            and t["tiled speed"].min() < 0 < t["tiled speed"].max(), t.to_dict())
    shown = t.drop(columns=["tiled speed"])
    s.text = f"""## Tiling K/V to the L2

B=1 H=1, persistent, one CTA order and three scans (the tiled scan cuts K/V into chunks sized
to the L2, every CTA sweeps chunk by chunk, partial states merged at the end), the table-driven kernel;
medians of {reps} repeats (DRAM reads under ncu, cold L2; TFLOP/s with CUDA events):

{md_table(shown)}

{s.claims[0].text}

![tiled](figures/tiled.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
