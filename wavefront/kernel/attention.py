"""FlashAttention forward in cuTile, driven by a work table: the schedule is data, not code.

A schedule decides which CTA takes which work item and in which order the item scans K/V. The
host writes those decisions into a small int32 table (`Launch.work_table`, one row per work
item in the order items are handed out: batch, head, K/V head, Q tile, the unmasked K/V scan
as start + step x t, the masked tiles, the chunk). The kernel reads its items' rows and
contains no schedule code at all, so every static CTA schedule and every K/V direction runs
the same machine code: a schedule can change only the order of memory accesses, never the
instructions. (Each schedule as its own specialisation, the first design, let the compiler
serialise the wgmma pipeline wherever both scan directions were compiled in: SASS showed a
`WARPGROUP.DEPBAR` after every HGMMA and local-memory spills, and sawtooth ran up to 20%
slower than linear at equal misses.)

Two assignment modes remain compile-time constants, because they change the loop itself:
static (CTA c takes table rows c, c + P, c + 2P, ...; a grid launch is the same loop with one
row per CTA) and dynamic (a CTA takes the next row from a global atomic counter when it
finishes one, FlashAttention-3's dynamic persistent scheduler; sawtooth then alternates on the
CTA's own count of items). The tiled K/V schedule writes partial states instead of the output
(PARTIALS) and keeps its own binary.

Layout: Q, O are (batch, heads, seqlen_q, head_dim); K, V are (batch, kv_heads, seqlen_kv,
head_dim); the last dimension is contiguous. The optional LSE is (batch, heads, seqlen_q) float32,
natural log.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import cuda.tile as ct

from wavefront.point import (DEFAULT_OCCUPANCY, DTYPES, HEAD_DIMS, LEVERS, TILE_SHAPES,
                             check_levers, with_lever_fields)
from wavefront.schedules import (
    WORK_BATCH,
    WORK_CHUNK,
    WORK_DIAGONAL,
    WORK_HEAD,
    WORK_KV_HEAD,
    WORK_KV_START,
    WORK_MASKED_HI,
    WORK_MASKED_LO,
    WORK_Q_START,
    WORK_Q_TILE,
    WORK_SCAN_COUNT,
    WORK_SCAN_START,
    WORK_SCAN_STEP,
    WORK_SEQLEN_KV,
    WORK_SEQLEN_Q,
    Launch,
)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

LOG2_E = 1.0 / math.log(2.0)
LN_2 = math.log(2.0)
# Running row maximum starts finite: a row whose first visited tile is fully masked (a causal
# tile with tile_m > tile_n) would otherwise compute -inf - -inf = NaN.
ROW_MAX_START = -1.0e30
# Load latency hints (1 low .. 10 high DRAM traffic) of the K and V tiles, unless a variant
# sets one hint for both (`KernelVariant.kv_latency`, a `wavefront tune` lever).
DEFAULT_K_LATENCY, DEFAULT_V_LATENCY = 2, 4


# 2^f on [0, 1) as a degree-3 polynomial (Horner, three FMAs): least-squares fit of the relative
# error, max 8.6e-5, far below the bfloat16 rounding of P (2^-9). p(0) = 1 exactly.
EXP2_POLY_COEFFS = (0.6951163362592897, 0.2276469991365117, 0.07706520291427181)
# Exponents below -126 would leave the normal range of the bit trick; 2^-126 beside a row sum
# >= 1 is nothing (a masked -inf lands here too).
EXP2_POLY_FLOOR = -126.0


def _exp2_on_fma(x):
    """2^x on the FMA units (FlashAttention-4's trick for an exp-bound softmax): 2^floor(x) put
    into the exponent bits of the polynomial's 2^frac(x), instead of one MUFU.EX2 per element."""
    x = ct.maximum(x, EXP2_POLY_FLOOR)
    whole = ct.floor(x)
    frac = x - whole
    c1, c2, c3 = EXP2_POLY_COEFFS
    mantissa = 1.0 + frac * (c1 + frac * (c2 + frac * c3))  # in [1, 2)
    bits = ct.bitcast(mantissa, ct.int32) + ct.bitwise_lshift(whole.astype(ct.int32), 23)
    return ct.bitcast(bits, ct.float32)


def _exp2_quarter(x, i: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, EXP2_POLY: ConstInt):
    part = ct.extract(x, (0, i), shape=(TILE_M, TILE_N // 4))
    if i >= 4 - EXP2_POLY:
        part = _exp2_on_fma(part)
    else:
        part = ct.exp2(part, flush_to_zero=True)
    return part


def _exp2_split(x, TILE_M: ConstInt, TILE_N: ConstInt, EXP2_POLY: ConstInt):
    """2^x with the last EXP2_POLY quarters of the columns on the FMA units, the rest on the
    exponential unit (MUFU.EX2, 16 per SM per clock against 128 FMAs: the bottleneck at D=64)."""
    if EXP2_POLY == 0:
        y = ct.exp2(x, flush_to_zero=True)
    elif EXP2_POLY == 4:
        y = _exp2_on_fma(x)
    else:
        y = ct.cat((ct.cat((_exp2_quarter(x, 0, TILE_M, TILE_N, EXP2_POLY),
                            _exp2_quarter(x, 1, TILE_M, TILE_N, EXP2_POLY)), 1),
                    ct.cat((_exp2_quarter(x, 2, TILE_M, TILE_N, EXP2_POLY),
                            _exp2_quarter(x, 3, TILE_M, TILE_N, EXP2_POLY)), 1)), 1)
    return y


def _scores(q, K, batch, kv_head, j, HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
            K_LATENCY: ConstInt):
    """S = Q K^T for K/V tile j, unscaled, in float32."""
    k = ct.load(K, index=(batch, kv_head, 0, j), shape=(1, 1, HEAD_DIM, TILE_N),
                order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO, latency=K_LATENCY)
    k = k.reshape((HEAD_DIM, TILE_N))  # [HEAD_DIM, TILE_N]: K^T, transposed by the load
    return ct.mma(q, k, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))  # [TILE_M, TILE_N]


def _online_softmax_step(q, K, V, batch, kv_head, j, m_i, l_i, acc, qk_scale_log2, rows,
                         seqlen_kv, HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                         MASKED: ConstBool, CAUSAL: ConstBool, K_LATENCY: ConstInt,
                         V_LATENCY: ConstInt, RESCALE_THRESHOLD: ConstInt,
                         EXP2_POLY: ConstInt):
    """Fold K/V tile j into the running (row max, row sum, output) of one Q tile."""
    qk = _scores(q, K, batch, kv_head, j, HEAD_DIM, TILE_M, TILE_N, K_LATENCY)
    return _fold_scores(qk, q, V, batch, kv_head, j, m_i, l_i, acc, qk_scale_log2, rows,
                        seqlen_kv, HEAD_DIM, TILE_M, TILE_N, MASKED, CAUSAL, V_LATENCY,
                        RESCALE_THRESHOLD, EXP2_POLY)


def _fold_scores(qk, q, V, batch, kv_head, j, m_i, l_i, acc, qk_scale_log2, rows, seqlen_kv,
                 HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, MASKED: ConstBool,
                 CAUSAL: ConstBool, V_LATENCY: ConstInt, RESCALE_THRESHOLD: ConstInt,
                 EXP2_POLY: ConstInt):
    """The online softmax of K/V tile j's scores `qk`, then P V into the output."""
    if MASKED:
        cols = j * TILE_N + ct.arange(TILE_N, dtype=ct.int32)[None, :]  # [1, TILE_N]
        keep = cols < seqlen_kv
        if CAUSAL:
            keep = keep & (rows >= cols)
        qk = ct.where(keep, qk, -np.inf)
    # Scale after the row max: one multiply per row instead of one per element.
    m_tile = ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2  # [TILE_M, 1]
    if RESCALE_THRESHOLD == 0:
        m_new = max(m_i, m_tile)  # [TILE_M, 1]
        p = _exp2_split(qk * qk_scale_log2 - m_new, TILE_M, TILE_N, EXP2_POLY)
        alpha = ct.exp2(m_i - m_new, flush_to_zero=True)  # [TILE_M, 1]
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
        acc = acc * alpha
        m_i = m_new
    else:
        # FlashAttention-4's conditional rescale: keep the stale maximum unless some row's grew
        # by more than 2^RESCALE_THRESHOLD. P is then at most 2^RESCALE_THRESHOLD (no overflow
        # in float32 or bfloat16) and the row sum and output share the same reference maximum,
        # so the final normalisation makes the result exact. The test is CTA-wide (a tile
        # condition): it skips the accumulator multiply, but costs a reduction across warps.
        if ct.max(m_tile - m_i) > RESCALE_THRESHOLD:
            m_new = max(m_i, m_tile)
            alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
            l_i = l_i * alpha
            acc = acc * alpha
            m_i = m_new
        p = _exp2_split(qk * qk_scale_log2 - m_i, TILE_M, TILE_N, EXP2_POLY)
        l_i = l_i + ct.sum(p, axis=-1, keepdims=True)
    # Zero padding matters here: a ragged V tile's rows meet p = 0, and 0 * garbage may be NaN.
    v = ct.load(V, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO, latency=V_LATENCY)
    v = v.reshape((TILE_N, HEAD_DIM))  # [TILE_N, HEAD_DIM]
    acc = ct.mma(p.astype(q.dtype), v, acc)  # [TILE_M, HEAD_DIM]
    return m_i, l_i, acc


def _store_normalised(Out, Lse, acc, row_max, row_sum, batch, head, q_tile,
                      HEAD_DIM: ConstInt, TILE_M: ConstInt, WRITE_LSE: ConstBool):
    """Output = acc / row sum in the output dtype; LSE (natural log) if asked.

    A row that saw no key (bottom-right causal with seqlen_q > seqlen_kv: its keys are all
    past the diagonal) has row sum 0 and acc 0: its output is 0, as FlashAttention's, not
    0 / 0, and its LSE -inf, the log of an empty sum (FlashAttention 2 writes +inf there for
    its backward's sake). Told by its row max, still ROW_MAX_START: its row sum is not 0
    where the polynomial exp2 (EXP2_POLY) floors a masked score's 2^-inf at 2^-126."""
    seen = row_max > ROW_MAX_START  # [TILE_M, 1]
    # x / inf = 0 under the approximate division (x times the reciprocal, 0)
    out = ct.truediv(acc, ct.where(seen, row_sum, np.inf), flush_to_zero=True,
                     rounding_mode=ct.RoundingMode.APPROX)
    ct.store(Out, index=(batch, head, q_tile, 0),
             tile=out.reshape((1, 1, TILE_M, HEAD_DIM)).astype(Out.dtype))
    if WRITE_LSE:
        lse = ct.where(seen, (row_max + ct.log2(row_sum)) * LN_2, -np.inf)  # [TILE_M, 1]
        ct.store(Lse, index=(batch, head, q_tile), tile=lse.reshape((1, 1, TILE_M)))


def _take_ticket(Order, Work, slot):
    """Order[slot] = the next value of a ticket counter: where this event falls in the launch's
    interleaving. The counter is never reset, so back-to-back launches need no memset; the
    host subtracts the launch's first ticket.

    Which counter: Order[0], shared by every CTA, unless the word after the tickets (Order[1
    + 2 x table rows], the launcher's `order_counters="per_cta"`) is 1; then each CTA counts
    on a word of its own after it (adjacent words: CTAs still share cache lines and L2
    slices, never a word). The flag is read, not compiled in, so the two are one binary.

    Relaxed: a ticket needs atomicity, not ordering. The default acquire-release order made each
    item wait for the previous item's stores, measured up to 6x slower (causal, one CTA per SM)
    and a different interleaving from the plain kernel's."""
    flag = 1 + 2 * Work.shape[0]
    counter = ct.gather(Order, flag) * (flag + 1 + ct.bid(0))
    ticket = ct.atomic_add(Order, counter, 1, memory_order=ct.MemoryOrder.RELAXED)
    ct.scatter(Order, slot, ticket)


def _work(Work, item, column):
    """One field of a work item's row (a scalar)."""
    return ct.gather(Work, (item, column))


def _attend_work_item(Q, K, V, Out, Lse, PartO, PartM, PartL, Work, Order, item, reverse,
                      qk_scale_log2, HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                      CAUSAL: ConstBool, PARTIALS: ConstBool, WRITE_LSE: ConstBool,
                      RECORD_ORDER: ConstBool, K_LATENCY: ConstInt, V_LATENCY: ConstInt,
                      RESCALE_THRESHOLD: ConstInt, EXP2_POLY: ConstInt, VARLEN: ConstBool,
                      QK_AHEAD: ConstInt):
    """Attend one work item as its table row says. `reverse` (0 or 1, dynamic sawtooth only)
    flips the row's unmasked scan.

    VARLEN: the arrays are packed sequences viewed as (1, heads, total rows, D); the item's
    sequence is sliced out of them (`Array.slice`, no copy), so tile indices, masks and the
    ragged end are the sequence's own, and a tile never reads or writes a neighbour's rows."""
    if RECORD_ORDER:
        _take_ticket(Order, Work, 1 + 2 * item)
    if VARLEN:
        q_start = _work(Work, item, WORK_Q_START)
        q_stop = q_start + _work(Work, item, WORK_SEQLEN_Q)
        kv_start = _work(Work, item, WORK_KV_START)
        seqlen_kv = _work(Work, item, WORK_SEQLEN_KV)
        Q = Q.slice(axis=2, start=q_start, stop=q_stop)
        Out = Out.slice(axis=2, start=q_start, stop=q_stop)
        K = K.slice(axis=2, start=kv_start, stop=kv_start + seqlen_kv)
        V = V.slice(axis=2, start=kv_start, stop=kv_start + seqlen_kv)
        if WRITE_LSE:
            Lse = Lse.slice(axis=2, start=q_start, stop=q_stop)
        batch = 0
    else:
        seqlen_kv = K.shape[2]
        batch = _work(Work, item, WORK_BATCH)
    head = _work(Work, item, WORK_HEAD)
    kv_head = _work(Work, item, WORK_KV_HEAD)
    q_tile = _work(Work, item, WORK_Q_TILE)
    count = _work(Work, item, WORK_SCAN_COUNT)
    step = _work(Work, item, WORK_SCAN_STEP)
    # A reversed scan starts at the other end; with reverse = 0 this is the row's own scan.
    start = _work(Work, item, WORK_SCAN_START) + reverse * step * (count - 1)
    step = step - 2 * reverse * step

    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))  # [TILE_M, HEAD_DIM]
    m_i = ct.full((TILE_M, 1), ROW_MAX_START, dtype=ct.float32)  # running row max (log2 units)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)  # running row sum
    acc = ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32)  # unnormalised output

    # One loop for both directions: the tile index is affine in the loop counter, so forward
    # and backward scans are the same instructions with a different start and sign.
    if QK_AHEAD == 0:
        for t in range(count):
            m_i, l_i, acc = _online_softmax_step(q, K, V, batch, kv_head, start + step * t, m_i,
                                                 l_i, acc, qk_scale_log2, 0, seqlen_kv,
                                                 HEAD_DIM, TILE_M, TILE_N, False, CAUSAL,
                                                 K_LATENCY, V_LATENCY, RESCALE_THRESHOLD,
                                                 EXP2_POLY)
    elif count > 0:
        # FlashAttention-3's intra-warpgroup overlap asks for tile t + 1's QK^T before tile
        # t's softmax. tileiras 13.4 issues it under the softmax's tail only (the rescale
        # factors, P's conversion, the accumulator's rescale), after the scores' exponentials,
        # and waits for it before P V (data/d128_limits/sass/); still 3-4% faster at most
        # D=128 shapes on the H100. Costs registers: tile t's P is held while tile t + 1's
        # scores arrive.
        qk = _scores(q, K, batch, kv_head, start, HEAD_DIM, TILE_M, TILE_N, K_LATENCY)
        for t in range(count - 1):
            qk_next = _scores(q, K, batch, kv_head, start + step * (t + 1), HEAD_DIM, TILE_M,
                              TILE_N, K_LATENCY)
            m_i, l_i, acc = _fold_scores(qk, q, V, batch, kv_head, start + step * t, m_i, l_i,
                                         acc, qk_scale_log2, 0, seqlen_kv, HEAD_DIM, TILE_M,
                                         TILE_N, False, CAUSAL, V_LATENCY, RESCALE_THRESHOLD,
                                         EXP2_POLY)
            qk = qk_next
        m_i, l_i, acc = _fold_scores(qk, q, V, batch, kv_head, start + step * (count - 1), m_i,
                                     l_i, acc, qk_scale_log2, 0, seqlen_kv, HEAD_DIM, TILE_M,
                                     TILE_N, False, CAUSAL, V_LATENCY, RESCALE_THRESHOLD,
                                     EXP2_POLY)
    # The tiles that need a mask (the causal diagonal, a ragged last tile) come last in every
    # direction, so the masked step is compiled once. Its row indices are made here, not
    # before the unmasked loop, so that they do not occupy registers across it.
    rows = q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]  # [TILE_M, 1]
    if CAUSAL:
        # Row r sees columns c <= r + diagonal (0: top-left; bottom-right: seqlen_kv -
        # seqlen_q of the item's sequence), a run-time value of the row: one binary for both.
        rows = rows + _work(Work, item, WORK_DIAGONAL)
    for j in range(_work(Work, item, WORK_MASKED_LO), _work(Work, item, WORK_MASKED_HI)):
        m_i, l_i, acc = _online_softmax_step(q, K, V, batch, kv_head, j, m_i, l_i, acc,
                                             qk_scale_log2, rows, seqlen_kv, HEAD_DIM, TILE_M,
                                             TILE_N, True, CAUSAL, K_LATENCY, V_LATENCY,
                                             RESCALE_THRESHOLD, EXP2_POLY)

    if PARTIALS:
        # The chunk's partial state, unnormalised, the output in PartO's dtype (float32, or
        # bfloat16 for tiled_fit_bf16); `combine_partials` merges the chunks.
        slab = _work(Work, item, WORK_CHUNK) * Q.shape[0] + batch
        ct.store(PartO, index=(slab, head, q_tile, 0),
                 tile=acc.reshape((1, 1, TILE_M, HEAD_DIM)).astype(PartO.dtype))
        ct.store(PartM, index=(slab, head, q_tile), tile=m_i.reshape((1, 1, TILE_M)))
        ct.store(PartL, index=(slab, head, q_tile), tile=l_i.reshape((1, 1, TILE_M)))
    else:
        _store_normalised(Out, Lse, acc, m_i, l_i, batch, head, q_tile, HEAD_DIM, TILE_M,
                          WRITE_LSE)
    if RECORD_ORDER:
        _take_ticket(Order, Work, 2 + 2 * item)


