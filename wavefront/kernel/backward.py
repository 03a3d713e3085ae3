"""FlashAttention backward in cuTile (FlashAttention-2's algorithm), driven by work tables.

With S = Q K^T, P = exp(scale S - LSE) (the forward's natural-log LSE), D = rowsum(dO * O):
    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dK = scale dS^T Q,   dQ = scale dS K.

Kernels:
- `backward_preprocess`: D = rowsum(dO * O) in float32, one (Q tile, batch x head) per CTA.
- `flash_attention_bwd_kv`: K/V-major. A work item (a `BackwardLaunch.work_table` row) is one
  (batch, K/V head, K/V tile); it holds K, V and float32 dK, dV on chip, recomputes P from Q, K
  and the LSE for every Q tile of every query head of its group (GQA: dK and dV summed over the
  group) and writes dK, dV once. ATOMIC_DQ: each Q tile's dQ contribution is added into a
  float32 dQ accumulator with relaxed float atomics (`ct.atomic_add` on a tile of indices),
  which `convert_dq` casts to the input dtype; the sum's order varies between runs.
  DQ_COALESCED: the accumulator is tile-major instead, (batch, heads, Q tiles, TILE_M x D),
  each tile column-major (`dq_tile_offsets`), and `convert_dq_tiles` turns it back; see
  `_add_dq_tile` for why.
- `flash_attention_bwd_dq`: the deterministic dQ: Q-major, one (batch, head, Q tile) per item
  scanning its K/V tiles (the forward's work table) and recomputing P and dS; dQ is written
  once, so dQ, dK and dV are bit-identical across runs.

Every kernel takes its items grid-stride (CTA c takes rows c, c + P, ...), so grid, persistent,
grouped and longest-first are the same binary with other tables, and so are both Q scans.

Layout as the forward's: Q, O, dO, dQ (batch, heads, seqlen_q, D); K, V, dK, dV (batch,
kv_heads, seqlen_kv, D); LSE and D (batch, heads, seqlen_q) float32; last dimension contiguous.
Causal: query row r sees key columns c <= r + the item's diagonal (its table row's
BWD_DIAGONAL / WORK_DIAGONAL: 0 top-left, seqlen_kv - seqlen_q bottom-right, per sequence in
a packed batch), one binary for both alignments as the forward's; a row that sees no key
(bottom-right, seqlen_q > seqlen_kv, LSE -inf) gets dQ = 0 and adds nothing (`_seen_lse`).
Ragged lengths: loads pad with zeros (a padded Q row has dO = 0 and contributes nothing;
stores and atomics past the end are dropped), and the last K/V tile's columns past seqlen_kv
are masked.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import cuda.tile as ct

from wavefront.backward_schedules import (
    BACKWARD_TILE_SHAPES,
    BWD_BATCH,
    BWD_DIAGONAL,
    BWD_HEAD_FIRST,
    BWD_HEAD_STEP,
    BWD_KV_HEAD,
    BWD_KV_TILE,
    BWD_MASKED_HI,
    BWD_MASKED_LO,
    BWD_KV_START,
    BWD_Q_START,
    BWD_SCAN_COUNT,
    BWD_SCAN_START,
    BWD_SCAN_STEP,
    BWD_SEQLEN_KV,
    BWD_SEQLEN_Q,
)
from wavefront.kernel.attention import (IO, LOG2_E, ConstBool, ConstInt, _contract, _work,
                                        aot_signature)
from wavefront.point import DTYPES, HEAD_DIMS
from wavefront.schedules import (
    WORK_BATCH,
    WORK_DIAGONAL,
    WORK_KV_START,
    WORK_Q_START,
    WORK_SEQLEN_KV,
    WORK_SEQLEN_Q,
    WORK_HEAD,
    WORK_KV_HEAD,
    WORK_MASKED_HI,
    WORK_MASKED_LO,
    WORK_Q_TILE,
    WORK_SCAN_COUNT,
    WORK_SCAN_START,
    WORK_SCAN_STEP,
)

# `num_worker_warps` values the backward's variants take (`BackwardConfig`): None, the
# compiler's choice, or 8, two consumer warpgroups (cuda-tile 1.7 with tileiras 13.4).
WORKER_WARPS = (None, 8)
# Rows per CTA of the small kernels (preprocess, dQ conversion): they stream, any size works.
ROWS_TILE = 64
# Rows of a Q tile's dQ the coalesced accumulate adds at a time (`_add_dq_tile`)
DQ_CHUNK_ROWS = 32
# Q tile rows of `dq_add_probe`'s adds (the default cut's)
TILE_M_PROBE = 64


def _load_rows(A, batch, head, q_tile, HEAD_DIM: ConstInt, TILE_M: ConstInt):
    """A (TILE_M, HEAD_DIM) tile of a (batch, heads, seqlen, D) array, zero past the end."""
    return ct.load(A, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                   padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))


def _load_row_stats(A, batch, head, q_tile, TILE_M: ConstInt):
    """A (TILE_M,) piece of a (batch, heads, seqlen) float32 array, zero past the end."""
    return ct.load(A, index=(batch, head, q_tile), shape=(1, 1, TILE_M),
                   padding_mode=ct.PaddingMode.ZERO)


@ct.kernel
def backward_preprocess(Out, dOut, Delta, HEAD_DIM: ConstInt, TILE_M: ConstInt):
    """Delta = rowsum(dO * O) in float32; grid (Q tiles, batch x heads)."""
    q_tile = ct.bid(0)
    heads = Out.shape[1]
    batch = ct.bid(1) // heads
    head = ct.bid(1) % heads
    o = _load_rows(Out, batch, head, q_tile, HEAD_DIM, TILE_M).astype(ct.float32)
    do = _load_rows(dOut, batch, head, q_tile, HEAD_DIM, TILE_M).astype(ct.float32)
    delta = ct.sum(o * do, axis=1)  # [TILE_M]
    ct.store(Delta, index=(batch, head, q_tile), tile=delta.reshape((1, 1, TILE_M)))


@ct.kernel
def convert_dq(dQacc, dQ, HEAD_DIM: ConstInt, TILE_M: ConstInt):
    """dQ = the float32 accumulator in the input dtype; grid (Q tiles, batch x heads)."""
    q_tile = ct.bid(0)
    heads = dQ.shape[1]
    batch = ct.bid(1) // heads
    head = ct.bid(1) % heads
    acc = _load_rows(dQacc, batch, head, q_tile, HEAD_DIM, TILE_M)
    ct.store(dQ, index=(batch, head, q_tile, 0),
             tile=acc.reshape((1, 1, TILE_M, HEAD_DIM)).astype(dQ.dtype))


def dq_tile_offsets(tile_m: int, head_dim: int) -> np.ndarray:
    """Where element (row r, column c) of a Q tile's dQ sits in its tile of the coalesced
    accumulator (DQ_COALESCED): c x tile_m + r, column-major, as `_add_dq_tile` adds it and
    `convert_dq_tiles` reads it back (for the host and the CPU tests; the kernels compute the
    same expression on tiles)."""
    rows = np.arange(tile_m)[:, None]
    return np.arange(head_dim)[None, :] * tile_m + rows


@ct.kernel
def convert_dq_tiles(dQacc, dQ, HEAD_DIM: ConstInt, TILE_M: ConstInt):
    """dQ from the coalesced (tile-major, column-major tiles) accumulator; grid (Q tiles,
    batch x heads); rows past seqlen_q are dropped by the store."""
    q_tile = ct.bid(0)
    heads = dQ.shape[1]
    batch = ct.bid(1) // heads
    head = ct.bid(1) % heads
    acc = ct.load(dQacc, index=(batch, head, q_tile, 0), shape=(1, 1, 1, TILE_M * HEAD_DIM))
    rows = ct.transpose(acc.reshape((HEAD_DIM, TILE_M)))  # [TILE_M, D]
    ct.store(dQ, index=(batch, head, q_tile, 0),
             tile=rows.reshape((1, 1, TILE_M, HEAD_DIM)).astype(dQ.dtype))


def _add_dq_tile(dQacc, dq, batch, head, q_tile, dq_row_step, HEAD_DIM: ConstInt,
                 TILE_M: ConstInt, COALESCED: ConstBool):
    """Add a Q tile's dQ contribution (float32, [TILE_M, D]) into the accumulator with relaxed
    float atomics (the sum needs atomicity only). tileiras 13.4 emits one 32-bit REDG per
    element whatever the index pattern and gives each thread 4 address-adjacent elements where
    it can prove adjacency, so a warp's REDG covers 32 floats 16 bytes apart: 16 sectors of
    32 bytes, 2 floats each (sm_90 SASS of the row-major accumulator). COALESCED: the
    accumulator's tile is column-major (rows adjacent), and the row step is a run-time value
    (`dq_row_step`, always 1) so the compiler cannot prove that adjacency; it then spreads the
    rows over the lanes and each REDG covers 128 contiguous bytes, 4 full sectors: a quarter
    of the L2 atomic transactions for the same sum, and no bounds check (every tile of the
    accumulator exists, the last one padded). It adds DQ_CHUNK_ROWS rows at a time: the whole
    tile at once stages it in 32 KiB more shared memory (D=128, 64x128 tiles: 232,672 bytes,
    over a CTA's 227 KiB; in halves, 199,904, as the row-major accumulate). Rows past seqlen_q
    (row-major accumulator) are dropped by the bounds check."""
    if COALESCED:
        rows = ct.arange(DQ_CHUNK_ROWS, dtype=ct.int32)[:, None] * dq_row_step
        columns = ct.arange(HEAD_DIM, dtype=ct.int32)[None, :] * TILE_M
        for part in ct.static_iter(range(TILE_M // DQ_CHUNK_ROWS)):
            piece = ct.extract(dq, (part, 0), shape=(DQ_CHUNK_ROWS, HEAD_DIM))
            offsets = columns + part * DQ_CHUNK_ROWS + rows
            ct.atomic_add(dQacc, (batch, head, q_tile, offsets), piece, check_bounds=False,
                          memory_order=ct.MemoryOrder.RELAXED)
    else:
        rows_at = q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]
        cols_at = ct.arange(HEAD_DIM, dtype=ct.int32)[None, :]
        ct.atomic_add(dQacc, (batch, head, rows_at, cols_at), dq,
                      memory_order=ct.MemoryOrder.RELAXED)


@ct.kernel
def dq_add_probe(dQacc, rounds: int, dq_row_step: int, HEAD_DIM: ConstInt, TILE_M: ConstInt,
                 COALESCED: ConstBool):
    """The atomic dQ accumulate alone, to time it (`scripts/backward_bench.py --red-probe`):
    CTA c adds a [TILE_M, D] float32 tile `rounds` times, its i-th add into Q tile
    (c + i x CTAs) mod the accumulator's tiles of head 0, as `_add_dq_tile` adds (COALESCED:
    dQacc (1, 1, tiles, TILE_M x D); else (1, 1, tiles x TILE_M, D))."""
    tiles = dQacc.shape[2]
    if not COALESCED:
        tiles = dQacc.shape[2] // TILE_M
    values = (ct.arange(TILE_M, dtype=ct.int32)[:, None]
              + ct.arange(HEAD_DIM, dtype=ct.int32)[None, :]).astype(ct.float32)
    for i in range(rounds):
        q_tile = (ct.bid(0) + i * ct.num_blocks(0)) % tiles
        _add_dq_tile(dQacc, values, 0, 0, q_tile, dq_row_step, HEAD_DIM, TILE_M, COALESCED)


def _seen_lse(lse):
    """The LSE the probabilities are recomputed from: a row that saw no key (bottom-right
    causal with seqlen_q > seqlen_kv) has the forward's LSE -inf, taken as +inf here (as
    FlashAttention 2 writes it), so its masked scores give P = 2^(-inf - inf) = 0, not
    2^(-inf + inf) = NaN: its dQ is 0 and it adds nothing to dK, dV."""
    return ct.where(lse != -np.inf, lse, np.inf)  # (a NaN stays NaN: not silenced to 0)


def _q_tile_step(Q, dOut, Lse, Delta, dQacc, k, v, dk, dv, batch, head, kv_tile, q_tile,
                 qk_scale_log2, scale, seqlen_kv, diagonal, dq_row_step, HEAD_DIM: ConstInt,
                 TILE_M: ConstInt, TILE_N: ConstInt, MASKED: ConstBool, CAUSAL: ConstBool,
                 ATOMIC_DQ: ConstBool, Q_LATENCY: ConstInt, DQ_COALESCED: ConstBool):
    """One Q tile's share of a K/V tile's dK and dV (and of the Q tile's dQ), transposed
    (K/V rows first) so that dV = P^T dO and dK = dS^T Q are plain products. `diagonal`
    (CAUSAL): query row r sees key columns c <= r + diagonal (the item's BWD_DIAGONAL)."""
    if Q_LATENCY > 0:  # a load latency hint (1 low .. 10 high DRAM traffic) on Q and dO
        q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                    padding_mode=ct.PaddingMode.ZERO, latency=Q_LATENCY).reshape(
                        (TILE_M, HEAD_DIM))
        do = ct.load(dOut, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                     padding_mode=ct.PaddingMode.ZERO, latency=Q_LATENCY).reshape(
                         (TILE_M, HEAD_DIM))
    else:
        q = _load_rows(Q, batch, head, q_tile, HEAD_DIM, TILE_M)  # [TILE_M, D]
        do = _load_rows(dOut, batch, head, q_tile, HEAD_DIM, TILE_M)  # [TILE_M, D]
    lse = _load_row_stats(Lse, batch, head, q_tile, TILE_M).reshape((1, TILE_M))
    if MASKED and CAUSAL:  # (an unmasked tile has no row that sees no key)
        lse = _seen_lse(lse)
    delta = _load_row_stats(Delta, batch, head, q_tile, TILE_M).reshape((1, TILE_M))
    s_t = ct.mma(k, ct.transpose(q), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
    if MASKED:
        cols = kv_tile * TILE_N + ct.arange(TILE_N, dtype=ct.int32)[:, None]  # [TILE_N, 1]
        keep = cols < seqlen_kv
        if CAUSAL:
            rows = q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[None, :]  # [1, TILE_M]
            keep = keep & (rows + diagonal >= cols)
        s_t = ct.where(keep, s_t, -np.inf)
    p_t = ct.exp2(s_t * qk_scale_log2 - lse * LOG2_E, flush_to_zero=True)  # [TILE_N, TILE_M]
    dv = ct.mma(p_t.astype(do.dtype), do, dv)  # [TILE_N, D]
    dp_t = ct.mma(v, ct.transpose(do), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
    ds_t = (p_t * (dp_t - delta) * scale).astype(q.dtype)  # scale dS^T, [TILE_N, TILE_M]
    dk = ct.mma(ds_t, q, dk)  # [TILE_N, D]
    if ATOMIC_DQ:
        dq = ct.mma(ct.transpose(ds_t), k, ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32))
        _add_dq_tile(dQacc, dq, batch, head, q_tile, dq_row_step, HEAD_DIM, TILE_M,
                     DQ_COALESCED)
    return dk, dv


def _sequence(Work, item, q_start_column, q_length_column, kv_start_column,
              kv_length_column):
    """A packed batch's item: (first Q row, Q rows' end, first K/V row, K/V rows' end) of its
    sequence, from its table row."""
    q_start = _work(Work, item, q_start_column)
    kv_start = _work(Work, item, kv_start_column)
    return (q_start, q_start + _work(Work, item, q_length_column), kv_start,
            kv_start + _work(Work, item, kv_length_column))


def _kv_work_item(Q, K, V, dOut, Lse, Delta, dK, dV, dQacc, Work, item, qk_scale_log2, scale,
                  dq_row_step, HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                  CAUSAL: ConstBool, ATOMIC_DQ: ConstBool, VARLEN: ConstBool,
                  Q_LATENCY: ConstInt, DQ_COALESCED: ConstBool):
    """VARLEN: the arrays are packed sequences viewed as (1, heads, total rows, D); the item's
    sequence is sliced out of them (no copy), so its tiles, masks and ragged ends are its own
    and no store or atomic reaches a neighbour's rows."""
    if VARLEN:
        q_start, q_stop, kv_start, kv_stop = _sequence(Work, item, BWD_Q_START, BWD_SEQLEN_Q,
                                                       BWD_KV_START, BWD_SEQLEN_KV)
        Q = Q.slice(axis=2, start=q_start, stop=q_stop)
        dOut = dOut.slice(axis=2, start=q_start, stop=q_stop)
        Lse = Lse.slice(axis=2, start=q_start, stop=q_stop)
        Delta = Delta.slice(axis=2, start=q_start, stop=q_stop)
        if ATOMIC_DQ:
            dQacc = dQacc.slice(axis=2, start=q_start, stop=q_stop)
        K = K.slice(axis=2, start=kv_start, stop=kv_stop)
        V = V.slice(axis=2, start=kv_start, stop=kv_stop)
        dK = dK.slice(axis=2, start=kv_start, stop=kv_stop)
        dV = dV.slice(axis=2, start=kv_start, stop=kv_stop)
        batch = 0
    else:
        batch = _work(Work, item, BWD_BATCH)
    kv_head = _work(Work, item, BWD_KV_HEAD)
    kv_tile = _work(Work, item, BWD_KV_TILE)
    head_first = _work(Work, item, BWD_HEAD_FIRST)
    head_step = _work(Work, item, BWD_HEAD_STEP)
    start = _work(Work, item, BWD_SCAN_START)
    step = _work(Work, item, BWD_SCAN_STEP)
    count = _work(Work, item, BWD_SCAN_COUNT)
    masked_lo = _work(Work, item, BWD_MASKED_LO)
    masked_hi = _work(Work, item, BWD_MASKED_HI)
    diagonal = 0
    if CAUSAL:
        diagonal = _work(Work, item, BWD_DIAGONAL)
    seqlen_kv = K.shape[2]
    group = Q.shape[1] // K.shape[1]

    k = _load_rows(K, batch, kv_head, kv_tile, HEAD_DIM, TILE_N)  # [TILE_N, D]
    v = _load_rows(V, batch, kv_head, kv_tile, HEAD_DIM, TILE_N)  # [TILE_N, D]
    dk = ct.full((TILE_N, HEAD_DIM), 0.0, dtype=ct.float32)
    dv = ct.full((TILE_N, HEAD_DIM), 0.0, dtype=ct.float32)
    for g in range(group):
        head = head_first + head_step * g
        for i in range(masked_lo, masked_hi):
            dk, dv = _q_tile_step(Q, dOut, Lse, Delta, dQacc, k, v, dk, dv, batch, head,
                                  kv_tile, i, qk_scale_log2, scale, seqlen_kv, diagonal,
                                  dq_row_step, HEAD_DIM, TILE_M, TILE_N, True, CAUSAL,
                                  ATOMIC_DQ, Q_LATENCY, DQ_COALESCED)
        for t in range(count):
            dk, dv = _q_tile_step(Q, dOut, Lse, Delta, dQacc, k, v, dk, dv, batch, head,
                                  kv_tile, start + step * t, qk_scale_log2, scale, seqlen_kv,
                                  diagonal, dq_row_step, HEAD_DIM, TILE_M, TILE_N, False,
                                  CAUSAL, ATOMIC_DQ, Q_LATENCY, DQ_COALESCED)
    ct.store(dK, index=(batch, kv_head, kv_tile, 0),
             tile=dk.reshape((1, 1, TILE_N, HEAD_DIM)).astype(dK.dtype))
    ct.store(dV, index=(batch, kv_head, kv_tile, 0),
             tile=dv.reshape((1, 1, TILE_N, HEAD_DIM)).astype(dV.dtype))


def flash_attention_bwd_kv(Q, K, V, dOut, Lse, Delta, dK, dV, dQacc, Work,
                           qk_scale_log2: float, scale: float, num_items: int,
                           dq_row_step: int, HEAD_DIM: ConstInt, TILE_M: ConstInt,
                           TILE_N: ConstInt, CAUSAL: ConstBool, ATOMIC_DQ: ConstBool,
                           VARLEN: ConstBool, Q_LATENCY: ConstInt, DQ_COALESCED: ConstBool):
    """One CTA: take K/V-major items (rows c, c + P, ...) and write each one's dK and dV.
    `dq_row_step`: 1 (DQ_COALESCED reads it; run-time on purpose, see `_add_dq_tile`)."""
    for item in range(ct.bid(0), num_items, ct.num_blocks(0)):
        _kv_work_item(Q, K, V, dOut, Lse, Delta, dK, dV, dQacc, Work, item, qk_scale_log2,
                      scale, dq_row_step, HEAD_DIM, TILE_M, TILE_N, CAUSAL, ATOMIC_DQ, VARLEN,
                      Q_LATENCY, DQ_COALESCED)


def _dq_step(K, V, q, do, lse, delta, dq, batch, kv_head, kv_tile, q_tile, qk_scale_log2,
             scale, seqlen_kv, diagonal, HEAD_DIM: ConstInt, TILE_M: ConstInt,
             TILE_N: ConstInt, MASKED: ConstBool, CAUSAL: ConstBool):
    """K/V tile `kv_tile`'s share of a Q tile's dQ (`diagonal` as in `_q_tile_step`)."""
    k_t = ct.load(K, index=(batch, kv_head, 0, kv_tile), shape=(1, 1, HEAD_DIM, TILE_N),
                  order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO).reshape(
                      (HEAD_DIM, TILE_N))  # K^T, transposed by the load
    v_t = ct.load(V, index=(batch, kv_head, 0, kv_tile), shape=(1, 1, HEAD_DIM, TILE_N),
                  order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO).reshape(
                      (HEAD_DIM, TILE_N))
    s = ct.mma(q, k_t, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))  # [TILE_M, TILE_N]
    if MASKED:
        cols = kv_tile * TILE_N + ct.arange(TILE_N, dtype=ct.int32)[None, :]  # [1, TILE_N]
        keep = cols < seqlen_kv
        if CAUSAL:
            rows = q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]
            keep = keep & (rows + diagonal >= cols)
        s = ct.where(keep, s, -np.inf)
    p = ct.exp2(s * qk_scale_log2 - lse * LOG2_E, flush_to_zero=True)
    dp = ct.mma(do, v_t, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
    ds = (p * (dp - delta) * scale).astype(q.dtype)
    return ct.mma(ds, ct.transpose(k_t), dq)  # [TILE_M, D]


def flash_attention_bwd_dq(Q, K, V, dOut, Lse, Delta, dQ, Work, qk_scale_log2: float,
                           scale: float, num_items: int, HEAD_DIM: ConstInt, TILE_M: ConstInt,
                           TILE_N: ConstInt, CAUSAL: ConstBool, VARLEN: ConstBool,
                           MASKED_FIRST: ConstBool):
    """One CTA: take Q-major items (the forward's work table, rows c, c + P, ...) and write
    each one's dQ once: deterministic. VARLEN: the packed batch's sequence sliced out, as in
    the K/V-major kernel (from the forward's varlen table). MASKED_FIRST: the K/V tiles that
    need a mask before the others (the same sum in another order), as the K/V-major kernel
    visits its Q tiles: tileiras 13.4 keeps the second loop free of spills and short (sm_90,
    D=128, 64x64: the unmasked loop 322 instructions, none to local memory, against 513 with
    102 when it comes first)."""
    for item in range(ct.bid(0), num_items, ct.num_blocks(0)):
        _dq_work_item(Q, K, V, dOut, Lse, Delta, dQ, Work, item, qk_scale_log2, scale,
                      HEAD_DIM, TILE_M, TILE_N, CAUSAL, VARLEN, MASKED_FIRST)


def _dq_work_item(Q, K, V, dOut, Lse, Delta, dQ, Work, item, qk_scale_log2, scale,
                  HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, CAUSAL: ConstBool,
                  VARLEN: ConstBool, MASKED_FIRST: ConstBool):
    if VARLEN:
        q_start, q_stop, kv_start, kv_stop = _sequence(Work, item, WORK_Q_START, WORK_SEQLEN_Q,
                                                       WORK_KV_START, WORK_SEQLEN_KV)
        Q = Q.slice(axis=2, start=q_start, stop=q_stop)
        dOut = dOut.slice(axis=2, start=q_start, stop=q_stop)
        Lse = Lse.slice(axis=2, start=q_start, stop=q_stop)
        Delta = Delta.slice(axis=2, start=q_start, stop=q_stop)
        dQ = dQ.slice(axis=2, start=q_start, stop=q_stop)
        K = K.slice(axis=2, start=kv_start, stop=kv_stop)
        V = V.slice(axis=2, start=kv_start, stop=kv_stop)
        batch = 0
    else:
        batch = _work(Work, item, WORK_BATCH)
    seqlen_kv = K.shape[2]
    head = _work(Work, item, WORK_HEAD)
    kv_head = _work(Work, item, WORK_KV_HEAD)
    q_tile = _work(Work, item, WORK_Q_TILE)
    start = _work(Work, item, WORK_SCAN_START)
    step = _work(Work, item, WORK_SCAN_STEP)
    count = _work(Work, item, WORK_SCAN_COUNT)
    q = _load_rows(Q, batch, head, q_tile, HEAD_DIM, TILE_M)
    do = _load_rows(dOut, batch, head, q_tile, HEAD_DIM, TILE_M)
    lse = _load_row_stats(Lse, batch, head, q_tile, TILE_M).reshape((TILE_M, 1))
    diagonal = 0
    if CAUSAL:
        lse = _seen_lse(lse)
        diagonal = _work(Work, item, WORK_DIAGONAL)
    delta = _load_row_stats(Delta, batch, head, q_tile, TILE_M).reshape((TILE_M, 1))
    dq = ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32)
    masked_lo = _work(Work, item, WORK_MASKED_LO)
    masked_hi = _work(Work, item, WORK_MASKED_HI)
    if MASKED_FIRST:
        for j in range(masked_lo, masked_hi):
            dq = _dq_step(K, V, q, do, lse, delta, dq, batch, kv_head, j, q_tile,
                          qk_scale_log2, scale, seqlen_kv, diagonal, HEAD_DIM, TILE_M, TILE_N,
                          True, CAUSAL)
    for t in range(count):
        dq = _dq_step(K, V, q, do, lse, delta, dq, batch, kv_head, start + step * t,
                      q_tile, qk_scale_log2, scale, seqlen_kv, diagonal, HEAD_DIM, TILE_M,
                      TILE_N, False, CAUSAL)
    if not MASKED_FIRST:
        for j in range(masked_lo, masked_hi):
            dq = _dq_step(K, V, q, do, lse, delta, dq, batch, kv_head, j, q_tile,
                          qk_scale_log2, scale, seqlen_kv, diagonal, HEAD_DIM, TILE_M, TILE_N,
                          True, CAUSAL)
    ct.store(dQ, index=(batch, head, q_tile, 0),
             tile=dq.reshape((1, 1, TILE_M, HEAD_DIM)).astype(dQ.dtype))


