"""Declarative, resumable sweeps: a TOML grid of points, each measured and appended at once.

Spec (TOML):

    name = "linear-vs-sawtooth"
    measure = ["timing", "counters"]   # either or both
    timeout_s = 120                    # per point; a point that takes longer is recorded failed
    reps = 30                          # timed repetitions (timing)
    peers = false                      # also time torch SDPA FA2 / cuDNN (timing)
    batch_points = 8                   # points per worker process

    [grid]                             # every combination of these is one point; several
                                       # [[grid]] tables give the union of their points
    batch = [1]
    heads = [1]
    kv_heads = [1]                     # optional, default = heads
    seqlen = [4096, 131072]
    head_dim = [64, 128]
    dtype = ["bfloat16"]
    causal = [false, true]
    tiles = ["128x64"]
    occupancy = [2]                    # optional, default per tile shape
    ctas = [0]                         # optional persistent grid cap; 0 = SMs x occupancy
    schedule = ["persistent+linear", "persistent+sawtooth"]

Every finished point is appended to `<out>/results.csv` at once (one fsync'd write per row);
re-running the spec skips points already recorded; Ctrl-C or a killed process loses nothing
that finished. Each point is independent, so a later runner can hand points to other GPUs.
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from wavefront.profiling import kill_group
from wavefront.records import (
    append_row,
    load_results,
    manifest,
    point_key,
    write_manifest,
)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

GRID_KEYS = {"batch", "heads", "kv_heads", "seqlen", "head_dim", "dtype", "causal", "tiles",
             "occupancy", "ctas", "schedule"}
REQUIRED_GRID_KEYS = {"seqlen", "head_dim", "schedule"}
MEASUREMENTS = ("timing", "counters")


@dataclass
class SweepSpec:
    name: str
    grid: list[dict]  # the union of these grids' points
    measure: list[str] = field(default_factory=lambda: ["timing"])
    timeout_s: float = 120.0
    reps: int = 30
    peers: bool = False
    batch_points: int = 8


def parse_spec(text: str, source: str = "spec") -> SweepSpec:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(raw) - {"name", "measure", "timeout_s", "reps", "peers", "batch_points", "grid"}
    if unknown:
        raise ValueError(f"{source}: unknown keys {sorted(unknown)}")
    grid = raw.get("grid")
    grids = [grid] if isinstance(grid, dict) else grid
    if not isinstance(grids, list) or not grids or not all(isinstance(g, dict) for g in grids):
        raise ValueError(f"{source}: needs a [grid] table (or [[grid]] tables)")
    for g in grids:
        bad = set(g) - GRID_KEYS
        if bad:
            raise ValueError(f"{source}: unknown grid keys {sorted(bad)}; "
                             f"allowed {sorted(GRID_KEYS)}")
        missing = REQUIRED_GRID_KEYS - set(g)
        if missing:
            raise ValueError(f"{source}: grid needs {sorted(missing)}")
        for key, values in g.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{source}: grid.{key} must be a non-empty list, "
                                 f"got {values!r}")
    measure = raw.get("measure", ["timing"])
    if isinstance(measure, str):
        measure = [measure]
    if not measure or set(measure) - set(MEASUREMENTS):
        raise ValueError(f"{source}: measure must list some of {MEASUREMENTS}, got {measure!r}")
    spec = SweepSpec(name=str(raw.get("name", Path(source).stem)), grid=grids, measure=measure,
                     timeout_s=float(raw.get("timeout_s", 120)), reps=int(raw.get("reps", 30)),
                     peers=bool(raw.get("peers", False)),
                     batch_points=int(raw.get("batch_points", 8)))
    if spec.timeout_s <= 0 or spec.reps < 1 or spec.batch_points < 1:
        raise ValueError(f"{source}: timeout_s, reps and batch_points must be positive")
    return spec


def load_spec(path) -> SweepSpec:
    return parse_spec(Path(path).read_text(), str(path))


def expand(spec: SweepSpec, *, gpu: str, sms: int, l2_bytes: int) -> list[dict]:
    """Every (point, measurement) of the spec, with the launch's derived parameters."""
    points, seen = [], set()
    for g in spec.grid:
        for p in _expand_grid(g, spec, gpu, sms, l2_bytes):
            if (p["key"], p["measurement"]) not in seen:
                seen.add((p["key"], p["measurement"]))
                points.append(p)
    return points


