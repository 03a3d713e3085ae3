"""The tiled K/V schedule vs linear and sawtooth at 64k-256k: DRAM reads and throughput.

    python experiments/tiled.py run            # on a GPU: measure what the figure needs
    python experiments/tiled.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.cli import experiment_cli
from wavefront.report import figures
from wavefront.report.analysis import tiled_table
from wavefront.results.store import with_timing

SPEC = """
name = "tiled"
measure = ["timing", "counters"]
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


def figure(study):
    return figures.tiled_vs_scans(with_timing(study.load("tiled")))


def table(study):
    return tiled_table(study.load("tiled"))


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
