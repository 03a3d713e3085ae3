"""The L2 side of one launch, simulated on the CPU from the same schedule objects the kernel uses.

1. `access_trace`: the global L2 access stream of a launch at tile granularity. Resident CTAs
   (SMs x CTAs per SM) advance one K/V step per round in lock-step; a finished CTA's slot takes
   its next work item (persistent: its own next item; grid: the next CTA in dispatch order).
   Optional jitter stalls a slot for a round with some probability.
2. `reuse_distances`: exact byte-weighted LRU stack distances, Bennett-Kruskal with a Fenwick
   tree, O(N log N) in numba; `sampled_reuse_distances` is the SHARDS variant for huge traces.
3. `simulate_l2`: a fully associative LRU, or two partitions (a line lives in its home partition
   and gets a copy in each partition whose SMs read it; BRIEF section 3), predicting the
   quantities the counters report: SM-side read lookups and hits, fabric lookups and hits, DRAM
   read sectors.

The per-item mapping comes from `Launch.item_plan`, i.e. from `wavefront.schedules`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numba
import numpy as np

from wavefront.point import SECTOR_BYTES
from wavefront.schedules import KV_TILED, Launch

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
    """Per work item: batch, head, q_tile, first K/V tile, tiles, backward, chunk."""
    n = launch.num_items
    table = np.empty((n, 7), dtype=np.int64)
    for item in range(n):
        b, h, qt, chunk, _, first, count, backward = launch.item_plan(item)
        table[item] = (b, h, qt, first, count, backward, chunk)
    return table


@numba.njit(cache=True)
def _lockstep(table, slot_stride, dynamic, n_slots, n_items, batch, heads, kv_heads, q_tiles,
              kv_tiles, tile_m, tile_n, seqlen_q, seqlen_kv, row_bytes, partial_row_bytes,
              tiled, jitter, seed, total):
    address = np.empty(total, np.int64)
    nbytes = np.empty(total, np.int32)
    kind = np.empty(total, np.int8)
    slot_of = np.empty(total, np.int32)
    np.random.seed(seed)
    cur = np.full(n_slots, -1, np.int64)  # work item in hand
    step = np.zeros(n_slots, np.int64)
    next_item = 0
    for s in range(n_slots):
        if dynamic:
            if next_item < n_items:
                cur[s] = next_item
                next_item += 1
        elif s < n_items:
            cur[s] = s
    qpk = heads // kv_heads
    n = 0
    active = True
    while active:
        active = False
        for s in range(n_slots):
            it = cur[s]
            if it < 0:
                continue
            active = True
            if jitter > 0.0 and np.random.random() < jitter:
                continue
            b = table[it, 0]
            h = table[it, 1]
            qt = table[it, 2]
            first = table[it, 3]
            count = table[it, 4]
            backward = table[it, 5]
            q_rows = min(tile_m, seqlen_q - qt * tile_m)
            q_index = (b * heads + h) * q_tiles + qt
            if step[s] == 0:
                address[n] = q_index * 8 + KIND_Q
                nbytes[n] = q_rows * row_bytes
                kind[n] = KIND_Q
                slot_of[n] = s
                n += 1
            if count > 0:
                j = first + step[s]
                if backward == 1:
                    j = first + count - 1 - step[s]
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
                    chunk = table[it, 6]
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
                if dynamic:
                    if next_item < n_items:
                        cur[s] = next_item
                        next_item += 1
                    else:
                        cur[s] = -1
                else:
                    nxt = it + slot_stride
                    cur[s] = nxt if nxt < n_items else -1
    return address[:n], nbytes[:n], kind[:n], slot_of[:n]


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
    nbytes = np.where(is_out, rows * row_bytes, rows * (p.head_dim * 4 + 8)).astype(np.int32)
    kind = np.where(is_out, KIND_O, KIND_PARTIAL_READ).astype(np.int8)
    slot = (q_index % n_slots).astype(np.int32)
    return address, nbytes, kind, slot


def access_trace(launch: Launch, *, jitter: float = 0.0, seed: int = 0) -> Trace:
    """The L2 access stream of one launch (tile granularity), in lock-step rounds.

    For the tiled schedule the combine kernel's reads of the partial states follow.
    """
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
    p = launch.problem
    table = _item_table(launch)
    n_items = launch.num_items
    total = int(2 * table[:, 4].sum() + 2 * n_items)
    dynamic = not launch.cta.persistent
    n_slots = min(launch.resident_ctas, n_items) if dynamic else launch.num_ctas
    tiled = launch.kv.code == KV_TILED
    address, nbytes, kind, slot = _lockstep(
        table, launch.num_ctas, dynamic, n_slots, n_items, p.batch, p.heads, p.kv_heads,
        p.q_tiles, p.kv_tiles, p.tile_m, p.tile_n, p.seqlen_q, p.seqlen_kv,
        p.head_dim * p.element_bytes, p.head_dim * 4 + 8, tiled, float(jitter), int(seed),
        total)
    if tiled:
        parts = _combine_pass(launch, n_slots)
        address, nbytes, kind, slot = (np.concatenate([a, b]) for a, b in
                                       zip((address, nbytes, kind, slot), parts))
    return Trace(address, nbytes, kind, slot, n_slots)


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


def sampled_reuse_distances(trace: Trace, rate: float = 0.01, modulus: int = 1 << 24):
    """SHARDS: keep tiles with hash(tile) mod P < T (T/P = rate), scale distances by P/T.

    Returns (distances of the sampled accesses, mask of the sampled accesses, scale). Each
    sampled access stands for 1/rate accesses.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"rate must be in (0, 1], got {rate!r}")
    threshold = max(1, int(rate * modulus))
    mask = (_hash64(trace.address) % np.uint64(modulus)) < np.uint64(threshold)
    scale = modulus / threshold
    sub = Trace(trace.address[mask], trace.nbytes[mask], trace.kind[mask], trace.slot[mask],
                trace.n_slots)
    d = reuse_distances(sub)
    d = np.where(d == COLD, COLD, (d * scale).astype(np.int64))
    return d, mask, scale


