"""Throughput vs DRAM traffic over every measured point, with the fitted model.

    python experiments/throughput_vs_misses.py run    # on a GPU: measure into data/ablation/
    python experiments/throughput_vs_misses.py plot   # anywhere: paper/figures/throughput_vs_misses.png and .pdf
"""
from wavefront.experiment import experiment

cli = experiment("throughput_vs_misses", spec="ablation", doc=__doc__)

if __name__ == "__main__":
    cli()
