"""Every CTA x K/V schedule, causal and not, D and tiles, at B=1 H=1 and B=8 H=16.

    python experiments/ablation.py run            # on a GPU: measure what the figure needs
    python experiments/ablation.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.report.experiments import run_as_script
from wavefront.report import figures
from wavefront.results.store import with_timing

SPEC = """
name = "ablation"
measure = ["timing", "counters"]
repeats = 3
timeout_s = 180
reps = 10
batch_points = 12

[[grid]]
batch = [1]
heads = [1]
seqlen = [131072]
head_dim = [64, 128]
causal = [false, true]
tiles = ["64x64", "128x64"]
schedule = ["grid+linear", "grid+sawtooth", "persistent+linear", "persistent+sawtooth",
            "grouped+linear", "grouped+sawtooth"]

[[grid]]
batch = [8]
heads = [16]
seqlen = [16384]
head_dim = [64, 128]
causal = [false, true]
tiles = ["64x64", "128x64"]
schedule = ["grid+linear", "grid+sawtooth", "persistent+linear", "persistent+sawtooth",
            "grouped+linear", "grouped+sawtooth"]
"""


def figure(study):
    return figures.ablation(with_timing(study.load("ablation")))


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
