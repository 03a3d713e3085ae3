"""The memory system's own numbers, measured by the toolkit: the parameters a timed cache model
needs (issue 21), each with how it was measured.

- Latency: one thread chases a random cyclic permutation of 128-byte lines with L1-bypassing
  loads (`ld.global.cg`), timing every hop with `clock64`. A working set well inside the L2
  gives L2 hits; their latencies split into two modes, the near and the far partition (an
  address's home partition decides). A working set far beyond the L2 gives DRAM latency (TLB
  misses included: the lines are spread over the whole buffer).
- Bandwidth: a reduction over a buffer 80x the L2 (`cupy.sum`), timed with CUDA events, best
  of several runs: DRAM read bandwidth as a kernel can use it.
"""
from __future__ import annotations

import statistics

CHASE_SOURCE = r"""
extern "C" __global__ void chase(const unsigned int* __restrict__ next, int hops, int warm,
                                 unsigned int start, long long* clocks, unsigned int* last) {
    unsigned int i = start;
    for (int h = 0; h < warm; ++h) {  // one lap first: the lines in L2 (if they fit)
        unsigned int j;
        asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(j) : "l"(next + i) : "memory");
        i = j;
    }
    // The clock is read as each hop's load is issued; that issue waits for the previous hop's
    // value (its address), so consecutive readings are one hop's latency apart.
    for (int h = 0; h < hops; ++h) {
        clocks[h] = clock64();
        unsigned int j;
        asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(j) : "l"(next + i) : "memory");
        i = j;
    }
    last[0] = i;
}
"""

LINE_BYTES = 128
WORDS_PER_LINE = LINE_BYTES // 4


