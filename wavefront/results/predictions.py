"""Predictions written before their measurement: a table stamped with when it was predicted and
from which commit of the model (marked where the model's files differ from that commit), so
that a later measurement can be scored against what was committed first
(paper/exposure_predictions.csv, paper/shared_prefix_predictions.csv; nothing regenerates them)."""
from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

from wavefront import files


def write_predictions(table, out, root: Path, model_paths: tuple[str, ...]) -> None:
    """Stamp `table` (a DataFrame, changed in place) with `predicted_on` (UTC) and
    `model_commit` (HEAD of the checkout at `root`, "+uncommitted model" where a path of
    `model_paths` has uncommitted changes), then write it as CSV (6 significant digits)."""
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", *model_paths],
                           capture_output=True, text=True).stdout.strip()
    table.insert(0, "predicted_on", datetime.datetime.now(datetime.timezone.utc)
                 .strftime("%Y-%m-%d %H:%M UTC"))
    table.insert(1, "model_commit", commit + ("+uncommitted model" if dirty else ""))
    files.write_file(out, table.to_csv(index=False, float_format="%.6g"), what="predictions")
