"""Does anything hit in L1 on the TMA path? L1 vs L2 sectors at S=32k and 128k.

    python experiments/l1_vs_l2.py run            # on a GPU: measure what the figure needs
    python experiments/l1_vs_l2.py plot --out DIR # anywhere: the paper's figure, from data/
"""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu

DATASETS = ("schedules_vs_seqlen",)
CAPTION = ("L1 and L2 sectors per launch on each GPU (persistent+linear, B=1 H=1 bf16, 128x64 "
           "tiles, S=32k and 128k; medians over repeats, log scale): the K/V stream arrives by "
           "TMA and bypasses L1; the few L1 global-load sectors are the work table's rows.")


def figure(study):
    c = study.sweep_counters
    d = c[(c["seqlen"].isin([32768, 131072])) & (c["cta_schedule"] == "persistent")
          & (c["kv_schedule"] == "linear") & c["l1_global_load_sectors"].notna()].copy()
    d["GPU"] = d["gpu"].map(short_gpu)
    long = pd.concat([
        d.assign(level="L1 global-load sectors (LSU)", sectors=d["l1_global_load_sectors"]),
        d.assign(level="L1 hits", sectors=d["l1_global_load_hit_sectors"]),
        d.assign(level="L2 read sectors (TMA)", sectors=d["l2_tex_read_sectors"]),
    ], ignore_index=True)
    long["config"] = ("S=" + (long["seqlen"] // 1024).astype(str) + "k D="
                      + long["head_dim"].astype(str) + np.where(long["causal"], " causal", ""))
    gpus = sorted(long["GPU"].unique())
    fig, axes = plt.subplots(1, len(gpus), figsize=(6 * len(gpus), 4), sharey=True,
                             squeeze=False)
    for ax, gpu in zip(axes[0], gpus):
        sub = long[long["GPU"] == gpu]
        sns.barplot(data=sub, x="config", y="sectors", hue="level", ax=ax, estimator="median",
                    errorbar=None)
        ax.set_yscale("log")
        ax.set(ylabel="sectors per launch (median, log)", xlabel="", title=gpu)
        l1 = float(d.loc[d["GPU"] == gpu, "l1_global_load_sectors"].sum())
        ax.text(0.01, 0.97, f"L1 global-load sectors over these {int((d['GPU'] == gpu).sum())} "
                f"launches: {l1:.0f}", transform=ax.transAxes, va="top")
        plt.setp(ax.get_xticklabels(), rotation=20, ha="right", rotation_mode="anchor")
        if ax is not axes[0][-1]:
            ax.get_legend().remove()
    fig.suptitle("L1 vs L2 traffic on the TMA path, persistent+linear, B=1 H=1 bf16 128x64")
    fig.tight_layout()
    return fig


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
