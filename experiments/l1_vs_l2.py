"""Does anything hit in L1 on the TMA path? L1 vs L2 sectors at S=32k and 128k.

    python experiments/l1_vs_l2.py run    # on a GPU: measure into data/schedules_vs_seqlen/
    python experiments/l1_vs_l2.py plot   # anywhere: paper/figures/l1_vs_l2.png and .pdf
"""
from wavefront.experiment import experiment

cli = experiment("l1_vs_l2", spec="schedules_vs_seqlen", doc=__doc__)

if __name__ == "__main__":
    cli()
