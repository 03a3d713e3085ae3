"""The L2 side of one launch, simulated on the CPU from the same schedule objects the kernel uses.

1. `trace_blocks`: the global L2 access stream of a launch at tile granularity, streamed in
   fixed-size blocks. Resident CTAs (SMs x CTAs per SM) advance one K/V step per round in
   lock-step; a finished CTA's slot takes its next work item (persistent: its own next item;
   grid: the next CTA in dispatch order). Optional jitter stalls a slot for a round with some
   probability. `access_trace` holds the whole stream in memory, for small launches.
2. `LruL2`: a fully associative LRU, or two partitions (a line lives in its home partition
   and gets a copy in each partition whose SMs read it: what the fabric counters show,
   paper/draft.md, the knee section), fed block by block
   in O(1) per access, predicting what the counters report: SM-side read lookups and hits,
   fabric lookups and hits, DRAM read sectors. This is how one capacity is answered.
3. `reuse_distances`: exact byte-weighted LRU stack distances, Bennett-Kruskal with a Fenwick
   tree, O(N log N), for miss curves over many capacities (`MissCurve`, fits);
   `ShardsSampler` is the SHARDS variant over a stream, for summaries of huge launches.

Each work item's coordinates and K/V order come from `Launch.work_table`, the very rows the
kernel reads. A dynamic CTA schedule's assignment is decided at run time; the rounds model it
as the next free slot taking the next row (with equally long items this is the grid-stride
assignment), each slot alternating on its own count where the kernel does (`Launch.alternate`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numba
import numpy as np

from wavefront.point import SECTOR_BYTES
from wavefront.schedules import (
    WORK_BATCH,
    WORK_CHUNK,
    WORK_HEAD,
    WORK_MASKED_HI,
    WORK_MASKED_LO,
    WORK_Q_TILE,
    WORK_SCAN_COUNT,
    WORK_SCAN_START,
    WORK_SCAN_STEP,
    Launch,
    positive_int,
)

# Access kinds. K and V are kinds 0 and 1 by construction: the trace builder adds k in range(2).
KIND_Q, KIND_O = 2, 3
KIND_PARTIAL_WRITE, KIND_PARTIAL_READ = 4, 5  # tiled schedule: fp32 partial states
WRITE_KINDS = (KIND_O, KIND_PARTIAL_WRITE)


@dataclass
class Trace:
    address: np.ndarray  # int64 tile id, dense enough to index arrays
    nbytes: np.ndarray  # int32 bytes of the tile
    kind: np.ndarray  # int8 KIND_*
    slot: np.ndarray  # int32 resident slot (~ SM) that issued it
    n_slots: int

    def __len__(self) -> int:
        return len(self.address)

    @property
    def is_read(self) -> np.ndarray:
        return ~np.isin(self.kind, WRITE_KINDS)


def _item_table(launch: Launch) -> np.ndarray:
    """The launch's work table (`wavefront.schedules.WORK_*` columns) as int64."""
    return launch.work_table.astype(np.int64)


def item_steps(launch: Launch) -> np.ndarray:
    """K/V tiles each work item of `launch` visits: its unmasked scan and its masked tiles."""
    table = _item_table(launch)
    return table[:, WORK_SCAN_COUNT] + table[:, WORK_MASKED_HI] - table[:, WORK_MASKED_LO]


# Generator state, carried between blocks: the round's next slot, whether the round saw an
# active slot, the next item to hand out (grid), whether the trace is finished.
_STATE_SLOT, _STATE_ACTIVE, _STATE_NEXT_ITEM, _STATE_DONE = range(4)
# The most accesses one slot emits per visit: Q, K, V, then O (or a partial write).
_MAX_PER_VISIT = 4


@numba.njit(cache=True)
def _seed(seed):
    np.random.seed(seed)


