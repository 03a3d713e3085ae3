"""Causal GQA at long S: with the CTA order deciding the heads in flight, does sawtooth pay?

B=1, 32 query heads over 8 K/V heads, S=32k, D=128, causal (K/V of all heads: 134 MB, 2.7x
the H100's L2). Persistent grid-stride runs one head's Q tiles at a time; longest_first runs
every head's longest tiles together (heads fastest); grouped_dynamic runs L2-sized groups of
heads, longest first inside a group. Each with linear and sawtooth scans, 3 repeats, counters
and timing; sawtooth against linear paired by repeat.

    python experiments/causal_gqa.py run            # on a GPU: measure into data/causal_gqa/

Not measured yet: the session that wrote it had no device time left. Its table, figure and
section (sawtooth against linear paired by repeat, per CTA order) are in commit 3821494 and
return with the data (an experiment with a section and no data stops the paper build).
"""
from wavefront.report.experiments import run_as_script

DATASETS = ("causal_gqa",)

SPEC = """
name = "causal_gqa"
measure = ["timing", "counters"]
repeats = 3
reps = 10
timeout_s = 240
batch_points = 12

[grid]
batch = [1]
heads = [32]
kv_heads = [8]
seqlen = [32768]
head_dim = [128]
dtype = ["bfloat16"]
causal = [true]
tiles = ["128x64"]
schedule = ["persistent+linear", "persistent+sawtooth", "longest_first+linear",
            "longest_first+sawtooth", "grouped_dynamic+linear", "grouped_dynamic+sawtooth"]
"""


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
