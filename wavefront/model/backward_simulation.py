"""The backward's L2 side, simulated as the forward's is (`model.simulation`): the access stream
of the K/V-major kernel in lock-step rounds, replayed from `BackwardLaunch.work_table` (the rows
the kernel reads), fed to the same LRU L2.

Per round every CTA slot in flight takes one step of its item: one (query head, Q tile) visit,
which reads the Q and dO tiles and the tile's LSE and row sums (dO.O), and, in the atomic mode,
adds into the float32 dQ tile (an atomic is performed at the L2: modelled as a read of the
line, whose miss costs DRAM). An item's first step reads its K and V tile too, and its end writes
dK and dV. A grid launch gives the next row to the first free slot; a persistent one takes rows
grid-stride (CTA c: c, c + P, ...). No jitter, no timing: what the lock-step model predicts.
"""
from __future__ import annotations

import numba
import numpy as np

from wavefront.backward_schedules import (
    BWD_BATCH,
    BWD_HEAD_FIRST,
    BWD_HEAD_STEP,
    BWD_KV_HEAD,
    BWD_KV_TILE,
    BWD_MASKED_HI,
    BWD_MASKED_LO,
    BWD_SCAN_COUNT,
    BWD_SCAN_START,
    BWD_SCAN_STEP,
    BackwardLaunch,
)
from wavefront.model.simulation import KIND_O, KIND_Q, L2Prediction, LruL2, Trace

# Access kinds besides the forward's (K 0, V 1, Q 2, writes as KIND_O): dO, the row statistics
# (LSE and dO.O, float32), the dQ accumulator's atomic add.
KIND_DO, KIND_ROW_STATS, KIND_DQ = 6, 7, 8
_KINDS = 16  # tile id = unit x 16 + kind


@numba.njit(cache=True)
def _rounds(table, n_slots, dynamic, slot_stride, n_items, heads, group, q_tiles, kv_tiles,
            tile_m, tile_n, seqlen_q, seqlen_kv, row_bytes, atomic, address, nbytes, kind,
            slot_of):
    """Fill the buffers with the lock-step rounds' accesses; returns how many."""
    cur = np.full(n_slots, -1, np.int64)
    for s in range(min(n_slots, n_items)):
        cur[s] = s
    next_item = min(n_slots, n_items)
    step = np.zeros(n_slots, np.int64)
    n = 0
    active = True
    while active:
        active = False
        for s in range(n_slots):
            it = cur[s]
            if it < 0:
                continue
            active = True
            b = table[it, BWD_BATCH]
            unit = b * (heads // group) + table[it, BWD_KV_HEAD]
            j = table[it, BWD_KV_TILE]
            masked = table[it, BWD_MASKED_HI] - table[it, BWD_MASKED_LO]
            per_head = masked + table[it, BWD_SCAN_COUNT]
            visits = group * per_head
            kv_rows = min(tile_n, seqlen_kv - j * tile_n)
            if step[s] == 0:
                for k in range(2):
                    address[n] = (unit * kv_tiles + j) * _KINDS + k
                    nbytes[n] = kv_rows * row_bytes
                    kind[n] = k
                    slot_of[n] = s
                    n += 1
            if step[s] < visits:
                g, t = step[s] // per_head, step[s] % per_head
                h = table[it, BWD_HEAD_FIRST] + table[it, BWD_HEAD_STEP] * g
                if t < masked:
                    i = table[it, BWD_MASKED_LO] + t
                else:
                    i = table[it, BWD_SCAN_START] + table[it, BWD_SCAN_STEP] * (t - masked)
                q_rows = min(tile_m, seqlen_q - i * tile_m)
                q_id = (b * heads + h) * q_tiles + i
                for k, size in ((KIND_Q, row_bytes), (KIND_DO, row_bytes),
                                (KIND_ROW_STATS, 8), (KIND_DQ, 2 * row_bytes)):
                    if k == KIND_DQ and not atomic:
                        continue
                    address[n] = q_id * _KINDS + k
                    nbytes[n] = q_rows * size
                    kind[n] = k
                    slot_of[n] = s
                    n += 1
                step[s] += 1
            if step[s] >= visits:
                for k in range(2):  # dK, dV written once
                    address[n] = (unit * kv_tiles + j) * _KINDS + 10 + k
                    nbytes[n] = kv_rows * row_bytes
                    kind[n] = KIND_O
                    slot_of[n] = s
                    n += 1
                step[s] = 0
                if dynamic:
                    cur[s] = next_item if next_item < n_items else -1
                    next_item += 1
                else:
                    cur[s] = it + slot_stride if it + slot_stride < n_items else -1
    return n


def backward_trace(launch: BackwardLaunch, atomic: bool = True) -> Trace:
    """The K/V-major kernel's access stream (tile granularity) in lock-step rounds."""
    p = launch.problem
    table = launch.work_table.astype(np.int64)
    visits = p.qheads_per_kv * (table[:, BWD_SCAN_COUNT] + table[:, BWD_MASKED_HI]
                                - table[:, BWD_MASKED_LO])
    size = int(4 * len(table) + (4 if atomic else 3) * visits.sum())
    dynamic = not launch.cta.persistent  # the hardware's next free slot
    n_slots = max(1, min(launch.resident_ctas, launch.num_items) if dynamic
                  else launch.num_ctas)
    buffers = (np.empty(size, np.int64), np.empty(size, np.int32), np.empty(size, np.int8),
               np.empty(size, np.int32))
    n = _rounds(table, n_slots, dynamic, launch.num_ctas, launch.num_items, p.heads,
                p.qheads_per_kv, p.q_tiles, p.kv_tiles, p.tile_m, p.tile_n, p.seqlen_q,
                p.seqlen_kv, p.head_dim * p.element_bytes, atomic, *buffers)
    return Trace(*(b[:n] for b in buffers), n_slots)


def predict_backward_l2(launch: BackwardLaunch, capacity_bytes: float | None = None, *,
                        atomic: bool = True, partitions: int = 1) -> L2Prediction:
    """What an LRU L2 of `capacity_bytes` (default the launch's L2) sees of the backward's
    K/V-major kernel: read lookups, hits and DRAM read sectors."""
    trace = backward_trace(launch, atomic)
    n_ids = int(trace.address.max()) + 1 if len(trace) else 1
    l2 = LruL2(capacity_bytes or launch.l2_bytes, n_ids, partitions=partitions,
               sms=launch.sms if partitions == 2 else None)
    return l2.feed(trace).result()
