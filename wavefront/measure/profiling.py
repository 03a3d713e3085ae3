"""Nsight Compute collection: points under `ncu`, each measured launch in its own NVTX range.

Only the measured launch of each point is profiled: the worker compiles and warms up with the
profiler off, then brackets the one measured launch with cudaProfilerStart/Stop
(`--profile-from-start off`) and an NVTX range named by the point's tag (`wf:<n>`); the
kernel-name filter keeps other kernels out. ncu writes a report file (`--export`), which is kept
for re-analysis and read with NVIDIA's Python report interface (`ncu_report`, shipped with
Nsight Compute under `extras/python`); where that module is missing, the report is read through
`ncu --import ... --csv --page raw --print-units base` with kernels renamed by their NVTX range.
Counters are attributed by tag, never by position: a point whose tag has the wrong number of
kernels, or none, fails with the reason.

Kernel replay with `--cache-control all` flushes the caches before every replay pass, so each
pass sees one launch from a cold L2, cross-CTA reuse included. Clocks are left alone
(`--clock-control none`): durations under ncu are not timings anyway.
"""
from __future__ import annotations

import csv
import glob
import hashlib
import importlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from wavefront.device import find_ncu
from wavefront.results.measurement import METRIC_SETS, METRICS, RATE_COLUMNS

KERNEL_FILTER = "regex:flash_attention_fwd|combine_partials"
KERNEL_NAMES = ("flash_attention_fwd", "combine_partials")
TAG_PREFIX = "wf:"
_TAG = re.compile(re.escape(TAG_PREFIX) + r"(\d+)")
# Marks the worker's result lines on stdout: anything else the program prints is ignored.
RESULT_MARK = "@@wavefront "
# Units ncu may choose per row in CSV output; everything is normalised to bytes and ns.
_UNIT_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6,
               "GB": 1e9, "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
               "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}


class ProfilerError(RuntimeError):
    pass


def tag_for(index: int) -> str:
    return f"{TAG_PREFIX}{index}"


# How every launch is profiled: only between cudaProfilerStart/Stop, kernel replay from a cold
# L2 (caches flushed before each pass), clocks left as the GPU runs them.
COLD_REPLAY = ("--target-processes", "all", "--profile-from-start", "off",
               "--replay-mode", "kernel", "--cache-control", "all", "--clock-control", "none")


def ncu_command(ncu: str, report_path: str, program: list[str],
                metric_set: str = "full") -> list[str]:
    return [ncu, *COLD_REPLAY, "--nvtx", "--kernel-name", KERNEL_FILTER,
            "--metrics", ",".join(METRIC_SETS[metric_set]),
            "--export", report_path, "--force-overwrite", *program]


def csv_command(ncu: str, report_path: str) -> list[str]:
    return [ncu, "--import", report_path, "--csv", "--page", "raw", "--print-units", "base",
            "--print-nvtx-rename", "kernel"]


@dataclass
class KernelRecord:
    """One profiled kernel: its name, the NVTX tag it ran under, our metric columns."""

    kernel_name: str
    tag: str | None
    metrics: dict = field(default_factory=dict)


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[KernelRecord]:
    """Rows of ncu `--csv --page raw` output -> one record per profiled kernel.

    The second CSV row may hold units; numbers may carry thousands separators; lines ncu prints
    before the CSV (==PROF== notes) are skipped. The NVTX tag is read from the kernel name
    (`--print-nvtx-rename kernel`) where present.
    """
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    table = list(csv.reader(io.StringIO("\n".join(lines))))
    header, rest = table[0], table[1:]
    units = {}
    if rest and not rest[0][0].strip().isdigit():
        units = dict(zip(header, rest[0]))
        rest = rest[1:]
    out = []
    for raw in rest:
        record = dict(zip(header, raw))
        name = record.get("Kernel Name", "")
        tag = _TAG.search(name)
        metrics = {}
        for metric, column in METRICS.items():
            if metric not in record:
                continue
            value = _number(record[metric])
            if value is not None:
                value *= _UNIT_SCALE.get(units.get(metric, "").strip(), 1)
            metrics[column] = value
        out.append(KernelRecord(name, tag.group(0) if tag else None, metrics))
    return out


