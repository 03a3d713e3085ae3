"""Misses vs S: where reads leave the compulsory level on H100 vs H200, and the model.

    python experiments/knee.py run    # on a GPU: measure into data/knee/
    python experiments/knee.py plot   # anywhere: paper/figures/knee.png and .pdf
"""
from wavefront.experiment import experiment

cli = experiment("knee", spec="knee", doc=__doc__)

if __name__ == "__main__":
    cli()
