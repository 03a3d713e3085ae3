"""Why do counters of one configuration vary between runs? DRAM reads over repeated launches.

Causal S=128k D=128 persistent launches read 2650-3490 MB of DRAM over five repeats on an H100
while non-causal D=64 agreed within 0.2% (earlier probes). Four candidate causes, each with a
test in this sweep:
- the replay passes: the full metric set needs several passes of the launch; the "dram" set
  fits in one, so its counters come from a single execution;
- CTA timing: causal work items differ in length, the CTAs drift apart and the interleaving
  (hence L2 reuse) differs per launch; non-causal items are equal, and the longest-first order
  keeps each round's items about equally long;
- the clocks: clocks are read per launch under ncu only as a duration; compared across repeats;
- the fabric-derived arithmetic: the DRAM bytes are read directly, no subtraction.

    python experiments/counter_variance.py run            # on a GPU: both metric sets
    python experiments/counter_variance.py plot --out DIR # anywhere: the figure, from data/
"""
import pandas as pd

from wavefront.report.draft import Section, md_table, paragraphs
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu
from wavefront.results.measurement import spread

GRID = """
repeats = 5
timeout_s = 300
batch_points = 40

[[grid]]
batch = [1]
heads = [1]
seqlen = [131072]
head_dim = [128]
causal = [false, true]
tiles = ["128x64"]
schedule = ["persistent+linear", "persistent+sawtooth", "longest_first+linear"]

[[grid]]
batch = [1]
heads = [1]
seqlen = [131072]
head_dim = [64]
causal = [false]
tiles = ["64x64"]
schedule = ["persistent+linear"]
"""
SPECS = {
    "counter_variance": 'name = "counter_variance"\nmeasure = ["counters"]\n'
                        'metric_set = "full"\n' + GRID,
    "counter_variance_dram": 'name = "counter_variance_dram"\nmeasure = ["counters"]\n'
                             'metric_set = "dram"\n' + GRID,
}


def repeats(study) -> pd.DataFrame:
    frames = []
    for dataset, metric_set in (("counter_variance", "full (several passes)"),
                                ("counter_variance_dram", "dram (one pass)")):
        c = study.counters(dataset)
        frames.append(c.assign(metric_set=metric_set))
    d = pd.concat(frames, ignore_index=True)
    d["GPU"] = d["gpu"].map(short_gpu)
    d["configuration"] = ("D" + d["head_dim"].astype(str) + " "
                          + d["cta_schedule"] + "+" + d["kv_schedule"]
                          + d["causal"].map({True: " causal", False: ""}))
    d["DRAM read / compulsory"] = d["dram_read_bytes"] / d["compulsory_read_bytes"]
    return d


CAPTION = ("Counters over repeated launches on each GPU (B=1 H=1 S=128k bf16, Nsight Compute, "
           "cold L2 each launch): DRAM reads over the compulsory bytes, one dot per launch, per "
           "metric set (several replay passes, or one).")


def figure(study):
    """Every repeat of each configuration: DRAM reads over the compulsory bytes, per metric set
    (several replay passes vs one); ticks spread over the data's own range."""
    import numpy as np
    import seaborn as sns
    from wavefront.report.figures import plain_log
    d = repeats(study)
    g = sns.catplot(data=d, x="DRAM read / compulsory", y="configuration", hue="metric_set",
                    col="GPU", kind="strip", dodge=True, height=3.6, aspect=1.6, jitter=False)
    g.set(xscale="log")
    lo, hi = float(d["DRAM read / compulsory"].min()), float(d["DRAM read / compulsory"].max())
    ticks = sorted({float(f"{x:.2g}") for x in np.geomspace(lo, hi, 6)})
    for ax in g.axes.flat:
        plain_log(ax.xaxis, ticks)
    g.set_axis_labels("DRAM reads / compulsory (log; a dot per launch)", "")
    g.figure.suptitle("Counters over repeated launches, B=1 H=1 S=128k bf16 (ncu, cold L2 each "
                      "launch)", y=1.04)
    return g.figure


