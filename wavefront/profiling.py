"""Nsight Compute collection: run points under `ncu` in a subprocess, parse its CSV, derive.

Only the measured launch of each point is profiled: the worker compiles and warms up with the
profiler off and brackets the one measured launch with cudaProfilerStart/Stop
(`--profile-from-start off`), and the kernel-name filter keeps other kernels out. Kernel replay
with `--cache-control all` flushes the caches before every replay pass, so each pass sees one
launch from a cold L2, cross-CTA reuse included. Clocks are left alone (`--clock-control none`):
durations under ncu are not timings anyway; time with `wavefront run`.
"""
from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from wavefront.device import find_ncu

METRICS = {
    "lts__t_sectors_srcunit_tex_op_read.sum": "l2_tex_read_sectors",
    "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum": "l2_tex_read_hit_sectors",
    "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum": "l2_tex_read_miss_sectors",
    "lts__t_sectors_srcunit_tex_op_write.sum": "l2_tex_write_sectors",
    "lts__t_sectors_srcunit_ltcfabric_op_read.sum": "l2_fabric_read_sectors",
    "lts__t_sectors_srcunit_ltcfabric_op_read_lookup_hit.sum": "l2_fabric_read_hit_sectors",
    "lts__t_sectors_srcunit_ltcfabric_op_read_lookup_miss.sum": "l2_fabric_read_miss_sectors",
    "l1tex__t_sector_hit_rate.pct": "l1_hit_rate_pct",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "l1_global_load_sectors",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_hit.sum": "l1_global_load_hit_sectors",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "gpu__time_duration.sum": "ncu_duration_ns",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active": "tensor_active_pct",
}
KERNEL_FILTER = "regex:flash_attention_fwd|combine_partials"
# Metrics that are rates, not counts: combined over a point's kernels weighted by duration.
_RATE_COLUMNS = {"l1_hit_rate_pct", "sm_throughput_pct", "tensor_active_pct"}
# Units ncu may choose per row; everything is normalised to bytes and nanoseconds.
_UNIT_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6,
               "GB": 1e9, "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
               "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}


class ProfilerError(RuntimeError):
    pass


def ncu_command(ncu: str, log_file: str, program: list[str]) -> list[str]:
    return [ncu, "--target-processes", "all", "--profile-from-start", "off",
            "--replay-mode", "kernel", "--cache-control", "all", "--clock-control", "none",
            "--kernel-name", KERNEL_FILTER, "--metrics", ",".join(METRICS),
            "--csv", "--page", "raw", "--log-file", log_file, *program]


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of ncu `--csv --page raw` output -> one dict per profiled kernel (our column names).

    The second CSV row holds units; numbers carry thousands separators; lines ncu prints
    before the CSV (==PROF== notes) are skipped.
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
        row = {"kernel_name": record.get("Kernel Name", "")}
        for metric, column in METRICS.items():
            if metric not in record:
                continue
            value = _number(record[metric])
            if value is not None:
                value *= _UNIT_SCALE.get(units.get(metric, "").strip(), 1)
            row[column] = value
        out.append(row)
    return out


def derive(row: dict, closed_form_read_sectors: float | None,
           compulsory_read_bytes: float | None) -> dict:
    """Hit rate seen by the SMs and reads that left L2, from raw sectors (BRIEF section 3).

    A read that misses in the SM's own partition is either homed there (it goes to DRAM) or
    looked up again at its home partition over the fabric (a fabric hit stays on chip). So the
    reads that left L2 are `tex read misses - fabric read hits`. BRIEF section 3 writes this as
    `lookups - hits - fabric hits`; that is the same in exact arithmetic, but lookups and hits
    come from different replay passes whose difference (measured: 0.3% of 2e9 sectors) is larger
    than the misses themselves, so subtracting them is noise. `lts__t_sector_hit_rate`
    double-counts the second lookup and is not used.
    """
    tex = row.get("l2_tex_read_sectors")
    miss = row.get("l2_tex_read_miss_sectors")
    fabric_hit = row.get("l2_fabric_read_hit_sectors")
    out = {}
    if tex and miss is not None and fabric_hit is not None:
        out["l2_read_miss_sectors"] = max(0.0, miss - fabric_hit)
        out["sm_hit_rate"] = 1.0 - out["l2_read_miss_sectors"] / tex
    if row.get("dram_read_bytes") is not None:
        out["dram_read_sectors"] = row["dram_read_bytes"] / 32
    if closed_form_read_sectors:
        out["closed_form_read_sectors"] = closed_form_read_sectors
        if tex:
            out["read_sectors_ratio"] = tex / closed_form_read_sectors
    if compulsory_read_bytes:
        out["compulsory_read_bytes"] = compulsory_read_bytes
    return out


