"""64x64 vs 128x64 vs 128x128 tiles at a long length: misses and throughput.

    python experiments/tile_size.py run            # on a GPU: measure what the figure needs
    python experiments/tile_size.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.report.experiments import run_as_script
from wavefront.report import figures
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


def figure(study):
    return figures.tile_size(with_timing(study.load("tile_size")))


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