@numba.njit(cache=True)
def _lockstep_block(table, state, cur, step, taken, slot_stride, dynamic, alternate, n_slots,
                    n_items, batch, heads, kv_heads, q_tiles, kv_tiles, tile_m, tile_n,
                    seqlen_q, seqlen_kv, row_bytes, partial_row_bytes, tiled, jitter, address,
                    nbytes, kind, slot_of):
    """Fill the buffers with the next accesses of the lock-step rounds; returns how many.

    Resumable: `state`, `cur` (item in hand per slot) and `step` (K/V steps taken) carry the
    rounds across calls, so a launch streams through fixed-size buffers and no consumer needs
    the whole trace in memory.
    """
    qpk = heads // kv_heads
    n = 0
    limit = len(address) - _MAX_PER_VISIT
    while state[_STATE_DONE] == 0:
        s = state[_STATE_SLOT]
        if s == n_slots:  # end of a round
            if state[_STATE_ACTIVE] == 0:
                state[_STATE_DONE] = 1
                break
            state[_STATE_SLOT] = 0
            state[_STATE_ACTIVE] = 0
            continue
        if n > limit:
            break
        state[_STATE_SLOT] = s + 1
        it = cur[s]
        if it < 0:
            continue
        state[_STATE_ACTIVE] = 1
        if jitter > 0.0 and np.random.random() < jitter:
            continue
        b = table[it, WORK_BATCH]
        h = table[it, WORK_HEAD]
        qt = table[it, WORK_Q_TILE]
        scan = table[it, WORK_SCAN_COUNT]
        count = scan + table[it, WORK_MASKED_HI] - table[it, WORK_MASKED_LO]
        q_rows = min(tile_m, seqlen_q - qt * tile_m)
        q_index = (b * heads + h) * q_tiles + qt
        if step[s] == 0:
            address[n] = q_index * 8 + KIND_Q
            nbytes[n] = q_rows * row_bytes
            kind[n] = KIND_Q
            slot_of[n] = s
            n += 1
        if count > 0:
            t = step[s]
            if t < scan:
                start = table[it, WORK_SCAN_START]
                sign = table[it, WORK_SCAN_STEP]
                if alternate and taken[s] % 2 == 1:  # the kernel reverses the row's scan
                    start = start + sign * (scan - 1)
                    sign = -sign
                j = start + sign * t
            else:
                j = table[it, WORK_MASKED_LO] + t - scan
            unit = b * kv_heads + h // qpk
            kv_rows = min(tile_n, seqlen_kv - j * tile_n)
            for k in range(2):
                address[n] = (unit * kv_tiles + j) * 8 + k
                nbytes[n] = kv_rows * row_bytes
                kind[n] = k
                slot_of[n] = s
                n += 1
            step[s] += 1
        if step[s] >= count:
            if tiled:
                chunk = table[it, WORK_CHUNK]
                address[n] = ((chunk * batch * heads) * q_tiles + q_index) * 8 + 4
                nbytes[n] = q_rows * partial_row_bytes
                kind[n] = KIND_PARTIAL_WRITE
            else:
                address[n] = q_index * 8 + KIND_O
                nbytes[n] = q_rows * row_bytes
                kind[n] = KIND_O
            slot_of[n] = s
            n += 1
            step[s] = 0
            taken[s] += 1
            if dynamic:
                nxt = state[_STATE_NEXT_ITEM]
                if nxt < n_items:
                    cur[s] = nxt
                    state[_STATE_NEXT_ITEM] = nxt + 1
                else:
                    cur[s] = -1
            else:
                nxt = it + slot_stride
                cur[s] = nxt if nxt < n_items else -1
    return n


def _combine_pass(launch: Launch, n_slots: int):
    """The combine kernel: per (batch, head, Q tile), read every chunk's partial, write O."""
    p = launch.problem
    n_q = p.batch * p.heads * p.q_tiles
    chunks = launch.n_chunks
    q_index = np.repeat(np.arange(n_q, dtype=np.int64), chunks + 1)
    step = np.tile(np.arange(chunks + 1, dtype=np.int64), n_q)
    rows = np.minimum(p.tile_m, p.seqlen_q - (q_index % p.q_tiles) * p.tile_m)
    is_out = step == chunks
    partial_id = ((step * p.batch * p.heads) * p.q_tiles + q_index) * 8 + 4
    address = np.where(is_out, q_index * 8 + KIND_O, partial_id)
    row_bytes = p.head_dim * p.element_bytes
    nbytes = np.where(is_out, rows * row_bytes, rows * launch.partial_row_bytes).astype(np.int32)
    kind = np.where(is_out, KIND_O, KIND_PARTIAL_READ).astype(np.int8)
    slot = (q_index % n_slots).astype(np.int32)
    return address, nbytes, kind, slot


def address_bound(launch: Launch) -> int:
    """One past the largest tile id the launch's trace can hold (ids index the LRU's arrays)."""
    p = launch.problem
    q_ids = p.batch * p.heads * p.q_tiles * max(1, launch.n_chunks)
    return 8 * max(q_ids, p.kv_units * p.kv_tiles)


# Accesses per streamed block: 4 Mi accesses are ~70 MB of buffers, whatever the launch.
BLOCK_ACCESSES = 1 << 22


def slots_of(launch: Launch) -> tuple[int, bool]:
    """(CTAs in flight, whether the next row goes to the first CTA that frees up): a grid
    launch is dynamic too, the hardware giving the next CTA to the first free slot."""
    dynamic = bool(launch.cta.dynamic or not launch.cta.persistent)
    n_slots = min(launch.resident_ctas, launch.num_items) if dynamic else launch.num_ctas
    return max(1, int(n_slots)), dynamic


