"""Does a schedule cost anything by itself? Every schedule against its own linear scan and grid.

Where K/V fits in L2 (S=8k) every schedule reads the same bytes, so any speed difference is
the schedule's own cost. The bench times every schedule and cuDNN / FA2 in interleaved rounds;
ratios are paired by round. Runs: the default levers (128x64 tiles, 2 CTAs per SM) and the
tuned ones (128x128, two consumer warpgroups), on the H100 (twice) and the H200.

    python experiments/schedule_cost.py run            # on a GPU: bench into data/schedule_cost/
    python experiments/schedule_cost.py plot --out DIR # anywhere: the paper's figure
"""
from wavefront.cli import experiment_cli
from wavefront.report import figures
from wavefront.report.analysis import schedule_cost_rows, schedule_cost_summary

SCHEDULES = ("grid+linear,grid+sawtooth,persistent+linear,persistent+sawtooth,grouped+linear,"
             "grouped+sawtooth,longest_first+linear,longest_first+sawtooth,dynamic+linear,"
             "dynamic+sawtooth,grouped_dynamic+linear,grouped_dynamic+sawtooth")
DATASETS = ()  # it reads bench rounds (data/schedule_cost/*.jsonl), not a results table
# `run` appends each of these `wavefront bench` runs to data/schedule_cost/bench.jsonl.
BENCH = [
    ["--seqlen", "8192", "--head-dim", "64,128", "--schedule", SCHEDULES, "--rounds", "15"],
    ["--seqlen", "8192", "--head-dim", "64,128", "--schedule", SCHEDULES, "--tile", "128x128",
     "--occupancy", "1", "--worker-warps", "8", "--tuned", "--rounds", "15"],
]


def figure(study):
    return figures.schedule_cost(schedule_cost_rows(study.data_dir))


def table(study):
    return schedule_cost_summary(schedule_cost_rows(study.data_dir))


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
