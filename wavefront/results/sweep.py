"""Declarative, resumable sweeps: a TOML grid of points, each repeat measured and appended at once.

Spec (TOML):

    name = "linear-vs-sawtooth"
    measure = ["timing", "counters"]   # either or both
    repeats = 3                        # every point measured this many times (separate
                                       # launches, interleaved with the other points)
    timeout_s = 120                    # per task, wall clock; longer is recorded failed
    reps = 30                          # timed repetitions inside one timing measurement
    peers = false                      # also time torch SDPA FA2 / cuDNN (timing)
    metric_set = "full"                # counters: "full" (several replay passes) or "dram"
                                       # (DRAM bytes and duration: one pass)
    batch_points = 8                   # tasks per worker process

    [grid]                             # every combination is one point; several [[grid]]
    batch = [1]                        # tables give the union of their points
    heads = [1]
    kv_heads = [1]                     # optional, default = heads
    seqlen = [4096, 131072]
    head_dim = [64, 128]
    dtype = ["bfloat16"]
    causal = [false, true]
    tiles = ["128x64"]
    occupancy = [2]                    # optional, default per tile shape
    ctas = [0]                         # optional persistent grid cap; 0 = SMs x occupancy
    chunk_tiles = [0]                  # optional, tiled schedule; 0 = from the L2
    schedule = ["persistent+linear", "persistent+sawtooth"]

Every finished task is appended to `<out>/results.csv` at once (one fsync'd write per row);
re-running the spec skips tasks already recorded; a killed sweep loses nothing that finished.
The directory is locked while a sweep writes to it. Each task is independent, so any runner
(processes on this GPU, a Dask cluster) can measure it; the runner is passed in.
"""
from __future__ import annotations

import itertools
import signal
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from wavefront.point import MAX_POINT_SEQLEN, ORDER_COUNTERS, PARAMS, GpuShape, Point
from wavefront.results.measurement import METRIC_SETS, Measurement
from wavefront.results.progress import Progress
from wavefront.results.store import (
    SCHEMA,
    DirectoryLock,
    SchemaError,
    append_row,
    load_results,
    manifest,
    read_manifest,
    write_manifest,
)
from wavefront.results.store import results_path as results_table

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

MEASUREMENTS = ("timing", "counters")
# The largest sequence length a sweep accepts: beyond it one launch's inputs alone outgrow
# any GPU we run on (B=H=1, D=128: 3 x 2^24 x 128 x 2 bytes = 12 GiB).
MAX_SEQLEN = MAX_POINT_SEQLEN
# Limits on what a spec may ask for, checked before anything is built (a product of values
# that are each fine can still be 10^12 tasks). Each is far above any sweep measured here (the
# largest, knee, has a few thousand tasks) and far below what exhausts a workstation.
MAX_POINTS = 100_000  # distinct points of one spec, all grids together
MAX_TASKS = 1_000_000  # points x repeats x measurements
MAX_REPEATS = 1000
MAX_REPS = 100_000  # timed repetitions inside one timing measurement
MAX_BATCH_POINTS = 10_000
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# No task starts a process, compiles and measures in less (1e-300 s killed every task at once)
MIN_TIMEOUT_S = 1.0
# A spec file: a regular file of at most this many bytes (not a device, a FIFO, a directory).
MAX_SPEC_BYTES = 1 << 20


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_at_most(limit, zero_ok=False):
    low = 0 if zero_ok else 1
    what = ("a non-negative integer (0 = default)" if zero_ok else "a positive integer")

    def check(v):
        return None if _is_int(v) and low <= v <= limit else f"{what} up to {limit}"
    return check


def _grid_check(p) -> Callable[[object], str | None]:
    """A grid value's check, from the parameter's declaration on Point: None if it is fine,
    else what was expected. A grid writes 0 for a parameter's default."""
    expected = f"{p.expected}, or 0 for the default" if p.zero_default else p.expected

    def check(v):
        if p.zero_default and _is_int(v) and v == 0:
            return None
        return None if p.valid(v) else expected
    return check


# The keys a grid may list, each checked as Point checks it: Point's parameter fields.
GRID_KEYS = {name: _grid_check(p) for name, p in PARAMS.items()}
REQUIRED_GRID_KEYS = tuple(name for name, p in PARAMS.items() if p.grid_required)
TOP_KEYS = {"name", "measure", "repeats", "timeout_s", "reps", "peers", "batch_points",
            "metric_set", "record_order", "free_shapes", "grid"}


