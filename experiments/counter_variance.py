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

from wavefront.cli import experiment_cli
from wavefront.report import figures

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
    d["GPU"] = d["gpu"].map(figures.short_gpu)
    d["configuration"] = ("D" + d["head_dim"].astype(str) + " "
                          + d["cta_schedule"] + "+" + d["kv_schedule"]
                          + d["causal"].map({True: " causal", False: ""}))
    d["DRAM read / compulsory"] = d["dram_read_bytes"] / d["compulsory_read_bytes"]
    return d


def figure(study):
    return figures.repeat_spread(repeats(study))


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


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
