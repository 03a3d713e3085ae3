"""Tidy results: one row per (configuration, measurement), a documented schema, manifests.

A results file is a CSV whose header is exactly `COLUMNS`; beside it, `manifest.json` says where
and how it was measured. Rows are appended one at a time with O_APPEND + fsync, so a killed sweep
loses nothing that finished. `load_results` refuses a file whose header does not match.
"""
from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import os
import subprocess
import sys
from pathlib import Path

from wavefront.profiling import METRICS

SCHEMA_VERSION = 2

_METRIC_NOTES = {
    "l1_hit_rate_pct": " (LSU traffic only: TMA bypasses L1)",
    "ncu_duration_ns": " under ncu (not a timing)",
}

# name -> (type, meaning). The order is the column order on disk.
SCHEMA: dict[str, tuple[str, str]] = {
    "point": ("str", "canonical key of the configuration (all parameters below)"),
    "measurement": ("str", "'timing' (CUDA events) or 'counters' (Nsight Compute)"),
    "status": ("str", "'ok' or 'failed'"),
    "error": ("str", "why the point failed (empty when ok)"),
    "gpu": ("str", "device name"),
    "sms": ("int", "SM count"),
    "l2_bytes": ("int", "L2 size reported by the device"),
    "batch": ("int", "batch size"),
    "heads": ("int", "query heads"),
    "kv_heads": ("int", "K/V heads (GQA when < heads)"),
    "seqlen": ("int", "sequence length (queries = keys)"),
    "head_dim": ("int", "head dimension"),
    "dtype": ("str", "bfloat16 | float16"),
    "causal": ("bool", "causal mask (top-left aligned)"),
    "tile_m": ("int", "Q tile rows"),
    "tile_n": ("int", "K/V tile rows"),
    "occupancy": ("int", "CTAs per SM asked of the compiler"),
    "cta_schedule": ("str", "grid | persistent | grouped"),
    "kv_schedule": ("str", "linear | sawtooth"),
    "num_ctas": ("int", "CTAs launched"),
    "resident_ctas": ("int", "CTAs in flight (SMs x occupancy, or the --ctas cap)"),
    "group_units": ("int", "(batch, K/V head) units per group (grouped schedule; else 1)"),
    "rel_error": ("float", "||out - ref|| / ||ref|| against float32 (timing rows)"),
    "median_ms": ("float", "kernel time, median of reps (timing rows)"),
    "p10_ms": ("float", "10th percentile"),
    "p90_ms": ("float", "90th percentile"),
    "reps": ("int", "timed repetitions"),
    "tflops": ("float", "useful FLOPs / median time, 1e12/s"),
    "useful_flops": ("float", "4 D per visible (query, key) pair"),
    "executed_flops": ("float", "4 D per (row, column) of every visited tile"),
    "fa2_ms": ("float", "torch SDPA flash (FA2), same shapes, same run"),
    "cudnn_ms": ("float", "torch SDPA cuDNN, same shapes, same run"),
    # One column per ncu metric, in `profiling.METRICS` order: that list is the only copy.
    **{column: ("float", metric + _METRIC_NOTES.get(column, ""))
       for metric, column in METRICS.items()},
    "sm_hit_rate": ("float", "1 - l2_read_miss_sectors / tex read lookups"),
    "l2_read_miss_sectors": ("float", "tex read misses - fabric read hits: reads that left L2"),
    "dram_read_sectors": ("float", "dram_read_bytes / 32 (cross-check of the line above)"),
    "closed_form_read_sectors": ("float", "Q + K/V reads the kernel issues, from the tiles visited"),
    "read_sectors_ratio": ("float", "l2_tex_read_sectors / closed_form_read_sectors"),
    "compulsory_read_bytes": ("float", "Q, K, V once"),
    "run_id": ("str", "which run (manifest) produced the row"),
}
COLUMNS = list(SCHEMA)

PARAMETER_COLUMNS = ["batch", "heads", "kv_heads", "seqlen", "head_dim", "dtype", "causal",
                     "tile_m", "tile_n", "occupancy", "cta_schedule", "kv_schedule",
                     "resident_ctas"]


class SchemaError(ValueError):
    pass