def _reset_when_last(NextItem, num_items):
    """NextItem = [item counter, CTAs finished]. The CTA that finishes last takes both back to
    zero, so the next launch (or graph replay) starts from zero with no host state.

    Every CTA takes items until one take finds none, so a launch of P CTAs leaves the counter at
    num_items + P. A CTA increments the finished count only after its last take has returned
    (the loop waits for the value), so when the last CTA's increment returns P - 1 every take
    of the launch has been performed, and its subtraction comes after all of them in the
    counter's order. The others subtract nothing. Relaxed and branchless, because tileiras 13.4
    crashed (segmentation fault) compiling an acquire-release increment or a conditional reset
    into the causal 128x128 dynamic kernel; the GPU tests check the counter after every
    launch."""
    ctas = ct.num_blocks(0)
    finished = ct.atomic_add(NextItem, 1, 1, memory_order=ct.MemoryOrder.RELAXED)
    last = (finished == ctas - 1).astype(ct.int32)
    ct.atomic_add(NextItem, 0, -(num_items + ctas) * last,
                  memory_order=ct.MemoryOrder.RELAXED)
    ct.atomic_add(NextItem, 1, -ctas * last, memory_order=ct.MemoryOrder.RELAXED)


def flash_attention_fwd(Q, K, V, Out, Lse, PartO, PartM, PartL, Work, NextItem, Order,
                        qk_scale_log2: float, num_items: int, alternate: int, HEAD_DIM: ConstInt, TILE_M: ConstInt,
                        TILE_N: ConstInt, CAUSAL: ConstBool, DYNAMIC: ConstBool,
                        PARTIALS: ConstBool, WRITE_LSE: ConstBool, RECORD_ORDER: ConstBool,
                        K_LATENCY: ConstInt, V_LATENCY: ConstInt, RESCALE_THRESHOLD: ConstInt,
                        EXP2_POLY: ConstInt, VARLEN: ConstBool, QK_AHEAD: ConstInt):
    """One CTA: take work items (table rows) and attend each.

    Static (DYNAMIC off): CTA c takes rows c, c + P, c + 2P, ... (grid-stride; a grid launch
    has one row per CTA). Dynamic: the CTA takes the row `NextItem[0]` names (a relaxed atomic
    increment) until the rows run out; with `alternate` its odd-numbered items scan backward
    (sawtooth on the CTA's own count). The last CTA to finish puts the counter back to zero
    (`_reset_when_last`), so a launch needs no host state: the same launch captured in a CUDA
    graph replays correctly, and back-to-back launches need no memset between them.

    RECORD_ORDER (off by default) takes a ticket from an atomic counter (`_take_ticket`) as
    each work item starts and ends, so the host learns the launch's true interleaving of work
    items, or, with the host's clock copied into the counters, their times.

    VARLEN: the item count is `NextItem[2]`, written with the table, since a packed batch's
    table may be written on the GPU from lengths the host never sees; `num_items` is then the
    table's rows, an upper bound."""
    if VARLEN:
        num_items = ct.gather(NextItem, 2)
    if DYNAMIC:
        taken = 0
        item = ct.atomic_add(NextItem, 0, 1, memory_order=ct.MemoryOrder.RELAXED)
        while item < num_items:
            _attend_work_item(Q, K, V, Out, Lse, PartO, PartM, PartL, Work, Order, item,
                              alternate * (taken % 2), qk_scale_log2, HEAD_DIM, TILE_M, TILE_N,
                              CAUSAL, PARTIALS, WRITE_LSE, RECORD_ORDER, K_LATENCY, V_LATENCY,
                              RESCALE_THRESHOLD, EXP2_POLY, VARLEN, QK_AHEAD)
            taken += 1
            item = ct.atomic_add(NextItem, 0, 1, memory_order=ct.MemoryOrder.RELAXED)
        _reset_when_last(NextItem, num_items)
    else:
        for item in range(ct.bid(0), num_items, ct.num_blocks(0)):
            _attend_work_item(Q, K, V, Out, Lse, PartO, PartM, PartL, Work, Order, item, 0,
                              qk_scale_log2, HEAD_DIM, TILE_M, TILE_N, CAUSAL, PARTIALS,
                              WRITE_LSE, RECORD_ORDER, K_LATENCY, V_LATENCY,
                              RESCALE_THRESHOLD, EXP2_POLY, VARLEN, QK_AHEAD)