def _expand_grid(g: dict, spec: SweepSpec, gpu: str, sms: int, l2_bytes: int) -> list[dict]:
    from wavefront.bench import Config
    axes = [g.get("batch", [1]), g.get("heads", [1]), g.get("kv_heads", [None]), g["seqlen"],
            g["head_dim"], g.get("dtype", ["bfloat16"]), g.get("causal", [False]),
            g.get("tiles", [None]), g.get("occupancy", [None]), g.get("ctas", [0]),
            g["schedule"]]
    points = []
    for (batch, heads, kv_heads, seqlen, head_dim, dtype, causal, tiles, occupancy, ctas,
         schedule) in itertools.product(*axes):
        # The launch resolves defaults (tiles, occupancy, K/V heads) as the kernel will.
        launch = Config(batch, heads, kv_heads, seqlen, head_dim, dtype, bool(causal), schedule,
                        tiles, occupancy, ctas or None).launch(sms, l2_bytes)
        p = launch.problem
        params = {"batch": batch, "heads": heads, "kv_heads": p.kv_heads, "seqlen": seqlen,
                  "head_dim": head_dim, "dtype": dtype, "causal": p.causal,
                  "tile_m": p.tile_m, "tile_n": p.tile_n, "occupancy": launch.ctas_per_sm,
                  "cta_schedule": launch.cta.name, "kv_schedule": launch.kv.name,
                  "resident_ctas": launch.resident_ctas}
        key = point_key(params)
        for measurement in spec.measure:
            points.append({**params, "key": key, "measurement": measurement, "gpu": gpu,
                           "sms": sms, "l2_bytes": l2_bytes, "num_ctas": launch.num_ctas,
                           "group_units": launch.group_units})
    return points


def done_keys(results_path, retry_failed: bool = False) -> set[tuple[str, str, str]]:
    """(gpu, point, measurement) already recorded: one results file can hold several GPUs."""
    if not Path(results_path).exists():
        return set()
    df = load_results(results_path)
    if retry_failed:
        df = df[df["status"] == "ok"]
    return set(zip(df["gpu"], df["point"], df["measurement"]))


OnResult = Callable[[dict, "dict | None", "str | None"], None]