@dataclass
class SweepSpec:
    name: str
    grid: list[dict]  # the union of these grids' points
    measure: list[str] = field(default_factory=lambda: ["timing"])
    repeats: int = 1
    timeout_s: float = 120.0
    reps: int = 30
    peers: bool = False
    batch_points: int = 8
    metric_set: str = "full"
    # Launch the RECORD_ORDER kernel: timings measure its overhead, counter runs save each
    # launch's work-item tickets beside the results (`wavefront.results.orders`). "per_cta":
    # its tickets from a counter per CTA (no launch order; `kernel.attention._take_ticket`).
    record_order: bool | str = False
    # Counter runs launch the binary compiled without the shapes the JIT bakes in of q, k, v
    # and out (a batch or head count of 1; `PreparedLaunch(free_shapes=...)`), not the JIT's.
    free_shapes: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def parse_spec(text: str, source: str = "spec") -> SweepSpec:
    """A spec from TOML text, every value checked up front; errors name `source` and the key."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError(f"{source}: not a spec: its TOML is nested too deeply") from None
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise ValueError(f"{source}: unknown keys {sorted(unknown)}; allowed {sorted(TOP_KEYS)}")
    grid = raw.get("grid")
    grids = [grid] if isinstance(grid, dict) else grid
    if not isinstance(grids, list) or not grids or not all(isinstance(g, dict) for g in grids):
        raise ValueError(f"{source}: needs a [grid] table (or [[grid]] tables)")
    for n, g in enumerate(grids):
        where = f"{source}: grid" + (f"[{n}]" if len(grids) > 1 else "")
        bad = set(g) - set(GRID_KEYS)
        if bad:
            raise ValueError(f"{where}: unknown grid keys {sorted(bad)}; "
                             f"allowed {sorted(GRID_KEYS)}")
        missing = [k for k in REQUIRED_GRID_KEYS if k not in g]
        if missing:
            raise ValueError(f"{where}: grid needs {missing}")
        for key, values in g.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{where}.{key} must be a non-empty list, got {values!r}")
            for i, value in enumerate(values):
                expected = GRID_KEYS[key](value)
                if expected:
                    raise ValueError(f"{where}.{key}[{i}] must be {expected}, got {value!r}")
    measure = raw.get("measure", ["timing"])
    if isinstance(measure, str):
        measure = [measure]
    if (not isinstance(measure, list) or not measure
            or any(m not in MEASUREMENTS for m in measure) or len(set(measure)) != len(measure)):
        raise ValueError(f"{source}: measure must list some of {MEASUREMENTS} once each, "
                         f"got {measure!r}")
    checks = {"repeats": (_check_at_most(MAX_REPEATS), 1), "reps": (_check_at_most(MAX_REPS), 30),
              "batch_points": (_check_at_most(MAX_BATCH_POINTS), 8)}
    values = {}
    for key, (check, default) in checks.items():
        value = raw.get(key, default)
        expected = check(value)
        if expected:
            raise ValueError(f"{source}: {key} must be {expected}, got {value!r}")
        values[key] = value
    timeout = raw.get("timeout_s", 120)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not MIN_TIMEOUT_S <= timeout <= MAX_TIMEOUT_S:
        raise ValueError(f"{source}: timeout_s must be a positive number of seconds up to "
                         f"{MAX_TIMEOUT_S:.0f}, at least {MIN_TIMEOUT_S:.0f}, got {timeout!r}")
    peers = raw.get("peers", False)
    if not isinstance(peers, bool):
        raise ValueError(f"{source}: peers must be true or false, got {peers!r}")
    metric_set = raw.get("metric_set", "full")
    if metric_set not in METRIC_SETS:
        raise ValueError(f"{source}: metric_set must be one of {sorted(METRIC_SETS)}, got "
                         f"{metric_set!r}")
    record_order = raw.get("record_order", False)
    if not isinstance(record_order, bool):
        if record_order not in ORDER_COUNTERS:
            raise ValueError(f"{source}: record_order must be true, false or one of "
                             f"{ORDER_COUNTERS}, got {record_order!r}")
    free_shapes = raw.get("free_shapes", False)
    if not isinstance(free_shapes, bool):
        raise ValueError(f"{source}: free_shapes must be true or false, got {free_shapes!r}")
    if free_shapes and measure != ["counters"]:
        raise ValueError(f"{source}: free_shapes applies to counter runs only (measure = "
                         f"[\"counters\"]), got measure = {measure!r}")
    name = raw.get("name", Path(source).stem)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{source}: name must be a non-empty string, got {name!r}")
    if not name.isprintable() or any(c in name for c in "/\\") or name in (".", ".."):
        # a label in progress lines and manifests, and a data set's directory elsewhere
        raise ValueError(f"{source}: name must be printable, without path separators, got "
                         f"{name!r}")
    points = sum(_grid_size(g) for g in grids)  # an upper bound: duplicates count here
    if points > MAX_POINTS:
        raise ValueError(f"{source}: the grid has {points} points, more than the limit of "
                         f"{MAX_POINTS} (MAX_POINTS): split it into several specs")
    tasks = points * values["repeats"] * len(measure)
    if tasks > MAX_TASKS:
        raise ValueError(f"{source}: {points} points x {values['repeats']} repeats x "
                         f"{len(measure)} measurements = {tasks} tasks, more than the limit of "
                         f"{MAX_TASKS} (MAX_TASKS)")
    spec = SweepSpec(name=name, grid=grids, measure=measure, timeout_s=float(timeout),
                     peers=peers, metric_set=metric_set, record_order=record_order,
                     free_shapes=free_shapes, **values)
    return spec


def _grid_size(grid: dict) -> int:
    size = 1
    for values in grid.values():
        size *= len(values)
    return size


def read_spec_text(path) -> str:
    """The text of a spec file: a regular file (not a device, FIFO or directory, which would
    read forever or block) of at most MAX_SPEC_BYTES, in UTF-8."""
    import os
    import stat
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then tells what it is.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the spec: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: a spec must be a regular file, not a device, FIFO or "
                             "directory")
        if info.st_size > MAX_SPEC_BYTES:
            raise ValueError(f"{path}: a spec must be at most {MAX_SPEC_BYTES} bytes, this one "
                             f"has {info.st_size}")
        data = os.read(fd, MAX_SPEC_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: cannot read the spec: not UTF-8 text ({exc.reason})") from None


def load_spec(path) -> SweepSpec:
    return parse_spec(read_spec_text(path), str(path))


def experiment_spec_texts(path) -> dict[str, str]:
    """The sweeps an experiment file owns (`SPEC`, `SPECS`), by the data set each measures
    into, read as data: the file is parsed, not run, so listing or checking a sweep imports
    nothing the figure needs (pandas, seaborn, numba) and runs none of its code.

    Module-level assignments are evaluated where they are literals: strings, numbers, lists,
    tuples and dicts of them, names bound earlier to such values, and `+` of strings (a grid
    shared by two specs). Anything else in SPEC or SPECS is an error naming it."""
    import ast
    name = Path(path).stem
    try:
        tree = ast.parse(read_spec_text(path), filename=str(path))
    except SyntaxError as exc:
        raise ValueError(f"{path}: not valid Python (line {exc.lineno}: {exc.msg})") from None
    values: dict[str, object] = {}

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool)):
            return node.value
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = value(node.left), value(node.right)
            if isinstance(left, str) and isinstance(right, str):
                return left + right
        if isinstance(node, (ast.List, ast.Tuple)):
            return [value(x) for x in node.elts]
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {value(k): value(v) for k, v in zip(node.keys, node.values)}
        raise ValueError(ast.unparse(node))

    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            continue
        target = node.targets[0].id
        try:
            values[target] = value(node.value)
        except ValueError as exc:
            if target in ("SPEC", "SPECS"):
                raise ValueError(f"{path}: {target} must be built from literals (strings, and "
                                 f"names bound to them) so it can be read without running the "
                                 f"file; got {str(exc)[:80]!r}") from None
    specs = values.get("SPECS") or {}
    if not isinstance(specs, dict):
        raise ValueError(f"{path}: SPECS must map data set names to TOML texts")
    texts = dict(specs)
    if values.get("SPEC"):
        texts[name] = values["SPEC"]
    for dataset, text in texts.items():
        if not isinstance(dataset, str) or not isinstance(text, str):
            raise ValueError(f"{path}: SPECS must map data set names to TOML texts")
    return texts


def expand_points(spec: SweepSpec, source: str = "spec") -> list[Point]:
    """Every distinct point of the spec (grid order: Point's parameter fields, the last
    varying fastest), each checked as a `Point`. A key a grid leaves out is the Point's
    default, but for heads: a grid that names none measures one head."""
    defaults = {**{name: getattr(Point(), name) for name in PARAMS}, "heads": 1,
                "kv_heads": None}
    names = list(PARAMS)
    points, seen = [], set()
    for n, g in enumerate(spec.grid):
        axes = [g.get(name, [defaults[name]]) for name in names]
        for values in itertools.product(*axes):
            chosen = {name: (None if PARAMS[name].zero_default and value == 0 else value)
                      for name, value in zip(names, values)}
            try:
                point = Point(**chosen)
            except ValueError as exc:
                raise ValueError(f"{source}: grid[{n}] point {chosen['schedule']} "
                                 f"S={chosen['seqlen']}: {exc}") from None
            if point not in seen:
                seen.add(point)
                points.append(point)
    return points


def grid_of(point: Point) -> dict:
    """A grid with one point: each parameter the point sets, as a one-value list."""
    return {name: [getattr(point, name)] for name in PARAMS if getattr(point, name) is not None}


def expand(spec: SweepSpec, *, gpu: str, sms: int, l2_bytes: int,
           source: str = "spec") -> list[dict]:
    """Every task of the spec on one GPU: (point, measurement, repeat) as a record. Repeats are
    interleaved: all points once, then all points again, so no point's repeats run back to back;
    within a repeat, tasks of one kind are consecutive so a worker process measures many."""
    shape = GpuShape(sms, l2_bytes)
    records = []
    for point in expand_points(spec, source):
        try:
            rec = point.to_record(shape, gpu)
        except ValueError as exc:
            raise ValueError(f"{source}: point {point.schedule} S={point.seqlen}: {exc}") from None
        records.append(rec)
    tasks, seen = [], set()
    for repeat in range(spec.repeats):
        for measurement in spec.measure:
            for rec in records:
                ident = (rec["point"], measurement, repeat)
                if ident not in seen:
                    seen.add(ident)
                    task = {**rec, "measurement": measurement, "repeat": repeat}
                    if spec.record_order:
                        task["record_order"] = spec.record_order
                    if spec.free_shapes:
                        task["free_shapes"] = True
                    tasks.append(task)
    return tasks


def done_keys(results_path, retry_failed: bool = False) -> set[tuple]:
    """(gpu, point, measurement, repeat) already recorded: one file can hold several GPUs."""
    if not Path(results_path).exists():
        return set()
    df = load_results(results_path, require_manifest=False)
    if retry_failed:
        df = df[df["status"] == "ok"]
    return set(zip(df["gpu"], df["point"], df["measurement"], df["repeat"].astype(int)))


def row_for(task: dict, run_id: str, result: dict | None, error: str | None) -> dict:
    """A results row: the task's record (the point on its GPU), the typed measurement's
    columns, and the run id."""
    measurement = Measurement.of(task["measurement"], task["repeat"], result, error)
    return {**{k: v for k, v in task.items() if k in SCHEMA}, **measurement.columns(),
            "run_id": run_id}


# What decides how a point is measured, as opposed to which points there are.
MEASUREMENT_SETTINGS = ("metric_set", "reps", "peers", "record_order", "free_shapes")


def check_same_settings(out_dir, runs: dict, spec: SweepSpec) -> None:
    """A sweep resumed into a directory must measure as the runs already there did."""
    for run_id, entry in runs.items():
        before = entry.get("spec")
        if not isinstance(before, dict):
            continue
        changed = [f"{key} {before[key]!r} -> {getattr(spec, key)!r}"
                   for key in MEASUREMENT_SETTINGS
                   if key in before and before[key] != getattr(spec, key)]
        if changed:
            raise SchemaError(f"{out_dir}: the spec measures differently from run {run_id} "
                              f"already here ({', '.join(changed)}): its rows would be kept "
                              "beside rows measured the new way; measure into a new --out "
                              "directory, or restore the settings")


def run_sweep(spec: SweepSpec, out_dir, *, gpu: str, sms: int, l2_bytes: int, runner,
              environment: dict | None = None, retry_failed: bool = False,
              progress: bool = True, command: list[str] | None = None,
              manifest_extra: dict | None = None) -> dict:
    """Measure every task of `spec` not yet in `<out_dir>/results.csv` with `runner`
    (`runner.run(tasks, spec, on_result, on_artifact)`). Returns a summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = results_table(out_dir)
    tasks = expand(spec, gpu=gpu, sms=sms, l2_bytes=l2_bytes)
    with DirectoryLock(out_dir):
        if results_path.exists():
            # refuse to append to data whose provenance is broken, or that was measured another
            # way: its rows would be kept (skipped as done) beside rows measured this way
            # and to append to a table `fit` and the paper would refuse (rows whose point,
            # GPU or numbers do not hold, rows duplicated): more rows would not make it load
            if load_results(results_path, require_manifest=False).shape[0]:
                try:
                    load_results(results_path, strict=True)
                except SchemaError as exc:
                    raise SchemaError(f"{exc}; not resumed: the table as it is would not "
                                      "load for `fit`. Measure into a new --out directory, "
                                      "or repair the table") from None
            check_same_settings(out_dir, read_manifest(out_dir), spec)
        done = done_keys(results_path, retry_failed)
        todo = [t for t in tasks if (gpu, t["point"], t["measurement"], t["repeat"]) not in done]
        summary = {"points": len(tasks), "skipped": len(tasks) - len(todo), "ok": 0,
                   "failed": 0}
        if not todo:
            return summary
        run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        entry = manifest(environment or {"gpu": {"name": gpu, "sms": sms,
                                                 "l2_bytes": l2_bytes}},
                         command, {"spec": spec.as_dict(), **(manifest_extra or {})})
        write_manifest(out_dir, run_id, entry)
        bar = Progress(len(todo), f"sweep {spec.name}", enabled=progress)
        written: set[tuple] = set()

        def on_result(task: dict, result: dict | None, error: str | None):
            ident = (task["point"], task["measurement"], task["repeat"])
            if ident in written:  # a runner that delivered a task twice: keep the first
                return
            written.add(ident)
            row = row_for(task, run_id, result, error)
            summary["ok" if row["status"] == "ok" else "failed"] += 1
            append_row(results_path, row)
            bar.update(ok=row["status"] == "ok", where=task.get("gpu_slot"))

        def on_artifact(report: dict):
            entry.setdefault("raw_reports", []).append(report)
            write_manifest(out_dir, run_id, entry)

        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        started = time.monotonic()
        try:
            runner.run(todo, spec, on_result, on_artifact)
            entry["wall_s"] = round(time.monotonic() - started, 1)
            entry["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            write_manifest(out_dir, run_id, entry)
        finally:
            signal.signal(signal.SIGTERM, previous)
            bar.close()
    return summary


def _raise_interrupt(signum, frame):
    # `timeout` and job control send SIGTERM: unwind like Ctrl-C so workers are killed and
    # every finished task is already on disk.
    raise KeyboardInterrupt


def describe(tasks: list[dict]) -> str:
    """One line per point of an expanded spec (for `sweep --dry-run`), in one pass over the
    tasks (a spec of many tasks must not take quadratic time to list)."""
    firsts, kinds, repeats = {}, {}, {}
    for t in tasks:
        point = t["point"]
        firsts.setdefault(point, t)
        kinds.setdefault(point, set()).add(t["measurement"])
        repeats[point] = max(repeats.get(point, 0), t["repeat"] + 1)
    lines = []
    for point, t in firsts.items():
        lines.append(f"B{t['batch']} H{t['heads']}/{t['kv_heads']} S{t['seqlen']} "
                     f"D{t['head_dim']} {t['dtype']} {'causal' if t['causal'] else 'full'} "
                     f"{t['tile_m']}x{t['tile_n']} occ{t['occupancy']} "
                     f"{t['cta_schedule']}+{t['kv_schedule']} ctas={t['num_ctas']} "
                     f"in flight={t['resident_ctas']}: {'+'.join(sorted(kinds[point]))} "
                     f"x{repeats[point]}")
    return "\n".join(lines)