def point_key(params: dict) -> str:
    return ",".join(f"{k}={params[k]}" for k in PARAMETER_COLUMNS)


def append_row(path: str | os.PathLike, row: dict) -> None:
    """Append one row; write the header first if the file is new. One write() per row."""
    unknown = set(row) - set(SCHEMA)
    if unknown:
        raise SchemaError(f"row has columns not in the schema: {sorted(unknown)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    new = not path.exists() or path.stat().st_size == 0
    if new:
        writer.writeheader()
    writer.writerow({k: _cell(row.get(k)) for k in COLUMNS})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, buf.getvalue().encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float) and value != value:
        return ""
    return value


def read_header(path) -> list[str]:
    with open(path, newline="") as f:
        return next(csv.reader(f), [])


def load_results(path, *, allow_partial_last_line: bool = True):
    """Load a results CSV as a pandas DataFrame, refusing a file that does not match SCHEMA."""
    import pandas as pd
    header = read_header(path)
    if header != COLUMNS:
        missing = [c for c in COLUMNS if c not in header]
        extra = [c for c in header if c not in COLUMNS]
        raise SchemaError(f"{path}: header does not match the wavefront results schema "
                          f"v{SCHEMA_VERSION} (missing {missing}, unexpected {extra})")
    text = Path(path).read_text()
    if allow_partial_last_line and text and not text.endswith("\n"):
        text = text[:text.rfind("\n") + 1]  # a line cut by a crash mid-write
    df = pd.read_csv(io.StringIO(text), dtype={c: "string" for c, (t, _) in SCHEMA.items()
                                               if t == "str"}, keep_default_na=False,
                     na_values={c: [""] for c, (t, _) in SCHEMA.items() if t != "str"})
    for col, (typ, _) in SCHEMA.items():
        try:
            if typ == "int":
                df[col] = pd.to_numeric(df[col]).astype("Int64")
            elif typ == "float":
                df[col] = pd.to_numeric(df[col]).astype("float64")
            elif typ == "bool":
                df[col] = df[col].map({"True": True, "False": False, True: True, False: False})
        except (ValueError, TypeError) as exc:
            raise SchemaError(f"{path}: column {col!r} is not {typ}: {exc}") from None
    bad = set(df["status"]) - {"ok", "failed"}
    if bad:
        raise SchemaError(f"{path}: status must be 'ok' or 'failed', found {sorted(bad)}")
    bad = set(df["measurement"]) - {"timing", "counters"}
    if bad:
        raise SchemaError(f"{path}: measurement must be 'timing' or 'counters', found {sorted(bad)}")
    return df


def with_timing(df):
    """Counter rows of a results frame with the same point's timing attached (TFLOP/s, time,
    error, executed FLOPs): the join every model and figure of counters against speed needs."""
    timed = ["tflops", "median_ms", "rel_error", "executed_flops"]
    c = df[df["measurement"] == "counters"]
    t = df[df["measurement"] == "timing"][["gpu", "point", *timed]]
    return c.drop(columns=timed).merge(t, on=["gpu", "point"])


def git_commit(root: str | os.PathLike | None = None) -> str:
    root = root or Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        commit = out.stdout.strip()
        if out.returncode != 0 or len(commit) != 40:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def manifest(command: list[str] | None = None, extra: dict | None = None) -> dict:
    """Where and how a run was measured."""
    from wavefront.device import current_device, software_versions
    dev = current_device()
    return {
        "schema_version": SCHEMA_VERSION,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": dev.as_dict() if dev else None,
        **software_versions(),
        "python": sys.version.split()[0],
        # A GPU host's copy of the checkout may have no usable git: the caller names the commit.
        "git_commit": os.environ.get("WAVEFRONT_GIT_COMMIT") or git_commit(),
        "command": " ".join(command if command is not None else sys.argv),
        **(extra or {}),
    }


def write_manifest(directory, run_id: str, data: dict) -> Path:
    """Manifests accumulate per run: manifest.json maps run_id -> manifest."""
    path = Path(directory) / "manifest.json"
    runs = json.loads(path.read_text()) if path.exists() else {}
    runs[run_id] = data
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(runs, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path
