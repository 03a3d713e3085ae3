"""Measured SM-side L2 read sectors against the closed-form count, causal and not.

    python experiments/closed_form.py run    # on a GPU: measure into data/schedules_vs_seqlen/
    python experiments/closed_form.py plot   # anywhere: paper/figures/closed_form.png and .pdf
"""
from wavefront.experiment import experiment

cli = experiment("closed_form", spec="schedules_vs_seqlen", doc=__doc__)

if __name__ == "__main__":
    cli()
