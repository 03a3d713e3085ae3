"""`wavefront paper`: every experiment's figure, the tables and the draft, from data/.

The experiments are discovered in `experiments_dir`; each figure is drawn by the same
`report.experiments.draw` that `python experiments/<name>.py plot` uses. Repository paths are
arguments (the CLI defaults them to the current directory's `data/`, `paper/`, `experiments/`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

from wavefront.files import write_file
from wavefront.report import draft, timed
from wavefront.report.analysis import Study
from wavefront.report.experiments import discover, draw
from wavefront.results.progress import peak_rss_mib
from wavefront.results.store import round_significant, write_csv_gz


def build(data_dir, paper_dir, experiments_dir, log=print) -> dict:
    """Build the paper into a scratch copy of `paper_dir` beside it and put the copy in its
    place only when the whole build succeeded: a build that fails (a data set that does not
    load, a claim the data contradicts, a full disk) leaves the existing paper as it was.
    `paper_dir` must not be, nor hold, a symbolic link (the build would replace the link and
    leave its target stale, or write through it). A build that was killed (SIGTERM ends this
    one cleanly; SIGKILL cannot be caught) leaves its scratch copy, removed by the next."""
    paper_dir = Path(paper_dir)
    _refuse_links(paper_dir)
    _remove_abandoned(paper_dir)
    scratch = paper_dir.with_name(f".{paper_dir.name}.building-{os.getpid()}")
    old = paper_dir.with_name(f".{paper_dir.name}.old-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    previous = _terminate_as_interrupt()
    try:
        if paper_dir.is_dir():  # files the build does not write are kept
            shutil.copytree(paper_dir, scratch, symlinks=True)
        else:
            scratch.mkdir(parents=True)
        summary = _build_into(data_dir, scratch, experiments_dir, log)
        swapped_out = paper_dir.exists()
        if swapped_out:
            paper_dir.rename(old)
        try:
            scratch.rename(paper_dir)
        except OSError:
            if swapped_out:
                old.rename(paper_dir)  # the paper as it was, never none
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        previous()
    log(f"{paper_dir / 'draft.md'} written in {summary['seconds']:.0f} s")
    summary["paper_dir"] = str(paper_dir)
    return summary


def _refuse_links(paper_dir: Path) -> None:
    from wavefront.files import UnsafePath
    if paper_dir.is_symlink():
        raise UnsafePath(f"--out {paper_dir}: is a symbolic link; the paper is built beside it "
                         "and put in its place, which would replace the link and leave its "
                         "target stale: name the target directory itself")
    if paper_dir.is_dir():
        for root, dirs, names in os.walk(paper_dir):
            for name in dirs + names:
                if os.path.islink(os.path.join(root, name)):
                    raise UnsafePath(f"{os.path.join(root, name)}: is a symbolic link; the "
                                     "paper build writes only files of its own (remove it)")


def _remove_abandoned(paper_dir: Path) -> None:
    """Scratch copies (`.<name>.building-<pid>`, `.<name>.old-<pid>`) of builds whose process
    is gone: a build killed before its own cleanup ran."""
    for stale in paper_dir.parent.glob(f".{paper_dir.name}.*-*"):
        kind, _, pid = stale.name[len(paper_dir.name) + 2:].rpartition("-")
        if kind not in ("building", "old") or not pid.isdigit() or stale.is_symlink():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass  # alive, another user's: not ours to remove


def _terminate_as_interrupt():
    """SIGTERM raises KeyboardInterrupt while the build runs, so its cleanup runs; -> what
    puts the handler it replaced back (nothing where signals cannot be set: not the main
    thread)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    try:
        replaced = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL if replaced is None
                                 else replaced)


def _build_into(data_dir, paper_dir: Path, experiments_dir, log) -> dict:
    start = time.perf_counter()
    experiments = discover(experiments_dir)
    study = Study(data_dir)
    # the paper's figures in figures/ (committed), every other one in figures/appendix/; a
    # figure that moved between them, or whose experiment is gone, is not left behind
    for old in list((paper_dir / "figures").glob("*.png")) + list(
            (paper_dir / "figures" / "appendix").glob("*.png")):
        old.unlink()
    for name, exp in experiments.items():
        began = time.perf_counter()
        draw(exp, study, figure_dir(paper_dir, name, experiments))
        # the time includes what this figure computed first for the rest (Study caches it)
        log(f"figure {name}: {time.perf_counter() - began:.1f} s, peak memory so far "
            f"{peak_rss_mib():.0f} MiB")
    numbers = draft.compute(study, experiments)
    write_file(paper_dir / "draft.md", draft.render(numbers), what="the draft")
    for old in paper_dir.glob("appendix_*.md"):
        old.unlink()
    for name, text in numbers.appendices.items():
        write_file(paper_dir / f"appendix_{name}.md", text, what=f"appendix {name}")
    # Per-point medians, ranges and flags of every repeated data set: what the figures
    # summarise (single-shot data sets have nothing to summarise).
    (paper_dir / "summary").mkdir(parents=True, exist_ok=True)
    # Compressed (without timestamps: the same rows give the same bytes) to keep the
    # repository small enough to travel with every GPU call.
    for dataset in sorted({d for e in experiments.values() for d in e.datasets}):
        summary = study.summary(dataset)
        target = paper_dir / "summary" / f"{dataset}.csv.gz"
        if (summary["repeats"] > 1).any():
            write_csv_gz(summary, target, float_format="%.6g")
        elif target.exists():
            target.unlink()
    tfits, _ = study.throughput
    write_csv_gz(study.capacity_validation, paper_dir / "summary" / "capacity_validation.csv.gz",
                 float_format="%.6g")
    study.predictions.to_csv(paper_dir / "predictions.csv", index=False, float_format="%.6g")
    drop = ("points", "predicted_ms", "measured_ms")
    summary = {
        "out_of_sample": {
            "capacity": study.capacity_validation.to_dict(orient="records"),
            "throughput": study.throughput_validation.to_dict(orient="records"),
        },
        "throughput_fits": {g: {k: v for k, v in f.as_dict().items() if k not in drop}
                            for g, f in tfits.items()},
        "in_sample": {"capacity_fits": {g: e.summary() for g, e in study.knee_fits.items()}},
        # the timed model: its calibration (what `wavefront simulate` and `advise` read), its
        # training set, and its held-out scores per family and GPU
        "timed_model": {
            "training": timed.TRAINING,
            "calibrations": {g: c.as_dict() for g, c in timed.calibrations(study).items()},
            "out_of_sample": timed.validation_table(study).to_dict(orient="records"),
            "advisor_on_held_out_shapes": timed.advisor_check(study).to_dict(orient="records"),
            "predictions": timed.predictions(study).to_dict(orient="records")},
        "claims": [{"text": c.text, "holds": c.holds,
                    "evidence": kept_evidence(rounded_numbers(c.evidence))}
                   for c in numbers.claims],
    }
    # Written without the elapsed time, so regenerating from the same data changes nothing;
    # at PRECISION significant digits, numbers inside evidence strings too: fits' optimisers
    # end a few ulps apart on another CPU's BLAS, and those digits must not reach the file.
    write_file(paper_dir / "fits.json", _json_lines(round_significant(summary, PRECISION)),
               what="fits.json")
    summary["finding"] = numbers.values.get("finding", "")  # for the main job's last lines
    summary["seconds"] = time.perf_counter() - start
    return summary


