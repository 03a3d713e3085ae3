"""SM-side L2 read sectors against the closed-form count, causal and not.

    python experiments/closed_form.py run            # on a GPU: measure what the figure needs
    python experiments/closed_form.py plot --out DIR # anywhere: the paper's figure, from data/
"""
import numpy as np
import pandas as pd
import seaborn as sns

from wavefront.report.experiments import run_as_script
from wavefront.report.figures import schedule_label, seqlen_axis, short_gpu

DATASETS = ("schedules_vs_seqlen",)


CAPTION = ("SM-side L2 read sectors measured by Nsight Compute over the closed-form count "
           "(ratio; 1 = the closed form, dashed) against the sequence length, causal and not, "
           "on the H100 and H200 (B=1 H=1 bf16, 128x64 tiles, D64 and D128; band: the spread "
           "over the 4 CTA and K/V schedules).")


def _draw(df: pd.DataFrame):
    d = df.copy()
    d["GPU"] = d["gpu"].map(short_gpu)
    d["schedule"] = schedule_label(d)
    d["mask"] = np.where(d["causal"], "causal", "non-causal")
    g = sns.relplot(data=d, x="seqlen", y="read_sectors_ratio", hue="mask", style="GPU",
                    col="head_dim", kind="line", marker="o", errorbar=("pi", 100), height=3.0,
                    aspect=1.3)
    g.set(xscale="log")
    for ax in g.axes.flat:
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        seqlen_axis(ax, d["seqlen"])
    g.set_axis_labels("sequence length S (tokens)",
                      "SM-side L2 read sectors / closed form")
    g.figure.suptitle("Measured L2 read sectors against the closed-form count (band: spread "
                      "over the 4 schedules), B=1 H=1 bf16 128x64", y=1.03)
    return g.figure


def figure(study):
    return _draw(study.sweep_counters)


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
