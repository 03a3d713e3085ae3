"""Hit rate vs CTAs in flight: a persistent grid from a few CTAs to every slot.

Today's kernel, 3 repeats, counters and timing (the first kernel's single sweep is kept in
data/ctas_in_flight_first/).

    python experiments/ctas_in_flight.py run            # on a GPU: measure what the figure needs
    python experiments/ctas_in_flight.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.report.experiments import run_as_script
from wavefront.report import figures

SPEC = """
name = "ctas_in_flight"
measure = ["timing", "counters"]
repeats = 3
reps = 10
timeout_s = 240
batch_points = 12

[grid]
batch = [1]
heads = [1]
seqlen = [131072]
head_dim = [64]
dtype = ["bfloat16"]
causal = [false]
tiles = ["128x64"]
ctas = [8, 16, 33, 66, 132, 264]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""


def figure(study):
    return figures.hit_rate_vs_ctas(study.counters("ctas_in_flight"))


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
