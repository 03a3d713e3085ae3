"""Tidy results on disk: one row per measured repeat, a schema built from the types, manifests.

A results file is a CSV whose header is exactly `COLUMNS`; beside it, `manifest.json` says where
and how each run was measured (one entry per `run_id`). Rows are appended one at a time, each in
one fsync'd write that is checked for completeness; a line torn by a crash or a full disk is
cut off (and logged in `repairs.log`) before the next append, so a file always loads. A results
directory is locked while a sweep writes to it.
"""
from __future__ import annotations

import csv
import datetime as _dt
import errno
import fcntl
import io
import json
import os
import re
import subprocess
import sys
import stat
from dataclasses import dataclass, fields
from pathlib import Path

from wavefront import files
from wavefront.point import (
    LAUNCH_COLUMNS,
    OPTIONAL_PARAMETER_COLUMNS,
    PARAMETER_COLUMNS,
    PARAMETER_TYPES,
    point_key,
)
from wavefront.results.measurement import (
    DERIVED,
    METRIC_NOTES,
    METRIC_SINCE,
    METRICS,
    Conditions,
    Timing,
)

# The schema version that added each column after v3: the optional parameters v4, later
# metrics theirs. A file of any earlier version is upgraded on load and rewritten before a row
# is appended, the new columns empty (what the rows meant: defaults, not measured).
COLUMN_SINCE = {**{c: 4 for c in OPTIONAL_PARAMETER_COLUMNS}, **METRIC_SINCE}
SCHEMA_VERSION = max(4, *COLUMN_SINCE.values())
RESULTS_FILE = "results.csv"
# A committed results table is kept gzip-compressed (about 8x smaller: the repository travels
# to the GPU hosts under a size cap). The store reads it and appends to it: each append is one
# more gzip member (a multi-member file is one gzip stream to every reader), so a sweep
# resumed on a compressed table still writes one fsync'd row at a time.
COMPRESSED_RESULTS_FILE = RESULTS_FILE + ".gz"


def results_path(directory) -> Path:
    """The results table of a directory: the compressed one where it exists, else the plain."""
    directory = Path(directory)
    compressed = directory / COMPRESSED_RESULTS_FILE
    return compressed if compressed.exists() else directory / RESULTS_FILE


def _is_compressed(path) -> bool:
    return str(path).endswith(".gz")


def read_results_bytes(path, what: str = "stored file") -> bytes:
    """A stored file's text (as bytes), compressed or not: a results table, a manifest, a
    record file. Through the one reader (`wavefront.files.read_packed`): a regular file only,
    bounded, a torn final append left out with a warning, a truncated or foreign packed file
    refused by name."""
    try:
        return files.read_packed(path, what)
    except files.FileRefused as exc:
        raise (UnsafePath if isinstance(exc, files.UnsafePath) else SchemaError)(
            str(exc)) from None


def write_stored(path, text: bytes | str, *, what: str = "stored file", rows=files.line_rows,
                 allow_shrink: bool = False, mode: int | None = None) -> Path:
    """The one writer (`wavefront.files.write_file`) with the store's errors: atomic, links
    refused, packed where the name ends in .gz, a rewrite to fewer rows refused unless asked."""
    try:
        return files.write_file(path, text, what=what, rows=rows, allow_shrink=allow_shrink,
                                mode=mode)
    except files.FileRefused as exc:
        raise (UnsafePath if isinstance(exc, files.UnsafePath) else SchemaError)(
            str(exc)) from None


def gzip_file(plain, target=None) -> Path:
    """`plain` packed as `target` (default: plain + .gz) in one gzip member without a
    timestamp, so the same bytes always pack alike; written to a temporary file first, checked,
    then the plain file removed. A packed file already there is never replaced by other
    content: both forms of one file are refused by name (merge them, or remove one)."""
    plain = Path(plain)
    target = Path(target) if target else plain.with_name(plain.name + ".gz")
    _refuse_link(plain, "a file to pack")
    text = read_results_bytes(plain, "a file to pack")
    if target.exists() or target.is_symlink():
        _refuse_link(target, "a packed file")
        if read_results_bytes(target, "a packed file") != text:
            raise SchemaError(f"{plain} and {target} both exist and differ: packing would "
                              f"replace what {target.name} holds; merge the two or remove one "
                              "(nothing changed)")
    else:
        write_stored(target, text, what="a packed file",
                     mode=stat.S_IMODE(os.stat(plain).st_mode))
    if read_results_bytes(target, "a packed file") != text:
        raise SchemaError(f"{target}: does not hold what {plain.name} held; {plain.name} kept")
    plain.unlink()
    return target


