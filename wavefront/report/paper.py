"""`wavefront paper`: every experiment's figure, the tables and the draft, from data/.

The experiments are discovered in `experiments_dir`; each figure is drawn by the same
`report.experiments.draw` that `python experiments/<name>.py plot` uses. Repository paths are
arguments (the CLI defaults them to the current directory's `data/`, `paper/`, `experiments/`).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from wavefront.report import draft
from wavefront.report.analysis import Study
from wavefront.report.experiments import discover, draw
from wavefront.report.figures import short_gpu


def build(data_dir, paper_dir, experiments_dir, log=print) -> dict:
    start = time.perf_counter()
    paper_dir = Path(paper_dir)
    experiments = discover(experiments_dir)
    study = Study(data_dir)
    for name, exp in experiments.items():
        draw(exp, study, paper_dir / "figures")
        log(f"figure {name}")
    numbers = draft.compute(study, experiments)
    (paper_dir / "draft.md").write_text(draft.render(numbers))
    # Per-point medians, ranges and flags of every repeated data set: what the figures
    # summarise (single-shot data sets have nothing to summarise).
    (paper_dir / "summary").mkdir(parents=True, exist_ok=True)
    for dataset in sorted({d for e in experiments.values() for d in e.datasets}):
        summary = study.summary(dataset)
        target = paper_dir / "summary" / f"{dataset}.csv"
        if (summary["repeats"] > 1).any():
            summary.to_csv(target, index=False, float_format="%.6g")
        elif target.exists():
            target.unlink()
    tfits, _ = study.throughput
    summary = {
        "capacity_fits": {g: e.summary() for g, e in study.knee_fits.items()},
        "sweep_fits": {g: e.summary() for g, e in study.sweep_fits.items()},
        "throughput_fits": {g: {k: v for k, v in f.as_dict().items()
                                if k in ("flop_rate", "dram_rate", "overhead_s", "errors")}
                            for g, f in tfits.items()},
        "claims": [{"text": c.text, "holds": c.holds, "evidence": c.evidence}
                   for c in numbers.claims],
    }
    # Written without the elapsed time, so regenerating from the same data changes nothing.
    (paper_dir / "model_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    summary["seconds"] = time.perf_counter() - start
    log(f"{paper_dir / 'draft.md'} written in {summary['seconds']:.0f} s")
    return summary


def main_summary(summary: dict) -> str:
    lines = []
    for gpu, e in summary["capacity_fits"].items():
        cross = ", ".join(f"predicts {k}: MAPE {v['mape']:.1%}" for k, v in e["cross_gpu"].items())
        lines.append(f"{short_gpu(gpu)}: effective LRU {e['capacity_mib']:.1f} MiB "
                     f"({e['fraction_of_l2']:.2f} of L2), read-miss MAPE {e['mape']:.1%} over "
                     f"{e['n']} points; {cross}")
    return "\n".join(lines)