def merge_partial_state(m, l_sum, acc, m_part, l_part, acc_part):
    """(row max, row sum, output) of two partial states of the same rows merged exactly: the
    online softmax's algebra. A part that saw no key (row max ROW_MAX_START, row sum 0) weighs
    nothing. The tiled schedule's and the cache call's split combines both merge so."""
    m_new = max(m, m_part)
    alpha = ct.exp2(m - m_new, flush_to_zero=True)
    beta = ct.exp2(m_part - m_new, flush_to_zero=True)
    return m_new, l_sum * alpha + l_part * beta, acc * alpha + acc_part * beta


@ct.kernel
def combine_partials(PartO, PartM, PartL, Out, Lse, n_chunks: int, HEAD_DIM: ConstInt,
                     TILE_M: ConstInt, WRITE_LSE: ConstBool):
    """Merge the K/V chunks' partial states of one (batch, head, Q tile) exactly.

    Same algebra as the online softmax, one chunk at a time. A chunk that saw no key (past the
    causal diagonal) has row max ROW_MAX_START and row sum 0, so it weighs nothing.
    """
    q_tile = ct.bid(0)
    heads = Out.shape[1]
    batch_size = Out.shape[0]
    batch = ct.bid(1) // heads
    head = ct.bid(1) % heads
    m = ct.full((TILE_M, 1), ROW_MAX_START, dtype=ct.float32)
    l_sum = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32)
    for chunk in range(n_chunks):
        slab = chunk * batch_size + batch
        m_c = ct.load(PartM, index=(slab, head, q_tile), shape=(1, 1, TILE_M),
                      padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, 1))
        l_c = ct.load(PartL, index=(slab, head, q_tile), shape=(1, 1, TILE_M),
                      padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, 1))
        a_c = ct.load(PartO, index=(slab, head, q_tile, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                      padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))
        m, l_sum, acc = merge_partial_state(m, l_sum, acc, m_c, l_c, a_c.astype(ct.float32))
    _store_normalised(Out, Lse, acc, m, l_sum, batch, head, q_tile, HEAD_DIM, TILE_M, WRITE_LSE)


