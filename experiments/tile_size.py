"""64x64 vs 128x64 vs 128x128 tiles at a long length: misses and throughput.

    python experiments/tile_size.py run            # on a GPU: measure what the figure needs
    python experiments/tile_size.py plot --out DIR # anywhere: the paper's figure, from data/
"""
import pandas as pd
import seaborn as sns

from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu
from wavefront.results.store import with_timing

SPEC = """
name = "tile_size"
measure = ["timing", "counters"]
repeats = 3
timeout_s = 180
reps = 10
batch_points = 12

[grid]
batch = [1]
heads = [1]
seqlen = [131072]
head_dim = [64, 128]
causal = [false]
tiles = ["64x64", "128x64", "128x128"]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""


def _draw(joined: pd.DataFrame):
    """`joined`: counter rows with their timing (`records.with_timing`)."""
    d = joined.copy()
    d["GPU"] = d["gpu"].map(short_gpu)
    # Each tile shape runs at its own default occupancy: the label says which, so a reader
    # does not take an occupancy effect for a tile effect.
    d["tiles"] = (d["tile_m"].astype(str) + "x" + d["tile_n"].astype(str) + "\n"
                  + d["occupancy"].astype(str) + " CTA/SM")
    d["x compulsory"] = d["dram_read_bytes"] / d["compulsory_read_bytes"]
    d["D"] = "D=" + d["head_dim"].astype(str)
    d["GPU, K/V scan"] = d["GPU"] + ", " + d["kv_schedule"]
    long = pd.concat([d.assign(metric="DRAM reads / compulsory", value=d["x compulsory"]),
                      d.assign(metric="TFLOP/s (useful FLOPs)", value=d["tflops"])],
                     ignore_index=True)
    g = sns.catplot(data=long, x="tiles", y="value", hue="GPU, K/V scan", col="D",
                    row="metric", kind="bar", height=2.8, aspect=1.4,
                    sharey="row", estimator="median", errorbar=("pi", 100), palette="deep",
                    dodge=True)
    for (metric, _), ax in g.axes_dict.items():
        ax.set_ylabel(metric)
        if metric.startswith("DRAM"):
            ax.set_yscale("log")
    g.set_titles("{col_name}")
    g.set_xlabels("tile (Q rows x K/V rows), CTAs per SM")
    g.figure.suptitle("Tile size, persistent grid, S=128k B=1 H=1 bf16, "
                      f"{' and '.join(sorted(d['GPU'].unique()))}; bars median, whiskers range "
                      "over repeats", y=1.04)
    return g.figure


CAPTION = ("64x64, 128x64 and 128x128 tiles on the persistent grid at S=128k (B=1 H=1 bf16, "
           "D64 and D128) on the H100 and H200: DRAM reads over the compulsory bytes (log "
           "scale) and useful TFLOP/s per K/V scan; bars are medians, whiskers the range over "
           "repeats.")


def figure(study):
    return _draw(with_timing(study.load("tile_size")))


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
