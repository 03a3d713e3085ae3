"""The tiled K/V schedule vs linear and sawtooth at 64k-256k: DRAM vs minimum, TFLOP/s.

    python experiments/tiled.py run    # on a GPU: measure into data/tiled/
    python experiments/tiled.py plot   # anywhere: paper/figures/tiled.png and .pdf
"""
from wavefront.experiment import experiment

cli = experiment("tiled", spec="tiled", doc=__doc__)

if __name__ == "__main__":
    cli()