# Significant digits of every number fits.json holds (in evidence strings too): relative
# differences of 1e-9 to 2e-6 between two x86 machines' BLAS stay below the last digit kept.
PRECISION = 6
_NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?:[eE][-+]?\d+)?|(?<![\w.])-?\d+[eE][-+]?\d+")


def figure_dir(paper_dir: Path, name: str, experiments) -> Path:
    """Where an experiment's figure goes: the paper's in figures/, the appendices' in
    figures/appendix/."""
    main = getattr(experiments, "draft", ())
    return paper_dir / "figures" if name in main else paper_dir / "figures" / "appendix"


def rounded_numbers(text: str, digits: int = PRECISION) -> str:
    """`text` with every decimal number in it written at `digits` significant digits
    (integers stay as they are)."""
    return _NUMBER.sub(lambda m: f"{float(m.group()):.{digits}g}", text)


# A claim's evidence in fits.json: its first characters. A few claims check whole tables
# (16 KB of one claim's evidence was a DataFrame's dictionary), and the repository travels to
# every GPU call; the whole evidence is what `wavefront paper` computes from data/ each time,
# and a claim that fails prints it. The mark of a cut says only how much went (it once also
# said where the whole is, 70 characters on each of about 100 cut claims).
EVIDENCE_KEPT = 300  # the repository travels to every GPU call: fits.json is its largest text


def kept_evidence(evidence: str) -> str:
    """`evidence` as fits.json keeps it: whole up to EVIDENCE_KEPT characters, else its start
    and how much was left out (`wavefront paper` recomputes the whole from data/)."""
    if len(evidence) <= EVIDENCE_KEPT:
        return evidence
    return f"{evidence[:EVIDENCE_KEPT]} ... [{len(evidence) - EVIDENCE_KEPT} more characters]"


def _json_lines(summary: dict) -> str:
    """`summary` as JSON with one line per record (a claim, a held-out score) under each
    top-level key: as readable in a diff as indented JSON, at the size of compact JSON (the
    repository travels to every GPU call)."""
    def dump(value):
        return json.dumps(value, separators=(",", ":"), default=str)
    parts = []
    for key, value in summary.items():
        if isinstance(value, list):
            parts.append(f"{json.dumps(key)}: [\n" + ",\n".join(map(dump, value)) + "\n]")
        elif isinstance(value, dict):
            parts.append(f"{json.dumps(key)}: {{\n" + ",\n".join(
                f"{json.dumps(k)}: {dump(v)}" for k, v in value.items()) + "\n}")
        else:
            parts.append(f"{json.dumps(key)}: {dump(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main_summary(summary: dict) -> str:
    """What the main job ends with: the paper's finding (its abstract's first claim), the timed
    model's held-out scores per GPU, and where the paper was written."""
    lines = []
    finding = summary.get("finding")
    if finding:
        lines.append(f"Finding: {finding}")
    scores = summary.get("timed_model", {}).get("out_of_sample", [])
    by_gpu: dict[str, list] = {}
    for e in scores:
        by_gpu.setdefault(e["GPU"], []).append(e)
    for gpu, rows in sorted(by_gpu.items()):
        time = sorted(r["time median"] for r in rows)
        dram = sorted(r["DRAM median above knee"] for r in rows if r.get("n above knee"))
        lines.append(f"{gpu}: timed model, held out ({len(rows)} families): median |time error| "
                     f"{time[0]:.1%}-{time[-1]:.1%} per family; median |DRAM error| above the "
                     f"knee {dram[0]:.0%}-{dram[-1]:.0%}" if dram else "")
    if summary.get("paper_dir"):
        paper_dir = Path(summary["paper_dir"])
        lines.append(f"Paper: {paper_dir / 'draft.md'} (appendices {paper_dir}/appendix_*.md); "
                     f"figures: {paper_dir / 'figures'}/ (appendix figures in "
                     f"{paper_dir / 'figures' / 'appendix'}/)")
    return "\n".join(line for line in lines if line)