def check_ncu_output(log_text: str, stderr: str) -> None:
    blob = log_text + "\n" + stderr
    if "ERR_NVGPUCTRPERM" in blob:
        raise ProfilerError("ncu may not read GPU performance counters on this machine "
                            "(ERR_NVGPUCTRPERM): run as root or allow profiling for all users "
                            "(NVreg_RestrictProfilingToAdminUsers=0)")
    if "LibraryNotLoaded" in blob or "Failed to initialize the profiler" in blob:
        raise ProfilerError("ncu could not initialise the profiler on this machine "
                            "(counters unavailable, e.g. inside gVisor)")


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def profile_points(points: list[dict], *, timeout_s: float, workdir: str | None = None,
                   ncu: str | None = None) -> tuple[list[tuple[dict, dict]], str | None]:
    """Profile `points` (worker point dicts) in one ncu process.

    Returns ([(point, counters row)], error): the points whose launch ncu profiled, in order,
    and the error that stopped the batch early, if any.
    """
    ncu = ncu or find_ncu()
    if ncu is None:
        raise ProfilerError("Nsight Compute (ncu) not found on PATH or in /usr/local/cuda/bin")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        points_file = Path(tmp) / "points.json"
        points_file.write_text(json.dumps(points))
        log_file = str(Path(tmp) / "ncu.csv")
        cmd = ncu_command(ncu, log_file, [sys.executable, "-m", "wavefront.worker",
                                          "--mode", "counters", "--points", str(points_file)])
        error = None
        # Own process group: on a timeout or Ctrl-C, ncu *and* the program it profiles die,
        # so nothing keeps the GPU busy under the next measurement.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s * len(points) + 60)
            if proc.returncode != 0:
                error = f"ncu exited {proc.returncode}: {stderr.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            stdout, stderr = proc.communicate()
            error = f"timed out after {timeout_s * len(points) + 60:.0f} s"
        except BaseException:
            kill_group(proc)
            raise
        log_text = Path(log_file).read_text() if os.path.exists(log_file) else ""
        keep = os.environ.get("WAVEFRONT_KEEP_NCU_LOG")
        if keep and log_text:
            # Raw captures are kept as parser fixtures (tests/fixtures) when asked for.
            with open(keep, "a") as f:
                f.write(log_text)
        check_ncu_output(log_text, stderr)
    launched = []  # (key, kernels that point launched)
    for line in stdout.splitlines():
        if line.startswith("{"):
            msg = json.loads(line)
            if msg.get("launched"):
                launched.append((msg["key"], int(msg.get("kernels", 1))))
            elif msg.get("error") and error is None:
                error = msg["error"]
    rows = parse_ncu_csv(log_text)
    by_key = {p["key"]: p for p in points}
    results, cursor = [], 0
    for key, kernels in launched:
        if cursor + kernels > len(rows):
            if error is None:
                error = f"ncu reported {len(rows)} kernels; launches needed more"
            break
        results.append((by_key[key], combine_kernel_rows(rows[cursor:cursor + kernels])))
        cursor += kernels
    return results, error


def combine_kernel_rows(rows: list[dict]) -> dict:
    """One point's counters from its kernels (the tiled schedule launches two): counts add,
    rates are averaged weighted by duration."""
    if len(rows) == 1:
        return rows[0]
    out = {"kernel_name": "+".join(r.get("kernel_name", "")[:40] for r in rows)}
    weights = [r.get("ncu_duration_ns") or 0.0 for r in rows]
    for column in METRICS.values():
        values = [r.get(column) for r in rows]
        if any(v is None for v in values):
            out[column] = None
        elif column in _RATE_COLUMNS and sum(weights) > 0:
            out[column] = sum(v * w for v, w in zip(values, weights)) / sum(weights)
        else:
            out[column] = sum(values)
    return out