def _refuse_link(path: Path, what: str) -> None:
    try:
        files.refuse_link(path, what)
    except files.UnsafePath as exc:
        raise UnsafePath(str(exc)) from None


def write_csv_gz(frame, path, **to_csv) -> Path:
    """A DataFrame as a gzip-compressed CSV whose bytes depend only on its rows (written
    through the one writer; a derived table, so it may shrink)."""
    return write_stored(path, frame.to_csv(index=False, **to_csv), what="a derived table",
                        allow_shrink=True)


# Committed data keeps a float to 7 significant digits: CUDA events and Nsight Compute's rates
# are float32 (about 7 digits), so the digits beyond say nothing measured, and they are most of
# what gzip cannot pack (`wavefront compress --significant-digits`). Whole numbers (counters,
# byte and FLOP counts) stay exact.
_DECIMAL = re.compile(r"-?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+")


def round_significant(value, digits: int):
    """A JSON value with each float that is not a whole number at `digits` significant
    digits; whole numbers, NaN, infinities and everything else as they were."""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")) or value.is_integer():
            return value
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: round_significant(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [round_significant(v, digits) for v in value]
    return value


def _round_cell(cell: str, digits: int) -> str:
    if not _DECIMAL.fullmatch(cell):
        return cell
    value = float(cell)
    if value.is_integer():
        return cell
    shorter = repr(float(f"{value:.{digits}g}"))
    return shorter if len(shorter) < len(cell) else cell


def _within_rounding(old: float, new: float, digits: int) -> bool:
    return old == new or (old != old and new != new) or \
        abs(old - new) <= 10.0 ** (1 - digits) * abs(old)


def _close(a: str, b: str, digits: int) -> bool:
    if a == b:
        return True
    try:
        return _within_rounding(float(a), float(b), digits)
    except ValueError:
        return False


def repack_significant(path, digits: int) -> tuple[int, int]:  # noqa: C901
    """A packed data file (`*.jsonl.gz` records or a `results.csv.gz` table) packed again, one
    gzip member, with every float that is not a whole number at `digits` significant digits.
    Each line is checked against the old one (the same fields and cells, every number within
    the rounding) before the file is replaced; -> (bytes before, bytes after)."""
    path = Path(path)
    if not 4 <= digits <= 17:
        raise ValueError(f"digits: {digits}; expected 4 to 17 significant digits")
    _refuse_link(path, "a packed data file")
    before = path.stat().st_size
    text = read_results_bytes(path, "a packed data file").decode()
    if path.name.endswith(".jsonl.gz"):
        lines = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            old = json.loads(line)
            lines.append(json.dumps(round_significant(old, digits)))
            if not _same_json(old, json.loads(lines[-1]), digits):
                raise SchemaError(f"{path}:{number}: a line changed beyond its rounding")
        packed = "".join(line + "\n" for line in lines)
    elif path.name.endswith(".csv.gz"):
        rows = list(csv.reader(io.StringIO(text)))
        rounded = rows[:1] + [[_round_cell(c, digits) for c in row] for row in rows[1:]]
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rounded)
        packed = out.getvalue()
        read_back = list(csv.reader(io.StringIO(packed)))
        for number, (row, again) in enumerate(zip(rows, read_back), 1):
            if len(row) != len(again) or not all(_close(a, b, digits) for a, b in zip(row, again)):
                raise SchemaError(f"{path}:{number}: a row changed beyond its rounding")
        if len(read_back) != len(rows):
            raise SchemaError(f"{path}: {len(rows)} rows became {len(read_back)}")
    else:
        raise ValueError(f"path: {path}; expected a packed *.jsonl.gz or *.csv.gz data file")
    write_stored(path, packed, what="a packed data file")  # rows may not shrink
    return before, path.stat().st_size


