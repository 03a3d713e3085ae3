"""Attention under DRAM-bandwidth starvation: a streaming kernel on the SMs the attention does
not use, running through the whole measurement, takes DRAM bandwidth away from it.

The paper's launch uses 48 of the GPU's SMs. A stream kernel, one CTA per remaining SM (its
shared memory keeps other CTAs off those SMs), reads a buffer far larger than the L2 with
streaming loads (`__ldcs`: evict-first, so it takes bandwidth, not the attention's L2 lines)
until a `%globaltimer` deadline. More stream CTAs leave less bandwidth. Each round times
the schedules back to back, in random order, beside the streamer; compared round by round.

The streamer counts its bytes (Nsight Compute's DRAM bytes over a short run:
data/starved_launch/NOTES.md); over longer runs its rate exceeds HBM3's peak (not understood):
recorded, not used.
"""
from __future__ import annotations

import time

STREAM_SOURCE = r"""
extern "C" __global__ void stream_reads(const int4* __restrict__ buf, long long n_vec,
                                        unsigned long long deadline_ns,
                                        unsigned long long* bytes_read, int* sink) {
    extern __shared__ int reserve[];  // only reserved: keeps other CTAs off this SM
    int acc = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long local = 0;
    while (true) {
        // 64 loads between clock checks: the check costs next to nothing
        #pragma unroll 4
        for (int k = 0; k < 64; ++k) {
            int4 v = __ldcs(buf + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
            i += stride;
            if (i >= n_vec) i -= n_vec;
        }
        local += 64 * sizeof(int4);
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now >= deadline_ns) break;
    }
    atomicAdd(bytes_read, local);
    if (acc == 0x13572468) sink[0] = acc + reserve[0];  // keeps the loads
}
"""

NOW_SOURCE = r"""
extern "C" __global__ void global_now(unsigned long long* out) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    out[0] = now;
}
"""

STREAM_BUFFER_BYTES = 4 << 30  # 80x the L2: every stream load misses it
STREAM_THREADS = 512
STREAM_SHARED_BYTES = 200 << 10  # leaves too little shared memory on its SM for any other CTA


class Streamer:
    """The bandwidth thief: `start(ctas, seconds)` on its own stream, `finish()` -> GB/s."""

    def __init__(self):
        import cupy
        self.cupy = cupy
        self.buf = cupy.random.default_rng(7).integers(0, 1 << 30, STREAM_BUFFER_BYTES // 4,
                                                       dtype=cupy.int32)
        self.kernel = cupy.RawKernel(STREAM_SOURCE, "stream_reads")
        self.kernel.max_dynamic_shared_size_bytes = STREAM_SHARED_BYTES
        self.now_kernel = cupy.RawKernel(NOW_SOURCE, "global_now")
        self.counter = cupy.zeros(1, dtype=cupy.uint64)
        self.sink = cupy.zeros(1, dtype=cupy.int32)
        self.now = cupy.zeros(1, dtype=cupy.uint64)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def gpu_now_ns(self) -> int:
        self.now_kernel((1,), (1,), (self.now,))
        return int(self.now.get()[0])

    def start(self, ctas: int, seconds: float) -> None:
        cupy = self.cupy
        self.counter.fill(0)
        cupy.cuda.Device().synchronize()
        deadline = self.gpu_now_ns() + int(seconds * 1e9)
        self.began, self.ended = cupy.cuda.Event(), cupy.cuda.Event()
        self.began.record(self.stream)
        self.kernel((ctas,), (STREAM_THREADS,),
                    (self.buf, cupy.int64(self.buf.size // 4), cupy.uint64(deadline),
                     self.counter, self.sink),
                    shared_mem=STREAM_SHARED_BYTES, stream=self.stream)
        self.ended.record(self.stream)

    def finish(self) -> float:
        """Waits for the streamer; -> its read bandwidth over its run, GB/s."""
        self.ended.synchronize()
        ms = self.cupy.cuda.get_elapsed_time(self.began, self.ended)
        return float(self.counter.get()[0]) / (ms * 1e-3) / 1e9


def starved_rounds(points: dict, stream_ctas: list[int], *, rounds: int = 8,
                   launches: int = 2, seed: int = 0, progress=None) -> list[dict]:
    """For each count of stream CTAs (0: none), `rounds` rounds; in each, the streamer runs
    while every point in `points` ({name: Point}) is launched `launches` times back to back,
    in a random order, on its own stream. -> one record per (stream CTAs, round, point): ms per
    launch (CUDA events), the stream's GB/s in that round, the SM clock (NVML) after it.

    Every point is checked against the reference first (IncorrectResult otherwise)."""
    import cupy
    import numpy as np

    from wavefront.device import current_device
    from wavefront.measure.conditions import ConditionsSampler
    from wavefront.measure.corunners import checked_launchers
    dev = current_device()
    runs = checked_launchers(points, seed)
    streamer = Streamer()
    attention_stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(seed)
    one = {}  # a first timing of each point alone: the streamer's deadline covers a round
    for name, (launcher, q, k, v, out) in runs.items():
        launcher(q, k, v, out, attention_stream.ptr)
        attention_stream.synchronize()
        began = time.perf_counter()
        launcher(q, k, v, out, attention_stream.ptr)
        attention_stream.synchronize()
        one[name] = time.perf_counter() - began
    # covers a round even if starvation doubled every launch
    seconds = 2.5 * launches * sum(one.values()) + 0.2
    records = []
    for ctas in stream_ctas:
        for r in range(rounds):
            with ConditionsSampler(period_s=0.05) as sampler:
                if ctas:
                    streamer.start(ctas, seconds)
                    time.sleep(0.02)  # the streamer occupies its SMs before attention starts
                times, stop = {}, None
                for idx in rng.permutation(len(runs)):
                    name = list(runs)[idx]
                    launcher, q, k, v, out = runs[name]
                    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                    start.record(attention_stream)
                    for _ in range(launches):
                        launcher(q, k, v, out, attention_stream.ptr)
                    stop.record(attention_stream)
                    stop.synchronize()
                    times[name] = cupy.cuda.get_elapsed_time(start, stop) / launches
                overran = False
                gbps = 0.0
                if ctas:
                    gbps = streamer.finish()
                    # the streamer must outlast the launches it starves: flagged if it ended first
                    overran = cupy.cuda.get_elapsed_time(stop, streamer.ended) < 0
            cond = sampler.conditions()
            for name, ms in times.items():
                records.append({"gpu": dev.name, "sms": dev.sms, "stream_ctas": ctas,
                                "round": r, "point": name, "ms": ms, "stream_gbps": gbps,
                                "sm_clock_mhz": cond.sm_clock_mhz,
                                "throttled": bool(cond.throttled), "overran": overran})
            if progress:
                progress(ctas, r)
    return records


def stream_alone_gbps(ctas: int, seconds: float = 0.5) -> float:
    """The streamer's bandwidth with nothing else running (all of its CTAs' SMs)."""
    streamer = Streamer()
    streamer.start(ctas, seconds)
    return streamer.finish()

