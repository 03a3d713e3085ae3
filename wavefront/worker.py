"""Measure a list of points in one process; one JSON line per point on stdout.

Started by the sweep runner (timing) or under ncu by `wavefront.profiling` (counters). Each point
is independent (its own inputs, its own result), so points can be handed to any process, GPU
or host.
"""
from __future__ import annotations

import json
import sys
import traceback

import click


def _emit(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _time_point(point: dict, peers: bool, reps: int) -> dict:
    from wavefront.bench import Config, measure, measure_peers
    cfg = Config.from_record(point)
    m = measure(cfg, reps=reps)
    result = {"rel_error": m.rel_error, "median_ms": m.timing["median_ms"],
              "p10_ms": m.timing["p10_ms"], "p90_ms": m.timing["p90_ms"],
              "reps": m.timing["reps"], "tflops": m.tflops, "useful_flops": m.useful_flops,
              "executed_flops": m.executed_flops, "num_ctas": m.num_ctas,
              "group_units": m.group_units}
    if peers:
        for name, res in measure_peers(cfg, reps=reps).items():
            result[f"{name}_ms"] = res.get("median_ms")
    return result


def _launch_for_counters(point: dict) -> int:
    import cupy

    from wavefront.api import attention
    from wavefront.bench import Config, random_inputs
    from wavefront.schedules import KV_TILED
    cfg = Config.from_record(point)
    q, k, v = random_inputs(cfg, seed=7)
    out = cupy.empty_like(q)

    def launch():
        attention(q, k, v, out=out, **cfg.attention_kwargs())

    launch()  # compiles; not profiled
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStart()
    launch()
    cupy.cuda.Device().synchronize()
    cupy.cuda.runtime.profilerStop()
    tiled = cfg.launch(point["sms"], point["l2_bytes"]).kv.code == KV_TILED
    return 2 if tiled else 1  # kernels per launch: the tiled schedule adds the combine


@click.command()
@click.option("--mode", type=click.Choice(["timing", "counters"]), required=True)
@click.option("--points", "points_file", type=click.Path(exists=True, dir_okay=False),
              required=True)
@click.option("--peers/--no-peers", default=False)
@click.option("--reps", type=click.IntRange(min=1), default=30)
def main(mode, points_file, peers, reps):
    with open(points_file) as f:
        points = json.load(f)
    for point in points:
        try:
            if mode == "timing":
                _emit({"key": point["key"], "result": _time_point(point, peers, reps)})
            else:
                kernels = _launch_for_counters(point)
                _emit({"key": point["key"], "launched": True, "kernels": kernels})
        except Exception as exc:
            _emit({"key": point["key"], "error": f"{type(exc).__name__}: {exc}",
                   "trace": traceback.format_exc()[-2000:]})
            if mode == "counters":
                # A failed launch may leave the context broken; stop so the parent can
                # restart the remaining points in a fresh process.
                return


if __name__ == "__main__":
    main()
