"""Measure a list of tasks (point records) in one process; one marked JSON line per task.

Started by the sweep runner (timing) or under ncu (counters). Each task is independent (its own
inputs, its own result), so tasks can be handed to any process, GPU or host. Result lines start
with `RESULT_MARK`; anything else a library prints on stdout is ignored by the runner.
"""
from __future__ import annotations

import json
import sys
import traceback
from dataclasses import asdict

import click

from wavefront.measure.profiling import RESULT_MARK, die_with_parent
from wavefront.point import Point


def _emit(msg: dict) -> None:
    sys.stdout.write(RESULT_MARK + json.dumps(msg) + "\n")
    sys.stdout.flush()


def _time_task(task: dict, peers: bool, reps: int) -> dict:
    from wavefront.measure.bench import measure, measure_peers
    from wavefront.measure.conditions import ConditionsSampler
    point = Point.from_record(task)
    with ConditionsSampler() as sampler:
        timing = measure(point, reps=reps, record_order=task.get("record_order") or False)
        peer = measure_peers(point, reps=reps) if peers else {}
    result = asdict(timing)
    for name, res in peer.items():
        result[f"{name}_ms"] = res.get("median_ms")
    result.update(asdict(sampler.conditions()))
    return result


def _launch_for_counters(task: dict) -> int:
    """Compile and warm up unprofiled, then launch once between profiler start/stop inside the
    task's NVTX range. -> kernels launched."""
    import cupy
    from cupy.cuda import nvtx

    from wavefront.kernel.launcher import launcher_for
    from wavefront.kernel.streams import current_stream
    from wavefront.measure.bench import random_inputs
    point = Point.from_record(task)
    q, k, v = random_inputs(point, seed=7 + int(task.get("repeat", 0)))
    out = cupy.empty_like(q)
    record_order = task.get("record_order") or False
    launcher, _ = launcher_for(q, k, v, record_order=record_order, **point.attention_kwargs())
    stream = current_stream("cupy")
    launch = launcher
    if task.get("free_shapes"):
        if launcher.tiled or launcher.launch.varlen:
            raise ValueError("free_shapes: a tiled or packed launch runs more than the one "
                             "prepared kernel; expected a schedule that is neither")
        # the binary without the JIT's size-1 shape constants, launched as it was compiled
        prepared = launcher.prepared_for(q, k, v, out, free_shapes=True)
        addresses = launcher.addresses(q, k, v, out)

        def launch(q, k, v, out, stream):
            if not prepared.launch(stream if type(stream) is int else stream.ptr, addresses):
                raise RuntimeError("free_shapes: the prepared launch refused its addresses")
    launch(q, k, v, out, stream)  # compiles; not profiled
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStart()
    nvtx.RangePush(task["tag"])
    launch(q, k, v, out, stream)
    cupy.cuda.Device().synchronize()
    nvtx.RangePop()
    cupy.cuda.runtime.profilerStop()
    if record_order:
        # The order of the very launch whose counters ncu reports (the last replay pass's
        # tickets: the "dram" metric set needs one pass). Per-CTA counters order no launch.
        from wavefront.measure.bench import check_tickets
        from wavefront.results.orders import save_order
        start, end = launcher.tickets()
        check_tickets(start, end, per_cta=launcher.order_counters == "per_cta")
        if launcher.order_counters == "shared":
            save_order(task["order_dir"], task["point"], int(task.get("repeat", 0)), start,
                       end)
    return 2 if launcher.tiled else 1  # the tiled schedule adds the combine kernel


@click.command()
@click.option("--mode", type=click.Choice(["timing", "counters"]), required=True)
@click.option("--points", "points_file", type=click.Path(exists=True, dir_okay=False),
              required=True)
@click.option("--peers/--no-peers", default=False)
@click.option("--reps", type=click.IntRange(min=1), default=30)
def main(mode, points_file, peers, reps):
    die_with_parent()
    with open(points_file) as f:
        tasks = json.load(f)
    for task in tasks:
        ident = {"key": task["point"], "repeat": task.get("repeat", 0), "tag": task.get("tag")}
        try:
            if mode == "timing":
                _emit({**ident, "result": _time_task(task, peers, reps)})
            else:
                _emit({**ident, "launched": True, "kernels": _launch_for_counters(task)})
        except Exception as exc:
            _emit({**ident, "error": f"{type(exc).__name__}: {exc}",
                   "trace": traceback.format_exc()[-2000:]})
            if mode == "counters":
                # A failed launch may leave the context broken; stop so the parent can
                # restart the remaining tasks in a fresh process.
                return


if __name__ == "__main__":
    main()
