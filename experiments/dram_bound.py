"""Where does DRAM bandwidth bind, and does a schedule's miss saving then become speed?

A regime built for it on Hopper: the longest-first order runs heads fastest, so with B x H
at least the CTAs in flight every CTA streams its own head's K/V and nothing is shared
(64 FLOP per DRAM byte at 64x64 tiles, below the H100's ~295 FLOP/B balance); with one head,
every CTA shares the same K/V and the launch is compute-bound. Sweeping the heads walks from
one regime to the other at fixed work per head, for linear and sawtooth scans, with persistent
(Q tiles fastest: heads shared) as the compute-bound reference. Timing and DRAM counters per
point; the throughput model's memory term is fitted here.

    python experiments/dram_bound.py run            # on a GPU: measure into data/dram_bound/
    python experiments/dram_bound.py plot --out DIR # anywhere: figure and table from data/
"""
from wavefront.cli import experiment_cli
from wavefront.report import figures
from wavefront.report.analysis import dram_bound_table

SPEC = """
name = "dram_bound"
measure = ["timing", "counters"]
repeats = 3
timeout_s = 240
reps = 10
batch_points = 24
metric_set = "dram"

[[grid]]
batch = [1]
heads = [1, 8, 32, 64, 128, 256]
seqlen = [8192]
head_dim = [64]
causal = [false]
tiles = ["64x64"]
schedule = ["longest_first+linear", "longest_first+sawtooth", "persistent+linear"]
"""


def figure(study):
    tfits, _ = study.throughput
    fit = tfits.get("H100")
    return figures.dram_bound(dram_bound_table(study), fit.dram_rate if fit else None,
                              fit.intervals["dram_rate"] if fit else None)


def table(study):
    return dram_bound_table(study)


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