class MissCurve:
    """Bytes that miss in a fully associative LRU as a function of its capacity, for one trace's
    reuse distances: sorted once, then any number of capacities cost a binary search each.

    An access hits iff the distinct data touched since its last use plus itself fits.
    """

    def __init__(self, distances: np.ndarray, nbytes: np.ndarray):
        need = np.where(distances == COLD, np.inf, distances + nbytes).astype(np.float64)
        order = np.argsort(need, kind="stable")
        self._need = need[order]
        self._cum = np.concatenate([[0.0], np.cumsum(nbytes[order], dtype=np.float64)])

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

@numba.njit(cache=True)
def _lru_partitions(address, nbytes, is_read_access, part_of_access, home_of_id, n_ids, n_parts,
                    capacity):
    """Per-partition LRU caches (doubly linked lists over tile ids), byte capacity each.

    Returns bytes: tex reads, tex read hits, fabric reads, fabric read hits, DRAM reads.
    """
    prev = np.full((n_parts, n_ids), -1, np.int64)
    nxt = np.full((n_parts, n_ids), -1, np.int64)
    present = np.zeros((n_parts, n_ids), np.bool_)
    size = np.zeros(n_ids, np.int64)
    head = np.full(n_parts, -1, np.int64)
    tail = np.full(n_parts, -1, np.int64)
    used = np.zeros(n_parts, np.int64)
    tex = 0
    tex_hit = 0
    fab = 0
    fab_hit = 0
    dram = 0
    for t in range(len(address)):
        a = address[t]
        w = nbytes[t]
        size[a] = w
        p = part_of_access[t]
        home = home_of_id[a]
        is_read = is_read_access[t]
        if is_read:
            tex += w
        targets = np.empty(2, np.int64)
        n_targets = 0
        if present[p, a]:
            if is_read:
                tex_hit += w
            targets[0] = p
            n_targets = 1
        elif not is_read:
            targets[0] = home  # a write allocates at home
            n_targets = 1
        elif home == p:
            dram += w
            targets[0] = p
            n_targets = 1
        else:
            fab += w
            if present[home, a]:
                fab_hit += w
            else:
                dram += w
            targets[0] = home
            targets[1] = p
            n_targets = 2
        for k in range(n_targets):
            q = targets[k]
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
    return tex, tex_hit, fab, fab_hit, dram


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
    """LRU L2 of `capacity_bytes` in total, split over `partitions` (1 or 2).

    With two partitions a slot runs on SM (slot mod SMs), SMs alternate between partitions,
    and a tile's home partition is a hash of its address.
    """
    if partitions not in (1, 2):
        raise ValueError(f"partitions must be 1 or 2, got {partitions!r}")
    if capacity_bytes <= 0:
        raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes!r}")
    if partitions == 2 and not sms:
        raise ValueError("sms (the GPU's SM count) is needed to place slots on partitions")
    n_ids = int(trace.address.max()) + 1 if len(trace) else 1
    if partitions == 1:
        part = np.zeros(len(trace), np.int64)
        home = np.zeros(n_ids, np.int64)
    else:
        part = ((trace.slot % sms) % 2).astype(np.int64)
        home = (_hash64(np.arange(n_ids)) % np.uint64(2)).astype(np.int64)
    counts = _lru_partitions(trace.address, trace.nbytes.astype(np.int64), trace.is_read, part, home,
                             n_ids, partitions, int(capacity_bytes // partitions))
    return L2Prediction(*(int(c) // SECTOR_BYTES for c in counts))


# Bytes the simulator holds per tile access at its peak (trace, stack distances, Fenwick tree,
# the sorted miss curve), measured on the paper-sized launch; used to refuse what cannot fit.
BYTES_PER_ACCESS = 64


def access_upper_bound(launch: Launch) -> int:
    """At most this many tile accesses: every item visits every K/V tile of its chunk (K and V),
    plus its Q and O; computed without enumerating the items."""
    return 2 * launch.num_items * (min(launch.chunk_tiles, launch.problem.kv_tiles) + 1)


def available_memory_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def check_simulable(launch: Launch, memory_bytes: int | None = None) -> None:
    """Refuse, before allocating anything, a launch whose trace cannot be held in memory."""
    memory = memory_bytes or available_memory_bytes()
    need = access_upper_bound(launch) * BYTES_PER_ACCESS
    if need > 0.8 * memory:
        raise ValueError(f"this launch has up to {access_upper_bound(launch):.3g} tile accesses "
                         f"(~{need / 2**30:.1f} GiB to simulate), more than 80% of the "
                         f"{memory / 2**30:.1f} GiB of memory available: shorten seqlen or "
                         "batch x heads")


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
