"""What the bench's NVML bookkeeping costs a host-bound contender (GPU host).

`run_rounds` makes a `ConditionsSampler` every round. Until 2026-11-26 each one initialised
NVML, asked for the device's handle, maximum clock and UUID, and sampled from a thread every
10 ms while the contenders ran. Now NVML and those answers are kept for the process, and the
sampler takes one sample after the round. Here the public call at B1 H8 S1k D64 runs in
rounds of one burst of 5 calls (30 rounds, synchronised between them), ways alternating:

- "bare": nothing but the burst;
- "old round": the old sampler's work around each burst (NVML initialised and asked again,
  a sampling thread during the burst);
- "new round": the new sampler around each burst (one sample after it);

then `run_rounds` with the call as its only contender (so every burst follows a sample).

    python scripts/sampler_cost.py [--repeats 3]
"""
import argparse
import socket
import statistics
import time

import cupy

import wavefront
from wavefront.measure.conditions import ConditionsSampler, _visible_index
from wavefront.measure.rounds import run_rounds, shape_contenders
from wavefront.point import Point


def _as_before():
    """What each round's new sampler asked NVML before 2026-11-26, besides sampling."""
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(_visible_index(0))
    pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
    return handle


def rounds_of(run, how: str, n_rounds: int = 30, per_burst: int = 5) -> float:
    """Median host us per call over rounds of one burst of `per_burst` calls."""
    per_call, n = [], 0
    for _ in range(n_rounds):
        sampler = ConditionsSampler(period_s=0.01 if how == "old" else None)
        if how == "old":
            _as_before()
        with sampler:
            began = time.perf_counter()
            for _ in range(per_burst):
                run(n)
                n += 1
            per_call.append((time.perf_counter() - began) / per_burst * 1e6)
            cupy.cuda.Device().synchronize()
            if how == "new":
                sampler.sample()
        if how != "bare":
            sampler.conditions()
        if how == "old":
            import pynvml
            pynvml.nvmlDeviceGetUUID(_as_before())
            socket.gethostname()
    return statistics.median(per_call)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    point = Point(batch=1, heads=8, seqlen=1024, head_dim=64, causal=False,
                  schedule="persistent+linear")
    contenders = shape_contenders([point], peers=False, api_call=wavefront.attention)
    api = next(c for c in contenders if c.name == "api")
    got = {"bare": [], "old round": [], "new round": [], "run_rounds, the call alone": []}
    for _ in range(args.repeats):
        for how in ("bare", "old", "new"):
            got["bare" if how == "bare" else f"{how} round"].append(rounds_of(api.run, how))
        (result,) = run_rounds([api], rounds=30, per_round=5)
        got["run_rounds, the call alone"].append(result.host_us)
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"{gpu}: public call at B1 H8 S1k D64, host us per call in rounds of one burst of 5 "
          f"calls, median of 30 rounds; {args.repeats} passes, alternating")
    for label, runs in got.items():
        print(f"  {label:28} {statistics.median(runs):6.2f}  {[round(x, 2) for x in runs]}")


if __name__ == "__main__":
    main()