@lru_cache(maxsize=None)
def kernel_for(occupancy: int, cluster: int = 1, worker_warps: int | None = None):
    """cuTile takes these as kernel options, so each combination is its own kernel object:
    CTAs per SM, CTAs per cluster (2: pairs of CTAs that can share K/V loads by TMA
    multicast) and warps per consumer warpgroup set (None: the compiler's choice)."""
    if not 1 <= occupancy <= 32:
        raise ValueError(f"occupancy must be in [1, 32], got {occupancy!r}")
    check_levers(cluster=cluster, worker_warps=worker_warps)
    return ct.kernel(flash_attention_fwd, occupancy=occupancy, num_ctas=cluster,
                     num_worker_warps=worker_warps)



# --------------------------------------------------------------------------------------------
# The launch contract: the kernels' own signatures, plus what each array parameter holds.
# The ahead-of-time signature and the launch arguments are both derived from these, so the
# argument order is written once (in the `def` above).
# --------------------------------------------------------------------------------------------

IO = "io"  # an array of the input dtype (bfloat16 or float16)


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "array" | "scalar" | "constant"
    dtype: str  # array or scalar element type: IO, "float32" or "int32"; "" for constants
    ndim: int = 0


def _contract(fn, arrays: dict[str, tuple[str, int]]) -> tuple[Param, ...]:
    """Parameters of `fn` in order: unannotated ones are the arrays named in `arrays`, `float`
    and `int` are run-time scalars, `ct.Constant[...]` are compile-time constants."""
    params = []
    for p in inspect.signature(fn).parameters.values():
        ann = p.annotation if isinstance(p.annotation, str) else repr(p.annotation)
        if "Const" in ann:
            params.append(Param(p.name, "constant", ""))
        elif ann in ("float", repr(float)):
            params.append(Param(p.name, "scalar", "float32"))
        elif ann in ("int", repr(int)):
            params.append(Param(p.name, "scalar", "int32"))
        else:
            dtype, ndim = arrays[p.name]
            params.append(Param(p.name, "array", dtype, ndim))
    return tuple(params)


