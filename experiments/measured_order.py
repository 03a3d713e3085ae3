"""Do the CTAs run in lock-step? The work items' real interleaving, recorded by the kernel, and
what it does to the cache model's predictions of DRAM reads.

The RECORD_ORDER kernel takes a ticket from a global atomic counter as each work item starts
and ends; a counter run saves the tickets of the very launch whose DRAM reads ncu reports.
Each launch is then predicted three ways against its own DRAM reads: lock-step rounds (the
model's default), the measured order, and a drift model (per-SM rate spread, start skew) fitted
to the *other* repeats' orders. The same points measured without the flag give its overhead.
Configurations: 132 vs 264 CTAs (occupancy 1 and 2), grouped with 256 vs 264 CTAs, causal,
all at B=8 H=16 S=16k D=128; and causal S=128k D=128, where sawtooth read more than linear.

    python experiments/measured_order.py run            # on a GPU: both data sets
    python experiments/measured_order.py plot --out DIR # anywhere: figure and table from data/
"""
from wavefront.cli import experiment_cli
from wavefront.report import figures
from wavefront.report.analysis import measured_order_table

GRID = """
repeats = 3
timeout_s = 300
reps = 10
batch_points = 16
metric_set = "dram"

[[grid]]
batch = [8]
heads = [16]
seqlen = [16384]
head_dim = [128]
causal = [false, true]
tiles = ["128x64"]
occupancy = [1, 2]
schedule = ["persistent+linear", "persistent+sawtooth"]

[[grid]]
batch = [8]
heads = [16]
seqlen = [16384]
head_dim = [128]
causal = [false]
tiles = ["128x64"]
ctas = [256, 0]
schedule = ["grouped+linear", "grouped+sawtooth"]

[[grid]]
batch = [1]
heads = [1]
seqlen = [131072]
head_dim = [128]
causal = [true]
tiles = ["128x64"]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""
SPECS = {
    "measured_order": 'name = "measured_order"\nmeasure = ["timing", "counters"]\n'
                      'record_order = true\n' + GRID,
    "measured_order_plain": 'name = "measured_order_plain"\n'
                            'measure = ["timing", "counters"]\n' + GRID,
}


def figure(study):
    return figures.measured_order(measured_order_table(study))


def table(study):
    return measured_order_table(study)


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
