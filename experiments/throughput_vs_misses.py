"""The fitted throughput model over every timed point: where misses matter at all.

    python experiments/throughput_vs_misses.py run            # on a GPU: measure what the figure needs
    python experiments/throughput_vs_misses.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.cli import experiment_cli
from wavefront.report import figures
from wavefront.report.analysis import TIMED_EXPERIMENTS

DATASETS = TIMED_EXPERIMENTS


def figure(study):
    fits, joined = study.throughput
    return figures.throughput_vs_misses(joined, fits)


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