ATTENTION_PARAMS = _contract(flash_attention_fwd, {
    "Q": (IO, 4), "K": (IO, 4), "V": (IO, 4), "Out": (IO, 4),  # (batch, heads, seqlen, D)
    "Lse": ("float32", 3),  # (batch, heads, seqlen); a 1-element stand-in when not written
    "PartO": ("float32", 4), "PartM": ("float32", 3), "PartL": ("float32", 3),  # tiled only
    "Work": ("int32", 2),  # (items, WORK_COLUMNS): the launch's work table
    # [item counter, CTAs finished] (DYNAMIC; zero between launches), item count (VARLEN)
    "NextItem": ("int32", 1),
    # RECORD_ORDER only: [counter, start and end ticket of each work item, per-CTA flag,
    # per-CTA counters] (`_take_ticket`)
    "Order": ("int32", 1),
})
COMBINE_PARAMS = _contract(combine_partials._pyfunc, {
    "PartO": ("float32", 4), "PartM": ("float32", 3), "PartL": ("float32", 3),
    "Out": (IO, 4), "Lse": ("float32", 3)})


def launch_args(params: tuple[Param, ...], values: dict) -> tuple:
    """The argument tuple of a launch, in the kernel's order, from named values."""
    names = [p.name for p in params]
    missing = [n for n in names if n not in values]
    extra = [n for n in values if n not in names]
    if missing or extra:
        raise TypeError(f"kernel arguments: missing {missing}, unexpected {extra}")
    return tuple(values[n] for n in names)


