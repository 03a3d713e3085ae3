"""Throughput against cuDNN and FA2 at B=1 H=32 S=8k, the first kernel, one shot per schedule.

History: the first kernel's bench (one timing per contender, peers in the same process), kept
as the comparison the interleaved bench (`bench_rounds`) and the table-driven kernel
(`schedule_cost`) replaced. Nothing here runs today; `plot` has no figure, the draft prints
its table.
"""
import pandas as pd

from wavefront.report.draft import Section, md_table
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu
from wavefront.results.records import BENCH_ONCE_RECORDS

DATASETS = ()
RECORDS = ("foundation_bench",)


def table(study) -> pd.DataFrame:
    rows = []
    for records in study.records(BENCH_ONCE_RECORDS, "foundation_bench", "bench_*.jsonl").values():
        for r in records:
            c = r["config"]
            cudnn = r["peers"].get("cudnn", {}).get("tflops")
            fa2 = r["peers"].get("fa2", {}).get("tflops")
            rows.append({"GPU": short_gpu(r["gpu"]), "D": c["head_dim"],
                         "causal": c["causal"], "schedule": c["schedule"],
                         "TFLOP/s": round(r["tflops"], 1),
                         "x cuDNN": round(r["tflops"] / cudnn, 2) if cudnn else None,
                         "x FA2": round(r["tflops"] / fa2, 2) if fa2 else None})
    return pd.DataFrame(rows)


def section(study) -> Section:
    return Section("## Foundation: throughput against cuDNN and FA2 (B=1, H=32, S=8192, bf16, "
                   f"same process)\n\n{md_table(table(study))}")


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