def trace_blocks(launch: Launch, *, jitter: float = 0.0, seed: int = 0,
                 block_accesses: int = BLOCK_ACCESSES) -> Iterator[Trace]:
    """The L2 access stream of one launch (tile granularity) in lock-step rounds, as blocks of
    at most `block_accesses`. A block's arrays are reused for the next one: copy what must
    outlive the iteration. For the tiled schedule the combine kernel's reads follow."""
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
    positive_int("block_accesses", block_accesses)
    n_slots, dynamic = slots_of(launch)
    yield from _blocks(launch, n_slots, dynamic, bool(launch.alternate), jitter, seed,
                       block_accesses)


def _blocks(launch: Launch, n_slots: int, dynamic: bool, alternate: bool, jitter: float,
            seed: int, block_accesses: int) -> Iterator[Trace]:
    p = launch.problem
    table = _item_table(launch)
    n_items = launch.num_items
    tiled = launch.kv.writes_partials
    state = np.zeros(4, np.int64)
    cur = np.full(n_slots, -1, np.int64)
    cur[:min(n_slots, n_items)] = np.arange(min(n_slots, n_items))
    state[_STATE_NEXT_ITEM] = min(n_slots, n_items) if dynamic else 0
    step = np.zeros(n_slots, np.int64)
    taken = np.zeros(n_slots, np.int64)
    size = max(block_accesses, 2 * _MAX_PER_VISIT)
    buffers = (np.empty(size, np.int64), np.empty(size, np.int32), np.empty(size, np.int8),
               np.empty(size, np.int32))
    _seed(int(seed))
    while not state[_STATE_DONE]:
        n = _lockstep_block(
            table, state, cur, step, taken, launch.num_ctas, dynamic, alternate, n_slots,
            n_items, p.batch,
            p.heads, p.kv_heads, p.q_tiles, p.kv_tiles, p.tile_m, p.tile_n, p.seqlen_q,
            p.seqlen_kv, p.head_dim * p.element_bytes, launch.partial_row_bytes, tiled,
            float(jitter), *buffers)
        if n:
            yield Trace(*(b[:n] for b in buffers), n_slots)
    if tiled:
        combine = _combine_pass(launch, n_slots)
        for lo in range(0, len(combine[0]), size):
            yield Trace(*(a[lo:lo + size] for a in combine), n_slots)


def access_trace(launch: Launch, *, jitter: float = 0.0, seed: int = 0) -> Trace:
    """The whole access stream of one launch in memory (see `trace_blocks`)."""
    blocks = [Trace(*(np.array(a) for a in (b.address, b.nbytes, b.kind, b.slot)), b.n_slots)
              for b in trace_blocks(launch, jitter=jitter, seed=seed)]
    if not blocks:
        return Trace(np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int8),
                     np.empty(0, np.int32), 1)
    return Trace(*(np.concatenate(parts) for parts in zip(
        *((b.address, b.nbytes, b.kind, b.slot) for b in blocks))), blocks[0].n_slots)


# ---------------------------------------------------------------------------------------------
# Timed work items: a measured order, or a drift model, instead of lock-step rounds
# ---------------------------------------------------------------------------------------------

def timed_trace(launch: Launch, start, end) -> Trace:
    """The launch's accesses when work item i runs from `start[i]` to `end[i]` (any monotone
    clock: the kernel's RECORD_ORDER tickets, or `drift_item_times`): an item reads its Q at
    its start, its K/V steps evenly spaced in between, and writes its output at its end; the
    items' streams are merged by time. The combine pass of the tiled schedule follows."""
    start = np.asarray(start, np.float64)
    end = np.asarray(end, np.float64)
    n_items = launch.num_items
    if start.shape != (n_items,) or end.shape != (n_items,):
        raise ValueError(f"start and end need one time per work item ({n_items}), got shapes "
                         f"{start.shape} and {end.shape}")
    if not (end >= start).all():
        raise ValueError("every work item must end no earlier than it starts")
    # One slot running the items one after another emits each item's accesses contiguously,
    # from the same generator as the lock-step rounds. (A dynamic sawtooth's directions depend
    # on which CTA took which item, which tickets do not say: its rows are replayed forward.)
    parts = [(b.address.copy(), b.nbytes.copy(), b.kind.copy())
             for b in _blocks(launch, 1, True, False, 0.0, 0, BLOCK_ACCESSES)]
    address, nbytes, kind = (np.concatenate(p) for p in zip(*parts))
    steps = item_steps(launch)
    per_item = 2 + 2 * steps  # Q, K and V of each step, then O (or the partial state)
    main = int(per_item.sum())
    item = np.repeat(np.arange(n_items), per_item)
    within = np.arange(main) - np.repeat(np.cumsum(per_item) - per_item, per_item)
    # position 0: Q (t = 0); 1 + 2k, 2 + 2k: K/V step k (t = (k + 0.5) / steps); last: O (t = 1)
    k_step = (within - 1) // 2
    frac = np.where(within == 0, 0.0,
                    np.where(within == per_item[item] - 1, 1.0,
                             (k_step + 0.5) / np.maximum(steps[item], 1)))
    time = start[item] + frac * (end[item] - start[item])
    order = np.argsort(time, kind="stable")
    slot = _slot_of_item(launch)[item]
    out = [address[:main][order], nbytes[:main][order], kind[:main][order], slot[order]]
    if len(address) > main:  # the tiled schedule's combine pass
        n_slots = _slot_of_item(launch).max() + 1
        combine = _combine_pass(launch, int(n_slots))
        out = [np.concatenate([a, c]) for a, c in zip(out, combine)]
    return Trace(*out, int(_slot_of_item(launch).max()) + 1)