def _same_json(old, new, digits: int) -> bool:
    if isinstance(old, float) and isinstance(new, float):
        return _within_rounding(old, new, digits)
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() == new.keys() and all(_same_json(old[k], new[k], digits) for k in old)
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(_same_json(a, b, digits) for a, b in zip(old, new))
    return type(old) is type(new) and old == new


def compress_manifest(directory) -> Path:
    """Replace a directory's plain manifest by its compressed form (runs unchanged)."""
    plain = Path(directory) / MANIFEST_FILE
    return gzip_file(plain, plain.with_name(COMPRESSED_MANIFEST_FILE))


def compress_results(directory) -> Path:
    """Replace a directory's plain results table by its compressed form (one gzip member, no
    timestamp, so the same rows always give the same bytes); the rows are unchanged."""
    plain = Path(directory) / RESULTS_FILE
    return gzip_file(plain, plain.with_name(COMPRESSED_RESULTS_FILE))
MANIFEST_FILE = "manifest.json"
COMPRESSED_MANIFEST_FILE = MANIFEST_FILE + ".gz"  # what `wavefront compress` leaves

_TYPE_NAMES = {"float": "float", "int": "int", "str": "str", "bool": "bool"}


def _field_type(annotation: str) -> str:
    base = str(annotation).split("|")[0].strip()
    return _TYPE_NAMES.get(base, "str")


# name -> (type, meaning). The order is the column order on disk.
SCHEMA: dict[str, tuple[str, str]] = {
    "point": ("str", "canonical key of the configuration (the parameter columns)"),
    "measurement": ("str", "'timing' (CUDA events) or 'counters' (Nsight Compute)"),
    "repeat": ("int", "which repeat of the point this row is (0, 1, ...)"),
    "status": ("str", "'ok' or 'failed'"),
    "error": ("str", "why the point failed (empty when ok)"),
    "run_id": ("str", "which run (manifest entry) produced the row"),
    "gpu": ("str", "device name"),
    "sms": ("int", "SM count"),
    "l2_bytes": ("int", "L2 size reported by the device"),
    **{c: (PARAMETER_TYPES[c], "point parameter (wavefront.point.Point)")
       for c in PARAMETER_COLUMNS},
    **{c: (PARAMETER_TYPES[c], "point parameter, empty where the point left it at its default (v4)")
       for c in OPTIONAL_PARAMETER_COLUMNS},
    **{c: ("int", "derived from the launch") for c in LAUNCH_COLUMNS if c not in
       ("gpu", "sms", "l2_bytes")},
    **{f.name: (_field_type(f.type), "timing (wavefront.results.measurement.Timing)")
       for f in fields(Timing)},
    **{f.name: (_field_type(f.type), "GPU conditions (NVML) and provenance")
       for f in fields(Conditions)},
    # One column per ncu metric, in `METRICS` order: that list is the only copy.
    **{column: ("float", metric + METRIC_NOTES.get(column, ""))
       for metric, column in METRICS.items()},
    **{column: ("float", meaning) for column, meaning in DERIVED.items()},
}
COLUMNS = list(SCHEMA)


def columns_of(version: int) -> list[str]:
    """The header of results schema `version` (3 or later)."""
    return [c for c in COLUMNS if COLUMN_SINCE.get(c, 3) <= version]


V3_COLUMNS = columns_of(3)

# Schema v2 (before repeats and conditions): upgraded on load, the new columns empty.
V2_COLUMNS = ["point", "measurement", "status", "error", "gpu", "sms", "l2_bytes", "batch",
              "heads", "kv_heads", "seqlen", "head_dim", "dtype", "causal", "tile_m", "tile_n",
              "occupancy", "cta_schedule", "kv_schedule", "num_ctas", "resident_ctas",
              "group_units", "rel_error", "median_ms", "p10_ms", "p90_ms", "reps", "tflops",
              "useful_flops", "executed_flops", "fa2_ms", "cudnn_ms", *METRICS.values(),
              "sm_hit_rate", "l2_read_miss_sectors", "dram_read_sectors",
              "closed_form_read_sectors", "read_sectors_ratio", "compulsory_read_bytes",
              "run_id"]
REQUIRED_MANIFEST_KEYS = ("schema_version", "date", "gpu", "git_commit", "command")


class SchemaError(ValueError):
    pass