def find_ncu_report(ncu: str | None = None):
    """NVIDIA's `ncu_report` module: importable already (PyPI `ncu-report`), or from the
    Nsight Compute installation beside `ncu` (extras/python). None if neither."""
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        pass
    candidates = []
    if ncu:
        real = Path(os.path.realpath(ncu)).parent
        candidates += [real / "extras" / "python", real.parent / "extras" / "python"]
    candidates += [Path(p) for p in sorted(glob.glob("/opt/nvidia/nsight-compute/*/extras/python"))]
    candidates += [Path(p) for p in sorted(glob.glob("/usr/local/cuda*/nsight-compute*/extras/python"))]
    for path in candidates:
        if (path / "ncu_report.py").exists():
            sys.path.insert(0, str(path))
            try:
                return importlib.import_module("ncu_report")
            except ImportError:
                sys.path.remove(str(path))
    return None


def _action_tag(action) -> str | None:
    try:
        state = action.nvtx_state()
        if state is None:
            return None
        for domain_id in state.domains():
            for name in state.domain_by_id(domain_id).push_pop_ranges():
                if name.startswith(TAG_PREFIX):
                    return name
    except Exception:
        return None
    return None


def report_actions(module, path: str):
    """Every profiled kernel (an `ncu_report` action) of a report file, in order."""
    ctx = module.load_report(path)
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            yield rng.action_by_idx(a)


def read_report_module(module, path: str) -> list[KernelRecord]:
    """Every kernel of a report file through `ncu_report` (values in base units)."""
    out = []
    for action in report_actions(module, path):
        metrics = {}
        for metric, column in METRICS.items():
            m = action.metric_by_name(metric)
            metrics[column] = None if m is None else float(m.as_double())
        out.append(KernelRecord(action.name(), _action_tag(action), metrics))
    return out


