"""Where sawtooth matters: the headline configurations re-measured with repeats and spread.

    python experiments/headline.py run            # on a GPU: measure into data/headline/
    python experiments/headline.py plot --out DIR # anywhere: the paper's figure, from data/
"""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wavefront.report.analysis import headline_pairs
from wavefront.report.draft import Section, md_table, pct
from wavefront.report.experiments import run_as_script

SPEC = """
name = "headline"
measure = ["timing", "counters"]
repeats = 3
timeout_s = 240
reps = 10
batch_points = 12

[[grid]]
batch = [8]
heads = [16]
seqlen = [16384]
head_dim = [128]
causal = [false]
tiles = ["128x64"]
schedule = ["grouped+linear", "grouped+sawtooth"]

[[grid]]
batch = [1]
heads = [1]
seqlen = [131072]
head_dim = [64]
causal = [false]
tiles = ["64x64"]
schedule = ["grid+linear", "grid+sawtooth", "persistent+linear", "persistent+sawtooth",
            "grouped+linear", "grouped+sawtooth"]

[[grid]]
batch = [1]
heads = [1]
seqlen = [262144]
head_dim = [64]
causal = [true]
tiles = ["64x64"]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""


def _draw(h: pd.DataFrame):
    """`h`: `report.analysis.headline_pairs`. DRAM reads and TFLOP/s, sawtooth vs linear, with
    the range over repeats; flagged rows marked."""
    d = h.copy()
    d["label"] = d["configuration"] + np.where(d["flag"] != "", "  (!)", "")
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(d) + 1.8), sharey=True)
    for gpu, sub in d.groupby("GPU"):
        y = np.arange(len(d))[d["GPU"].to_numpy() == gpu]
        x = sub["DRAM reads, sawtooth vs linear"].to_numpy() * 100
        err = np.vstack([x - sub["range lo"].to_numpy() * 100, sub["range hi"].to_numpy() * 100 - x])
        axes[0].errorbar(x, y, xerr=err, fmt="o", capsize=3, label=gpu)
        axes[1].plot(sub["TFLOP/s, sawtooth vs linear"].to_numpy() * 100, y, "o", label=gpu)
    for ax in axes:
        ax.axvline(0, color="k", lw=0.8)
    axes[0].set_yticks(np.arange(len(d)), d["label"])
    from matplotlib.ticker import MaxNLocator
    axes[1].xaxis.set_major_locator(MaxNLocator(6))
    axes[0].set_xlabel("DRAM reads, sawtooth vs linear (%; bar: range)")
    axes[1].set_xlabel("TFLOP/s, sawtooth vs linear (%; medians)")
    axes[0].legend(title="GPU")
    fig.suptitle("Headline configurations on H100 SXM and H200, bf16, "
                 f"{h['repeats'].iloc[0].split('+')[0]} repeats each "
                 "((!): repeats disagree by more than 10%)")
    fig.tight_layout()
    return fig


def figure(study):
    return _draw(headline_pairs(study.load("headline")))


def table(study):
    return headline_pairs(study.load("headline"))


def section(study) -> Section:
    h = study.headline
    repeats = int(study.load("headline").groupby(["gpu", "point", "measurement"]).size().min())
    shown = pd.DataFrame({
        "GPU": h["GPU"], "configuration": h["configuration"],
        "linear DRAM / min": h["linear DRAM / min"],
        "DRAM reads (measured)": [f"{pct(m)} [{pct(lo)}, {pct(hi)}]" for m, lo, hi in
                                  zip(h["DRAM reads, sawtooth vs linear"], h["range lo"],
                                      h["range hi"])],
        "TFLOP/s": h["TFLOP/s, sawtooth vs linear"].map(pct),
        "flag": h["flag"],
    })
    return Section(f"""## Where sawtooth matters (headline)

The configurations where sawtooth cut misses most in the first sweeps, re-measured with
{repeats} repeats each on both GPUs (`experiments/headline.py`): DRAM reads and
TFLOP/s of sawtooth against linear (medians; in brackets the range over every pair of repeats).
The model's predictions for these launches are in the model's part, scored out of sample.

{md_table(shown)}

![headline](figures/headline.png)""")


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
