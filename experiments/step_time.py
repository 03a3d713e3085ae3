"""What does one K/V step cost a CTA when nothing waits on DRAM? The timed model's compute time.

The timed cache model (`wavefront.model.timed`) gives every CTA a clock; a K/V step's compute
time is the one parameter it cannot take from a microbenchmark of the memory system. It is
measured here, per GPU and kernel variant (head dim, tile shape, mask, CTAs per SM), on
launches whose K/V in flight fits in the L2 (the counters check it: DRAM reads near the
compulsory bytes), at two sequence lengths so that a step's cost and a work item's fixed cost
separate. These launches are the model's named training set; every other data set is held out.
Today's kernel measured every number.

    python experiments/step_time.py run            # on a GPU: the sweep (timing and counters)

No figure or section of its own: the calibration it yields is the first table of the timed
model's section (experiments/timed_model.py), and `table` here.
"""
from wavefront.report.experiments import run_as_script

# Every grid: the same launches (B1 H32, two lengths, both head dims and masks, persistent);
# they differ in tiles, CTAs per SM and CTAs in flight.
LAUNCHES = """
[[grid]]
batch = [1]
heads = [32]
seqlen = [2048, 8192]
head_dim = [64, 128]
causal = [false, true]
schedule = ["persistent+linear"]
"""
SPEC = """
name = "step_time"
measure = ["timing", "counters"]
metric_set = "dram"
repeats = 3
reps = 20
timeout_s = 300
batch_points = 8
""" + LAUNCHES + """tiles = ["64x64", "128x64"]
occupancy = [1, 2]
""" + LAUNCHES + """tiles = ["128x128"]
occupancy = [1]
""" + LAUNCHES + """tiles = ["64x64", "128x64", "128x128"]
occupancy = [1]
ctas = [48]
"""


def table(study):
    """The compute timings fitted on this data set, per GPU and kernel variant."""
    import pandas as pd

    from wavefront.model.timed import variant_label
    from wavefront.report.timed import calibrations
    return pd.DataFrame([{"gpu": gpu, "variant": variant_label(v), "step_ns": ns,
                          "item_ns": c.item_ns, "launch_ns": c.launch_ns}
                         for gpu, c in calibrations(study).items()
                         for v, ns in sorted(c.step_ns.items())])


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