@lru_cache(maxsize=None)
def _kernel(function, occupancy: int, worker_warps: int | None = None):
    """cuTile takes these as kernel options (one kernel object each): CTAs per SM, and warps
    per consumer warpgroup set (8: two consumer warpgroups split the tile's rows; None: the
    compiler's choice, one at these tiles)."""
    return ct.kernel(function, occupancy=occupancy, num_worker_warps=worker_warps)


# --------------------------------------------------------------------------------------------
# The launch contracts and the specialisations (as the forward's: `attention.KernelVariant`)
# --------------------------------------------------------------------------------------------

PREPROCESS_PARAMS = _contract(backward_preprocess._pyfunc, {
    "Out": (IO, 4), "dOut": (IO, 4), "Delta": ("float32", 3)})
CONVERT_DQ_PARAMS = _contract(convert_dq._pyfunc, {"dQacc": ("float32", 4), "dQ": (IO, 4)})
CONVERT_DQ_TILES_PARAMS = _contract(convert_dq_tiles._pyfunc, {
    "dQacc": ("float32", 4),  # (batch, heads, Q tiles, TILE_M x D), tiles column-major
    "dQ": (IO, 4)})
BWD_KV_PARAMS = _contract(flash_attention_bwd_kv, {
    "Q": (IO, 4), "K": (IO, 4), "V": (IO, 4), "dOut": (IO, 4),
    "Lse": ("float32", 3), "Delta": ("float32", 3),
    "dK": (IO, 4), "dV": (IO, 4),
    # ATOMIC_DQ: (batch, heads, seqlen_q, D), or DQ_COALESCED (batch, heads, Q tiles,
    # TILE_M x D); a 1-element stand-in otherwise
    "dQacc": ("float32", 4),
    "Work": ("int32", 2)})  # (items, BWD_COLUMNS): `BackwardLaunch.work_table`
