"""L2 read misses vs S for grid/persistent x linear/sawtooth (issue 3's sweep).

    python experiments/schedules_vs_seqlen.py run    # on a GPU: measure into data/schedules_vs_seqlen/
    python experiments/schedules_vs_seqlen.py plot   # anywhere: paper/figures/schedules_vs_seqlen.png and .pdf
"""
from wavefront.experiment import experiment

cli = experiment("schedules_vs_seqlen", spec="schedules_vs_seqlen", doc=__doc__)

if __name__ == "__main__":
    cli()
