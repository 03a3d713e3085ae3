"""Per-work-item start and end times, in nanoseconds, from the kernel's RECORD_ORDER tickets.

cuTile offers no clock, but the RECORD_ORDER binary already takes a ticket from a counter
(a relaxed atomic add) as each work item starts and ends: `Order[0]`, shared by the launch, or
one word per CTA (a launcher made with `record_order="per_cta"`). While the launch runs, the
host keeps overwriting the counters with its own clock (nanoseconds since the launch was
queued) through the copy engine: one copy from pinned memory, the next one issued when the
last has landed. So each ticket the attention takes reads the time, plus the few tickets
taken since the last copy. No attention instruction changes and no SM is taken: the same
binary that records the order records the clock.

A GPU-side timer (a one-thread kernel writing `%globaltimer` into the counter) was tried first
and dropped: beside the S256k launch of 264 persistent CTAs (two per SM) the launch took 1.6x
as long (H200, 112 against 70 ms); why was not established.

The attention waits behind a gate (a one-thread kernel on its stream that spins until the
clock's first copy lands), so the clock runs from before its first CTA starts, however long
the host takes to queue it. The copies' resolution is the host's round trip, a few
microseconds: each `ItemClocks` carries its copies and their mean interval.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np

_H2D = 1  # cudaMemcpyHostToDevice
# The most ticket counters the clock copies into (one per CTA of a per-CTA launcher)
MAX_COUNTERS = 4096
# The gate gives up after this long on the GPU's clock (the host died or never copied)
GATE_TIMEOUT_NS = 5_000_000_000

_GATE_SOURCE = r"""
extern "C" __global__ void clock_gate(const int* gate, unsigned long long timeout_ns) {
    unsigned long long began, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(began));
    do {
        asm volatile("nanosleep.u32 1000;");
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (*(volatile const int*)gate == 0 && now - began < timeout_ns);
}
"""


@dataclass(frozen=True)
class ItemClocks:
    """One launch's items: `start_ns`, `end_ns` (int64, from the launch's first event),
    `copies` (the host's clock writes over the launch), `step_ns` (their mean interval: the
    clock's resolution), `launch_ms` (CUDA events around the attention launch alone)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    copies: int
    step_ns: float
    launch_ms: float

    def first_wave(self) -> int:
        """How many items started before the first item ended (a persistent launch's CTAs
        resident at once)."""
        return int((self.start_ns < self.end_ns.min()).sum())

    def first_wave_started(self, ctas: int) -> bool:
        """Whether every one of `ctas` persistent CTAs started in the first wave."""
        return self.first_wave() >= min(ctas, len(self.start_ns))

    def ns_per_step(self, slot_of_item: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Per CTA slot (`slot_of_item`: the slot that ran each item): its busy time (its items'
        durations) over its K/V steps (`steps`, per item)."""
        n = int(slot_of_item.max()) + 1
        busy = np.bincount(slot_of_item, weights=self.end_ns - self.start_ns, minlength=n)
        work = np.bincount(slot_of_item, weights=steps, minlength=n)
        return busy / np.maximum(work, 1)


class ItemClock:
    """The host clock's pinned word and copy stream, made once per process (needs CuPy and a
    GPU)."""

    def __init__(self):
        import cupy
        self.cupy = cupy
        self.pinned = cupy.cuda.alloc_pinned_memory(4 * MAX_COUNTERS)
        self.value = np.frombuffer(self.pinned, np.int32, MAX_COUNTERS)
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)
        self.gate_kernel = cupy.RawKernel(_GATE_SOURCE, "clock_gate")
        self.gate = cupy.zeros(1, dtype=cupy.int32)
        self._loaded = weakref.WeakSet()  # launchers already launched once

    def _write(self, word_ptr: int, value: int, words: int = 1) -> None:
        """`value` into `words` device words from `word_ptr`, in one copy."""
        self.value[:words] = value
        self.cupy.cuda.runtime.memcpyAsync(word_ptr, self.pinned.ptr, 4 * words, _H2D,
                                           self.copy_stream.ptr)
        self.copy_stream.synchronize()

    def record(self, launcher, q, k, v, out, stream) -> ItemClocks:
        """Launch `launcher` (made with record_order=True) once on `stream` (a non-blocking
        CuPy stream); -> its items' clocks. A launcher's first record launches it once without
        the clock first: that loads its binary, and a module load waits for the device."""
        cupy = self.cupy
        if not launcher.record_order:
            raise ValueError("launcher: expected one made with record_order=True")
        own = launcher.on_stream(stream.ptr)
        if own not in self._loaded:
            own(q, k, v, out, stream.ptr)
            stream.synchronize()
            self._loaded.add(own)
        counters = own.counter_words()  # the ticket counters the attention adds to
        word, words = counters.data.ptr, counters.size
        if words > MAX_COUNTERS:
            raise ValueError(f"launcher: {words} ticket counters, more than the clock's "
                             f"{MAX_COUNTERS}")
        self.gate.fill(0)
        cupy.cuda.Device().synchronize()
        self.gate_kernel((1,), (1,), (self.gate, cupy.uint64(GATE_TIMEOUT_NS)), stream=stream)
        t0, t1 = cupy.cuda.Event(), cupy.cuda.Event()
        t0.record(stream)
        own(q, k, v, out, stream.ptr)
        t1.record(stream)
        base = time.perf_counter_ns()
        self._write(word, 1, words)
        self._write(self.gate.data.ptr, 1)  # the attention may start
        copies, first = 0, time.perf_counter_ns()
        while not t1.done:
            self._write(word, time.perf_counter_ns() - base, words)
            copies += 1
        last = time.perf_counter_ns()
        stream.synchronize()
        order = np.asarray(own.ticket_words().get(), dtype=np.int64)
        start, end = order[0::2], order[1::2]
        begin = start.min()
        ms = float(cupy.cuda.get_elapsed_time(t0, t1))
        # The items span about as long as the copies ran, if the copies reached the counter
        # (on the H200 a launch of 16 CTAs once saw them stop after about 0.1 ms of 25: its
        # later tickets were counts)
        if end.max() - begin < 0.5 * (last - first):
            raise RuntimeError(f"the clock did not follow the launch: its items span "
                               f"{(end.max() - begin) * 1e-6:.3f} ms of the "
                               f"{(last - first) * 1e-6:.3f} ms the host copied its clock")
        return ItemClocks(start - begin, end - begin, copies,
                          (last - first) / max(copies, 1), ms)

