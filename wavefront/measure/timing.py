"""Timing with CUDA events: warm-up, many repetitions, median and spread, rotating inputs."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable


@dataclass(frozen=True)
class EventTimes:
    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    reps: int

    def as_dict(self) -> dict:
        return asdict(self)

    def tflops(self, flops: float) -> float:
        return flops / (self.median_ms * 1e-3) / 1e12


def _quantile(xs, q):
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def time_gpu(fn: Callable[[int], object], *, warmup: int = 5, reps: int = 30,
             stream=None) -> EventTimes:
    """Time `fn(i)` (i = repetition index, for rotating input sets) with CUDA events.

    Each repetition gets its own event pair so one slow launch shows in the spread instead of
    hiding in a mean. The first `warmup` calls (compilation, module load) are not timed.
    """
    import cupy
    if warmup < 0 or reps < 1:
        raise ValueError(f"warmup must be >= 0 and reps >= 1, got {warmup}, {reps}")
    stream = stream or cupy.cuda.get_current_stream()
    for i in range(warmup):
        fn(i)
    stream.synchronize()
    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]
    for i, (start, stop) in enumerate(events):
        start.record(stream)
        fn(warmup + i)
        stop.record(stream)
    stream.synchronize()
    ms = [cupy.cuda.get_elapsed_time(a, b) for a, b in events]
    return EventTimes(statistics.median(ms), _quantile(ms, 0.1), _quantile(ms, 0.9), min(ms), reps)


def input_sets_needed(bytes_per_set: int, l2_bytes: int) -> int:
    """Rotate among enough input sets that one set's data is out of L2 when it comes back."""
    if bytes_per_set >= 4 * l2_bytes:
        return 1
    return min(8, max(2, -(-4 * l2_bytes // bytes_per_set)))