DQ_ADD_PROBE_PARAMS = _contract(dq_add_probe._pyfunc, {"dQacc": ("float32", 4)})
BWD_DQ_PARAMS = _contract(flash_attention_bwd_dq, {
    "Q": (IO, 4), "K": (IO, 4), "V": (IO, 4), "dOut": (IO, 4),
    "Lse": ("float32", 3), "Delta": ("float32", 3), "dQ": (IO, 4),
    "Work": ("int32", 2)})  # (items, WORK_COLUMNS): the forward's `Launch.work_table`


def _check(dtype, head_dim, tile_m, tile_n):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim!r}")
    if (tile_m, tile_n) not in BACKWARD_TILE_SHAPES:
        raise ValueError(f"tiles must be one of {BACKWARD_TILE_SHAPES}, got "
                         f"{(tile_m, tile_n)!r}")


@dataclass(frozen=True)
class _TiledVariant:
    """What the two tiled backward kernels' binaries have in common. Every CTA schedule and Q
    (or K/V) scan shares one binary: the schedule is the work table."""

    dtype: str
    head_dim: int
    tile_m: int
    tile_n: int
    causal: bool

    def __post_init__(self):
        _check(self.dtype, self.head_dim, self.tile_m, self.tile_n)
        if not (isinstance(getattr(self, "q_latency", 0), int)
                and 0 <= getattr(self, "q_latency", 0) <= 10):
            raise ValueError(f"q_latency must be an integer in [0, 10], got {self.q_latency!r}")
        if self.worker_warps not in WORKER_WARPS:
            raise ValueError(f"worker_warps must be one of {WORKER_WARPS}, got "
                             f"{self.worker_warps!r}")
        if (self.varlen and self.head_dim == 128 and (self.tile_m, self.tile_n) == (64, 64)
                and not getattr(self, "atomic_dq", False)):
            raise ValueError(f"{self.label}: tileiras 13.4 fails to compile the deterministic "
                             "packed-batch binaries at D=128 with 64x64 tiles (return code 5); "
                             "use 128x64 tiles")
        if getattr(self, "dq_coalesced", False) and (self.varlen or not self.atomic_dq):
            raise ValueError("dq_coalesced (the tile-major dQ accumulator) needs atomic_dq and "
                             "a dense batch (a packed sequence starts mid-tile), got "
                             f"atomic_dq={self.atomic_dq}, varlen={self.varlen}")

    @property
    def constants(self) -> dict:
        return {"HEAD_DIM": self.head_dim, "TILE_M": self.tile_m, "TILE_N": self.tile_n,
                "CAUSAL": self.causal, "VARLEN": self.varlen}

    @property
    def label(self) -> str:
        return (f"{self.prefix}_{self.dtype[:2]}_d{self.head_dim}_{self.tile_m}x{self.tile_n}"
                f"_{'causal' if self.causal else 'full'}{self.suffix}_occ{self.occupancy}"
                f"{f'_ww{self.worker_warps}' if self.worker_warps else ''}"
                f"{'_varlen' if self.varlen else ''}")

    def kernel(self):
        return _kernel(self.function, self.occupancy, self.worker_warps)

    def signature(self):
        return aot_signature(self.params, self.dtype, self.constants, self.function.__name__)