def _slot_of_item(launch: Launch) -> np.ndarray:
    """The CTA slot (~ SM) of each work item: persistent CTA c takes c, c+P, ...; a grid
    launch's CTA i lands on slot i mod resident CTAs (dispatch order, approximately)."""
    static = launch.cta.persistent and not launch.cta.dynamic
    stride = launch.num_ctas if static else min(launch.resident_ctas,
                                                               launch.num_items)
    return (np.arange(launch.num_items) % stride).astype(np.int32)


@dataclass(frozen=True)
class DriftModel:
    """CTAs that drift apart, with physical parameters: each slot (~ SM) runs at its own rate,
    normal with relative spread `rate_spread`, and starts after a uniform delay of up to
    `start_skew` K/V steps. A work item costs its K/V steps plus `item_overhead` (Q load,
    epilogue). Zero spread and skew is lock-step with every slot in step."""

    rate_spread: float
    start_skew: float
    item_overhead: float = 1.0

    def item_times(self, launch: Launch, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of every work item, in K/V steps of a mean-rate slot."""
        import heapq
        rng = np.random.default_rng(seed)
        steps = item_steps(launch).astype(np.float64)
        n_items = launch.num_items
        n_slots = int(_slot_of_item(launch).max()) + 1
        rate = np.clip(1.0 + self.rate_spread * rng.standard_normal(n_slots), 0.2, None)
        ready = self.start_skew * rng.random(n_slots)
        cost = steps + self.item_overhead
        start = np.empty(n_items)
        end = np.empty(n_items)
        if launch.cta.persistent and not launch.cta.dynamic:
            for s in range(n_slots):
                items = np.arange(s, n_items, n_slots)
                finish = ready[s] + np.cumsum(cost[items] / rate[s])
                end[items] = finish
                start[items] = finish - cost[items] / rate[s]
        else:  # grid or dynamic: the next item goes to the first slot that frees up
            heap = [(ready[s], s) for s in range(n_slots)]
            heapq.heapify(heap)
            for i in range(n_items):
                t, s = heapq.heappop(heap)
                start[i], end[i] = t, t + cost[i] / rate[s]
                heapq.heappush(heap, (end[i], s))
        return start, end

    # The grid `fit` searches: relative rate spreads, and start skews in K/V steps.
    RATE_SPREADS = (0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
    START_SKEWS = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0)

    @classmethod
    def fit(cls, launch: Launch, orders, seeds: int = 2) -> "DriftModel":
        """The parameters whose simulated orders look most like the measured ones.

        Tickets count events, not time, so the parameters are matched on order alone:
        `order_lag` (how far each round's items have spread apart in the order, over the launch)
        of the model against that of each measured (start, end) in `orders`, least squares
        over the grid RATE_SPREADS x START_SKEWS, averaged over a few seeds."""
        target = np.mean([order_lag(launch, s) for s, _ in orders], axis=0)
        best, best_loss = None, np.inf
        for spread in cls.RATE_SPREADS:
            for skew in cls.START_SKEWS:
                model = cls(spread, skew)
                lag = np.mean([order_lag(launch, model.item_times(launch, seed)[0])
                               for seed in range(seeds)], axis=0)
                loss = float(((lag - target) ** 2).sum())
                if loss < best_loss:
                    best, best_loss = model, loss
        return best


def order_lag(launch: Launch, start, parts: int = 4) -> np.ndarray:
    """How far apart the work items of one round run: each item's start rank (0..1) minus the
    median start rank of its round (its slot's local iteration), mean absolute value over each
    of `parts` consecutive spans of rounds. Lock-step gives ~0 everywhere; CTAs that drift apart
    give values that grow over the launch."""
    start = np.asarray(start, np.float64)
    n = len(start)
    rank = np.empty(n)
    rank[np.argsort(start, kind="stable")] = np.arange(n) / max(1, n - 1)
    slots = int(_slot_of_item(launch).max()) + 1
    rounds = np.arange(n) // slots
    med = np.array([np.median(rank[rounds == r]) for r in range(rounds.max() + 1)])
    lag = np.abs(rank - med[rounds])
    span = np.minimum(rounds * parts // (rounds.max() + 1), parts - 1)
    return np.array([lag[span == k].mean() if (span == k).any() else 0.0
                     for k in range(parts)])


# ---------------------------------------------------------------------------------------------
# Reuse distance
# ---------------------------------------------------------------------------------------------

COLD = -1  # distance of a first access


@numba.njit(cache=True)
def _stack_distances(address, nbytes, n_ids):
    """Byte-weighted LRU stack distance of every access (bytes of distinct other data touched
    since the previous access to the same tile), COLD for first accesses. Bennett-Kruskal: a
    Fenwick tree over time holds each tile's size at its latest access time."""
    n = len(address)
    tree = np.zeros(n + 1, np.int64)
    last = np.full(n_ids, -1, np.int64)
    out = np.empty(n, np.int64)
    total = 0  # sum of the tree
    for t in range(n):
        a = address[t]
        w = nbytes[t]
        prev = last[a]
        if prev < 0:
            out[t] = COLD
        else:
            # bytes at positions (prev, t): total - prefix(prev)
            i = prev + 1
            pref = 0
            while i > 0:
                pref += tree[i]
                i -= i & (-i)
            out[t] = total - pref
            i = prev + 1
            while i <= n:
                tree[i] -= w
                i += i & (-i)
            total -= w
        i = t + 1
        while i <= n:
            tree[i] += w
            i += i & (-i)
        total += w
        last[a] = t
    return out


def reuse_distances(trace: Trace) -> np.ndarray:
    """Exact LRU stack distance (bytes) per access; COLD (-1) for first accesses."""
    if len(trace) == 0:
        return np.empty(0, np.int64)
    return _stack_distances(trace.address, trace.nbytes, int(trace.address.max()) + 1)


def _hash64(x: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser: spreads structured tile ids before sampling.
    z = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _shards_mask(address: np.ndarray, threshold: int, modulus: int) -> np.ndarray:
    """SHARDS keeps a tile's every access or none: hash(tile) mod P < T."""
    return (_hash64(address) % np.uint64(modulus)) < np.uint64(threshold)


def sampled_reuse_distances(trace: Trace, rate: float = 0.01, modulus: int = 1 << 24):
    """SHARDS: keep tiles with hash(tile) mod P < T (T/P = rate), scale distances by P/T.

    Returns (distances of the sampled accesses, mask of the sampled accesses, scale). Each
    sampled access stands for 1/rate accesses.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"rate must be in (0, 1], got {rate!r}")
    threshold = max(1, int(rate * modulus))
    mask = _shards_mask(trace.address, threshold, modulus)
    scale = modulus / threshold
    sub = Trace(trace.address[mask], trace.nbytes[mask], trace.kind[mask], trace.slot[mask],
                trace.n_slots)
    d = reuse_distances(sub)
    d = np.where(d == COLD, COLD, (d * scale).astype(np.int64))
    return d, mask, scale


class ShardsSampler:
    """SHARDS over a streamed trace: keeps the accesses whose tile hashes under the rate, so a
    launch of any length leaves a sample of about `rate` x its accesses; `distances()` are the
    sample's stack distances scaled back to the whole trace (rate 1: exact)."""

    def __init__(self, rate: float = 1.0, modulus: int = 1 << 24):
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {rate!r}")
        self.modulus = modulus
        self.threshold = max(1, int(rate * modulus))
        self.scale = modulus / self.threshold
        self._parts: list[tuple[np.ndarray, ...]] = []

    def feed(self, trace: Trace) -> "ShardsSampler":
        keep = (slice(None) if self.threshold >= self.modulus
                else _shards_mask(trace.address, self.threshold, self.modulus))
        self._parts.append((trace.address[keep].copy(), trace.nbytes[keep].copy(),
                            trace.kind[keep].copy()))
        return self

    def sample(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scaled stack distances, bytes, is-read) of the sampled accesses."""
        if not self._parts:
            return np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, bool)
        address, nbytes, kind = (np.concatenate(p) for p in zip(*self._parts))
        self._parts = [(address, nbytes, kind)]
        d = (_stack_distances(address, nbytes, int(address.max()) + 1) if len(address)
             else np.empty(0, np.int64))
        if self.scale != 1.0:
            d = np.where(d == COLD, COLD, (d * self.scale).astype(np.int64))
        return d, nbytes, ~np.isin(kind, WRITE_KINDS)


class MissCurve:
    """Bytes that miss in a fully associative LRU as a function of its capacity, for one trace's
    reuse distances: sorted once, then any number of capacities cost a binary search each.

    An access hits iff the distinct data touched since its last use plus itself fits.
    """

    def __init__(self, distances: np.ndarray, nbytes: np.ndarray):
        need = np.where(distances == COLD, np.inf, distances + nbytes).astype(np.float64)
        order = np.argsort(need, kind="stable")
        need = need[order]
        cum = np.cumsum(nbytes[order], dtype=np.float64)
        # Kept per distinct need, not per access: a capacity's hits are the cumulative bytes
        # after the last access with that need, the same numbers, in a few thousand entries
        # instead of one per access (a long launch's curve held 270 MB).
        last = np.flatnonzero(np.append(need[1:] != need[:-1], len(need) > 0))
        self._need = need[last]
        self._cum = np.concatenate([[0.0], cum[last]])

    @property
    def total_bytes(self) -> float:
        return float(self._cum[-1])

    def miss_bytes(self, capacity):
        hits = self._cum[np.searchsorted(self._need, capacity, side="right")]
        return self._cum[-1] - hits


def miss_ratio_curve(distances: np.ndarray, nbytes: np.ndarray, capacities) -> np.ndarray:
    """Fraction of accessed bytes that miss in a fully associative LRU of each capacity."""
    curve = MissCurve(distances, nbytes)
    return curve.miss_bytes(np.asarray(capacities, dtype=np.float64)) / curve.total_bytes


def miss_bytes_at(distances: np.ndarray, nbytes: np.ndarray, capacity: float) -> float:
    return float(MissCurve(distances, nbytes).miss_bytes(capacity))


# ---------------------------------------------------------------------------------------------
# L2 simulator
# ---------------------------------------------------------------------------------------------

@numba.njit(cache=True, inline="always")
def lru_touch(q, a, w, capacity, prev, nxt, present, size, head, tail, used):
    """The LRU's one rule, for partition q's list over tile ids: line `a` (`w` bytes) goes to
    the head (unlinked first if present, else allocated), then the tail is evicted until the
    partition's bytes fit `capacity` (never the line just touched)."""
    size[a] = w
    if present[q, a]:  # unlink, then relink at the head
        if prev[q, a] >= 0:
            nxt[q, prev[q, a]] = nxt[q, a]
        else:
            head[q] = nxt[q, a]
        if nxt[q, a] >= 0:
            prev[q, nxt[q, a]] = prev[q, a]
        else:
            tail[q] = prev[q, a]
    else:
        present[q, a] = True
        used[q] += w
    prev[q, a] = -1
    nxt[q, a] = head[q]
    if head[q] >= 0:
        prev[q, head[q]] = a
    head[q] = a
    if tail[q] < 0:
        tail[q] = a
    while used[q] > capacity and tail[q] >= 0 and tail[q] != a:
        victim = tail[q]
        tail[q] = prev[q, victim]
        if tail[q] >= 0:
            nxt[q, tail[q]] = -1
        else:
            head[q] = -1
        present[q, victim] = False
        used[q] -= size[victim]


@numba.njit(cache=True)
def _lru_feed(address, nbytes, is_read_access, part_of_access, home_of_id, capacity, prev, nxt,
              present, size, head, tail, used, counts):
    """Per-partition LRU caches (doubly linked lists over tile ids), byte capacity each.

    Resumable: the lists (`prev`, `nxt`, `present`, `head`, `tail`, `used`) and the byte
    counts (tex reads, tex read hits, fabric reads, fabric read hits, DRAM reads) carry over
    between calls, so a launch can be fed block by block. O(1) per access.
    """
    targets = np.empty(2, np.int64)
    for t in range(len(address)):
        a = address[t]
        w = nbytes[t]
        size[a] = w
        p = part_of_access[t]
        home = home_of_id[a]
        is_read = is_read_access[t]
        if is_read:
            counts[0] += w
        n_targets = 0
        if present[p, a]:
            if is_read:
                counts[1] += w
            targets[0] = p
            n_targets = 1
        elif not is_read:
            targets[0] = home  # a write allocates at home
            n_targets = 1
        elif home == p:
            counts[4] += w
            targets[0] = p
            n_targets = 1
        else:
            counts[2] += w
            if present[home, a]:
                counts[3] += w
            else:
                counts[4] += w
            targets[0] = home
            targets[1] = p
            n_targets = 2
        for k in range(n_targets):
            lru_touch(targets[k], a, w, capacity, prev, nxt, present, size, head, tail, used)


class LruL2:
    """An LRU L2 of `capacity_bytes` in total over `partitions` (1 or 2), fed a trace block by
    block (`feed`), O(1) per access: the linear-time answer for one capacity.

    With two partitions a slot runs on SM (slot mod SMs), SMs alternate between partitions, a
    tile's home partition is a hash of its address, and a read from the far partition leaves a
    copy near the reader (the fabric counters agree: paper/draft.md, the knee section).
    """

    def __init__(self, capacity_bytes: float, n_ids: int, *, partitions: int = 1,
                 sms: int | None = None):
        if partitions not in (1, 2):
            raise ValueError(f"partitions must be 1 or 2, got {partitions!r}")
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes!r}")
        if partitions == 2 and not sms:
            raise ValueError("sms (the GPU's SM count) is needed to place slots on partitions")
        self.partitions, self.sms = partitions, sms
        self.capacity = int(capacity_bytes // partitions)
        n_ids = max(1, int(n_ids))
        self._prev = np.full((partitions, n_ids), -1, np.int64)
        self._nxt = np.full((partitions, n_ids), -1, np.int64)
        self._present = np.zeros((partitions, n_ids), np.bool_)
        self._size = np.zeros(n_ids, np.int64)
        self._head = np.full(partitions, -1, np.int64)
        self._tail = np.full(partitions, -1, np.int64)
        self._used = np.zeros(partitions, np.int64)
        self._counts = np.zeros(5, np.int64)
        self._home = (np.zeros(n_ids, np.int64) if partitions == 1 else
                      (_hash64(np.arange(n_ids)) % np.uint64(2)).astype(np.int64))

    def feed(self, trace: Trace) -> "LruL2":
        if len(trace) == 0:
            return self
        if self.partitions == 1:
            part = np.zeros(len(trace), np.int64)
        else:
            part = ((trace.slot % self.sms) % 2).astype(np.int64)
        _lru_feed(trace.address, trace.nbytes.astype(np.int64), trace.is_read, part,
                  self._home, self.capacity, self._prev, self._nxt, self._present, self._size,
                  self._head, self._tail, self._used, self._counts)
        return self

    def result(self) -> "L2Prediction":
        return L2Prediction(*(int(c) // SECTOR_BYTES for c in self._counts))


@numba.njit(cache=True)
def _random_feed(address, nbytes, is_read_access, capacity, slot_of_id, resident, size,
                 state, counts):
    """A fully associative cache with random replacement: the resident tiles in a dense
    array (`resident`, `slot_of_id` its inverse), a uniformly random other tile evicted while
    over capacity. state = [resident count, bytes used, rng state]. Resumable like `_lru_feed`;
    counts as there (no partitions: fabric counts stay 0)."""
    for t in range(len(address)):
        a = address[t]
        w = nbytes[t]
        size[a] = w
        if is_read_access[t]:
            counts[0] += w
        if slot_of_id[a] >= 0:
            if is_read_access[t]:
                counts[1] += w
            continue
        if is_read_access[t]:
            counts[4] += w
        slot_of_id[a] = state[0]
        resident[state[0]] = a
        state[0] += 1
        state[1] += w
        while state[1] > capacity and state[0] > 1:
            # xorshift64: a fixed, seedable stream inside numba
            x = state[2]
            x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
            x ^= x >> 7
            x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
            state[2] = x
            k = x % state[0]
            victim = resident[k]
            if victim == a:
                continue
            last = resident[state[0] - 1]
            resident[k] = last
            slot_of_id[last] = k
            slot_of_id[victim] = -1
            state[0] -= 1
            state[1] -= size[victim]


class RandomL2:
    """The soft-cliff alternative to `LruL2`: one fully associative cache of `capacity_bytes`
    with random replacement (a cyclic scan slightly larger than the cache still hits in part,
    where LRU hits nothing). Same `feed` / `result` interface."""

    def __init__(self, capacity_bytes: float, n_ids: int, *, seed: int = 1):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes!r}")
        n_ids = max(1, int(n_ids))
        self.capacity = int(capacity_bytes)
        self._slot_of_id = np.full(n_ids, -1, np.int64)
        self._resident = np.zeros(n_ids, np.int64)
        self._size = np.zeros(n_ids, np.int64)
        self._state = np.array([0, 0, (0x2545F4914F6CDD1D * (seed + 1)) & 0x7FFFFFFFFFFFFFFF],
                               dtype=np.int64)
        self._counts = np.zeros(5, np.int64)

    def feed(self, trace: "Trace") -> "RandomL2":
        if len(trace):
            _random_feed(trace.address, trace.nbytes.astype(np.int64), trace.is_read,
                         self.capacity, self._slot_of_id, self._resident, self._size,
                         self._state, self._counts)
        return self

    def result(self) -> "L2Prediction":
        return L2Prediction(*(int(c) // SECTOR_BYTES for c in self._counts))


@dataclass(frozen=True)
class L2Prediction:
    tex_read_sectors: int
    tex_read_hit_sectors: int
    fabric_read_sectors: int
    fabric_read_hit_sectors: int
    dram_read_sectors: int

    @property
    def read_miss_sectors(self) -> int:
        return self.dram_read_sectors

    @property
    def sm_hit_rate(self) -> float:
        return 1.0 - self.dram_read_sectors / max(1, self.tex_read_sectors)


def simulate_l2(trace: Trace, capacity_bytes: float, *, partitions: int = 1,
                sms: int | None = None) -> L2Prediction:
    """LRU L2 of `capacity_bytes` in total, split over `partitions` (1 or 2); see `LruL2`."""
    n_ids = int(trace.address.max()) + 1 if len(trace) else 1
    return LruL2(capacity_bytes, n_ids, partitions=partitions, sms=sms).feed(trace).result()


# The simulator streams the trace, so its memory follows the launch's shape, not its length:
# bytes per work item (the item table), per tile id (LRU lists, per partition, and sizes), and
# a fixed part (stream buffers, the SHARDS sample). Launches past MAX_ACCESSES would take hours.
BYTES_PER_ITEM = 7 * 8
BYTES_PER_ID = 2 * (8 + 8 + 1) + 8 + 8
FIXED_BYTES = 256 << 20
MAX_ACCESSES = 10**11


def memory_estimate(launch: Launch) -> int:
    return launch.num_items * BYTES_PER_ITEM + address_bound(launch) * BYTES_PER_ID + FIXED_BYTES


def access_upper_bound(launch: Launch) -> int:
    """At most this many tile accesses: every item visits every K/V tile of its chunk (K and V),
    plus its Q and O; computed without enumerating the items."""
    return 2 * launch.num_items * (min(launch.chunk_tiles, launch.problem.kv_tiles) + 1)


def available_memory_bytes() -> int:
    """What this process may still allocate: the machine's free memory, capped by the process's
    own limits (address space and data segment, `ulimit -v` / `-d`) and its control group's
    (a container's or a batch job's memory limit), each less what is already in use."""
    limits = []
    try:
        limits.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import resource
        in_use = _process_virtual_bytes()
        for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
            soft, _ = resource.getrlimit(which)
            if soft != resource.RLIM_INFINITY and soft > 0:
                limits.append(max(0, soft - in_use))
    except (ImportError, ValueError, OSError):
        pass
    cgroup = _cgroup_headroom_bytes()
    if cgroup is not None:
        limits.append(cgroup)
    return min(limits) if limits else 8 << 30


def _process_virtual_bytes() -> int:
    """The address space this process maps now (what RLIMIT_AS counts); 0 where unknown."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def _cgroup_headroom_bytes(root: str = "/sys/fs/cgroup") -> int | None:
    """Limit less usage of this process's memory control group (v2, else v1); None: no limit."""
    for limit_name, usage_name in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes",
                                    "memory/memory.usage_in_bytes")):
        try:
            limit = Path(root, limit_name).read_text().strip()
            usage = int(Path(root, usage_name).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None  # v1 reports "no limit" as a huge number
        return max(0, int(limit) - usage)
    return None


def check_simulable(launch: Launch, memory_bytes: int | None = None) -> None:
    """Refuse, before allocating anything, a launch that cannot be held in memory or would
    take hours."""
    memory = memory_bytes or available_memory_bytes()
    need = memory_estimate(launch)
    accesses = access_upper_bound(launch)
    if accesses > MAX_ACCESSES:
        raise ValueError(f"this launch has up to {accesses:.3g} tile accesses, more than the "
                         f"{MAX_ACCESSES:.0e} the simulator takes (about an hour): shorten "
                         "seqlen or batch x heads")
    if need > 0.8 * memory:
        raise ValueError(f"this launch has {launch.num_items:.3g} work items and "
                         f"{address_bound(launch):.3g} tile ids (~{need / 2**30:.1f} GiB to "
                         f"simulate), more than 80% of the {memory / 2**30:.1f} GiB of memory "
                         "available: shorten seqlen or batch x heads")


# ---------------------------------------------------------------------------------------------
# Open traces
# ---------------------------------------------------------------------------------------------

# libCacheSim's oracleGeneral binary format: one packed little-endian record per request,
# (uint32 clock time, uint64 object id, uint32 object size, int64 next access, -1 if none).
ORACLE_GENERAL = np.dtype([("clock", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"),
                           ("next_access", "<i8")])


def next_access(address: np.ndarray) -> np.ndarray:
    """For every access, the index of the next access to the same object (-1 if none)."""
    n = len(address)
    out = np.full(n, -1, np.int64)
    order = np.lexsort((np.arange(n), address))  # by object, then by time
    same = address[order[1:]] == address[order[:-1]]
    out[order[:-1][same]] = order[1:][same]
    return out


def write_oracle_general(trace: Trace, path, *, reads_only: bool = True) -> int:
    """Write the trace (its reads by default: what the L2 misses on) as oracleGeneral for other
    cache tools; the clock is the access index. Returns the number of records."""
    keep = trace.is_read if reads_only else np.ones(len(trace), bool)
    address = trace.address[keep]
    rec = np.empty(len(address), ORACLE_GENERAL)
    rec["clock"] = np.arange(len(address), dtype=np.uint32)
    rec["obj_id"] = address.astype(np.uint64)
    rec["obj_size"] = trace.nbytes[keep].astype(np.uint32)
    rec["next_access"] = next_access(address)
    rec.tofile(path)
    return len(rec)


def read_oracle_general(path) -> np.ndarray:
    return np.fromfile(path, dtype=ORACLE_GENERAL)
