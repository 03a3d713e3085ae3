"""Per-work-item start and end times, in nanoseconds, from the kernel's RECORD_ORDER tickets.

cuTile offers no clock, but the RECORD_ORDER binary already takes a ticket from a global
counter (`Order[0]`, a relaxed atomic add) as each work item starts and ends. A one-thread
kernel on its own stream keeps overwriting that counter with the GPU's `%globaltimer` (less
the time it started), so each ticket the attention takes reads the time, plus the few tickets
taken since the timer's last write. No attention instruction changes: the same binary that
records the order records the clock.

What it costs: the timer is one thread that reads the timer and stores only when the value
changed, sleeping between reads; it takes a CTA slot on one SM (`measure` checks that every
attention CTA started in the launch's first wave and times the plain launch beside it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

# The timer sleeps this long between reads: its SM's attention warps keep the issue slots
SLEEP_NS = 200
# The host waits at most this long for the timer's first write before giving up
START_TIMEOUT_S = 2.0

_TIMER_SOURCE = r"""
extern "C" __global__ void broadcast_clock(int* word, const int* stop, int* started,
                                           unsigned long long base,
                                           unsigned long long deadline,
                                           unsigned long long* stats) {
    unsigned long long now = 0, last = 0, writes = 0, finest = ~0ull;
    while (true) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now != last) {
            if (last != 0 && now - last < finest) finest = now - last;
            atomicExch(word, (int)(now - base));
            if (writes == 0) atomicExch(started, 1);
            last = now;
            ++writes;
        }
        if (*(volatile const int*)stop != 0 || now >= deadline) break;
        asm volatile("nanosleep.u32 %0;" :: "r"(SLEEP_NS));
    }
    stats[0] = writes;
    stats[1] = finest;
    stats[2] = now - base;
}
"""


@dataclass(frozen=True)
class ItemClocks:
    """One launch's items: `start_ns`, `end_ns` (int64, from the launch's first event),
    `timer_writes` (the timer's stores over the launch), `timer_step_ns` (the finest step of
    `%globaltimer` the timer saw: the clock's resolution), `launch_ms` (CUDA events around the
    attention launch alone)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    timer_writes: int
    timer_step_ns: int
    launch_ms: float

    def first_wave_started(self, ctas: int) -> bool:
        """Whether `ctas` items started before the first item ended (every CTA of a
        persistent launch was resident at once: the timer took no attention CTA's place)."""
        first_end = self.end_ns.min()
        return int((self.start_ns < first_end).sum()) >= min(ctas, len(self.start_ns))


class ItemClock:
    """The timer kernel and its buffers, made once per process (needs CuPy and a GPU)."""

    def __init__(self):
        import cupy
        self.cupy = cupy
        source = _TIMER_SOURCE.replace("SLEEP_NS", str(SLEEP_NS))
        self.kernel = cupy.RawKernel(source, "broadcast_clock")
        self.flags = cupy.zeros(2, dtype=cupy.int32)  # stop, started
        self.stats = cupy.zeros(3, dtype=cupy.uint64)
        self.timer_stream = cupy.cuda.Stream(non_blocking=True)
        self.poll_stream = cupy.cuda.Stream(non_blocking=True)

    def record(self, launcher, q, k, v, out, stream, *, deadline_s: float = 10.0) -> ItemClocks:
        """Launch `launcher` (made with record_order=True) once on `stream` (a non-blocking
        CuPy stream) while the timer runs; -> its items' clocks."""
        from wavefront.measure.corunners import gpu_now_ns
        cupy = self.cupy
        if not launcher.record_order:
            raise ValueError("launcher: expected one made with record_order=True")
        own = launcher.on_stream(stream.ptr)
        cupy.cuda.Device().synchronize()
        self.flags.fill(0)
        self.stats.fill(0)
        cupy.cuda.Device().synchronize()
        base = gpu_now_ns()
        word = own.order  # Order[0]: the ticket counter the attention adds to
        self.kernel((1,), (1,), (word, self.flags[0:1], self.flags[1:2], cupy.uint64(base),
                                 cupy.uint64(base + int(deadline_s * 1e9)), self.stats),
                    stream=self.timer_stream)
        began = time.perf_counter()
        while True:  # the attention starts only once the clock runs
            with self.poll_stream:
                started = int(self.flags[1:2].get(stream=self.poll_stream)[0])
            if started:
                break
            if time.perf_counter() - began > START_TIMEOUT_S:
                self._stop(stream)
                raise RuntimeError(f"the timer kernel did not start within {START_TIMEOUT_S} s")
            time.sleep(1e-4)
        t0, t1 = cupy.cuda.Event(), cupy.cuda.Event()
        t0.record(stream)
        own(q, k, v, out, stream.ptr)
        t1.record(stream)
        self._stop(stream)
        writes, finest, ran_ns = (int(x) for x in self.stats.get())
        if ran_ns >= int(deadline_s * 1e9):
            raise RuntimeError(f"the timer reached its {deadline_s} s deadline before the "
                               "attention finished: its clocks are not times")
        order = np.asarray(own.order[1:].get(), dtype=np.int64)
        start, end = order[0::2], order[1::2]
        first = start.min()
        return ItemClocks(start - first, end - first, writes, finest,
                          float(cupy.cuda.get_elapsed_time(t0, t1)))

    def _stop(self, stream) -> None:
        # after the attention on its own stream: the timer stops when the launch has ended
        self.cupy.cuda.runtime.memsetAsync(self.flags.data.ptr, 1, 1, stream.ptr)
        self.timer_stream.synchronize()
        stream.synchronize()


def per_cta(clocks: ItemClocks, slot_of_item: np.ndarray, steps: np.ndarray) -> dict:
    """Per CTA slot (static persistent: CTA c runs items c, c + P, ...): its K/V steps, its
    busy time (sum of its items' durations) and its ns per step."""
    n = int(slot_of_item.max()) + 1
    busy = np.bincount(slot_of_item, weights=clocks.end_ns - clocks.start_ns, minlength=n)
    work = np.bincount(slot_of_item, weights=steps, minlength=n)
    return {"steps": work, "busy_ns": busy, "ns_per_step": busy / np.maximum(work, 1)}
