"""Tile size: 64x64 vs 128x64 vs 128x128 (split by the compiler?), misses and TFLOP/s.

    python experiments/tile_size.py run    # on a GPU: measure into data/tile_size/
    python experiments/tile_size.py plot   # anywhere: paper/figures/tile_size.png and .pdf
"""
from wavefront.experiment import experiment

cli = experiment("tile_size", spec="tile_size", doc=__doc__)

if __name__ == "__main__":
    cli()