class UnsafePath(SchemaError):
    """A file the store writes is a symbolic link: writing through it would change a file
    outside the results directory (another data set, or anything the user can write)."""


def _open_no_follow(path, flags: int, mode: int = 0o644) -> int:
    """os.open that refuses a symbolic link as the last component (O_NOFOLLOW)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{path}: is a symbolic link; the store writes only its own "
                             "files (remove the link)") from None
        raise


class StoreLocked(RuntimeError):
    pass


def _row_text(row: dict) -> str:
    unknown = set(row) - set(SCHEMA)
    if unknown:
        raise SchemaError(f"row has columns not in the schema: {sorted(unknown)}")
    buf = io.StringIO()
    csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n").writerow(
        {k: _cell(row.get(k)) for k in COLUMNS})
    return buf.getvalue()


def _header_text() -> str:
    return ",".join(COLUMNS) + "\n"


def _write_all(fd: int, data: bytes) -> None:
    """os.write may write less than asked (a full disk, a signal): write the rest or raise."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(f"short write: {len(view)} bytes of a row not written")
        view = view[n:]


def repair_tail(path) -> int:
    """Cut a torn last line (no newline: a crash or a failed write mid-row) so the file loads
    and the next append starts on a fresh line. Logs what was cut to `repairs.log` beside the
    file. Returns the bytes cut."""
    path = Path(path)
    if not path.exists():
        return 0
    with os.fdopen(_open_no_follow(path, os.O_RDWR), "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return 0
        if _is_compressed(path):
            f.seek(0)
            data = f.read()
            try:  # a member cut mid-append goes; a cut or foreign file is refused
                keep = size - files.unpack_members(data, str(path), what="a results file")[1]
            except files.FileRefused as exc:
                raise SchemaError(f"{exc}; nothing appended") from None
            if keep == size:
                return 0
        else:
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return 0
            f.seek(0)
            data = f.read()
            keep = data.rfind(b"\n") + 1
        cut = data[keep:]
        # The log is opened (and refused if it is a link) before anything is cut, so a cut is
        # never left unlogged.
        log_fd = _open_no_follow(path.with_name("repairs.log"),
                                 os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(log_fd, "a") as log:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
            log.write(json.dumps({"date": _now(), "file": path.name, "cut_bytes": len(cut),
                                  "cut": cut[:300].decode(errors="replace")}) + "\n")
    return len(cut)


def append_row(path, row: dict) -> None:
    """Append one row (the header first if the file is new) in one checked, fsync'd write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _row_text(row)
    repair_tail(path)
    upgrade_in_place(path)
    if not path.exists() or path.stat().st_size == 0:
        text = _header_text() + text
    data = text.encode()
    if _is_compressed(path):
        import gzip
        data = gzip.compress(data, mtime=0)  # one more member: see COMPRESSED_RESULTS_FILE
    fd = _open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except OSError as exc:  # a full disk, say: named by the file it was writing
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise
    finally:
        os.close(fd)


def upgrade_in_place(path: Path) -> None:
    """A results file of an older schema (v3 or later) rewritten as the current one before a
    row of the current one is appended to it: the new columns inserted empty, through a temporary
    file and an atomic rename, and logged in repairs.log. A v2 file is refused (upgrade it by
    loading and saving it); a current or new file is left alone."""
    if not path.exists() or path.stat().st_size == 0:
        return
    header = read_header(path)
    if header == COLUMNS:
        return
    older = [v for v in range(3, SCHEMA_VERSION) if header == columns_of(v)]
    if not older:
        raise SchemaError(f"{path}: rows of schema v{SCHEMA_VERSION} cannot be appended to a "
                          f"file of another schema (header {header[:4]}...)")
    if path.is_symlink():
        raise UnsafePath(f"{path}: is a symbolic link; the store writes only files of its own")
    at = [COLUMNS.index(c) for c in COLUMNS if c not in header]
    rows = list(csv.reader(io.StringIO(read_results_bytes(path, "a results file").decode(),
                                       newline="")))
    for row in rows[1:]:
        for i in at:
            row.insert(i, "")
    rows[0] = COLUMNS
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    data = buf.getvalue().encode()
    log_fd = _open_no_follow(path.parent / "repairs.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        _write_all(log_fd, (json.dumps({"date": _now(), "file": path.name,
                                        "upgraded": f"schema v{older[0]} -> v{SCHEMA_VERSION}",
                                        "added_columns": [COLUMNS[i] for i in at],
                                        "rows": len(rows) - 1}) + "\n").encode())
        os.fsync(log_fd)
    finally:
        os.close(log_fd)
    write_stored(path, data, what="a results file")


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float) and value != value:
        return ""
    return value


def _header_of(data: bytes) -> list[str]:
    return next(csv.reader([data.split(b"\n", 1)[0].decode()]), [])


def read_header(path) -> list[str]:
    if _is_compressed(path):
        return _header_of(read_results_bytes(path))
    with open(path, newline="") as f:
        return next(csv.reader(f), [])


def require_regular_file(path: Path, what: str) -> None:
    """Refuse what would read forever or block (a device, a FIFO) or is no file at all, by
    name, before opening it (stat does not open: a FIFO without a writer cannot block it)."""
    import stat
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read {what}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise SchemaError(f"{path}: {what} must be a regular file, not a device, FIFO or "
                          "directory")


def load_results(path, *, require_manifest: bool = True, strict: bool = False):
    """Load a results CSV as a pandas DataFrame, refusing a file that does not match the schema
    (v3, or v2 upgraded in memory) or has no valid manifest; `strict` (what feeds a fit or a
    figure) also refuses duplicated rows, rows measured again under another run, no rows, and
    rows whose provenance or numbers do not hold (`check_rows`). A torn last line is ignored,
    not repaired (read-only)."""
    import numpy as np
    import pandas as pd
    path = Path(path)
    if not path.exists():
        raise SchemaError(f"{path}: no such results file")
    require_regular_file(path, "a results file")
    try:
        data = read_results_bytes(path, "results table")  # once: decompressed once
        header = _header_of(data)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SchemaError(f"{path}: not a readable CSV: {exc}") from None
    version = 2 if header == V2_COLUMNS else next(
        (v for v in range(3, SCHEMA_VERSION + 1) if header == columns_of(v)), None)
    if version is None:
        missing = [c for c in COLUMNS if c not in header]
        extra = [c for c in header if c not in COLUMNS]
        raise SchemaError(f"{path}: header does not match the wavefront results schema "
                          f"v{SCHEMA_VERSION} (missing {missing}, unexpected {extra})")
    text = data.decode(errors="replace")
    if text and not text.endswith("\n"):
        text = text[:text.rfind("\n") + 1]  # a line cut by a crash mid-write
    try:
        df = pd.read_csv(io.StringIO(text), dtype={c: "string" for c, (t, _) in SCHEMA.items()
                                                   if t in ("str", "bool")},
                         keep_default_na=False,
                         na_values={c: [""] for c, (t, _) in SCHEMA.items()
                                    if t not in ("str", "bool")})
    except (ValueError, pd.errors.ParserError) as exc:
        raise SchemaError(f"{path}: rows do not parse: {exc}") from None
    if version < SCHEMA_VERSION:
        for col in COLUMNS:
            if col not in df:
                df[col] = 0 if col == "repeat" else ("" if SCHEMA[col][0] == "str" else None)
        df = df[COLUMNS]
    for col, (typ, _) in SCHEMA.items():
        try:
            if typ == "int":
                df[col] = pd.to_numeric(df[col]).astype("Int64")
            elif typ == "float":
                df[col] = pd.to_numeric(df[col]).astype("float64")
            elif typ == "bool":
                values = df[col].astype("string").fillna("")
                bad = set(values) - {"True", "False", ""}
                if bad:
                    raise ValueError(f"not True/False: {sorted(bad)[:3]}")
                df[col] = values.map({"True": True, "False": False, "": None})
            else:
                df[col] = df[col].astype("string").fillna("")
        except (ValueError, TypeError) as exc:
            raise SchemaError(f"{path}: column {col!r} is not {typ}: {exc}") from None
    for col, allowed in (("status", {"ok", "failed"}), ("measurement", {"timing", "counters"})):
        bad = set(df[col]) - allowed
        if bad:
            raise SchemaError(f"{path}: {col} must be one of {sorted(allowed)}, found "
                              f"{sorted(bad)}")
    runs = check_manifest(path.parent, set(df["run_id"])) if require_manifest else None
    if strict:
        check_rows(path, df, runs)
        if df.empty:
            raise SchemaError(f"{path}: no rows")
        dup = df.duplicated(subset=["gpu", "point", "measurement", "repeat", "run_id"])
        if dup.any():
            raise SchemaError(f"{path}: {int(dup.sum())} duplicated rows (same gpu, point, "
                              "measurement, repeat and run)")
        # The same measured rows under two runs (a data set appended to itself) would count
        # twice in every fit: one successful row per GPU, point, measurement and repeat.
        ok = df[df["status"] == "ok"]
        again = ok.duplicated(subset=["gpu", "point", "measurement", "repeat"])
        if again.any():
            first = ok[again].iloc[0]
            raise SchemaError(f"{path}: {int(again.sum())} rows measured again under another "
                              f"run (e.g. {first['point']} {first['measurement']} repeat "
                              f"{first['repeat']}, run {first['run_id']})")
        ok = df[df["status"] == "ok"]
        for col in ("median_ms", "tflops", "dram_read_bytes"):
            values = ok[col].dropna().to_numpy(float)
            if len(values) and not np.isfinite(values).all():
                raise SchemaError(f"{path}: column {col!r} has non-finite values")
    return df


def with_timing(df):
    """Counter rows of a results frame with the same point's timing attached (TFLOP/s, time,
    error, executed FLOPs; the median over timing repeats): the join every model and figure of
    counters against speed needs."""
    timed = ["tflops", "median_ms", "rel_error", "executed_flops"]
    c = df[df["measurement"] == "counters"]
    t = (df[df["measurement"] == "timing"].groupby(["gpu", "point"], as_index=False)[timed]
         .median())
    return c.drop(columns=timed).merge(t, on=["gpu", "point"])


def git_commit(root=None) -> str:
    """The checkout's commit (with -dirty), or 'unknown' where git does not answer."""
    root = root or os.getcwd()
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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def manifest(environment: dict, command: list[str] | None = None,
             extra: dict | None = None) -> dict:
    """Where and how a run was measured. `environment`: the GPU and tool versions
    (`wavefront.device.environment()`)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "date": _now(),
        **environment,
        "python": sys.version.split()[0],
        # A GPU host's copy of the checkout may have no usable git: the caller names the commit.
        "git_commit": os.environ.get("WAVEFRONT_GIT_COMMIT") or git_commit(),
        "command": " ".join(command if command is not None else sys.argv),
        **(extra or {}),
    }


def manifest_path(directory) -> Path:
    """A directory's manifest: the compressed one where it exists, else the plain."""
    directory = Path(directory)
    compressed = directory / COMPRESSED_MANIFEST_FILE
    return compressed if compressed.exists() else directory / MANIFEST_FILE


def read_manifest(directory) -> dict:
    path = manifest_path(directory)
    if not path.exists():
        raise SchemaError(f"{path}: missing; results without a manifest are not accepted")
    require_regular_file(path, "a manifest")
    try:
        runs = json.loads(read_results_bytes(path, "manifest"))
    except (OSError, ValueError) as exc:
        raise SchemaError(f"{path}: not valid JSON: {exc}") from None
    except RecursionError:
        raise SchemaError(f"{path}: not valid JSON: nested too deeply") from None
    if not isinstance(runs, dict):
        raise SchemaError(f"{path}: must map run ids to manifests")
    for run_id, entry in runs.items():
        if not isinstance(entry, dict):
            raise SchemaError(f"{path}: run {run_id!r} is not an object")
        missing = [k for k in REQUIRED_MANIFEST_KEYS if k not in entry]
        if missing:
            raise SchemaError(f"{path}: run {run_id!r} lacks {missing}")
        version = entry["schema_version"]
        if isinstance(version, bool) or not isinstance(version, int) \
                or not 1 <= version <= SCHEMA_VERSION:
            raise SchemaError(f"{path}: run {run_id!r} has schema_version {version!r}; this "
                              f"wavefront reads versions 1 to {SCHEMA_VERSION}")
        for key in ("date", "git_commit", "command"):
            if not isinstance(entry[key], str) or not entry[key].strip():
                raise SchemaError(f"{path}: run {run_id!r} has no {key} (got {entry[key]!r})")
        if manifest_gpu_name(entry) is None:
            raise SchemaError(f"{path}: run {run_id!r} names no GPU (got {entry['gpu']!r})")
    return runs


def manifest_gpu_name(entry: dict) -> str | None:
    """The GPU a manifest entry names (a device description, or its name as text)."""
    gpu = entry.get("gpu")
    name = gpu.get("name") if isinstance(gpu, dict) else gpu
    return name if isinstance(name, str) and name.strip() else None


# Raw counters and timings a measured row may not hold negative (a difference of counters,
# like l2_read_miss_sectors, may).
NON_NEGATIVE = (*METRICS.values(), "rel_error", "median_ms", "p10_ms", "p90_ms", "tflops",
                "useful_flops", "executed_flops", "dram_read_sectors")
# No memory moves faster than this (HBM3e is under 5 TB/s; a generous bound): a row whose DRAM
# bytes over its duration exceed it was not measured.
MAX_BYTES_PER_S = 100e12


def check_rows(path, df, runs: dict | None) -> None:
    """What a measured row must be: its point key the one its parameter columns make; its GPU
    the one its run's manifest names; counters and timings finite and not negative; no more
    DRAM bytes than its duration allows."""
    import numpy as np
    if df.empty:
        return
    if df["causal"].isna().any():
        raise SchemaError(f"{path}: column 'causal' must be True or False in every row")
    columns = [*PARAMETER_COLUMNS, *OPTIONAL_PARAMETER_COLUMNS]
    keys = [point_key(dict(zip(columns, row)))
            for row in df[columns].itertuples(index=False, name=None)]
    wrong = df["point"].to_numpy() != np.array(keys, dtype=object)
    if wrong.any():
        i = int(np.argmax(wrong))
        raise SchemaError(f"{path}: row {i + 2}: point {df['point'].iloc[i]!r} disagrees with "
                          f"its parameter columns ({keys[i]!r}); {int(wrong.sum())} such rows")
    if runs is not None:
        for run_id, gpus in df.groupby("run_id")["gpu"]:
            named = manifest_gpu_name(runs[run_id])
            other = sorted(set(gpus) - {named})
            if other:
                raise SchemaError(f"{path}: rows of run {run_id!r} name GPU {other[0]!r}, its "
                                  f"manifest {named!r}")
    ok = df[df["status"] == "ok"]
    for col, (typ, _) in SCHEMA.items():
        if typ not in ("float", "int") or col not in ok:
            continue
        values = ok[col].dropna().to_numpy(float)
        if np.isinf(values).any():
            raise SchemaError(f"{path}: column {col!r} holds a non-finite value (inf)")
        if col in NON_NEGATIVE and (values < 0).any():
            raise SchemaError(f"{path}: column {col!r} holds a negative value "
                              f"({values[values < 0][0]:g})")
    moved = ok[["dram_read_bytes", "ncu_duration_ns"]].dropna()
    too_fast = moved["dram_read_bytes"] > moved["ncu_duration_ns"] * 1e-9 * MAX_BYTES_PER_S
    if too_fast.any():
        row = moved[too_fast].iloc[0]
        raise SchemaError(f"{path}: a row reads {row['dram_read_bytes']:.3g} bytes of DRAM in "
                          f"{row['ncu_duration_ns']:.3g} ns, faster than any GPU's memory "
                          f"({MAX_BYTES_PER_S:.0e} B/s)")


def check_manifest(directory, run_ids: set[str]) -> dict:
    runs = read_manifest(directory)
    unknown = sorted(r for r in run_ids if r not in runs)
    if unknown:
        raise SchemaError(f"{manifest_path(directory)}: no entry for runs {unknown[:3]}")
    return runs


def manifest_text(runs: dict) -> str:
    """A manifest file's text: one line per run, runs in id order. (Indenting each run's ncu
    report list, as pretty-printing did, made manifests a quarter of the repository.)"""
    lines = [f"{json.dumps(run_id)}: {json.dumps(runs[run_id], sort_keys=True)}"
             for run_id in sorted(runs)]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_manifest(directory, run_id: str, data: dict) -> Path:
    """Manifests accumulate per run: manifest.json maps run_id -> manifest (kept compressed
    where `wavefront compress` packed it). Written through a unique temporary file and an
    atomic rename."""
    path = manifest_path(directory)
    if path.is_symlink():  # the rename below would not follow it, but reading it would
        raise UnsafePath(f"{path}: is a symbolic link; the store writes only files of its own")
    runs = read_manifest(directory) if path.exists() else {}
    runs[run_id] = data
    # 0644: a manifest is read by whoever reads the data (mkstemp's 0600 hid it)
    return write_stored(path, manifest_text(runs), what="a manifest", mode=0o644)


class DirectoryLock:
    """An exclusive lock on a results directory for the life of a sweep (flock on `.lock`):
    a second sweep into the same directory is refused instead of measuring everything twice."""

    def __init__(self, directory):
        self.path = Path(directory) / ".lock"
        self._fd = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = _open_no_follow(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise StoreLocked(f"{self.path.parent}: another sweep is writing here") from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())
        return self

    def __exit__(self, *exc):
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class NothingToCompress(ValueError):
    """A directory `compress_dir` was given holds no file to pack (nor, repacking, a packed
    one)."""


@dataclass(frozen=True)
class Packed:
    """One file `compress_dir` packed: its packed path, sizes before and after, and what it
    holds (runs of a manifest, rows of a table), or the digits it was repacked at."""

    path: Path
    before: int
    after: int
    holds: str = ""  # "12 runs", "340 rows"
    digits: int | None = None

    def __str__(self) -> str:
        what = (f"at {self.digits} significant digits, " if self.digits
                else f"{self.holds}, " if self.holds else "")
        return f"{self.path}: {what}{self.before} -> {self.after} bytes"


def compress_dir(directory, digits: int | None = None):
    """Pack a data directory as data is committed (`wavefront compress`), yielding each file
    packed (`Packed`): its plain results.csv as results.csv.gz, every manifest.json as
    manifest.json.gz and every record file (*.jsonl, in subdirectories too) as *.jsonl.gz. Each
    packed file is checked to hold what it was made from before the plain file goes (a failed
    check raises ValueError, the packed file left for inspection). With `digits`, every packed
    table and record file is then packed again with each fraction at that many significant
    digits (`repack_significant`: whole numbers stay exact, each line checked). A plain file
    beside a packed one that holds something else is refused, nothing replaced."""
    directory = Path(directory)
    plain = directory / RESULTS_FILE
    records = sorted(directory.rglob("*.jsonl"))
    manifests = sorted(directory.rglob(MANIFEST_FILE))
    packed_files = [*directory.rglob("*.jsonl.gz"), *directory.rglob(COMPRESSED_RESULTS_FILE)]
    if not plain.is_file() and not records and not manifests and not (digits and packed_files):
        raise NothingToCompress(f"{directory}: no {RESULTS_FILE}, {MANIFEST_FILE} or *.jsonl "
                                "record file to compress"
                                + (", nor a packed one" if digits else ""))
    for manifest in manifests:
        runs = read_manifest(manifest.parent)
        size = manifest.stat().st_size
        packed = compress_manifest(manifest.parent)
        if read_manifest(manifest.parent) != runs:
            raise ValueError(f"{packed}: does not hold the runs it was made from")
        yield Packed(packed, size, packed.stat().st_size, f"{len(runs)} runs")
    for record in records:
        text = read_results_bytes(record, "a record file")
        packed = gzip_file(record)
        if read_results_bytes(packed) != text:
            raise ValueError(f"{packed}: does not hold the lines it was made from")
        yield Packed(packed, len(text), packed.stat().st_size)
    if plain.is_file():
        rows = len(load_results(plain, require_manifest=False))
        text = read_results_bytes(plain, "a results file")
        packed = compress_results(directory)
        if read_results_bytes(packed) != text:  # the plain file is gone: say so loudly
            raise ValueError(f"{packed}: does not hold the rows it was made from")
        yield Packed(packed, len(text), packed.stat().st_size, f"{rows} rows")
    if digits is None:
        return
    for path in sorted([*directory.rglob("*.jsonl.gz"),
                        *directory.rglob(COMPRESSED_RESULTS_FILE)]):
        before, after = repack_significant(path, digits)
        yield Packed(path, before, after, digits=digits)