def _array_constraint(dtype, ndim):
    from cuda.tile.compilation import ArrayConstraint
    return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False,
                           stride_constant=(None,) * (ndim - 1) + (1,),
                           stride_divisible_by=(8,) * (ndim - 1) + (1,),
                           shape_divisible_by=(1,) * (ndim - 1) + (16 if ndim == 4 else 1,),
                           base_addr_divisible_by=16)


def aot_signature(params: tuple[Param, ...], io_dtype: str, constants: dict, symbol: str,
                  array_dtypes: dict | None = None):
    """The general ahead-of-time signature: contiguous arrays, any batch, heads and length.

    The JIT may specialise further for the arrays it is given (e.g. it bakes in dimensions of
    size 1 and divisibility of the sequence length); this is the variant that serves them all.
    """
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint
    out = []
    for p in params:
        if p.kind == "array":
            dtype = (array_dtypes or {}).get(p.name, p.dtype)
            out.append(_array_constraint(getattr(ct, io_dtype if dtype == IO else dtype),
                                         p.ndim))
        elif p.kind == "scalar":
            out.append(ScalarConstraint(getattr(ct, p.dtype)))
        else:
            out.append(constants[p.name])
    sig = KernelSignature(out, CallingConvention.cutile_python_v2())
    return sig.with_mangled_symbol(symbol)


