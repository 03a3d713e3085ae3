"""Does anything hit in L1 on the TMA path? L1 vs L2 sectors at S=32k and 128k.

    python experiments/l1_vs_l2.py run            # on a GPU: measure what the figure needs
    python experiments/l1_vs_l2.py plot --out DIR # anywhere: the paper's figure, from data/
"""
from wavefront.report.experiments import run_as_script
from wavefront.report import figures

DATASETS = ("schedules_vs_seqlen",)


def figure(study):
    c = study.sweep_counters
    c = c[(c["seqlen"].isin([32768, 131072])) & (c["cta_schedule"] == "persistent")
          & (c["kv_schedule"] == "linear")]
    return figures.l1_vs_l2(c)


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