@dataclass(frozen=True)
class BackwardKvVariant(_TiledVariant):
    """One binary of the K/V-major kernel.
    Label: `bwd_kv_<dtype>_d<D>_<M>x<N>_<full|causal>_<atomic[_coal]|det>[_lat<L>]_occ<O>
    [_ww<W>][_varlen]`."""

    atomic_dq: bool = True
    occupancy: int = 1
    varlen: bool = False  # packed sequences, sliced per work item
    worker_warps: int | None = None
    q_latency: int = 0  # 0: no hint on the Q and dO loads; 1..10: cuTile's latency hint
    dq_coalesced: bool = False  # the tile-major dQ accumulator (`_add_dq_tile`)
    prefix = "bwd_kv"
    function = staticmethod(flash_attention_bwd_kv)
    params = BWD_KV_PARAMS

    @property
    def constants(self) -> dict:
        return {**super().constants, "ATOMIC_DQ": self.atomic_dq, "Q_LATENCY": self.q_latency,
                "DQ_COALESCED": self.dq_coalesced}

    @property
    def suffix(self) -> str:
        return (("_atomic" if self.atomic_dq else "_det")
                + ("_coal" if self.dq_coalesced else "")
                + (f"_lat{self.q_latency}" if self.q_latency else ""))


@dataclass(frozen=True)
class BackwardDqVariant(_TiledVariant):
    """One binary of the deterministic Q-major dQ kernel.
    Label: `bwd_dq_<dtype>_d<D>_<M>x<N>_<full|causal>[_mf]_occ<O>[_ww<W>][_varlen]`."""

    occupancy: int = 1
    varlen: bool = False
    worker_warps: int | None = None
    masked_first: bool = False  # the masked K/V tiles' loop before the others
    prefix = "bwd_dq"
    function = staticmethod(flash_attention_bwd_dq)
    params = BWD_DQ_PARAMS

    @property
    def constants(self) -> dict:
        return {**super().constants, "MASKED_FIRST": self.masked_first}

    @property
    def suffix(self) -> str:
        return "_mf" if self.masked_first else ""