# --------------------------------------------------------------------------------------------
# Specialisations
# --------------------------------------------------------------------------------------------

# The tiled family's partial outputs: float32, or bfloat16 (tiled_fit_bf16).
PARTIAL_DTYPES = ("float32", "bfloat16")


def partials_dtype_for(launch: Launch) -> str:
    return "bfloat16" if launch.kv.partial_output_bytes == 2 else "float32"


@dataclass(frozen=True)
@with_lever_fields
class KernelVariant:
    """One compiled binary of the attention kernel. The schedule is not part of it: every
    static CTA schedule and K/V direction runs the same binary, with its own work table.

    Label: `<dtype>_d<D>_<M>x<N>_<full|causal>_<static|dynamic>[_partials]_occ<O>[_lse][_order]`,
    e.g. `bf_d128_128x64_causal_static_occ2` (dtype bf = bfloat16, fp = float16).
    """

    dtype: str  # "bfloat16" | "float16"
    head_dim: int
    tile_m: int
    tile_n: int
    causal: bool
    occupancy: int
    dynamic: bool = False  # CTAs take items from an atomic counter (dynamic CTA schedules)
    partials: bool = False  # the tiled K/V schedule: write chunk partial states
    write_lse: bool = False
    record_order: bool = False  # work-item tickets (measured order); off in every timed run
    partials_dtype: str = "float32"  # the partial outputs' dtype (tiled_fit_bf16: bfloat16)
    varlen: bool = False  # packed variable-length sequences, sliced per work item
    # then one field per kernel lever (`point.LEVERS`), added by `with_lever_fields`

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim!r}")
        if (self.tile_m, self.tile_n) not in TILE_SHAPES:
            raise ValueError(f"tiles must be one of {TILE_SHAPES}, got "
                             f"{(self.tile_m, self.tile_n)!r}")
        if self.varlen and self.partials:
            raise ValueError("variable-length batches do not run the tiled schedules")
        if self.partials and self.write_lse:
            raise ValueError("the tiled schedule writes partial states; its combine kernel "
                             "writes the LSE")
        check_levers(**self.levers)
        if self.partials_dtype not in PARTIAL_DTYPES:
            raise ValueError(f"partials_dtype must be one of {PARTIAL_DTYPES}, got "
                             f"{self.partials_dtype!r}")

    @property
    def levers(self) -> dict:
        return {lever.name: getattr(self, lever.name) for lever in LEVERS}

    @classmethod
    def for_launch(cls, launch: Launch, dtype: str, *, write_lse: bool = False,
                   record_order: bool = False, **levers) -> "KernelVariant":
        """The binary that runs `launch` (with these kernel levers, by name)."""
        p = launch.problem
        partials = launch.kv.writes_partials
        return cls(dtype, p.head_dim, p.tile_m, p.tile_n, p.causal, launch.ctas_per_sm,
                   launch.cta.dynamic, partials, write_lse and not partials, record_order,
                   partials_dtype=partials_dtype_for(launch), varlen=launch.varlen, **levers)

    @property
    def constants(self) -> dict:
        return {"HEAD_DIM": self.head_dim, "TILE_M": self.tile_m, "TILE_N": self.tile_n,
                "CAUSAL": self.causal, "DYNAMIC": self.dynamic, "PARTIALS": self.partials,
                "WRITE_LSE": self.write_lse, "RECORD_ORDER": self.record_order,
                # K is needed first (QK^T), V after the softmax: hint V as further away
                "K_LATENCY": self.kv_latency or DEFAULT_K_LATENCY,
                "V_LATENCY": self.kv_latency or DEFAULT_V_LATENCY,
                "RESCALE_THRESHOLD": self.rescale_threshold, "EXP2_POLY": self.exp2_poly,
                "VARLEN": self.varlen, "QK_AHEAD": self.qk_ahead}

    @property
    def label(self) -> str:
        return (f"{self.dtype[:2]}_d{self.head_dim}_{self.tile_m}x{self.tile_n}"
                f"_{'causal' if self.causal else 'full'}"
                f"_{'dynamic' if self.dynamic else 'static'}{'_partials' if self.partials else ''}"
                f"{'_bf16' if self.partials_dtype != 'float32' else ''}"
                f"_occ{self.occupancy}{'_lse' if self.write_lse else ''}"
                f"{'_order' if self.record_order else ''}"
                + "".join(f"_{lever.label}{getattr(self, lever.name)}" for lever in LEVERS
                          if getattr(self, lever.name) != lever.default)
                + f"{'_varlen' if self.varlen else ''}")

    def kernel(self):
        return kernel_for(self.occupancy, self.cluster, self.worker_warps)

    def signature(self):
        return aot_signature(ATTENTION_PARAMS, self.dtype, self.constants, "flash_attention_fwd",
                             {"PartO": self.partials_dtype})