def table(study):
    d = repeats(study)
    g = d.groupby(["GPU", "configuration", "metric_set"])
    out = g["dram_read_bytes"].agg(["median", "min", "max", "count"])
    out["spread"] = (out["max"] - out["min"]) / out["median"]
    dur = g["ncu_duration_ns"].agg(["min", "max"])
    out["duration spread"] = (dur["max"] - dur["min"]) / dur["min"]
    out = out.reset_index()
    return pd.DataFrame({
        "GPU": out["GPU"], "configuration": out["configuration"],
        "counters": out["metric_set"], "repeats": out["count"],
        "DRAM read MB (median)": (out["median"] / 1e6).round(1),
        "min-max MB": ((out["min"] / 1e6).round(0).astype(int).astype(str) + "-"
                       + (out["max"] / 1e6).round(0).astype(int).astype(str)),
        "spread": out["spread"].map(lambda x: f"{x:.1%}"),
        "duration spread": out["duration spread"].map(lambda x: f"{x:.1%}"),
    })


def _range_mb(d: pd.DataFrame, configuration: str) -> str:
    """'2925-4576 MB on the H100, 1343-1907 MB on the H200' over every repeat and metric set."""
    sub = d[d["configuration"] == configuration]
    return ", ".join(f"{g['dram_read_bytes'].min() / 1e6:.0f}-{g['dram_read_bytes'].max() / 1e6:.0f}"
                     f" MB on the {gpu}" for gpu, g in sub.groupby("GPU"))


def section(study) -> Section:
    """The run-to-run spread of counters, its four candidate causes, and the claims."""
    s = Section()
    d = repeats(study)
    g = d.groupby(["GPU", "configuration", "metric_set"])
    sp = g["dram_read_bytes"].agg(spread)
    dur = g["ncu_duration_ns"].agg(lambda v: (v.max() - v.min()) / v.min())
    med = g["dram_read_bytes"].median()
    causal = "D128 persistent+linear causal"
    one_pass = sp.xs("dram (one pass)", level="metric_set")
    causal_one_pass = one_pass.xs(causal, level="configuration")
    noncausal = sp[[c for c in sp.index if "causal" not in c[1] and "persistent" in c[1]]]
    balanced = (med.xs("D128 longest_first+linear causal", level="configuration")
                / med.xs(causal, level="configuration"))
    s.claim("in one replay pass the causal persistent launch still varies",
            causal_one_pass.max() > 0.10, f"one-pass spreads {causal_one_pass.to_dict()}",
            listed=False)
    s.claim("durations under ncu vary little", dur.max() < 0.05, f"max {dur.max():.3f}",
            listed=False)
    s.claim("non-causal persistent launches vary too", noncausal.max() > 0.10,
            f"spreads {noncausal.to_dict()}", listed=False)
    s.claim("longest-first cuts causal DRAM reads", balanced.max() < 0.5,
            f"ratios {balanced.to_dict()}", listed=False)
    text = paragraphs(
        f"Over five launches, the same causal launch (S=128k, D=128, persistent, 128x64) read "
        f"from DRAM {_range_mb(d, causal)}. Four candidate causes, each tested in "
        "`experiments/counter_variance.py` (five cold launches per configuration, interleaved):"
        "\n\n"
        f"- *Replay passes*: measured with a metric set that fits in one pass, the spread remains "
        f"({causal_one_pass.min():.0%}-{causal_one_pass.max():.0%} for that launch): the "
        "counters of one execution differ from the next; it is not an artifact of combining "
        "passes.\n"
        f"- *Clocks*: the launch durations under ncu vary by at most {dur.max():.1%} over all "
        "repeats, far less than the DRAM reads.\n"
        "- *The fabric arithmetic*: the DRAM bytes are read directly; no difference of counters "
        "is involved.\n"
        f"- *CTA timing*: even non-causal persistent launches, whose work items are all equally "
        f"long, spread by {noncausal.min():.0%}-{noncausal.max():.0%} (the first kernel's agreed "
        "within 2.3%, measured in its own profile harness, which kept its CTAs together: see the "
        "S=256k section). Our hypothesis: the CTAs drift apart inside their work items, so how "
        "much of the K/V stream is still in L2 when a CTA reaches it depends on the interleaving "
        "of that launch (the time-resolved DRAM traffic of the S=256k section agrees; no "
        "controlled experiment has isolated it). Causal work items also differ in length. "
        "Handing them out longest first, so that every round's items are about equally long, "
        f"reads {balanced.min():.2f}-{balanced.max():.2f}x the DRAM bytes of the persistent "
        "order.\n\n"
        "The first three causes are ruled out: the counters are right, the launches differ, and "
        "CTA timing is what is left (the hypothesis above). The paper therefore reports medians "
        "over repeats, with their range, and flags points whose repeats disagree by more than "
        "10%.")
    s.text = f"""## Why counters vary between runs

{text}

{md_table(table(study))}

![variance](figures/counter_variance.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