def read_report(path: str, ncu: str) -> tuple[list[KernelRecord], str]:
    """-> (kernel records, how they were read)."""
    module = find_ncu_report(ncu)
    if module is not None:
        return read_report_module(module, path), "ncu_report"
    out = subprocess.run(csv_command(ncu, path), capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise ProfilerError(f"ncu --import failed ({out.returncode}): {out.stderr[-300:]}")
    return parse_ncu_csv(out.stdout), "csv"


def attribute(records: list[KernelRecord], launched: dict[str, int]) -> dict[str, dict | str]:
    """Counters per tag from the kernel records: `launched` maps each tag to the kernels its
    point launched. -> tag: combined metrics, or tag: the reason it cannot be attributed."""
    by_tag: dict[str, list[KernelRecord]] = {}
    for rec in records:
        if rec.tag is not None:
            by_tag.setdefault(rec.tag, []).append(rec)
    untagged = sum(1 for rec in records if rec.tag is None)
    out: dict[str, dict | str] = {}
    for tag, expected in launched.items():
        got = by_tag.get(tag, [])
        if len(got) != expected:
            out[tag] = (f"ncu reported {len(got)} kernels under NVTX range {tag}, the point "
                        f"launched {expected}" + (f" ({untagged} kernels carried no tag)"
                                                  if untagged else ""))
            continue
        foreign = [r.kernel_name for r in got
                   if not r.kernel_name.startswith(KERNEL_NAMES) and not _TAG.search(r.kernel_name)]
        if foreign:
            out[tag] = f"unexpected kernel under {tag}: {foreign[0][:60]}"
            continue
        out[tag] = combine_kernel_metrics([r.metrics for r in got])
    return out


def combine_kernel_metrics(rows: list[dict]) -> dict:
    """One point's counters from its kernels (the tiled schedule launches two): counts add,
    rates are averaged weighted by duration."""
    if len(rows) == 1:
        return dict(rows[0])
    out = {}
    weights = [r.get("ncu_duration_ns") or 0.0 for r in rows]
    for column in METRICS.values():
        values = [r.get(column) for r in rows]
        if any(v is None for v in values):
            out[column] = None
        elif column in RATE_COLUMNS and sum(weights) > 0:
            out[column] = sum(v * w for v, w in zip(values, weights)) / sum(weights)
        else:
            out[column] = sum(values)
    return out


def check_ncu_output(text: str) -> None:
    if "ERR_NVGPUCTRPERM" in text:
        raise ProfilerError("ncu may not read GPU performance counters on this machine "
                            "(ERR_NVGPUCTRPERM): run as root or allow profiling for all users "
                            "(NVreg_RestrictProfilingToAdminUsers=0)")
    if "LibraryNotLoaded" in text or "Failed to initialize the profiler" in text:
        raise ProfilerError("ncu could not initialise the profiler on this machine "
                            "(counters unavailable, e.g. inside gVisor)")


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies, so a worker (or ncu) never outlives a
    runner that was itself killed, holding the GPU. Used as a `preexec_fn` and by the worker."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def read_results(stdout: str) -> list[dict]:
    """The worker's marked JSON lines; a malformed one becomes an error entry, never a crash."""
    out = []
    for line in stdout.splitlines():
        if not line.startswith(RESULT_MARK):
            continue
        try:
            msg = json.loads(line[len(RESULT_MARK):])
            if isinstance(msg, dict):
                out.append(msg)
        except ValueError:
            continue
    return out


@dataclass
class ProfileBatch:
    """What one ncu process produced: counters or a reason per task index, and the report."""

    counters: dict[int, dict] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    error: str | None = None  # why the batch stopped early (the tasks after it are not run)
    report: dict | None = None  # {"file", "sha256", "read_with", "tags"}


def profile_tasks(tasks: list[dict], *, timeout_s: float, keep_dir: str | None = None,
                  ncu: str | None = None, worker_cmd: list[str] | None = None,
                  first_index: int = 0, metric_set: str = "full") -> ProfileBatch:
    """Profile `tasks` (point records) in one ncu process; task i runs under tag
    `wf:<first_index + i>`. The report is kept in `keep_dir` when given."""
    ncu = ncu or find_ncu()
    if ncu is None:
        raise ProfilerError("Nsight Compute (ncu) not found on PATH or in /usr/local/cuda/bin")
    worker_cmd = worker_cmd or [sys.executable, "-m", "wavefront.measure.worker"]
    batch = ProfileBatch()
    tagged = [{**t, "tag": tag_for(first_index + i)} for i, t in enumerate(tasks)]
    with tempfile.TemporaryDirectory() as tmp:
        points_file = Path(tmp) / "points.json"
        points_file.write_text(json.dumps(tagged))
        report = str(Path(keep_dir or tmp) / (f"counters-{socket.gethostname()}-{os.getpid()}-"
                                              f"{first_index}.ncu-rep"))
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        cmd = ncu_command(ncu, report, [*worker_cmd, "--mode", "counters", "--points",
                                        str(points_file)], metric_set)
        limit = timeout_s * len(tasks) + 60
        # Own process group: on a timeout or Ctrl-C, ncu *and* the program it profiles die.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, preexec_fn=die_with_parent,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            stdout, _ = proc.communicate(timeout=limit)
            if proc.returncode != 0:
                batch.error = f"ncu exited {proc.returncode}: {stdout.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            stdout, _ = proc.communicate()
            batch.error = f"timed out after {limit:.0f} s"
        except BaseException:
            kill_group(proc)
            raise
        check_ncu_output(stdout or "")
        launched, by_tag = {}, {t["tag"]: i for i, t in enumerate(tagged)}
        for msg in read_results(stdout or ""):
            index = by_tag.get(msg.get("tag"))
            if index is None:
                continue
            if msg.get("launched"):
                launched[msg["tag"]] = int(msg.get("kernels", 1))
            elif msg.get("error"):
                batch.failures[index] = msg["error"]
        if launched:
            if not os.path.exists(report):
                for tag in launched:
                    batch.failures[by_tag[tag]] = "ncu wrote no report"
            else:
                records, how = read_report(report, ncu)
                for tag, result in attribute(records, launched).items():
                    if isinstance(result, str):
                        batch.failures[by_tag[tag]] = result
                    else:
                        batch.counters[by_tag[tag]] = result
                if keep_dir:
                    batch.report = {"file": os.path.basename(report), "sha256": _sha256(report),
                                    "read_with": how, "metric_set": metric_set,
                                    "tags": {t["tag"]: [t["point"], t.get("repeat", 0)]
                                             for t in tagged if t["tag"] in launched}}
    return batch


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# `wavefront profile` in a process of its own (what the experiments' counter steps run)
# ---------------------------------------------------------------------------------------------

def profile_command(points, *, repeats: int, out_dir, record_order: bool | str = False,
                    free_shapes: bool = False) -> list[str]:
    """The `wavefront profile` command line that profiles `points` (Points forming one grid of
    lengths x schedules, every other field shared and passed as an option here), `repeats`
    launches each, into `out_dir`; `record_order`: the ticket-taking binary (True, or its
    counters by name: `point.ORDER_COUNTERS`); `free_shapes`: the binary compiled
    without the JIT's size-1 shape constants."""
    from wavefront.point import Point
    points = list(points)
    if not points:
        raise ValueError("points: expected at least one Point")
    first = points[0]
    seqlens = sorted({p.seqlen for p in points})
    schedules = list(dict.fromkeys(p.schedule for p in points))
    grid = {(s, c) for s in seqlens for c in schedules}
    if ({(p.seqlen, p.schedule) for p in points} != grid or len(points) != len(grid)
            or any(p.replace(seqlen=first.seqlen, schedule=first.schedule) != first
                   for p in points)):
        raise ValueError("points: expected one grid of sequence lengths x schedules, every "
                         "other field the same")
    passed = dict(batch=first.batch, heads=first.heads, head_dim=first.head_dim,
                  tiles=first.tiles, occupancy=first.occupancy, causal=first.causal)
    if Point(seqlen=first.seqlen, schedule=first.schedule, **passed) != first:
        raise ValueError("points: only batch, heads, seqlen, head_dim, tiles, occupancy, "
                         "schedule and causal are passed to `wavefront profile`; "
                         f"{first} sets another field")
    return [sys.executable, "-m", "wavefront.cli", "profile", "--batch", str(first.batch),
            "--heads", str(first.heads), "--seqlen", ",".join(map(str, seqlens)),
            "--head-dim", str(first.head_dim), "--tile", str(first.tiles),
            "--occupancy", str(first.occupancy), "--schedule", ",".join(schedules),
            "--repeats", str(repeats), "--out", str(out_dir),
            "--causal" if first.causal else "--no-causal",
            *([f"--record-order={'shared' if record_order is True else record_order}"]
              if record_order else []), *(["--free-shapes"] if free_shapes else [])]


def profile_in_process(points, *, repeats: int, record_order: bool | str = False,
                       free_shapes: bool = False) -> list[dict]:
    """`profile_command` run in a process of its own (a crash under Nsight Compute does not take
    the caller with it) -> its results rows; ProfilerError with the output's tail if it
    failed."""
    import pandas as pd
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(profile_command(points, repeats=repeats, out_dir=tmp,
                                             record_order=record_order,
                                             free_shapes=free_shapes),
                             capture_output=True, text=True)
        results = Path(tmp) / "results.csv"
        if run.returncode or not results.exists():
            raise ProfilerError((run.stderr or run.stdout)[-300:])
        return pd.read_csv(results).to_dict("records")


# What an experiment keeps of each profiled launch (`profile_records`)
RECORDED_COUNTERS = ("status", "dram_read_bytes", "compulsory_read_bytes", "ncu_duration_ns")


def profile_records(write, points, base: dict, *, repeats: int, row_fields=None,
                    record_order: bool | str = False, free_shapes: bool = False) -> int:
    """`profile_in_process`, each results row written (`write`) as one record: `base`, what
    `row_fields(row)` adds (if given) and the row's RECORDED_COUNTERS. A profile that failed is
    one record, `base` with its error, and the caller goes on. -> failures (0 or 1)."""
    try:
        rows = profile_in_process(points, repeats=repeats, record_order=record_order,
                                  free_shapes=free_shapes)
    except ProfilerError as exc:
        write({**base, "error": str(exc)})
        return 1
    for row in rows:
        write({**base, **(row_fields(row) if row_fields else {}),
               **{name: row.get(name) for name in RECORDED_COUNTERS}})
    return 0
