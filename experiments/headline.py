"""Where sawtooth matters: the headline configurations re-measured with repeats and spread.

    python experiments/headline.py run            # on a GPU: measure into data/headline/
    python experiments/headline.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.cli import experiment_cli
from wavefront.report import figures
from wavefront.report.analysis import headline_pairs

SPEC = """
name = "headline"
measure = ["timing", "counters"]
repeats = 3
timeout_s = 240
reps = 10
batch_points = 12

[[grid]]
batch = [8]
heads = [16]
seqlen = [16384]
head_dim = [128]
causal = [false]
tiles = ["128x64"]
schedule = ["grouped+linear", "grouped+sawtooth"]

[[grid]]
batch = [1]
heads = [1]
seqlen = [131072]
head_dim = [64]
causal = [false]
tiles = ["64x64"]
schedule = ["grid+linear", "grid+sawtooth", "persistent+linear", "persistent+sawtooth",
            "grouped+linear", "grouped+sawtooth"]

[[grid]]
batch = [1]
heads = [1]
seqlen = [262144]
head_dim = [64]
causal = [true]
tiles = ["64x64"]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""


def figure(study):
    return figures.headline_pairs(headline_pairs(study.load("headline")))


def table(study):
    return headline_pairs(study.load("headline"))


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