@dataclass(frozen=True)
class RowsVariant:
    """The preprocess (`which` = "preprocess") or a dQ conversion kernel ("convert_dq", of the
    row-major accumulator; "convert_dq_tiles", of the coalesced one at its Q tile rows)."""

    which: str
    dtype: str
    head_dim: int
    tile_m: int = ROWS_TILE

    def __post_init__(self):
        if self.which not in ROWS_KERNELS:
            raise ValueError(f"which must be one of {tuple(ROWS_KERNELS)}, got {self.which!r}")
        _check(self.dtype, self.head_dim, 64, 64)
        if self.tile_m not in (64, 128):
            raise ValueError(f"tile_m must be 64 or 128, got {self.tile_m!r}")

    @property
    def constants(self) -> dict:
        return {"HEAD_DIM": self.head_dim, "TILE_M": self.tile_m}

    @property
    def label(self) -> str:
        return f"bwd_{self.which}_{self.dtype[:2]}_d{self.head_dim}_m{self.tile_m}"

    def kernel(self):
        return ROWS_KERNELS[self.which][0]

    def signature(self):
        kernel, params = ROWS_KERNELS[self.which]
        return aot_signature(params, self.dtype, self.constants, kernel._pyfunc.__name__)


@dataclass(frozen=True)
class DqAddProbeVariant:
    """The binary of `dq_add_probe` (the atomic dQ accumulate timed alone), one per layout."""

    head_dim: int
    tile_m: int = 64
    coalesced: bool = False

    def __post_init__(self):
        _check("bfloat16", self.head_dim, self.tile_m, 64)

    @property
    def constants(self) -> dict:
        return {"HEAD_DIM": self.head_dim, "TILE_M": self.tile_m, "COALESCED": self.coalesced}

    @property
    def label(self) -> str:
        return (f"bwd_dq_add_probe_d{self.head_dim}_m{self.tile_m}"
                f"_{'coal' if self.coalesced else 'rows'}")

    def kernel(self):
        return dq_add_probe

    def signature(self):
        return aot_signature(DQ_ADD_PROBE_PARAMS, "float32", self.constants, "dq_add_probe")


