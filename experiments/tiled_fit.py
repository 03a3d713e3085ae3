"""Chunks fitted to Hopper's two L2 partitions: tiled_fit vs tiled vs the scans at D=128.

`tiled` cut K/V into 40%-of-L2 chunks; at D=128 the Q tiles and fp32 partial states that each
round of CTAs streams through the L2 (26 MB on the H100) pushed its chunks out between rounds.
`tiled_fit` sizes the chunk as (0.8 x L2 - stream) / 2: a copy in each partition plus the stream.
DRAM reads and writes under Nsight Compute; the table also gives TFLOP/s against linear from
the bench in data/tiled_fit/bench.jsonl.

    python experiments/tiled_fit.py run            # on a GPU: measure into data/tiled_fit/
    python experiments/tiled_fit.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.cli import experiment_cli
from wavefront.report import figures
from wavefront.report.analysis import tiled_fit_table

SPEC = """
name = "tiled_fit"
measure = ["counters"]
repeats = 2
timeout_s = 300
batch_points = 8

[[grid]]
batch = [1]
heads = [1]
seqlen = [131072, 262144]
head_dim = [128]
causal = [false, true]
tiles = ["128x64"]
schedule = ["persistent+linear", "persistent+sawtooth", "persistent+tiled",
            "persistent+tiled_fit", "persistent+tiled_fit_bf16"]
"""


def figure(study):
    return figures.tiled_fit(tiled_fit_table(study.load("tiled_fit")))


def table(study):
    return tiled_fit_table(study.load("tiled_fit"))


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
