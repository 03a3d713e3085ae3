"""Misses vs S for grid/persistent x linear/sawtooth, causal and not, D=64/128.

    python experiments/schedules_vs_seqlen.py run            # on a GPU: measure what the figure needs
    python experiments/schedules_vs_seqlen.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.report.experiments import run_as_script
from wavefront.report import figures

SPEC = """
name = "schedules_vs_seqlen"
measure = ["timing", "counters"]
repeats = 3
timeout_s = 120
reps = 20
batch_points = 16

[grid]
batch = [1]
heads = [1]
seqlen = [4096, 8192, 16384, 32768, 65536, 131072]
head_dim = [64, 128]
dtype = ["bfloat16"]
causal = [false, true]
tiles = ["128x64"]
schedule = ["grid+linear", "grid+sawtooth", "persistent+linear", "persistent+sawtooth"]
"""


CAPTION = ("DRAM reads over the compulsory bytes against the sequence length (4k-128k "
           "tokens) for the grid and persistent CTA orders with the linear and sawtooth scans, "
           "causal and not, on the H100 and H200 (B=1 H=1 bf16, 128x64 tiles, D64 and D128; "
           "Nsight Compute, medians over repeats).")


def figure(study):
    return figures.misses_vs_seqlen(study.sweep_counters)


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
