"""Fold a data set's per-run record files into one records file (`wavefront fold`).

A run writes its records into a folder of its own (data/public_call/<commit>/bench.jsonl,
data/tune/<search>/tune.jsonl and levers.jsonl); the committed runs live in one file per kind,
each record marked with the file it came from (`source`: '<folder>/<file name without
.jsonl>'), which the experiments read as they read the files (`Study.folded_records`). One file
instead of one per run: the repository travels to every GPU call, and each small file costs a
block of its own. `merge_manifests` merges the folders' manifests into the data set's (each
entry's `folder` names where it was).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from wavefront.results.store import manifest_path, manifest_text, read_manifest

FOLDED = "bench_runs.jsonl"  # data/public_call's


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [line for line in f if line.strip()]


def fold(directory: Path, files: str = "bench*", into: str = FOLDED) -> int:
    """Folds every <folder>/<files>.jsonl[.gz] of `directory` into `into` (plain, for
    `wavefront compress` to pack); -> how many files were folded. A source already folded
    is refused: nothing is written."""
    folded = [p for p in (directory / into, directory / (into + ".gz")) if p.exists()]
    records = [json.loads(line) for p in folded for line in _lines(p)]
    known = {r["source"] for r in records}
    paths = sorted(set(directory.glob(f"*/{files}.jsonl"))
                   | set(directory.glob(f"*/{files}.jsonl.gz")))
    for path in paths:
        source = f"{path.parent.name}/{path.name.split('.')[0]}"
        if source in known:
            raise ValueError(f"{path}: {source} is folded already; remove one of the two")
        records += [{**json.loads(line), "source": source} for line in _lines(path)]
    if not paths:
        return 0
    records.sort(key=lambda r: r["source"])  # stable: each file's lines keep their order
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    (directory / into).write_text(text)
    for path in folded:
        if path.name != into:
            path.unlink()
    for path in paths:
        path.unlink()
    return len(paths)


def merge_manifests(directory: Path) -> int:
    """The folders' manifests merged into `directory`'s, each entry marked with its `folder`;
    -> how many were merged."""
    runs = read_manifest(directory) if manifest_path(directory).exists() else {}
    merged = 0
    for folder in sorted(p for p in directory.iterdir() if p.is_dir()):
        if not manifest_path(folder).exists():
            continue
        for run_id, run in read_manifest(folder).items():
            if run_id in runs:
                raise ValueError(f"{folder}: run {run_id} is in {directory}'s manifest already")
            runs[run_id] = {**run, "folder": folder.name}
        manifest_path(folder).unlink()
        merged += 1
    for stale in (directory / "manifest.json", directory / "manifest.json.gz"):
        stale.unlink(missing_ok=True)
    (directory / "manifest.json").write_text(manifest_text(runs))
    return merged

