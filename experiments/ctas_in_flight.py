"""Hit rate vs number of CTAs in flight, persistent grid from 8 to 264 CTAs.

    python experiments/ctas_in_flight.py run    # on a GPU: measure into data/ctas_in_flight/
    python experiments/ctas_in_flight.py plot   # anywhere: paper/figures/ctas_in_flight.png and .pdf
"""
from wavefront.experiment import experiment

cli = experiment("ctas_in_flight", spec="ctas_in_flight", doc=__doc__)

if __name__ == "__main__":
    cli()