def _chain(cupy, span_lines: int, used_lines: int, seed: int):
    """A buffer of `span_lines` 128-byte lines in which `used_lines` of them, chosen at random,
    form one random cycle: next[line * 32] = the next line's first word. Built on the GPU (the
    DRAM chase spans gigabytes)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    used = (rng.permutation(span_lines)[:used_lines] if used_lines < span_lines
            else rng.permutation(span_lines)).astype(np.int64)
    nxt = cupy.zeros(span_lines * WORDS_PER_LINE, dtype=cupy.uint32)
    positions = cupy.asarray(used * WORDS_PER_LINE)
    nxt[positions] = cupy.asarray(np.roll(used, -1) * WORDS_PER_LINE, dtype=cupy.uint32)
    return nxt, int(used[0] * WORDS_PER_LINE)


def chase_cycles(working_set_bytes: int, hops: int = 20000, seed: int = 0,
                 used_lines: int | None = None):
    """Cycles of each of `hops` dependent loads over a random cycle of lines spread over
    `working_set_bytes` (`used_lines` of them; default all), one warm-up lap first when the
    lap is short: the differences of the clock read at each issue, each one hop's latency plus
    the loop's few cycles."""
    import cupy
    import numpy as np
    kernel = cupy.RawKernel(CHASE_SOURCE, "chase")
    span = max(2, working_set_bytes // LINE_BYTES)
    used = min(span, used_lines or span)
    nxt, start = _chain(cupy, span, used, seed)
    if not used <= 1 << 20 or used != span:
        # Building the chain left its last-written lines in the L2: overwrite the L2 with
        # other data first, so the first lap's loads miss as they should.
        flush = cupy.empty(4 * working_set_bytes // 64 + (256 << 20), dtype=cupy.uint8)
        flush.fill(1)
        del flush
    clocks = cupy.zeros(hops + 1, dtype=cupy.int64)
    last = cupy.zeros(1, dtype=cupy.uint32)
    warm = used if used <= 1 << 20 and used == span else 0
    kernel((1,), (1,), (nxt, cupy.int32(hops + 1), cupy.int32(warm), cupy.uint32(start), clocks,
                        last))
    return np.diff(clocks.get())


def two_modes(cycles) -> tuple[float, float, float]:
    """(low mode median, high mode median, share of the high mode): the hops split at the
    largest gap between the sorted latencies' 5th and 95th percentiles."""
    import numpy as np
    x = np.sort(np.asarray(cycles, dtype=float))
    lo, hi = np.searchsorted(x, np.percentile(x, [5, 95]))
    core = x[lo:hi]
    if len(core) < 2:
        m = float(np.median(x))
        return m, m, 0.0
    cut = core[int(np.argmax(np.diff(core)))]
    low, high = x[x <= cut], x[x > cut]
    if len(high) == 0:
        return float(np.median(low)), float(np.median(low)), 0.0
    return float(np.median(low)), float(np.median(high)), len(high) / len(x)


def read_bandwidth(buffer_bytes: int = 4 << 30, runs: int = 7) -> tuple[float, list[float]]:
    """DRAM read bandwidth of a reduction over `buffer_bytes` (GB/s): best and every run."""
    import cupy
    x = cupy.ones(buffer_bytes // 4, dtype=cupy.float32)
    x.sum()
    rates = []
    for _ in range(runs):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        x.sum()
        stop.record()
        stop.synchronize()
        rates.append(buffer_bytes / (cupy.cuda.get_elapsed_time(start, stop) * 1e-3) / 1e9)
    return max(rates), rates


def measure(l2_bytes: int, sm_clock_hz: float) -> dict:
    """Every parameter, in ns, cycles and GB/s, with the method beside each."""
    import numpy as np
    l2_cycles = chase_cycles(l2_bytes // 8)
    near, far, far_share = two_modes(l2_cycles)
    if not 0.2 <= far_share <= 0.8:
        # no second mode of any size: one SM sees one L2 latency (near and far not told apart)
        near = far = float(np.median(l2_cycles))
    dram_cycles = chase_cycles(64 * l2_bytes, hops=5000, used_lines=1 << 18)
    best, rates = read_bandwidth()
    ns = 1e9 / sm_clock_hz
    return {
        "l2_near_cycles": near, "l2_far_cycles": far, "l2_far_share": far_share,
        "l2_near_ns": near * ns, "l2_far_ns": far * ns,
        "dram_cycles": float(np.median(dram_cycles)), "dram_ns": float(np.median(dram_cycles)) * ns,
        "dram_read_gbps": best, "dram_read_gbps_runs": rates,
        "l2_hop_cycles_p10_p50_p90": [float(np.percentile(l2_cycles, q)) for q in (10, 50, 90)],
        "dram_hop_cycles_p10_p50_p90": [float(np.percentile(dram_cycles, q)) for q in (10, 50, 90)],
        "sm_clock_hz": sm_clock_hz,
        "methods": {
            "l2": f"one thread chasing a random cycle of 128-B lines over {l2_bytes // 8} bytes "
                  "(1/8 of the L2), ld.global.cg, clock64 per hop after a warm lap; the hops "
                  "split at the largest latency gap into near and far where the smaller mode "
                  "holds 20-80% of them, else one median for both",
            "dram": f"the same chase over 2^18 random lines spread over {64 * l2_bytes} bytes "
                    "(64x the L2), the L2 overwritten first, no warm lap; TLB misses included",
            "bandwidth": "cupy.sum over 4 GiB of float32, CUDA events, best of 7",
            "ns": "cycles at the SM clock NVML reported",
        },
    }


def summary_line(m: dict) -> str:
    l2 = (f"L2 near {m['l2_near_ns']:.0f} ns, far {m['l2_far_ns']:.0f} ns "
          f"({m['l2_far_share']:.0%} of hops)" if m["l2_near_ns"] != m["l2_far_ns"]
          else f"L2 {m['l2_near_ns']:.0f} ns (no near/far split seen)")
    return (f"{l2}, DRAM {m['dram_ns']:.0f} ns, "
            f"read bandwidth {m['dram_read_gbps']:.0f} GB/s "
            f"(runs {statistics.median(m['dram_read_gbps_runs']):.0f} median)")
