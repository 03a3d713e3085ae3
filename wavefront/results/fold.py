"""Fold a data set's per-run record files into one records file (`wavefront fold`).

A run writes its records into a folder of its own (data/public_call/<commit>/bench.jsonl,
data/tune/<search>/tune.jsonl and levers.jsonl); the committed runs live in one file per kind,
each record marked with the file it came from (`source`: '<folder>/<file name without
.jsonl>'), which the experiments read as they read the files (`Study.folded_records`). One file
instead of one per run: the repository travels to every GPU call, and each small file costs a
block of its own. `merge_manifests` merges the folders' manifests into the data set's (each
entry's `folder` names where it was). `fold_notes` gathers the run folders' READMEs, the notes
of what ran and why, into the data set's packed `RUNS.md.gz`, one section per folder.
"""
from __future__ import annotations

import json
from pathlib import Path

from wavefront.files import FileRefused, line_rows, read_file, read_packed, write_file

FOLDED = "bench_runs.jsonl"  # data/public_call's
NOTES = "RUNS.md.gz"  # a data set's run notes, one section per run folder (`fold_notes`)


class FoldError(ValueError):
    """What stops a fold, named by file (and line); nothing is written or deleted."""


def _records(path: Path, *, folded: bool = False) -> list[dict]:
    """The JSON objects of a record file (plain or packed, through the one reader); a folded
    file's each with its `source`."""
    try:
        text = read_packed(path, "a record file").decode()
    except (FileRefused, UnicodeDecodeError) as exc:
        raise FoldError(str(exc)) from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise FoldError(f"{path}:{number}: not a JSON line ({exc})") from None
        if not isinstance(record, dict):
            raise FoldError(f"{path}:{number}: a record is a JSON object")
        if folded and not isinstance(record.get("source"), str):
            raise FoldError(f"{path}:{number}: a folded record without its 'source'")
        out.append(record)
    return out


def fold(directory: Path, files: str = "bench*", into: str = FOLDED) -> int:
    """Folds every <folder>/<files>.jsonl[.gz] of `directory` into `into` (plain, for
    `wavefront compress` to pack); -> how many files were folded. A source already folded
    is refused, as is a file that does not read: nothing is written. The run files and an
    older packed fold go only once the new fold is safely written."""
    folded = [p for p in (directory / into, directory / (into + ".gz")) if p.exists()]
    records = [r for p in folded for r in _records(p, folded=True)]
    known = {r["source"] for r in records}
    paths = sorted(set(directory.glob(f"*/{files}.jsonl"))
                   | set(directory.glob(f"*/{files}.jsonl.gz")))
    for path in paths:
        source = f"{path.parent.name}/{path.name.split('.')[0]}"
        if source in known:
            raise FoldError(f"{path}: {source} is folded already; remove one of the two")
        records += [{**r, "source": source} for r in _records(path)]
    if not paths:
        return 0
    records.sort(key=lambda r: r["source"])  # stable: each file's lines keep their order
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    write_file(directory / into, text, what="a folded record file", rows=line_rows)
    for path in folded:
        if path.name != into:
            path.unlink()
    for path in paths:
        path.unlink()
    return len(paths)


def merge_manifests(directory: Path) -> int:
    """The folders' manifests merged into `directory`'s, each entry marked with its `folder`;
    -> how many were merged."""
    from wavefront.results.store import (SchemaError, manifest_path, manifest_text,
                                         read_manifest, write_stored)
    try:
        runs = read_manifest(directory) if manifest_path(directory).exists() else {}
        merged = []
        for folder in sorted(p for p in directory.iterdir() if p.is_dir()):
            if not manifest_path(folder).exists():
                continue
            for run_id, run in read_manifest(folder).items():
                if run_id in runs:
                    raise FoldError(f"{folder}: run {run_id} is in {directory}'s manifest "
                                    "already; nothing merged")
                runs[run_id] = {**run, "folder": folder.name}
            merged.append(manifest_path(folder))
        if not merged:
            return 0
        # The merged manifest first (atomic; never fewer runs than the plain one held), then
        # what it replaces: a failure anywhere leaves every run in some manifest.
        write_stored(directory / "manifest.json", manifest_text(runs), what="a manifest",
                     mode=0o644)
    except SchemaError as exc:
        raise FoldError(str(exc)) from None
    (directory / "manifest.json.gz").unlink(missing_ok=True)
    for path in merged:
        path.unlink()
    return len(merged)


def _demoted(text: str) -> str:
    """A README's markdown with every heading two levels down (outside fenced code), so that
    its title (#) sits under the section naming its folder (##) as ###."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append("##" + line if not fenced and line.startswith("#") else line)
    return "\n".join(out).strip("\n") + "\n"


def fold_notes(directory: Path, into: str = NOTES) -> int:
    """Gathers every <folder>/README.md of `directory` into `into` (packed where it ends in
    .gz), each as a section '## <folder>' after the notes already there (a plain RUNS.md or the
    packed file; a plain RUNS.md is taken in and goes); -> how many READMEs were gathered. A
    folder whose section is there already is refused, as is a README that does not read:
    nothing is written. The READMEs go only once the notes are written; a folder left empty
    goes too."""
    directory = Path(directory)
    target = directory / into
    plain = directory / "RUNS.md"
    sources = [p for p in (target, plain) if p.exists()]
    if len(sources) == 2 and target != plain:
        raise FoldError(f"{plain} and {target} both exist; keep one of the two")
    try:
        text = "".join(read_packed(p, "run notes").decode() for p in sources)
        readmes = sorted(directory.glob("*/README.md"))
        sections = [(p.parent.name, read_file(p, "a run folder's README").decode())
                    for p in readmes]
    except (FileRefused, UnicodeDecodeError, OSError) as exc:
        raise FoldError(str(exc)) from None
    known = {line[3:].strip() for line in text.splitlines() if line.startswith("## ")}
    for folder, _ in sections:
        if folder in known:
            raise FoldError(f"{directory / folder / 'README.md'}: {into} has a section "
                            f"'{folder}' already; remove one of the two")
    if not sections and not (plain.exists() and target != plain):
        return 0
    if not text.strip():
        text = (f"# {directory.name}: the runs' notes, one section per run folder\n\n"
                "Each run once had a folder of its own with a README saying what ran and why; "
                "the READMEs are gathered here (`wavefront fold --notes`: one file instead of "
                "one per run, since the repository travels to every GPU call). A folder's "
                "other files stay where they were.\n")
    for folder, body in sections:
        text = text.rstrip("\n") + f"\n\n## {folder}\n\n" + _demoted(body)
    write_file(target, text, what="run notes")  # checked to unpack to `text`
    if plain.exists() and target != plain:
        plain.unlink()
    for path in readmes:
        path.unlink()
        if not any(path.parent.iterdir()):
            path.parent.rmdir()
    return len(sections)
