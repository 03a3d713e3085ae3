"""Schedule ablation: grid/persistent/grouped x linear/sawtooth, misses, DRAM, TFLOP/s.

    python experiments/ablation.py run    # on a GPU: measure into data/ablation/
    python experiments/ablation.py plot   # anywhere: paper/figures/ablation.png and .pdf
"""
from wavefront.experiment import experiment

cli = experiment("ablation", spec="ablation", doc=__doc__)

if __name__ == "__main__":
    cli()