class SubprocessRunner:
    """Measures points in worker processes: timing directly, counters under ncu.

    A worker that prints nothing for `timeout_s` is killed; the point it was on is recorded
    as failed and the rest go on in a fresh worker.
    """

    def __init__(self, worker_cmd: list[str] | None = None, workdir: str | None = None):
        self.worker_cmd = worker_cmd or [sys.executable, "-m", "wavefront.worker"]
        self.workdir = workdir

    def run(self, points: list[dict], spec: SweepSpec, on_result: OnResult) -> None:
        timing = [p for p in points if p["measurement"] == "timing"]
        counters = [p for p in points if p["measurement"] == "counters"]
        for chunk in _chunks(timing, spec.batch_points):
            self._run_timing(chunk, spec, on_result)
        for chunk in _chunks(counters, spec.batch_points):
            self._run_counters(chunk, spec, on_result)

    def _run_timing(self, points, spec, on_result):
        pending = list(points)
        while pending:
            with tempfile.NamedTemporaryFile("w", suffix=".json", dir=self.workdir,
                                             delete=False) as f:
                json.dump(pending, f)
            cmd = [*self.worker_cmd, "--mode", "timing", "--points", f.name,
                   "--reps", str(spec.reps), "--peers" if spec.peers else "--no-peers"]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
            stderr_tail: list[str] = []
            threading.Thread(target=_tail, args=(proc.stderr, stderr_tail), daemon=True).start()
            by_key = {p["key"]: p for p in pending}
            try:
                while pending:
                    try:
                        line = lines.get(timeout=spec.timeout_s)
                    except queue.Empty:
                        kill_group(proc)
                        on_result(pending.pop(0), None,
                                  f"hung: no result within {spec.timeout_s:.0f} s")
                        break
                    if line is None:  # worker exited
                        proc.wait()
                        if pending:
                            tail = "".join(stderr_tail)[-300:].strip()
                            on_result(pending.pop(0), None,
                                      f"worker exited {proc.returncode}: {tail}")
                        break
                    if not line.startswith("{"):
                        continue
                    msg = json.loads(line)
                    point = by_key.get(msg.get("key"))
                    if point is None or point not in pending:
                        continue
                    pending.remove(point)
                    on_result(point, msg.get("result"), msg.get("error"))
            finally:
                kill_group(proc)
                os.unlink(f.name)

    def _run_counters(self, points, spec, on_result):
        from wavefront.bench import Config
        from wavefront.counting import launch_counts
        from wavefront.profiling import derive, profile_points
        pending = list(points)
        while pending:
            results, error = profile_points(pending, timeout_s=spec.timeout_s,
                                            workdir=self.workdir)
            for point, row in results:
                launch = Config.from_record(point).launch(point["sms"], point["l2_bytes"])
                counts = launch_counts(launch.problem, launch.n_chunks)
                row.pop("kernel_name", None)
                row.update(derive(row, counts.read_sectors, counts.compulsory_read_bytes))
                pending.remove(point)
                on_result(point, row, None)
            if error and pending:
                on_result(pending.pop(0), None, error)


def _pump(stream, lines: queue.Queue):
    for line in stream:
        lines.put(line)
    lines.put(None)


def _tail(stream, keep: list[str]):
    for line in stream:
        keep.append(line)
        del keep[:-20]


def _chunks(items, size):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def run_sweep(spec: SweepSpec, out_dir, *, gpu: str, sms: int, l2_bytes: int,
              runner=None, retry_failed: bool = False, progress: bool = True,
              command: list[str] | None = None, manifest_extra: dict | None = None) -> dict:
    """Measure every point of `spec` not yet in `<out_dir>/results.csv`. Returns a summary."""
    import click
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / "results.csv"
    points = expand(spec, gpu=gpu, sms=sms, l2_bytes=l2_bytes)
    done = done_keys(results_path, retry_failed)
    todo = [p for p in points if (gpu, p["key"], p["measurement"]) not in done]
    summary = {"points": len(points), "skipped": len(points) - len(todo), "ok": 0, "failed": 0}
    if not todo:
        return summary
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    write_manifest(out_dir, run_id, manifest(command, {"spec": spec.__dict__,
                                                       **(manifest_extra or {})}))
    runner = runner or SubprocessRunner()
    bar = click.progressbar(length=len(todo), label=f"sweep {spec.name}", file=sys.stderr,
                            show_eta=True) if progress else None

    def on_result(point: dict, result: dict | None, error: str | None):
        row = {k: point.get(k) for k in ("gpu", "sms", "l2_bytes", "batch", "heads",
                                         "kv_heads", "seqlen", "head_dim", "dtype", "causal",
                                         "tile_m", "tile_n", "occupancy", "cta_schedule",
                                         "kv_schedule", "num_ctas", "resident_ctas",
                                         "group_units", "measurement")}
        row.update(point=point["key"], run_id=run_id)
        if error is None and result is not None:
            row.update({k: v for k, v in result.items() if k not in ("num_ctas", "group_units")})
            row["status"] = "ok"
            summary["ok"] += 1
        else:
            row.update(status="failed", error=(error or "no result")[:500])
            summary["failed"] += 1
        append_row(results_path, row)
        if bar is not None:
            bar.update(1)

    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        runner.run(todo, spec, on_result)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if bar is not None:
            bar.render_finish()
    return summary


def _raise_interrupt(signum, frame):
    # `timeout` and job control send SIGTERM: unwind like Ctrl-C so workers are killed and
    # every finished point is already on disk.
    raise KeyboardInterrupt