ROWS_KERNELS = {"preprocess": (backward_preprocess, PREPROCESS_PARAMS),
                "convert_dq": (convert_dq, CONVERT_DQ_PARAMS),
                "convert_dq_tiles": (convert_dq_tiles, CONVERT_DQ_TILES_PARAMS)}


def config_variants(config, dtype: str, head_dim: int, causal: bool) -> dict:
    """The binaries a `BackwardConfig` runs (dense): {'kv_det', 'kv_atomic', 'dq'} -> variant."""
    kv = {f"kv_{'atomic' if atomic else 'det'}": BackwardKvVariant(
        dtype, head_dim, *config.kv_tiles, causal, atomic, worker_warps=config.kv_worker_warps,
        q_latency=config.q_latency, dq_coalesced=atomic and config.dq_coalesced)
        for atomic in (False, True)}
    return {**kv, "dq": BackwardDqVariant(dtype, head_dim, *config.dq_tiles, causal,
                                          worker_warps=config.dq_worker_warps,
                                          masked_first=config.dq_masked_first)}


def all_backward_variants(dtypes=DTYPES, head_dims=HEAD_DIMS, tiles=None):
    """Every backward binary the calls run: per dtype and head dim, the K/V-major kernel (both
    masks, atomic and deterministic dQ) and the deterministic dQ kernel of the default config
    (`backward_schedules.DEFAULT_BACKWARD_CONFIG`; or both kernels at `tiles`, the compiler's
    warps), packed variable-length batches at their own tiles, and the row kernels (with the
    coalesced accumulator's conversion where the default config adds coalesced)."""
    from wavefront.backward_schedules import (DEFAULT_VARLEN_BACKWARD_TILES, BackwardConfig,
                                              backward_config)
    for dtype in dtypes:
        for head_dim in head_dims:
            for causal in (False, True):
                if tiles is None:
                    yield from config_variants(backward_config(None, head_dim), dtype,
                                               head_dim, causal).values()
                else:
                    yield from config_variants(BackwardConfig(tiles, tiles), dtype, head_dim,
                                               causal).values()
                tile_m, tile_n = tiles or DEFAULT_VARLEN_BACKWARD_TILES[head_dim]
                if head_dim == 128 and (tile_m, tile_n) == (64, 64):
                    tile_m = 128  # (the deterministic packed binaries do not build at 64x64)
                for atomic in (True, False):
                    yield BackwardKvVariant(dtype, head_dim, tile_m, tile_n, causal, atomic,
                                            varlen=True)
                yield BackwardDqVariant(dtype, head_dim, tile_m, tile_n, causal, varlen=True)
            yield RowsVariant("preprocess", dtype, head_dim)
            yield RowsVariant("convert_dq", dtype, head_dim)
            default = backward_config(None, head_dim)
            if tiles is None and default.dq_coalesced:  # the coalesced accumulator's pass
                yield RowsVariant("convert_dq_tiles", dtype, head_dim, default.kv_tiles[0])