def all_variants(dtypes=DTYPES, head_dims=HEAD_DIMS, tiles=TILE_SHAPES, write_lse=(False,)):
    """Every binary `wavefront compile --all` builds: static and dynamic assignment, each for
    packed variable-length batches too, and the tiled schedule's partial-state writer (static
    only: its chunk-major order is static)."""
    for dtype in dtypes:
        for head_dim in head_dims:
            for tile in tiles:
                for causal in (False, True):
                    occupancy = DEFAULT_OCCUPANCY[tile]
                    for dynamic in (False, True):
                        for lse in write_lse:
                            yield KernelVariant(dtype, head_dim, tile[0], tile[1], causal,
                                                occupancy, dynamic, False, lse)
                        yield KernelVariant(dtype, head_dim, tile[0], tile[1], causal,
                                            occupancy, dynamic, varlen=True)
                    for partials_dtype in PARTIAL_DTYPES:
                        yield KernelVariant(dtype, head_dim, tile[0], tile[1], causal,
                                            occupancy, False, True,
                                            partials_dtype=partials_dtype)


@dataclass(frozen=True)
class CombineVariant:
    """One specialisation of the tiled schedule's combine kernel."""

    dtype: str
    head_dim: int
    tile_m: int
    write_lse: bool = False
    partials_dtype: str = "float32"

    @property
    def constants(self) -> dict:
        return {"HEAD_DIM": self.head_dim, "TILE_M": self.tile_m, "WRITE_LSE": self.write_lse}

    @property
    def label(self) -> str:
        return (f"combine_{self.dtype[:2]}_d{self.head_dim}_m{self.tile_m}"
                f"{'_lse' if self.write_lse else ''}"
                f"{'_bf16' if self.partials_dtype != 'float32' else ''}")

    def kernel(self):
        return combine_partials

    def signature(self):
        return aot_signature(COMBINE_PARAMS, self.dtype, self.constants, "combine_partials",
                             {"PartO": self.partials_dtype})


# Rows per combine CTA: the partials are indexed by row, so this need not match the attention
# tile; 64 rows keep the fp32 accumulator of D=128 in registers.
COMBINE_TILE_M = 64


def all_combine_variants(dtypes=DTYPES, head_dims=HEAD_DIMS, write_lse=(False, True)):
    for dtype in dtypes:
        for head_dim in head_dims:
            for lse in write_lse:
                for partials_dtype in PARTIAL_DTYPES:
                    yield CombineVariant(dtype, head_dim, COMBINE_TILE_M, lse, partials_dtype)


def compile_variant(variant, arch: str = "sm_90") -> bytes:
    """Compile one variant (attention or combine) ahead of time to a cubin: tileiras, no GPU."""
    import io

    from cuda.tile.compilation import export_kernel

    from wavefront.kernel.arch_support import check_buildable
    check_buildable(variant, arch)  # what the target's compiler cannot build, by name
    buf = io.BytesIO()
    export_kernel(variant.kernel(), [variant.signature()], buf, gpu_code=arch,
                  output_format="cubin")
    return buf.getvalue()
