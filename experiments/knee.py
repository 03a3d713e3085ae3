"""Where misses leave the compulsory level, H100 vs H200, and the model's knee.

    python experiments/knee.py run            # on a GPU: measure what the figure needs
    python experiments/knee.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.cli import experiment_cli
from wavefront.report import figures
from wavefront.report.analysis import unfitted_predictions, knees, predicted_curve

SPEC = """
name = "knee"
measure = ["timing", "counters"]
repeats = 3
timeout_s = 180
reps = 10
batch_points = 12

[grid]
batch = [1]
heads = [1]
seqlen = [16384, 24576, 32768, 49152, 65536, 98304, 131072, 196608, 262144]
head_dim = [64, 128]
dtype = ["bfloat16"]
causal = [false]
tiles = ["128x64"]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""


def figure(study):
    c = study.knee_counters
    return figures.misses_vs_seqlen(c, predicted_curve(c, study.knee_fits))


def table(study):
    """Knees measured and predicted by the partition model, which fits nothing."""
    return knees(study.knee_counters, unfitted_predictions(study, "knee"))


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
