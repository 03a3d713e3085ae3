"""A cache model with a clock: DRAM reads, L2 hits and kernel time from one simulation.

The lock-step rounds of `simulation.trace_blocks` assume the order in which tiles reach the L2;
here the order comes out of time. Every resident CTA (a slot, on SM slot mod SMs) has a clock:

- the binary's producer warp fills a ring of K stages and a ring of V stages (their lengths
  read from its SASS, `model.pipeline`), issuing K_0, V_0, K_1, V_1, ... in program order,
  each as soon as its stage is free: a work item begins by loading its Q tile and as many K
  and V tiles as the rings hold;
- a K/V step computes in two phases: A (QK^T and the softmax, `PHASE_A_FRACTION` of
  `step_ns`) once the previous step is done and K_t has arrived, then B (P.V, the rest) once
  V_t has arrived. The end of A releases K_t's stage, the end of B V_t's (the consumer's two
  barrier waits and two releases per step), and the producer fills them with K_{t+k_stages}
  and V_{t+v_stages}: the next K loads during a step's P.V, the next V during the next QK^T;
- a launch given an explicit `loads_ahead` (and a binary whose pipeline was not read: two)
  runs the joint pipeline instead: K and V of a step travel together, the step computes
  once both have arrived, and its end frees the buffer for the step `loads_ahead` further on;
- a load that hits in the reader's L2 partition returns after the L2 latency; one that hits
  only in the home partition after the far latency (the line is then copied near the reader,
  the partition model of `simulation.LruL2`); a miss goes to a DRAM that serves bytes at its
  measured bandwidth in arrival order, then returns after the DRAM latency;
- a load of a line whose fill is still under way waits for that fill (concurrent misses to one
  line are served once);
- the item ends with its output write and `item_ns` of fixed cost; a persistent CTA then takes
  its next row, a dynamic schedule (and a grid launch's next CTA) the next row of the work table
  in simulated time.

Events are processed in global time order (a heap over the slots), so the L2's LRU state sees
accesses in the order the clocks produce them: convoys, drift and imbalance come out of the
simulation. Each work item's tiles and scan order come from `Launch.work_table`, the rows the
kernel reads.

Parameters: the memory system's from `wavefront microbench` (data/microbench), the compute
time per K/V step from launches that fit in the L2 (experiments/step_time.py, the model's
training set; `calibrate`). Nothing is fitted to the data the model is scored on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from wavefront.model.pipeline import ASSUMED_LOADS_AHEAD, kv_stages_of
from wavefront.model.simulation import (
    KIND_O, KIND_PARTIAL_READ, _combine_pass, _hash64, _item_table, item_steps, lru_touch,
    slots_of)
from wavefront.point import SECTOR_BYTES
from wavefront.schedules import (
    WORK_BATCH, WORK_CHUNK, WORK_HEAD, WORK_MASKED_HI, WORK_MASKED_LO, WORK_Q_TILE,
    WORK_SCAN_COUNT, WORK_SCAN_START, WORK_SCAN_STEP, Launch, kv_tile_span)


@dataclass(frozen=True)
class MemoryTiming:
    """The memory system as the pointer chase and the stream measured it."""

    l2_ns: float  # a hit in the reader's partition
    far_ns: float  # a hit served by the other partition (the fabric)
    dram_ns: float  # a miss, unloaded
    dram_bytes_per_s: float  # sustained read bandwidth
    source: str = ""
    # L2 bandwidth where it binds (bytes/s over all slices; 0: unbounded). Hits queue for it
    # in arrival order like misses for the DRAM.
    l2_bytes_per_s: float = 0.0


@dataclass(frozen=True)
class Exposure:
    """What else runs on the GPU beside the attention, as inputs of the simulation (issue 49's
    regimes): all default to nothing.

    - `l2_bytes_taken`: L2 held by someone else for the whole launch (a co-runner's lines kept
      by a persisting access-policy window): the attention's LRU gets the rest.
    - `corunner_dram_bytes_per_s`: a co-runner's DRAM traffic (reads + writes). It takes that
      much of the DRAM's bandwidth from the attention's queue and loads the DRAM: a miss's
      latency grows as an M/D/1 queue's wait at that utilisation, `dram_queue_service_ns` the
      assumed service time (a guess until a loaded pointer chase measures it).
    - `corunner_l2_fraction`: the share of the co-runner's bytes that allocate in the L2 as
      normal lines (1: default policy; near 0: evict-first/streaming or no-allocate stores).
      Those lines stream through the attention's LRU in simulated time, in chunks, half of them
      copied into both partitions (co-runner SMs sit in both).
    - `cta_speed`: per-CTA speed multipliers (a step takes step_ns / speed), one per slot, or
      a measured sample of any length drawn from with `seed` (e.g. per-CTA start/end clocks
      recorded by the kernel). None: every CTA at the calibrated speed."""

    l2_bytes_taken: int = 0
    corunner_dram_bytes_per_s: float = 0.0
    corunner_l2_fraction: float = 1.0
    dram_queue_service_ns: float = 80.0
    cta_speed: tuple | None = None
    seed: int = 0

    def loaded_dram_ns(self, memory: "MemoryTiming") -> float:
        """A miss's latency with the co-runner's DRAM load (M/D/1 wait at its utilisation,
        capped at 98%)."""
        u = min(0.98, self.corunner_dram_bytes_per_s / memory.dram_bytes_per_s)
        return memory.dram_ns + u * self.dram_queue_service_ns / (2 * (1 - u))


NO_EXPOSURE = Exposure()
# The co-runner's lines enter the LRU in chunks of this many bytes
CORUNNER_CHUNK_BYTES = 1 << 16
# The DRAM bandwidth left to the attention never falls below this share (arbitration keeps
# serving every requester)
MIN_DRAM_SHARE = 0.05


@dataclass(frozen=True)
class ComputeTiming:
    """What a CTA spends computing, for one kernel variant (head dim, tiles, mask, CTAs per SM)."""

    step_ns: float  # one K/V step of one CTA, its SM shared with its co-resident CTAs
    item_ns: float  # a work item's fixed cost beyond its loads (prologue, epilogue)
    launch_ns: float  # launch and drain, once per launch
    source: str = ""


# The kernel's K/V pipeline: tileiras multi-buffers the K and V tiles of a loop; its rings'
# lengths are read from each binary's SASS (`model.pipeline`, data/kv_pipeline), a joint ring
# of two steps where a binary was not read. Not fitted.
# The share of a K/V step before its P.V (phase A: QK^T and the softmax). Chosen, not fitted:
# QK^T and P.V are the same MMA work (2 x tile_m x tile_n x head_dim each), and the softmax
# (an exponential per score on the MUFU, row max and sum, the output's rescale) comes on top
# of QK^T. Unhidden it would be about one more MMA's time at these tiles (f ~ 2/3); the
# consumer warpgroups overlap one's softmax with another's MMA, which pulls it towards 1/2.
PHASE_A_FRACTION = 0.6
# The DRAM series is kept in this many bins over the launch (rebinned for comparisons).
SERIES_BINS = 4096


@dataclass
class TimedPrediction:
    """One launch, simulated with clocks."""

    kernel_ns: float
    dram_read_bytes: float
    tex_read_bytes: float  # reads the SMs send to the L2
    near_hit_bytes: float  # hits in the reader's partition
    far_hit_bytes: float  # hits served by the home partition over the fabric
    fill_waits: int  # loads that found their line's fill under way and waited for it
    bin_ns: float  # the DRAM series' bin width
    dram_series: np.ndarray = field(repr=False)  # DRAM read bytes per bin
    item_start_ns: np.ndarray = field(repr=False)
    item_end_ns: np.ndarray = field(repr=False)
    item_slot: np.ndarray = field(repr=False)

    @property
    def dram_read_sectors(self) -> float:
        return self.dram_read_bytes / SECTOR_BYTES

    def dram_rate_series(self, interval_ns: float) -> tuple[np.ndarray, np.ndarray]:
        """(bin start in ns, DRAM read rate in bytes/s) over bins of `interval_ns`."""
        per = max(1, int(round(interval_ns / self.bin_ns)))
        used = int(np.ceil(self.kernel_ns / self.bin_ns))
        series = self.dram_series[:max(used, 1)]
        n = int(np.ceil(len(series) / per))
        padded = np.zeros(n * per)
        padded[:len(series)] = series
        width = per * self.bin_ns
        return np.arange(n) * width, padded.reshape(n, per).sum(axis=1) / (width * 1e-9)

    def summary(self) -> dict:
        return {"kernel_ms": self.kernel_ns * 1e-6, "dram_read_bytes": self.dram_read_bytes,
                "tex_read_bytes": self.tex_read_bytes, "near_hit_bytes": self.near_hit_bytes,
                "far_hit_bytes": self.far_hit_bytes, "fill_waits": self.fill_waits}


# ---------------------------------------------------------------------------------------------
# The event loop
# ---------------------------------------------------------------------------------------------

# counts: tex read bytes, near hits, fabric lookups, far hits, DRAM read bytes, fill waits
_TEX, _NEAR, _FABRIC, _FAR, _DRAM, _WAITS = range(6)


@numba.njit(cache=True, inline="always")
def _l2_queue(now, w, timing, free):
    """When a hit of `w` bytes issued at `now` has crossed the L2's bandwidth (timing[5]
    bytes/ns, 0: unbounded; free[1]: when the L2 is next free)."""
    if timing[5] <= 0:
        return now
    start = max(now, free[1])
    free[1] = start + w / timing[5]
    return free[1]


@numba.njit(cache=True)
def _corunner_until(now, state, rate, chunk, base, n_chunks, home_of, capacity, prev, nxt,
                    present, size, head, tail, used):
    """Stream the co-runner's L2 lines into the LRU up to time `now`: `rate` bytes/ns in
    chunks of `chunk` bytes cycling over ids base..base+n_chunks (more than the L2 holds, so
    every chunk is new to it). state = (time streamed to, bytes pending, next chunk)."""
    if rate <= 0 or now <= state[0]:
        return
    state[1] += (now - state[0]) * rate
    state[0] = now
    partitions = prev.shape[0]
    while state[1] >= chunk:
        state[1] -= chunk
        k = int(state[2])
        state[2] = (k + 1) % n_chunks
        a = base + k
        q = home_of[a]
        lru_touch(q, a, chunk, capacity, prev, nxt, present, size, head, tail, used)
        if partitions == 2 and (k // 2) % 2 == 0:  # read by an SM of the other partition
            lru_touch(1 - q, a, chunk, capacity, prev, nxt, present, size, head, tail, used)


@numba.njit(cache=True, inline="always")
def _serve(n_acc, acc_id, acc_bytes, acc_read, acc_ready, p, now, home_of, timing, capacity,
           prev, nxt, present, size, head, tail, used, fill, dram_free, series, counts, targets):
    """Serve the accesses one event issues at time `now` from a CTA in partition p; each
    one's data arrival time goes to acc_ready (a write's is `now`: it is not waited for).

    One body for every access (hit, far hit, miss, write) keeps the hot loop small: per
    partition LRU lists over tile ids as in `simulation._lru_feed`, plus each line's fill time.
    timing = (L2 ns, far L2 ns, DRAM ns, DRAM bytes per ns, series bin ns); `targets` a
    scratch array of 2 (allocated once by the caller: an allocation per event cost ~10%)."""
    for i in range(n_acc):
        a = acc_id[i]
        w = acc_bytes[i]
        size[a] = w
        home = home_of[a]
        n_targets = 1
        if not acc_read[i]:  # a write allocates at home
            targets[0] = home
            ready = now
        elif present[p, a]:
            counts[_TEX] += w
            counts[_NEAR] += w
            ready = _l2_queue(now, w, timing, dram_free) + timing[0]
            if fill[p, a] > ready:
                ready = fill[p, a]
                counts[_WAITS] += 1
            targets[0] = p
        else:
            counts[_TEX] += w
            far = False
            if home != p:
                counts[_FABRIC] += w
                if present[home, a]:
                    far = True
            if far:
                counts[_FAR] += w
                ready = _l2_queue(now, w, timing, dram_free) + timing[1]
                if fill[home, a] > ready:
                    ready = fill[home, a]
                    counts[_WAITS] += 1
            else:  # the DRAM serves requests in arrival order at its bandwidth
                start = max(now, dram_free[0])
                dram_free[0] = start + w / timing[3]
                ready = dram_free[0] + timing[2]
                counts[_DRAM] += w
                series[min(int(start / timing[4]), len(series) - 1)] += w
            targets[0] = home
            if home != p:
                targets[1] = p
                n_targets = 2
        acc_ready[i] = ready
        for k in range(n_targets):
            q = targets[k]
            if present[q, a]:
                if ready > fill[q, a] and not acc_read[i]:
                    fill[q, a] = ready
            else:
                fill[q, a] = ready
            lru_touch(q, a, w, capacity, prev, nxt, present, size, head, tail, used)


@numba.njit(cache=True, inline="always")
def _heap_push(ht, hs, n, t, s):
    i = n
    ht[i] = t
    hs[i] = s
    while i > 0:
        parent = (i - 1) >> 1
        if ht[parent] <= ht[i]:
            break
        ht[parent], ht[i] = ht[i], ht[parent]
        hs[parent], hs[i] = hs[i], hs[parent]
        i = parent
    return n + 1


@numba.njit(cache=True, inline="always")
def _heap_sift_down(ht, hs, n):
    """Restore the heap after its root changed (a pop, or the root slot's next event)."""
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        child = left
        if left + 1 < n and ht[left + 1] < ht[left]:
            child = left + 1
        if ht[i] <= ht[child]:
            break
        ht[child], ht[i] = ht[i], ht[child]
        hs[child], hs[i] = hs[i], hs[child]
        i = child


@numba.njit(cache=True, inline="always")
def _q_rows(q_index, q_tiles, tile_m, seqlen_q):
    """Rows of a Q tile (the last one of a sequence may be short)."""
    return min(tile_m, seqlen_q - (q_index % q_tiles) * tile_m)


@numba.njit(cache=True, inline="always")
def _kv_tile(t, scan_start, scan_sign, scan_count, masked_lo):
    """The K/V tile an item reads at its step t: its scan, then its masked tiles."""
    if t < scan_count:
        return scan_start + scan_sign * t
    return masked_lo + t - scan_count


@numba.njit(cache=True, error_model="numpy")
def _run(table, n_slots, dynamic, stride, alternate, heads, kv_heads, q_tiles, kv_tiles, tile_m,
         tile_n, seqlen_q, seqlen_kv, row_bytes, partial_row_bytes, tiled, batch_heads,
         q_base, o_base, partial_base, v_base, step_ns, item_ns, k_stages, v_stages, phase_a,
         part_of_slot, home_of, timing, capacity, prev, nxt, present, size, head, tail, used,
         fill, dram_free, series, counts, item_start, item_end, item_slot, co_rate, co_chunk,
         co_base, co_chunks):
    """Simulate the launch; returns the time the last CTA finished (ns, from launch).

    Two pipelines (see `simulate_timed`): split (v_base >= 0), a K ring of `k_stages` and a V
    ring of `v_stages`, each step in two events (the end of phase A, `phase_a` of the step,
    which needs K; the end of phase B, which needs V); joint (v_base < 0), one ring of
    `k_stages` steps whose K and V travel together, one event per step."""
    n_items = table.shape[0]
    qpk = heads // kv_heads
    split = v_base >= 0
    cur = np.full(n_slots, -1, np.int64)
    step = np.zeros(n_slots, np.int64)  # the step whose compute ends at the pending event
    in_a = np.zeros(n_slots, np.bool_)  # (split) the pending event ends that step's phase A
    steps = np.zeros(n_slots, np.int64)  # K/V steps of the item in hand
    begin = np.zeros(n_slots, np.bool_)  # the pending event begins an item
    taken = np.zeros(n_slots, np.int64)
    # per slot, the item in hand's scan (start, step, length, first masked tile), its K/V
    # unit's first tile id and its Q tile's index, worked out once per item
    scan_start = np.zeros(n_slots, np.int64)
    scan_sign = np.zeros(n_slots, np.int64)
    scan_count = np.zeros(n_slots, np.int64)
    masked_lo = np.zeros(n_slots, np.int64)
    kv_base = np.zeros(n_slots, np.int64)
    q_of = np.zeros(n_slots, np.int64)
    # the rings: data arrival time of step t's K (joint: K and V) at t % k_stages, of its V
    # at t % v_stages; the producer's next K (joint: K/V) load and next V load
    ready_k = np.zeros((n_slots, k_stages), np.float64)
    ready_v = np.zeros((n_slots, v_stages), np.float64)
    next_k = np.zeros(n_slots, np.int64)
    next_v = np.zeros(n_slots, np.int64)
    ht = np.empty(n_slots, np.float64)
    hs = np.empty(n_slots, np.int64)
    # the accesses of one event: Q, up to a ring's worth of K and V loads, the output; per
    # access the step a K/V load is for (-1: Q or output) and whether it is a V
    n_max = k_stages + v_stages + 2
    acc_id = np.empty(n_max, np.int64)
    acc_bytes = np.empty(n_max, np.int64)
    acc_read = np.empty(n_max, np.bool_)
    acc_ready = np.empty(n_max, np.float64)
    acc_step = np.empty(n_max, np.int64)
    acc_v = np.zeros(n_max, np.bool_)
    co_state = np.zeros(3, np.float64)
    targets = np.empty(2, np.int64)
    n = 0
    next_item = min(n_slots, n_items)
    for s in range(min(n_slots, n_items)):
        cur[s] = s
        begin[s] = True
        n = _heap_push(ht, hs, n, 0.0, s)
    finish = 0.0
    while n > 0:
        # the root is the slot whose clock is earliest; its next event replaces it in place
        # (one sift instead of a pop and a push), or it leaves the heap when it is done
        now = ht[0]
        s = hs[0]
        it = cur[s]
        starting = begin[s]
        n_acc = 0
        if starting:
            begin[s] = False
            item_start[it] = now
            item_slot[it] = s
            b = table[it, WORK_BATCH]
            h = table[it, WORK_HEAD]
            kv_base[s] = (b * kv_heads + h // qpk) * kv_tiles
            q_of[s] = (b * heads + h) * q_tiles + table[it, WORK_Q_TILE]
            scan = table[it, WORK_SCAN_COUNT]
            start = table[it, WORK_SCAN_START]
            sign = table[it, WORK_SCAN_STEP]
            if alternate and taken[s] % 2 == 1:  # the kernel reverses this row's scan
                start = start + sign * (scan - 1)
                sign = -sign
            scan_start[s], scan_sign[s], scan_count[s] = start, sign, scan
            masked_lo[s] = table[it, WORK_MASKED_LO]
            steps[s] = scan + table[it, WORK_MASKED_HI] - masked_lo[s]
            step[s] = 0
            in_a[s] = split
            next_k[s] = 0
            next_v[s] = 0
            acc_id[0] = q_base + q_of[s]
            acc_bytes[0] = _q_rows(q_of[s], q_tiles, tile_m, seqlen_q) * row_bytes
            acc_read[0] = True
            acc_step[0] = -1
            n_acc = 1
            k_done = 0  # steps whose K stage (joint: K/V) the consumer has released
            v_done = 0
        elif in_a[s]:  # phase A of step t ends (QK^T and softmax): K_t's stage is released
            in_a[s] = False
            k_done = step[s] + 1
            v_done = step[s]
        else:  # step t ends (P.V): V_t's stage (joint: the step's buffer) is released
            step[s] += 1
            in_a[s] = split
            k_done = step[s]
            v_done = step[s]
        # The producer issues its loads in program order (K_0, V_0, K_1, ...; joint: one
        # K/V load per step), each as soon as its stage is free, and waits at the first
        # whose stage is not
        while True:
            if split and next_v[s] < next_k[s]:
                t = next_v[s]
                if t >= v_done + v_stages:
                    break
                next_v[s] += 1
                acc_v[n_acc] = True
                acc_id[n_acc] = v_base
            else:
                t = next_k[s]
                if t >= steps[s] or t >= k_done + k_stages:
                    break
                next_k[s] += 1
                acc_v[n_acc] = False
                acc_id[n_acc] = 0
            j = _kv_tile(t, scan_start[s], scan_sign[s], scan_count[s], masked_lo[s])
            acc_id[n_acc] += kv_base[s] + j
            # (joint: the LRU keeps a step's K and V as one line of both sizes)
            acc_bytes[n_acc] = ((1 if split else 2) * min(tile_n, seqlen_kv - j * tile_n)
                                * row_bytes)
            acc_read[n_acc] = True
            acc_step[n_acc] = t
            n_acc += 1
        done_item = step[s] >= steps[s]
        if done_item:  # the item's epilogue writes its output (or its partial state)
            q_rows = _q_rows(q_of[s], q_tiles, tile_m, seqlen_q)
            if tiled:
                acc_id[n_acc] = (partial_base + table[it, WORK_CHUNK] * batch_heads * q_tiles
                                 + q_of[s])
                acc_bytes[n_acc] = q_rows * partial_row_bytes
            else:
                acc_id[n_acc] = o_base + q_of[s]
                acc_bytes[n_acc] = q_rows * row_bytes
            acc_read[n_acc] = False
            acc_step[n_acc] = -1
            n_acc += 1
        _corunner_until(now, co_state, co_rate, co_chunk, co_base, co_chunks, home_of, capacity,
                        prev, nxt, present, size, head, tail, used)
        _serve(n_acc, acc_id, acc_bytes, acc_read, acc_ready, part_of_slot[s], now, home_of,
               timing, capacity, prev, nxt, present, size, head, tail, used, fill, dram_free,
               series, counts, targets)
        arrival = acc_ready[0] if starting else now  # the first step waits for the Q tile too
        for i in range(n_acc):
            t = acc_step[i]
            if t >= 0:
                if acc_v[i]:
                    ready_v[s, t % v_stages] = acc_ready[i]
                else:
                    ready_k[s, t % k_stages] = acc_ready[i]
        if not done_item:
            t = step[s]
            if not split:
                ht[0] = max(arrival, ready_k[s, t % k_stages]) + step_ns[s]
            elif in_a[s]:  # phase A of step t: after phase B of t - 1, once K_t is in
                ht[0] = max(arrival, ready_k[s, t % k_stages]) + phase_a * step_ns[s]
                # (next_k <= t + k_stages here: the K ring never runs further ahead)
                if next_v[s] < next_k[s] or next_k[s] >= steps[s]:
                    # the producer waits for a V stage (or is done): the K stage phase A
                    # frees issues nothing, so its end is no event and phase B follows
                    # (V_t was issued by the end of step t - 1) -- half the events where the
                    # K ring is the longer by two or more
                    in_a[s] = False
                    ht[0] = (max(ht[0], ready_v[s, t % v_stages])
                             + (1.0 - phase_a) * step_ns[s])
            else:  # phase B: once V_t is in
                ht[0] = max(arrival, ready_v[s, t % v_stages]) + (1.0 - phase_a) * step_ns[s]
            _heap_sift_down(ht, hs, n)
            continue
        done = arrival + item_ns
        item_end[it] = done
        taken[s] += 1
        if dynamic:
            nxt_item = next_item
            next_item += 1
        else:
            nxt_item = it + stride
        if nxt_item < n_items:
            cur[s] = nxt_item
            begin[s] = True
            ht[0] = done
        else:
            cur[s] = -1
            finish = max(finish, done)
            n -= 1
            ht[0] = ht[n]
            hs[0] = hs[n]
        _heap_sift_down(ht, hs, n)
    return max(finish, dram_free[0])


@numba.njit(cache=True)
def _combine(address, nbytes, kind, slot, start, sms, partitions, home_of, timing, capacity,
             prev, nxt, present, size, head, tail, used, fill, series, counts):
    """The tiled schedule's combine kernel, after the main one: its accesses in order, each
    CTA's clock advancing with its loads (a CTA per output tile); returns when the last is
    done."""
    clock = np.full(sms, start)
    dram_free = np.array([start, start])
    acc_id = np.empty(1, np.int64)
    acc_bytes = np.empty(1, np.int64)
    acc_read = np.empty(1, np.bool_)
    acc_ready = np.empty(1, np.float64)
    targets = np.empty(2, np.int64)
    for i in range(len(address)):
        c = slot[i] % sms
        acc_id[0] = address[i]
        acc_bytes[0] = nbytes[i]
        acc_read[0] = kind[i] == KIND_PARTIAL_READ
        _serve(1, acc_id, acc_bytes, acc_read, acc_ready, (c % 2) if partitions == 2 else 0,
               clock[c], home_of, timing, capacity, prev, nxt, present, size, head, tail, used,
               fill, dram_free, series, counts, targets)
        clock[c] = max(clock[c], acc_ready[0])
    return max(clock.max(), dram_free[0])


# ---------------------------------------------------------------------------------------------
# The host side
# ---------------------------------------------------------------------------------------------

def ctas_per_sm(launch: Launch) -> int:
    """CTAs sharing an SM in this launch (what a step's compute time depends on)."""
    n_slots, _ = slots_of(launch)
    return max(1, -(-n_slots // launch.sms))


# The timed model's pace on one core here (K/V steps simulated per second, paper launch: 12-15 M/s)
# and the work it takes on without being asked to
TIMED_STEPS_PER_S = 12e6
MAX_TIMED_STEPS = 3_000_000_000


def timed_cost(launch: Launch) -> tuple[int, int]:
    """(bytes the simulation allocates, K/V steps it simulates) for one launch: the LRU's
    per-partition arrays over every tile id (K and V apart: three of 8 bytes and a flag, per
    partition, plus the line sizes) and the work table's steps (a dense launch's counted from
    its problem, `dense_steps`: its table is not built to be refused)."""
    p = launch.problem
    n_ids = (2 * p.kv_units * p.kv_tiles + 2 * p.batch * p.heads * p.q_tiles
             + (p.batch * p.heads * p.q_tiles * launch.n_chunks
                if launch.kv.writes_partials else 0))
    table_bytes = launch.num_items * 8 * 16
    steps = dense_steps(launch)
    if steps is None:
        steps = int(item_steps(launch).sum())
    return 2 * n_ids * (3 * 8 + 1) + 8 * n_ids + table_bytes + 4 * 8 * launch.num_items, steps


def dense_steps(launch: Launch) -> int | None:
    """The K/V steps of a dense launch's items, from the problem alone (`kv_tile_span` per Q
    tile): what its work table's rows add up to, without building that table (gigabytes for
    a launch the model refuses). None for a packed batch (its spans are per sequence)."""
    if launch.varlen:
        return None
    p = launch.problem
    visited, _ = kv_tile_span(np.arange(p.q_tiles), p.tile_m, p.tile_n, p.seqlen_q,
                              p.seqlen_kv, p.causal, p.diagonal)
    # (without the causal mask every Q tile visits all K/V tiles: one number, broadcast)
    return p.batch * p.heads * int(np.broadcast_to(visited, (p.q_tiles,)).sum())


def check_timed(launch: Launch, memory_bytes: int | None = None) -> float:
    """Refuse, before allocating, a launch the timed model cannot hold in memory or would take
    hours on; -> its expected seconds here (for a progress message)."""
    from wavefront.model.simulation import available_memory_bytes
    need, steps = timed_cost(launch)
    memory = memory_bytes or available_memory_bytes()
    if steps > MAX_TIMED_STEPS:
        raise ValueError(f"this launch has {steps:.3g} K/V steps, more than the "
                         f"{MAX_TIMED_STEPS:.0e} the timed model takes (about "
                         f"{MAX_TIMED_STEPS / TIMED_STEPS_PER_S / 60:.0f} min): shorten seqlen "
                         "or batch x heads")
    if need > 0.8 * memory:
        raise ValueError(f"the timed model needs ~{need / 2**30:.1f} GiB for this launch, more "
                         f"than 80% of the {memory / 2**30:.1f} GiB available: shorten seqlen "
                         "or batch x heads")
    return steps / TIMED_STEPS_PER_S


def simulate_timed(launch: Launch, memory: MemoryTiming, compute: ComputeTiming, *,
                   l2_bytes: int, partitions: int = 2, loads_ahead: int | None = None,
                   kv_stages: tuple[int, int] | None = None,
                   phase_a_fraction: float | None = None, horizon_ns: float | None = None,
                   exposure: Exposure = NO_EXPOSURE) -> TimedPrediction:
    """Simulate one launch with clocks (see the module docstring). `l2_bytes` is the whole
    L2, split over `partitions` (1 or 2) as in `simulation.LruL2`'s partition model;
    the K/V pipeline: `kv_stages` (K stages, V stages) simulates the two rings apart, each
    step in two phases, `phase_a_fraction` of it before P.V (None: PHASE_A_FRACTION);
    `loads_ahead` instead runs the joint pipeline, K and V of a step together, that many
    steps ahead (the phase diagram and the depth regimes sweep it); neither: the launch's
    binary's rings as read from its SASS (`model.pipeline`), else a joint two. `exposure`
    what else runs beside it (`Exposure`)."""
    if loads_ahead is not None and kv_stages is not None:
        raise ValueError("give loads_ahead (the joint pipeline) or kv_stages (K and V rings), "
                         f"not both: got {loads_ahead!r} and {kv_stages!r}")
    if loads_ahead is None and kv_stages is None:
        kv_stages, _ = kv_stages_of(launch)
        if kv_stages is None:
            loads_ahead = ASSUMED_LOADS_AHEAD
    if partitions not in (1, 2):
        raise ValueError(f"partitions must be 1 or 2, got {partitions!r}")
    if loads_ahead is not None and loads_ahead < 1:
        raise ValueError(f"loads_ahead must be at least 1, got {loads_ahead!r}")
    if kv_stages is not None and (len(kv_stages) != 2 or min(kv_stages) < 1):
        raise ValueError(f"kv_stages must be (K stages, V stages), each at least 1, got "
                         f"{kv_stages!r}")
    phase_a = PHASE_A_FRACTION if phase_a_fraction is None else phase_a_fraction
    if not 0 <= phase_a <= 1:
        raise ValueError(f"phase_a_fraction must be in [0, 1], got {phase_a_fraction!r}")
    for name in ("step_ns", "item_ns", "launch_ns"):
        if not np.isfinite(getattr(compute, name)) or getattr(compute, name) < 0:
            raise ValueError(f"compute.{name} must be a finite number >= 0, got "
                             f"{getattr(compute, name)!r}")
    if not 0 <= exposure.l2_bytes_taken < l2_bytes:
        raise ValueError(f"exposure.l2_bytes_taken must be in [0, l2_bytes={l2_bytes}), got "
                         f"{exposure.l2_bytes_taken!r}")
    if exposure.corunner_dram_bytes_per_s < 0 or not 0 <= exposure.corunner_l2_fraction <= 1:
        raise ValueError("exposure.corunner_dram_bytes_per_s must be >= 0 and "
                         "exposure.corunner_l2_fraction in [0, 1], got "
                         f"{exposure.corunner_dram_bytes_per_s!r}, "
                         f"{exposure.corunner_l2_fraction!r}")
    p = launch.problem
    table = _item_table(launch)
    n_slots, dynamic = slots_of(launch)
    # Tile ids, dense per kind so that the LRU's arrays stay small and K/V tiles neighbours:
    # K per unit, then V per unit (joint: a step's K and V as one line), then Q, outputs,
    # partial states
    n_kv = p.kv_units * p.kv_tiles
    v_base = n_kv if kv_stages is not None else -1
    n_lines = 2 * n_kv if kv_stages is not None else n_kv
    n_q = p.batch * p.heads * p.q_tiles
    q_base, o_base, partial_base = n_lines, n_lines + n_q, n_lines + 2 * n_q
    n_ids = partial_base + (n_q * launch.n_chunks if launch.kv.writes_partials else 0)
    co_rate = (exposure.corunner_dram_bytes_per_s * exposure.corunner_l2_fraction * 1e-9)
    co_base = n_ids
    co_chunks = int(2 * l2_bytes // CORUNNER_CHUNK_BYTES) + 2 if co_rate > 0 else 0
    n_ids += co_chunks
    capacity = int((l2_bytes - exposure.l2_bytes_taken) // partitions)
    prev = np.full((partitions, n_ids), -1, np.int64)
    nxt = np.full((partitions, n_ids), -1, np.int64)
    present = np.zeros((partitions, n_ids), np.bool_)
    fill = np.zeros((partitions, n_ids), np.float64)
    size = np.zeros(n_ids, np.int64)
    head = np.full(partitions, -1, np.int64)
    tail = np.full(partitions, -1, np.int64)
    used = np.zeros(partitions, np.int64)
    home_of = (np.zeros(n_ids, np.int64) if partitions == 1 else
               (_hash64(np.arange(n_ids)) % np.uint64(2)).astype(np.int64))
    part_of_slot = ((np.arange(n_slots) % launch.sms) % partitions).astype(np.int64)
    counts = np.zeros(6, np.float64)
    if horizon_ns is None:  # every byte from DRAM, plus every step's compute, is an upper end
        steps = float(np.sum(item_steps(launch)))
        horizon_ns = (2 * steps * p.tile_n * p.head_dim * p.element_bytes
                      / (memory.dram_bytes_per_s * 1e-9)
                      + (steps / n_slots + 1) * compute.step_ns
                      + (len(table) / n_slots + 1) * (compute.item_ns + memory.dram_ns) + 1e4)
    bin_ns = max(1.0, horizon_ns / SERIES_BINS)
    series = np.zeros(SERIES_BINS, np.float64)
    item_start = np.zeros(len(table), np.float64)
    item_end = np.zeros(len(table), np.float64)
    item_slot = np.zeros(len(table), np.int64)
    step_ns = float(compute.step_ns) / cta_speeds(exposure, n_slots)
    dram_left = max(memory.dram_bytes_per_s - exposure.corunner_dram_bytes_per_s,
                    MIN_DRAM_SHARE * memory.dram_bytes_per_s)
    timing = np.array([memory.l2_ns, memory.far_ns, exposure.loaded_dram_ns(memory),
                       dram_left * 1e-9, bin_ns, memory.l2_bytes_per_s * 1e-9], np.float64)
    lru = (capacity, prev, nxt, present, size, head, tail, used, fill)
    end = _run(table, n_slots, dynamic, launch.num_ctas, bool(launch.alternate), p.heads,
               p.kv_heads, p.q_tiles, p.kv_tiles, p.tile_m, p.tile_n, p.seqlen_q, p.seqlen_kv,
               p.head_dim * p.element_bytes, launch.partial_row_bytes,
               bool(launch.kv.writes_partials), p.batch * p.heads, q_base, o_base, partial_base,
               v_base, step_ns, float(compute.item_ns),
               int(kv_stages[0] if kv_stages is not None else loads_ahead),
               int(kv_stages[1] if kv_stages is not None else 1), float(phase_a), part_of_slot,
               home_of, timing, *lru,
               np.zeros(2), series, counts, item_start, item_end, item_slot, co_rate,
               CORUNNER_CHUNK_BYTES, co_base, max(co_chunks, 1))
    if launch.kv.writes_partials:  # the combine kernel, a second launch
        address, nbytes, kind, slot = _combine_pass(launch, launch.sms)
        address = np.where(kind == KIND_O, o_base + (address - KIND_O) // 8,
                           partial_base + (address - 4) // 8)
        end = _combine(address, nbytes.astype(np.int64), kind, slot, end + compute.launch_ns,
                       launch.sms, partitions, home_of, timing, *lru, series, counts)
    return TimedPrediction(
        kernel_ns=end + compute.launch_ns, dram_read_bytes=counts[_DRAM],
        tex_read_bytes=counts[_TEX], near_hit_bytes=counts[_NEAR], far_hit_bytes=counts[_FAR],
        fill_waits=int(counts[_WAITS]), bin_ns=bin_ns, dram_series=series,
        item_start_ns=item_start, item_end_ns=item_end, item_slot=item_slot)



def cta_speeds(exposure: Exposure, n_slots: int) -> np.ndarray:
    """Per slot, the speed multiplier of its steps: `exposure.cta_speed` as given (one per
    slot), drawn from it with the exposure's seed (a measured sample of another length), or 1."""
    if exposure.cta_speed is None:
        return np.ones(n_slots)
    speed = np.asarray(exposure.cta_speed, np.float64)
    if speed.ndim != 1 or len(speed) == 0 or not np.all(np.isfinite(speed)) or (speed <= 0).any():
        raise ValueError("exposure.cta_speed must be a non-empty 1-D sequence of positive "
                         f"numbers, got {exposure.cta_speed!r}")
    if len(speed) == n_slots:
        return speed
    return np.random.default_rng(exposure.seed).choice(speed, size=n_slots, replace=True)


# ---------------------------------------------------------------------------------------------
# Calibration: a K/V step's compute time from launches that fit in the L2
# ---------------------------------------------------------------------------------------------

def variant_of(launch: Launch) -> tuple:
    """What a step's compute time depends on: head dim, tile shape, mask, CTAs per SM. (The
    kernel is schedule-neutral in the interleaved bench, so the CTA and K/V orders are not.)"""
    p = launch.problem
    return (p.head_dim, p.tile_m, p.tile_n, bool(p.causal), ctas_per_sm(launch))


def variant_label(variant: tuple) -> str:
    d, tm, tn, causal, per_sm = variant
    return f"D{d} {tm}x{tn} {'causal' if causal else 'non-causal'}, {per_sm} CTA/SM"


# Probe values for the linearisation (ns): large enough to dominate the memory latencies.
_PROBE_STEP_NS, _PROBE_ITEM_NS = 1000.0, 10000.0


def _time_terms(time_ns, launch: Launch, step_ns: float,
                item_ns: float) -> tuple[float, float, float]:
    """The kernel time `time_ns(launch, ComputeTiming)` about (step_ns, item_ns) as
    T0 + A*step_ns + B*item_ns, by finite differences: the time is nearly linear in the two
    compute costs once memory waits are small, which is what a training launch (its K/V in
    flight fits in the L2) is chosen for."""
    def at(step, item):
        return time_ns(launch, ComputeTiming(step, item, 0.0))
    base = at(step_ns, item_ns)
    a = (at(step_ns + _PROBE_STEP_NS, item_ns) - base) / _PROBE_STEP_NS
    b = (at(step_ns, item_ns + _PROBE_ITEM_NS) - base) / _PROBE_ITEM_NS
    return base - a * step_ns - b * item_ns, a, b


def fit_compute_costs(time_ns, launches: list[Launch], measured_ns,
                      rounds: int) -> tuple[dict, float, float, np.ndarray]:
    """Per-variant step time, one item cost and one launch cost that make
    `time_ns(launch, ComputeTiming)` meet the measured kernel times: non-negative least
    squares on relative error, the time linearised about the current estimate and refitted
    `rounds` times. -> (step by variant, item ns, launch ns, the fitted times). The timed
    model's calibration and the no-cache baseline's (`report.timed`) both fit so."""
    from scipy.optimize import nnls
    measured = np.asarray(measured_ns, np.float64)
    variants = sorted({variant_of(l) for l in launches})
    column = {v: i for i, v in enumerate(variants)}
    step = {v: 100.0 for v in variants}
    item, launch_ns = 1000.0, 0.0
    for _ in range(rounds):
        rows, rhs = [], []
        for launch, t in zip(launches, measured):
            v = variant_of(launch)
            t0, a, b = _time_terms(time_ns, launch, step[v], item)
            row = np.zeros(len(variants) + 2)
            row[column[v]], row[-2], row[-1] = a, b, 1.0  # step, item, launch
            rows.append(row / t)
            rhs.append((t - t0) / t)
        x, _ = nnls(np.array(rows), np.array(rhs))
        step = {v: float(x[column[v]]) for v in variants}
        item, launch_ns = float(x[-2]), float(x[-1])
    fitted = np.array([time_ns(l, ComputeTiming(step[variant_of(l)], item, launch_ns))
                       for l in launches])
    return step, item, launch_ns, fitted


@dataclass
class Calibration:
    """Compute timings of one GPU per kernel variant, fitted on named training launches."""

    gpu: str
    launch_ns: float
    item_ns: float
    step_ns: dict  # variant -> ns
    training: str  # what it was fitted on
    points: int
    errors: dict  # in-sample relative error of the fitted times (median, max)

    def compute(self, launch: Launch) -> ComputeTiming | None:
        """The variant's timing; a variant not trained falls back to the same tiles and mask
        at another CTAs-per-SM count, scaled by the CTAs sharing an SM; None if none."""
        v = variant_of(launch)
        step = self.step_ns.get(v)
        source = f"fitted on {self.training} ({variant_label(v)})"
        if step is None:
            near = [(k, s) for k, s in self.step_ns.items() if k[:4] == v[:4]]
            if near:
                k, s = min(near, key=lambda ks: abs(ks[0][4] - v[4]))
                step = s * v[4] / k[4]
                source = (f"fitted on {self.training} for {variant_label(k)}, scaled to "
                          f"{v[4]} CTA/SM")
        if step is None:  # tiles never calibrated: PROJECTED at the closest tiles' FLOP rate
            near = [(k, s) for k, s in self.step_ns.items() if k[0] == v[0] and k[3] == v[3]]
            if not near:
                return None
            k, s = min(near, key=lambda ks: (abs(np.log(ks[0][1] * ks[0][2] / (v[1] * v[2]))),
                                             abs(ks[0][4] - v[4])))
            step = s * (v[1] * v[2]) / (k[1] * k[2]) * v[4] / k[4]
            source = (f"PROJECTED (not calibrated): {variant_label(k)}'s step on "
                      f"{self.training} scaled by the tile's FLOPs to {variant_label(v)}")
        return ComputeTiming(step, self.item_ns, self.launch_ns, source)

    def as_dict(self) -> dict:
        """JSON-ready (paper/fits.json carries it; `from_dict` reads it back)."""
        return {"gpu": self.gpu, "launch_ns": self.launch_ns, "item_ns": self.item_ns,
                "step_ns": [{"variant": variant_label(k), "head_dim": k[0], "tile_m": k[1],
                             "tile_n": k[2], "causal": k[3], "ctas_per_sm": k[4], "ns": v}
                            for k, v in sorted(self.step_ns.items())],
                "training": self.training, "points": self.points, "errors": self.errors}

    @classmethod
    def from_dict(cls, d: dict, where: str = "calibration") -> "Calibration":
        """Read back `as_dict`; anything malformed (not a mapping, a missing key, a step list
        that is empty, has a zero or negative time, or names one variant twice) is a
        ValueError naming `where` (the file and entry) and the field."""
        def bad(field, expected):
            return ValueError(f"{where}: field {field!r} must be {expected}")
        if not isinstance(d, dict):
            raise bad("(entry)", f"a mapping of the calibration's fields, got "
                                 f"{type(d).__name__}")
        for key in ("gpu", "launch_ns", "item_ns", "step_ns", "training", "points", "errors"):
            if key not in d:
                raise bad(key, "present (missing)")
        for key in ("launch_ns", "item_ns"):
            value = d[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    np.isfinite(value) and value >= 0):
                raise bad(key, f"a finite number >= 0, got {value!r}")
        rows = d["step_ns"]
        if not isinstance(rows, list) or not rows:
            raise bad("step_ns", f"a non-empty list of per-variant steps, got {rows!r}")
        step = {}
        def whole(value) -> bool:  # JSON integers only: 64.7, "64", true are not sizes
            return isinstance(value, int) and not isinstance(value, bool) and value >= 1
        for i, r in enumerate(rows):
            try:
                sizes = [r[name] for name in ("head_dim", "tile_m", "tile_n", "ctas_per_sm")]
                if not all(whole(x) for x in sizes) or not isinstance(r["causal"], bool):
                    raise ValueError(f"integers >= 1 and a true/false causal, got {sizes} "
                                     f"causal={r['causal']!r}")
                key = (sizes[0], sizes[1], sizes[2], r["causal"], sizes[3])
                ns = float(r["ns"])
            except (KeyError, TypeError, ValueError) as exc:
                raise bad(f"step_ns[{i}]", "a mapping with head_dim, tile_m, tile_n, causal, "
                                           f"ctas_per_sm and ns ({exc.__class__.__name__}: "
                                           f"{exc})") from None
            if not np.isfinite(ns) or ns <= 0:
                raise bad(f"step_ns[{i}].ns", f"a finite time > 0 ns, got {r['ns']!r}")
            if key in step:
                raise bad(f"step_ns[{i}]", f"one entry per variant; {variant_label(key)} "
                                           "appears twice")
            step[key] = ns
        if not isinstance(d["errors"], dict):
            raise bad("errors", f"a mapping, got {d['errors']!r}")
        if isinstance(d["points"], bool) or not isinstance(d["points"], int) or d["points"] < 0:
            raise bad("points", f"a count of points >= 0, got {d['points']!r}")
        return cls(str(d["gpu"]), float(d["launch_ns"]), float(d["item_ns"]), step,
                   str(d["training"]), int(d["points"]), dict(d["errors"]))


def calibrate(gpu: str, launches: list[Launch], measured_ns, memory: MemoryTiming, *,
              l2_bytes: int, partitions: int, training: str, rounds: int = 2) -> Calibration:
    """Per-variant step time, one item cost and one launch cost for the GPU, by non-negative
    least squares on relative error over the training launches (their measured kernel times,
    `measured_ns`), the simulation linearised about the current estimate and refitted."""
    measured = np.asarray(measured_ns, np.float64)
    if len(launches) != len(measured) or len(measured) < 3:
        raise ValueError("calibrate needs at least 3 training launches, each with a time")

    def time_ns(launch, compute):
        return simulate_timed(launch, memory, compute, l2_bytes=l2_bytes,
                              partitions=partitions).kernel_ns
    step, item, launch_ns, fitted = fit_compute_costs(time_ns, launches, measured, rounds)
    err = np.abs(fitted - measured) / measured
    return Calibration(gpu, launch_ns, item, step, training, len(launches),
                       {"median": float(np.median(err)), "max": float(err.max())})


def memory_timing(gpu) -> MemoryTiming:
    """A GPU preset's memory system for the timed model (`presets.GPUSpec`; one latency for
    near and far L2 hits: the pointer chase saw no second mode on Hopper)."""
    if not gpu.l2_latency_ns or not gpu.dram_read_bytes_per_s:
        raise ValueError(f"the {gpu.name} preset has no memory timings for the timed model")
    sources = dict(gpu.sources)
    return MemoryTiming(gpu.l2_latency_ns, gpu.l2_latency_ns, gpu.dram_latency_ns,
                        gpu.dram_read_bytes_per_s,
                        "; ".join(f"{k}: {sources.get(k, '?')}" for k in
                                  ("l2_latency_ns", "dram_latency_ns", "dram_read_bytes_per_s")))


def projected_compute(calibration: Calibration, measured_on, gpu, launch: Launch,
                      fraction_of_peak: float | None = None) -> ComputeTiming:
    """A compute timing for a GPU nobody calibrated (`gpu`), from a calibrated one's
    (`calibration`, measured on preset `measured_on`): the same variant's step at the same
    fraction of each GPU's peak per SM, or at `fraction_of_peak` of `gpu`'s where given (the
    bounds of a prediction's interval)."""
    on_ref = replace_launch_sms(launch, measured_on.sms)
    ref = calibration.compute(on_ref)
    if ref is None:
        raise ValueError(f"no calibrated variant near {variant_label(variant_of(launch))}")
    p = launch.problem
    step_flops = 4.0 * p.tile_m * p.tile_n * p.head_dim
    per_sm = gpu.peak_bf16_flops / gpu.sms
    ref_fraction = step_flops * ctas_per_sm(on_ref) / (ref.step_ns * 1e-9) / (
        measured_on.peak_bf16_flops / measured_on.sms)
    fraction = fraction_of_peak or ref_fraction
    step = step_flops * ctas_per_sm(launch) / (fraction * per_sm) * 1e9
    return ComputeTiming(step, ref.item_ns, ref.launch_ns,
                         f"{fraction:.0%} of {gpu.name}'s peak per SM "
                         f"({'as calibrated on ' + measured_on.name if not fraction_of_peak else 'assumed'})")


def replace_launch_sms(launch: Launch, sms: int) -> Launch:
    """The same launch on a GPU of `sms` SMs (the CTAs it runs are kept)."""
    from dataclasses import replace
    return replace(launch, sms=sms)


# ---------------------------------------------------------------------------------------------
# The baseline a clock must beat: the same compute timings without any memory
# ---------------------------------------------------------------------------------------------

def no_cache_ns(launch: Launch, compute: ComputeTiming) -> float:
    """Kernel time with no memory system at all: launch + the busiest CTA's items x item cost
    + its K/V steps x step time. Static schedules give each CTA its rows (s, s + stride, ...);
    dynamic ones (and a grid's next CTA) hand the next row to the first CTA that frees up.
    The timed model earns its clock only where it beats this on time."""
    import heapq
    n_slots, dynamic = slots_of(launch)
    steps = item_steps(launch).astype(np.float64)
    cost = compute.item_ns + steps * compute.step_ns
    if not dynamic:
        stride = launch.num_ctas
        busiest = max(float(cost[s::stride].sum()) for s in range(min(stride, len(cost))))
        return compute.launch_ns + busiest
    free = [0.0] * min(n_slots, len(cost))
    heapq.heapify(free)
    for c in cost:
        heapq.heappush(free, heapq.heappop(free) + float(c))
    return compute.launch_ns + max(free)
