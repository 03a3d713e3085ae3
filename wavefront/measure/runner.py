"""Measure sweep tasks in worker processes: timing directly, counters under ncu.

Every task ends as a result or a failure, never silently: a worker that has not answered a
task within `timeout_s` of wall-clock time is killed (whatever it prints meanwhile) and the task
is recorded failed; a worker that dies fails the task it was on; every ncu call either resolves
at least one task or fails the first one, so retries are bounded by the number of tasks.
"""
from __future__ import annotations

import json
import os
import socket
import queue
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

from wavefront.measure.conditions import gpu_uuid
from wavefront.measure.profiling import (
    RESULT_MARK,
    die_with_parent,
    kill_group,
    profile_tasks,
    read_results,
)
from wavefront.model.counting import launch_counts
from wavefront.point import GpuShape, Point
from wavefront.results.measurement import derive

OnResult = Callable[[dict, "dict | None", "str | None"], None]
OnArtifact = Callable[[dict], None]


def _chunks(items, size):
    for i in range(0, len(items), size):
        yield items[i:i + size]


class SubprocessRunner:
    """Runs tasks in `python -m wavefront.measure.worker` processes (or `worker_cmd`)."""

    def __init__(self, worker_cmd: list[str] | None = None, report_dir: str | None = None,
                 ncu: str | None = None, order_dir: str | None = None):
        self.worker_cmd = worker_cmd or [sys.executable, "-m", "wavefront.measure.worker"]
        self.report_dir = report_dir
        self.order_dir = order_dir  # where RECORD_ORDER counter runs save their tickets
        self.ncu = ncu
        self._next_tag = 0

    def run(self, tasks: list[dict], spec, on_result: OnResult,
            on_artifact: OnArtifact | None = None) -> None:
        # Tasks stay in the sweep's order (repeats interleaved with other points); consecutive
        # tasks of one kind share a worker process.
        i = 0
        while i < len(tasks):
            kind = tasks[i]["measurement"]
            j = i
            while j < len(tasks) and tasks[j]["measurement"] == kind and j - i < spec.batch_points:
                j += 1
            if kind == "timing":
                self._run_timing(tasks[i:j], spec, on_result)
            else:
                self._run_counters(tasks[i:j], spec, on_result, on_artifact)
            i = j

    def _run_timing(self, tasks, spec, on_result):
        pending = list(tasks)
        while pending:
            fd, points_path = tempfile.mkstemp(suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(pending, f)
            cmd = [*self.worker_cmd, "--mode", "timing", "--points", points_path,
                   "--reps", str(spec.reps), "--peers" if spec.peers else "--no-peers"]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True,
                                    preexec_fn=die_with_parent,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
            stderr_tail: list[str] = []
            threading.Thread(target=_tail, args=(proc.stderr, stderr_tail), daemon=True).start()
            try:
                deadline = time.monotonic() + spec.timeout_s
                while pending:
                    try:
                        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        kill_group(proc)
                        on_result(pending.pop(0), None,
                                  f"hung: no result within {spec.timeout_s:.0f} s (wall clock)")
                        break
                    if line is None:  # worker exited
                        proc.wait()
                        if pending:
                            tail = "".join(stderr_tail)[-300:].strip()
                            on_result(pending.pop(0), None,
                                      f"worker exited {proc.returncode}: {tail}")
                        break
                    for msg in read_results(line):
                        task = _match(pending, msg)
                        if task is None:
                            continue
                        pending.remove(task)
                        on_result(task, msg.get("result"), msg.get("error"))
                        deadline = time.monotonic() + spec.timeout_s
            finally:
                kill_group(proc)
                os.unlink(points_path)

    def _run_counters(self, tasks, spec, on_result, on_artifact):
        if any(t.get("record_order") for t in tasks) and not self.order_dir:
            raise ValueError("record_order counter runs need the runner's order_dir")
        pending = [{**t, "order_dir": self.order_dir} if t.get("record_order") else t
                   for t in tasks]
        while pending:
            first = self._next_tag
            self._next_tag += len(pending)
            batch = profile_tasks(pending, timeout_s=spec.timeout_s, keep_dir=self.report_dir,
                                  ncu=self.ncu, worker_cmd=self.worker_cmd, first_index=first,
                                  metric_set=spec.metric_set)
            where = {"host": socket.gethostname(), "gpu_uuid": gpu_uuid()}
            if batch.report and on_artifact:
                on_artifact(batch.report)
            resolved = set()
            for index, counters in batch.counters.items():
                task = pending[index]
                point = Point.from_record(task)
                launch = point.launch(GpuShape.of(task))
                counts = launch_counts(launch.problem, launch.n_chunks, launch.partial_row_bytes)
                on_result(task, {**counters, **where,
                                 **derive(counters, counts.read_sectors,
                                          counts.compulsory_read_bytes)}, None)
                resolved.add(index)
            for index, reason in batch.failures.items():
                if index not in resolved:
                    on_result(pending[index], None, reason)
                    resolved.add(index)
            rest = [t for i, t in enumerate(pending) if i not in resolved]
            if rest and (batch.error or not resolved):
                # The batch stopped at the first unresolved task: fail it, go on with the rest.
                on_result(rest.pop(0), None, batch.error or "ncu produced no result for it")
            pending = rest


def _match(pending: list[dict], msg: dict) -> dict | None:
    for task in pending:
        if task["point"] == msg.get("key") and task.get("repeat", 0) == msg.get("repeat", 0):
            return task
    return None


def _pump(stream, lines: queue.Queue):
    for line in stream:
        if line.startswith(RESULT_MARK):
            lines.put(line)
    lines.put(None)


def _tail(stream, keep: list[str]):
    for line in stream:
        keep.append(line)
        del keep[:-20]
