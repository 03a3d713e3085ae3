"""Fold data/public_call's per-commit bench files into its one records file (CPU).

`wavefront experiment run public_call` writes each run into data/public_call/<commit>/
(bench.jsonl and its manifest); the committed runs live in one file,
data/public_call/bench_runs.jsonl.gz, each record marked with the file it came from
(`source`: '<commit>/<file name without .jsonl>'), which `experiments/public_call.py` reads as
it read the files. One file instead of one per run: 57 small gzip files took 33 KB more than
their records packed together, and the repository travels to every GPU call. The commit
folders keep their READMEs and manifests.

    python scripts/fold_public_call.py [data/public_call]
    wavefront compress data/public_call --significant-digits 7
"""
import gzip
import json
import sys
from pathlib import Path

FOLDED = "bench_runs.jsonl"


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [line for line in f if line.strip()]


def fold(directory: Path) -> int:
    """Folds every <commit>/bench*.jsonl[.gz] of `directory` into FOLDED (plain, for
    `wavefront compress` to pack); -> how many files were folded. A source already folded
    is refused: nothing is written."""
    folded = [p for p in (directory / FOLDED, directory / (FOLDED + ".gz")) if p.exists()]
    records = [json.loads(line) for p in folded for line in _lines(p)]
    known = {r["source"] for r in records}
    files = sorted(set(directory.glob("*/bench*.jsonl")) | set(directory.glob("*/bench*.jsonl.gz")))
    for path in files:
        source = f"{path.parent.name}/{path.name.split('.')[0]}"
        if source in known:
            raise SystemExit(f"{path}: {source} is folded already; remove one of the two")
        records += [{**json.loads(line), "source": source} for line in _lines(path)]
    if not files:
        return 0
    records.sort(key=lambda r: r["source"])  # stable: each file's lines keep their order
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    (directory / FOLDED).write_text(text)
    for path in folded:
        if path.name != FOLDED:
            path.unlink()
    for path in files:
        path.unlink()
    return len(files)


if __name__ == "__main__":
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "data/public_call")
    print(f"{fold(directory)} files folded into {directory / FOLDED}; now "
          f"`wavefront compress {directory} --significant-digits 7`")
