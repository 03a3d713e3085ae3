"""SM-side L2 read sectors against the closed-form count, causal and not.

    python experiments/closed_form.py run            # on a GPU: measure what the figure needs
    python experiments/closed_form.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.report.experiments import run_as_script
from wavefront.report import figures

DATASETS = ("schedules_vs_seqlen",)


def figure(study):
    return figures.sectors_vs_closed_form(study.sweep_counters)


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
