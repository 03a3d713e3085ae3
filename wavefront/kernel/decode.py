"""Attention against a KV cache in cuTile: decode (one query per sequence) to chunked prefill
(thousands), contiguous or paged K/V, GQA packed, split-KV, driven by a work table.

Three kernels, launched in this order on one stream:

- `append_kv`: the call's new keys and values written into the cache at each sequence's
  `cache_seqlens` (FlashAttention's `flash_attn_with_kvcache` appends in place).
- `decode_attention`: persistent CTAs take rows of the work table grid-stride
  (`wavefront.decode_schedules`); a row is (batch, K/V head, Q tile, split). Its Q tile
  holds the query rows of every query head of the K/V head (GQA packing: a row r of the tile is
  query position `q_tile * ROWS + r // GROUP_TILE` of head `kv_head * group + r % GROUP_TILE`),
  so each K/V byte is read once per group. The item reads its sequence's key count on the GPU,
  takes its split's share of the K/V tiles (`split_tiles`), and writes the output or, with
  PARTIALS, its partial state.
- `combine_splits`: merges the splits' partial states (the tiled prefill's combine, per
  split), normalises, writes the output and the LSE.

Layouts (the last dimension contiguous): q and the output as the caller has them, (batch,
seqlen_q, heads, head_dim), viewed as (batch, seqlen_q, kv_heads, group, head_dim); the cache
(batch, S_max, kv_heads, head_dim), or a page pool (pages, page_size, kv_heads, head_dim) with
a block table (batch, pages per sequence) of page ids. A contiguous cache is the paged kernel
with sequence b's one page being row b (PAGED off: no table read). The LSE is (batch, heads,
seqlen_q) float32, natural log, viewed as (batch, kv_heads, group, seqlen_q).

Lengths are never trusted: every key count is clamped to the cache's capacity, every page id
into the pool, and a kernel that clamped raises a bit in `Flags` (`FLAG_*`), which the call
checks without waiting for the GPU (`wavefront.kernel.kvcache`).

Causal masks are bottom-right aligned (FlashAttention >= 2.1): with `seqlen_k = cache_seqlens
+ seqlen_new` keys, query i sits at key position `seqlen_k - seqlen_q + i` and sees the keys
up to it. A row that sees no key (an empty cache, or a query before the first key) gets
output 0 and LSE -inf.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import cuda.tile as ct

from wavefront.decode_schedules import (DECODE_BATCH, DECODE_KV_HEAD, DECODE_Q_TILE,
                                        DECODE_SPLIT, DECODE_SPLITS, MAX_TILE_M, MIN_TILE_M,
                                        PAGE_SIZES, DEFAULT_TILE_N, key_span,
                                        next_power_of_two, page_slot, pages_per_tile,
                                        split_tiles, sub_tile_page)
from wavefront.kernel.attention import (DEFAULT_K_LATENCY, DEFAULT_V_LATENCY, IO, LN_2,
                                        ROW_MAX_START, ConstBool, ConstInt, Param, _contract,
                                        merge_partial_state)
from wavefront.kernel.prepared import record_jit_binaries
from wavefront.point import DTYPES, HEAD_DIMS

# Bits of the flags buffer (int32 [4]): what a kernel clamped.
FLAG_SEQLEN = 1  # a cache_seqlens entry negative, or with the new keys past the capacity
FLAG_PAGE = 2  # a block table entry outside the page pool
FLAG_APPEND = 4  # a new key past the capacity (not written)
FLAG_WORDS = 4

# CTAs per SM of the attention kernel: decode is bound by memory, so more loads in flight.
DECODE_OCCUPANCY = 2
# Smallest positive row sum of a row that saw a key: the row's maximum contributes 2^0 = 1.
SEEN_ROW_SUM = 1.0


def _field(Work, item, column):
    """One field of a work item's row (a scalar)."""
    return ct.gather(Work, (item, column))


def _kv_page(BlockTable, num_pages, batch, slot):
    """-> (the page id in the block table's `slot` of sequence `batch`, clamped into the pool;
    1 if it was outside, else 0)."""
    page = ct.gather(BlockTable, (batch, slot))
    bad = ((page < 0) | (page >= num_pages)).astype(ct.int32)
    return min(max(page, 0), num_pages - 1), bad


def _page_part(K, V, BlockTable, batch, kv_head, j, part, PAGES_PER_TILE: ConstInt,
               HEAD_DIM: ConstInt, SUB_N: ConstInt, K_LATENCY: ConstInt,
               V_LATENCY: ConstInt):
    """K^T [HEAD_DIM, SUB_N] and V [SUB_N, HEAD_DIM] of one page of K/V tile j, and its
    page id's fault bit."""
    slot, _ = sub_tile_page(j, part, PAGES_PER_TILE, 1)
    page, bad = _kv_page(BlockTable, K.shape[0], batch, slot)
    k = ct.load(K, index=(page, kv_head, 0, 0), shape=(1, 1, HEAD_DIM, SUB_N),
                order=(0, 2, 3, 1), padding_mode=ct.PaddingMode.ZERO, latency=K_LATENCY)
    v = ct.load(V, index=(page, 0, kv_head, 0), shape=(1, SUB_N, 1, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO, latency=V_LATENCY)
    return k.reshape((HEAD_DIM, SUB_N)), v.reshape((SUB_N, HEAD_DIM)), bad


def _pages_tile(K, V, BlockTable, batch, kv_head, j, PAGES_PER_TILE: ConstInt,
                HEAD_DIM: ConstInt, TILE_N: ConstInt, K_LATENCY: ConstInt,
                V_LATENCY: ConstInt):
    """K^T [HEAD_DIM, TILE_N] and V [TILE_N, HEAD_DIM] of K/V tile j gathered from
    PAGES_PER_TILE (2 or 4) pages, one load each, and the number of bad page ids."""
    SUB_N = TILE_N // PAGES_PER_TILE
    k0, v0, bad0 = _page_part(K, V, BlockTable, batch, kv_head, j, 0, PAGES_PER_TILE,
                              HEAD_DIM, SUB_N, K_LATENCY, V_LATENCY)
    k1, v1, bad1 = _page_part(K, V, BlockTable, batch, kv_head, j, 1, PAGES_PER_TILE,
                              HEAD_DIM, SUB_N, K_LATENCY, V_LATENCY)
    if PAGES_PER_TILE == 2:
        k = ct.cat((k0, k1), 1)
        v = ct.cat((v0, v1), 0)
        bad = bad0 + bad1
    else:
        k2, v2, bad2 = _page_part(K, V, BlockTable, batch, kv_head, j, 2, PAGES_PER_TILE,
                                  HEAD_DIM, SUB_N, K_LATENCY, V_LATENCY)
        k3, v3, bad3 = _page_part(K, V, BlockTable, batch, kv_head, j, 3, PAGES_PER_TILE,
                                  HEAD_DIM, SUB_N, K_LATENCY, V_LATENCY)
        k = ct.cat((ct.cat((k0, k1), 1), ct.cat((k2, k3), 1)), 1)
        v = ct.cat((ct.cat((v0, v1), 0), ct.cat((v2, v3), 0)), 0)
        bad = bad0 + bad1 + bad2 + bad3
    return k, v, bad


def _decode_step(q, K, V, BlockTable, batch, kv_head, j, m_i, l_i, acc, bad_pages,
                 qk_scale_log2, row_end, subs_per_page, HEAD_DIM: ConstInt, TILE_M: ConstInt,
                 TILE_N: ConstInt, MASKED: ConstBool, PAGED: ConstBool,
                 PAGES_PER_TILE: ConstInt, K_LATENCY: ConstInt, V_LATENCY: ConstInt):
    """Fold K/V tile j into the running (row max, row sum, output); MASKED: keys at or past a
    row's `row_end` weigh nothing. Contiguous: sequence b's one page is row b of the cache."""
    if PAGES_PER_TILE == 1:
        if PAGED:
            slot, tile = sub_tile_page(j, 0, 1, subs_per_page)
            page, bad = _kv_page(BlockTable, K.shape[0], batch, slot)
        else:
            page, tile, bad = batch, j, 0
        # K^T straight from the (page, key, K/V head, D) layout: the load's order permutes it
        k = ct.load(K, index=(page, kv_head, 0, tile), shape=(1, 1, HEAD_DIM, TILE_N),
                    order=(0, 2, 3, 1), padding_mode=ct.PaddingMode.ZERO,
                    latency=K_LATENCY).reshape((HEAD_DIM, TILE_N))
        v_early = ct.full((TILE_N, HEAD_DIM), 0.0, dtype=q.dtype)  # (not used)
    else:
        k, v_early, bad = _pages_tile(K, V, BlockTable, batch, kv_head, j, PAGES_PER_TILE,
                                      HEAD_DIM, TILE_N, K_LATENCY, V_LATENCY)
        page, tile = 0, 0  # (not used)
    qk = ct.mma(q, k, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
    if MASKED:
        cols = j * TILE_N + ct.arange(TILE_N, dtype=ct.int32)[None, :]  # [1, TILE_N]
        qk = ct.where(cols < row_end, qk, -np.inf)
    m_tile = ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2  # [TILE_M, 1]
    m_new = max(m_i, m_tile)
    p = ct.exp2(qk * qk_scale_log2 - m_new, flush_to_zero=True)
    alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
    if PAGES_PER_TILE == 1:
        # Zero padding: a ragged cache's last V rows meet p = 0, and 0 * garbage may be NaN.
        v = ct.load(V, index=(page, tile, kv_head, 0), shape=(1, TILE_N, 1, HEAD_DIM),
                    padding_mode=ct.PaddingMode.ZERO,
                    latency=V_LATENCY).reshape((TILE_N, HEAD_DIM))
    else:
        v = v_early
    acc = ct.mma(p.astype(q.dtype), v, acc * alpha)
    return m_new, l_i, acc, bad_pages + bad


def _store_rows(Out, Lse, acc, row_max, row_sum, batch, kv_head, q_tile, HEAD_DIM: ConstInt,
                TILE_M: ConstInt, GROUP_TILE: ConstInt, WRITE_LSE: ConstBool):
    """Output = acc / row sum (0 for a row that saw no key), unpacked from the tile's
    (position, head) rows into (batch, seqlen_q, kv_heads, group, D); LSE if asked. Rows
    past the query length or the group are clipped by the store."""
    ROWS = TILE_M // GROUP_TILE
    # A row that saw a key has a row sum >= 1; one that saw none has acc = 0 and sum 0.
    out = ct.truediv(acc, ct.maximum(row_sum, SEEN_ROW_SUM), flush_to_zero=True,
                     rounding_mode=ct.RoundingMode.APPROX)
    ct.store(Out, index=(batch, q_tile, kv_head, 0, 0),
             tile=out.reshape((1, ROWS, 1, GROUP_TILE, HEAD_DIM)).astype(Out.dtype))
    if WRITE_LSE:
        lse = (row_max + ct.log2(row_sum)) * LN_2  # [TILE_M, 1]; log2(0) = -inf: no key
        lse = ct.permute(lse.reshape((ROWS, GROUP_TILE)), (1, 0))  # [GROUP_TILE, ROWS]
        ct.store(Lse, index=(batch, kv_head, 0, q_tile),
                 tile=lse.reshape((1, 1, GROUP_TILE, ROWS)))


def _attend_item(Q, K, V, Out, Lse, PartO, PartM, PartL, CacheSeqlens, BlockTable, Work,
                 Flags, item, qk_scale_log2, seqlen_new, causal, HEAD_DIM: ConstInt,
                 TILE_M: ConstInt, TILE_N: ConstInt, GROUP_TILE: ConstInt, PAGED: ConstBool,
                 PAGES_PER_TILE: ConstInt, PARTIALS: ConstBool, WRITE_LSE: ConstBool,
                 K_LATENCY: ConstInt, V_LATENCY: ConstInt):
    """Attend one work item (batch, K/V head, Q tile, split) as its table row says."""
    ROWS = TILE_M // GROUP_TILE
    batch = _field(Work, item, DECODE_BATCH)
    kv_head = _field(Work, item, DECODE_KV_HEAD)
    q_tile = _field(Work, item, DECODE_Q_TILE)
    split = _field(Work, item, DECODE_SPLIT)
    splits = _field(Work, item, DECODE_SPLITS)
    seqlen_q = Q.shape[1]
    page_size = K.shape[1]
    subs_per_page = page_size // (TILE_N // PAGES_PER_TILE)  # 1 where a tile holds pages
    if PAGED:
        capacity = BlockTable.shape[1] * page_size
    else:
        capacity = page_size
    # The sequence's keys, clamped to the cache (a bad length is flagged, never read past).
    cached = ct.gather(CacheSeqlens, (batch,))
    bad_length = ((cached < 0) | (cached + seqlen_new > capacity)).astype(ct.int32)
    seqlen_k = min(max(cached, 0) + seqlen_new, capacity)
    # Query position s sees the keys below min(s + offset, seqlen_k).
    first_row = q_tile * ROWS
    offset, keys_any, keys_all = key_span(seqlen_k, seqlen_q, causal, first_row, ROWS)
    first, last = split_tiles(split, splits, (keys_any + TILE_N - 1) // TILE_N)
    unmasked_end = min(last, keys_all // TILE_N)

    q = ct.load(Q, index=(batch, q_tile, kv_head, 0, 0),
                shape=(1, ROWS, 1, GROUP_TILE, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))
    m_i = ct.full((TILE_M, 1), ROW_MAX_START, dtype=ct.float32)  # running row max (log2)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)  # running row sum
    acc = ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32)  # unnormalised output
    bad_pages = 0
    for j in range(first, unmasked_end):
        m_i, l_i, acc, bad_pages = _decode_step(
            q, K, V, BlockTable, batch, kv_head, j, m_i, l_i, acc, bad_pages, qk_scale_log2,
            0, subs_per_page, HEAD_DIM, TILE_M, TILE_N, False, PAGED, PAGES_PER_TILE,
            K_LATENCY, V_LATENCY)
    # The rows' ends, made after the unmasked loop so they hold no registers across it.
    rows = first_row + ct.arange(TILE_M, dtype=ct.int32)[:, None] // GROUP_TILE  # [TILE_M, 1]
    row_end = min(rows + offset, seqlen_k)
    for j in range(max(first, unmasked_end), last):
        m_i, l_i, acc, bad_pages = _decode_step(
            q, K, V, BlockTable, batch, kv_head, j, m_i, l_i, acc, bad_pages, qk_scale_log2,
            row_end, subs_per_page, HEAD_DIM, TILE_M, TILE_N, True, PAGED, PAGES_PER_TILE,
            K_LATENCY, V_LATENCY)

    if PARTIALS:
        slab = split * Q.shape[0] + batch
        ct.store(PartO, index=(slab, q_tile, kv_head, 0, 0),
                 tile=acc.reshape((1, ROWS, 1, GROUP_TILE, HEAD_DIM)))
        ct.store(PartM, index=(slab, q_tile, kv_head, 0),
                 tile=m_i.reshape((1, ROWS, 1, GROUP_TILE)))
        ct.store(PartL, index=(slab, q_tile, kv_head, 0),
                 tile=l_i.reshape((1, ROWS, 1, GROUP_TILE)))
    else:
        _store_rows(Out, Lse, acc, m_i, l_i, batch, kv_head, q_tile, HEAD_DIM, TILE_M,
                    GROUP_TILE, WRITE_LSE)
    flags = FLAG_SEQLEN * bad_length + FLAG_PAGE * min(bad_pages, 1)
    ct.atomic_or(Flags, 0, flags, memory_order=ct.MemoryOrder.RELAXED)


def decode_attention(Q, K, V, Out, Lse, PartO, PartM, PartL, CacheSeqlens, BlockTable, Work,
                     Flags, qk_scale_log2: float, num_items: int, seqlen_new: int, causal: int,
                     HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                     GROUP_TILE: ConstInt, PAGED: ConstBool, PAGES_PER_TILE: ConstInt,
                     PARTIALS: ConstBool, WRITE_LSE: ConstBool, K_LATENCY: ConstInt,
                     V_LATENCY: ConstInt):
    """One persistent CTA: take table rows c, c + P, c + 2P, ... and attend each."""
    for item in range(ct.bid(0), num_items, ct.num_blocks(0)):
        _attend_item(Q, K, V, Out, Lse, PartO, PartM, PartL, CacheSeqlens, BlockTable, Work,
                     Flags, item, qk_scale_log2, seqlen_new, causal, HEAD_DIM, TILE_M, TILE_N,
                     GROUP_TILE, PAGED, PAGES_PER_TILE, PARTIALS, WRITE_LSE, K_LATENCY,
                     V_LATENCY)


def _split_state(PartO, PartM, PartL, batches, batch, kv_head, split, q_block,
                 ROWS: ConstInt, GROUP_TILE: ConstInt, HEAD_DIM: ConstInt):
    """(row max [TILE_M, 1], row sum [TILE_M, 1], output [TILE_M, HEAD_DIM]) of one split's
    ROWS query positions; a split past the last reads as row max -inf, which weighs
    nothing."""
    TILE_M = ROWS * GROUP_TILE
    slab = split * batches + batch
    m_s = ct.load(PartM, index=(slab, q_block, kv_head, 0), shape=(1, ROWS, 1, GROUP_TILE),
                  padding_mode=ct.PaddingMode.NEG_INF).reshape((TILE_M, 1))
    l_s = ct.load(PartL, index=(slab, q_block, kv_head, 0), shape=(1, ROWS, 1, GROUP_TILE),
                  padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, 1))
    a_s = ct.load(PartO, index=(slab, q_block, kv_head, 0, 0),
                  shape=(1, ROWS, 1, GROUP_TILE, HEAD_DIM),
                  padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))
    return m_s, l_s, a_s


def _four_states(PartO, PartM, PartL, batches, batch, kv_head, first, q_block,
                 ROWS: ConstInt, GROUP_TILE: ConstInt, HEAD_DIM: ConstInt):
    """The partial states of splits first .. first + 3, their loads issued together."""
    m0, l0, a0 = _split_state(PartO, PartM, PartL, batches, batch, kv_head, first, q_block,
                              ROWS, GROUP_TILE, HEAD_DIM)
    m1, l1, a1 = _split_state(PartO, PartM, PartL, batches, batch, kv_head, first + 1, q_block,
                              ROWS, GROUP_TILE, HEAD_DIM)
    m2, l2, a2 = _split_state(PartO, PartM, PartL, batches, batch, kv_head, first + 2, q_block,
                              ROWS, GROUP_TILE, HEAD_DIM)
    m3, l3, a3 = _split_state(PartO, PartM, PartL, batches, batch, kv_head, first + 3, q_block,
                              ROWS, GROUP_TILE, HEAD_DIM)
    return m0, l0, a0, m1, l1, a1, m2, l2, a2, m3, l3, a3


def _merge_four(m, l_sum, acc, states):
    m0, l0, a0, m1, l1, a1, m2, l2, a2, m3, l3, a3 = states
    m, l_sum, acc = merge_partial_state(m, l_sum, acc, m0, l0, a0)
    m, l_sum, acc = merge_partial_state(m, l_sum, acc, m1, l1, a1)
    m, l_sum, acc = merge_partial_state(m, l_sum, acc, m2, l2, a2)
    return merge_partial_state(m, l_sum, acc, m3, l3, a3)


@ct.kernel
def combine_splits(PartO, PartM, PartL, Out, Lse, num_splits: int, HEAD_DIM: ConstInt,
                   ROWS: ConstInt, GROUP_TILE: ConstInt, SPLIT_CHUNK: ConstInt,
                   WRITE_LSE: ConstBool):
    """Merge the splits' partial states of ROWS query positions of one (batch, K/V head)
    exactly: the online softmax's algebra, one split at a time, SPLIT_CHUNK (1, 4 or 8)
    splits' loads issued before the first of them is merged. (Merging the attention tile's 64
    rows split by split, each merge waiting on its load, the B1 32k decode step grew about half
    a microsecond a split from 64 to 128 splits on an H200; this form took its graphed step
    from 53.9 to 46.6 us at 29 splits: scripts/parallel_session.sh decode_sweep. Merging in
    the attention kernel instead, the last split of a unit merging after an acq_rel count of
    its arrival and gathering the partial states into registers, was correct in the GPU tests
    but slower: graphed B1 4k 43.6 against 17.4 us, 32k 97.2 against 44.3 us on an H200,
    commit 23aef87, reverted.) A split that
    saw no key has row max ROW_MAX_START and row sum 0, and one past the last reads as row max
    -inf: both weigh nothing. Grid: (query blocks of ROWS, batch x K/V heads)."""
    TILE_M = ROWS * GROUP_TILE
    q_block = ct.bid(0)
    kv_heads = Out.shape[2]
    batch = ct.bid(1) // kv_heads
    kv_head = ct.bid(1) % kv_heads
    batches = Out.shape[0]
    m = ct.full((TILE_M, 1), ROW_MAX_START, dtype=ct.float32)
    l_sum = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32)
    for chunk in range((num_splits + SPLIT_CHUNK - 1) // SPLIT_CHUNK):
        first = chunk * SPLIT_CHUNK
        if SPLIT_CHUNK == 1:
            m0, l0, a0 = _split_state(PartO, PartM, PartL, batches, batch, kv_head, first,
                                      q_block, ROWS, GROUP_TILE, HEAD_DIM)
            m, l_sum, acc = merge_partial_state(m, l_sum, acc, m0, l0, a0)
        else:
            states = _four_states(PartO, PartM, PartL, batches, batch, kv_head, first, q_block,
                                  ROWS, GROUP_TILE, HEAD_DIM)
            if SPLIT_CHUNK == 8:  # the second four's loads issued before the first merge
                later = _four_states(PartO, PartM, PartL, batches, batch, kv_head, first + 4,
                                     q_block, ROWS, GROUP_TILE, HEAD_DIM)
                m, l_sum, acc = _merge_four(m, l_sum, acc, states)
                m, l_sum, acc = _merge_four(m, l_sum, acc, later)
            else:
                m, l_sum, acc = _merge_four(m, l_sum, acc, states)
    _store_rows(Out, Lse, acc, m, l_sum, batch, kv_head, q_block, HEAD_DIM, TILE_M, GROUP_TILE,
                WRITE_LSE)


@ct.kernel
def append_kv(KNew, VNew, K, V, CacheSeqlens, BlockTable, Flags, HEAD_DIM: ConstInt,
              PAGED: ConstBool):
    """Write new key i of sequence b (and its value), every K/V head, at cache position
    cache_seqlens[b] + i. Grid: (new keys, batch). A position past the capacity (or a bad
    length or page id) writes nothing and raises FLAG_APPEND."""
    i = ct.bid(0)
    batch = ct.bid(1)
    page_size = K.shape[1]
    if PAGED:
        capacity = BlockTable.shape[1] * page_size
    else:
        capacity = page_size
    cached = ct.gather(CacheSeqlens, (batch,))
    position = cached + i
    # (not position < capacity: cached + i wraps past 2^31 - 1 to a negative position, which
    # the clamp below would turn into key 0 of the sequence, overwriting it)
    fits = (cached >= 0) & (cached < capacity - i)
    position = min(max(position, 0), capacity - 1)
    if PAGED:
        slot, key = page_slot(position, page_size)
        page = ct.gather(BlockTable, (batch, slot))
        fits = fits & (page >= 0) & (page < K.shape[0])
        page = min(max(page, 0), K.shape[0] - 1)
    else:
        page = batch
        key = position
    dims = ct.arange(HEAD_DIM, dtype=ct.int32)
    write = ct.full((HEAD_DIM,), 1, dtype=ct.int32) * fits.astype(ct.int32) > 0
    for head in range(K.shape[2]):
        k = ct.load(KNew, index=(batch, i, head, 0), shape=(1, 1, 1, HEAD_DIM))
        ct.scatter(K, (page, key, head, dims), k.reshape((HEAD_DIM,)), mask=write)
        v = ct.load(VNew, index=(batch, i, head, 0), shape=(1, 1, 1, HEAD_DIM))
        ct.scatter(V, (page, key, head, dims), v.reshape((HEAD_DIM,)), mask=write)
    ct.atomic_or(Flags, 0, FLAG_APPEND * (1 - fits.astype(ct.int32)),
                 memory_order=ct.MemoryOrder.RELAXED)


@lru_cache(maxsize=None)
def decode_kernel_for(occupancy: int):
    """The attention kernel object for `occupancy` CTAs per SM (a cuTile kernel option)."""
    if not 1 <= occupancy <= 32:
        raise ValueError(f"occupancy must be in [1, 32], got {occupancy!r}")
    kernel = ct.kernel(decode_attention, occupancy=occupancy)
    record_jit_binaries(kernel)  # before its first launch: the cache call prepares that binary
    return kernel


record_jit_binaries(combine_splits)


# --------------------------------------------------------------------------------------------
# The launch contract (as `attention.ATTENTION_PARAMS`): the kernels' signatures, plus what
# each array holds.
# --------------------------------------------------------------------------------------------

DECODE_PARAMS = _contract(decode_attention, {
    "Q": (IO, 5), "Out": (IO, 5),  # (batch, seqlen_q, kv_heads, group, D)
    "K": (IO, 4), "V": (IO, 4),  # (pages, page_size, kv_heads, D); contiguous: page = batch
    "Lse": ("float32", 4),  # (batch, kv_heads, group, seqlen_q); a stand-in when not written
    # PARTIALS: (splits x batch, seqlen_q, kv_heads, group[, D])
    "PartO": ("float32", 5), "PartM": ("float32", 4), "PartL": ("float32", 4),
    "CacheSeqlens": ("int32", 1), "BlockTable": ("int32", 2), "Work": ("int32", 2),
    "Flags": ("int32", 1)})
COMBINE_SPLITS_PARAMS = _contract(combine_splits._pyfunc, {
    "PartO": ("float32", 5), "PartM": ("float32", 4), "PartL": ("float32", 4),
    "Out": (IO, 5), "Lse": ("float32", 4)})
APPEND_PARAMS = _contract(append_kv._pyfunc, {
    "KNew": (IO, 4), "VNew": (IO, 4), "K": (IO, 4), "V": (IO, 4),
    "CacheSeqlens": ("int32", 1), "BlockTable": ("int32", 2), "Flags": ("int32", 1)})


def _signature(params: tuple[Param, ...], io_dtype: str, constants: dict, symbol: str):
    """The general ahead-of-time signature: any shapes, strides in elements (a view of q by
    group, an LSE of one query, have strides no multiple of anything), the last dimension
    contiguous."""
    from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                       ScalarConstraint)
    out = []
    for p in params:
        if p.kind == "array":
            dtype = getattr(ct, io_dtype if p.dtype == IO else p.dtype)
            out.append(ArrayConstraint(dtype, p.ndim, index_dtype=ct.int32,
                                       stride_lower_bound_incl=0, alias_groups=(),
                                       may_alias_internally=False,
                                       stride_constant=(None,) * (p.ndim - 1) + (1,),
                                       stride_divisible_by=(1,) * p.ndim,
                                       shape_divisible_by=(1,) * p.ndim,
                                       base_addr_divisible_by=16))
        elif p.kind == "scalar":
            out.append(ScalarConstraint(getattr(ct, p.dtype)))
        else:
            out.append(constants[p.name])
    return KernelSignature(out, CallingConvention.cutile_python_v2()).with_mangled_symbol(symbol)


def _check_common(dtype: str, head_dim: int) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim!r}")


TILE_MS = tuple(1 << n for n in range(MIN_TILE_M.bit_length() - 1, MAX_TILE_M.bit_length()))
TILE_NS = (DEFAULT_TILE_N,)
PAGES_PER_TILES = tuple(sorted({pages_per_tile(size) for size in PAGE_SIZES}))


@dataclass(frozen=True)
class DecodeVariant:
    """One binary of the cache attention kernel. Label:
    `decode_<dtype>_d<D>_m<TILE_M>_n<TILE_N>_g<GROUP_TILE>[_paged[_p<pages per tile>]][_splits]
    [_lse]_occ<O>`."""

    dtype: str
    head_dim: int
    tile_m: int
    tile_n: int
    group_tile: int
    paged: bool
    partials: bool = False  # split-KV: write partial states for `combine_splits`
    write_lse: bool = False
    pages_per_tile: int = 1  # pages of 16 or 32 keys: a K/V tile is loaded page by page
    occupancy: int = DECODE_OCCUPANCY

    def __post_init__(self):
        _check_common(self.dtype, self.head_dim)
        if self.pages_per_tile not in PAGES_PER_TILES or (self.pages_per_tile > 1
                                                          and not self.paged):
            raise ValueError(f"pages_per_tile must be one of {PAGES_PER_TILES} (above 1 only "
                             f"for a paged cache), got {self.pages_per_tile!r}")
        if self.tile_m not in TILE_MS:
            raise ValueError(f"tile_m must be one of {TILE_MS}, got {self.tile_m!r}")
        if self.tile_n not in TILE_NS:
            raise ValueError(f"tile_n must be one of {TILE_NS}, got {self.tile_n!r}")
        if self.group_tile & (self.group_tile - 1) or not 1 <= self.group_tile <= self.tile_m:
            raise ValueError(f"group_tile must be a power of two at most tile_m "
                             f"({self.tile_m}), got {self.group_tile!r}")
        if self.partials and self.write_lse:
            raise ValueError("a split launch writes partial states; combine_splits writes the "
                             "LSE")

    @property
    def constants(self) -> dict:
        return {"HEAD_DIM": self.head_dim, "TILE_M": self.tile_m, "TILE_N": self.tile_n,
                "GROUP_TILE": self.group_tile, "PAGED": self.paged,
                "PAGES_PER_TILE": self.pages_per_tile, "PARTIALS": self.partials,
                "WRITE_LSE": self.write_lse,
                # K is needed first (QK^T), V after the softmax: hint V as further away
                "K_LATENCY": DEFAULT_K_LATENCY, "V_LATENCY": DEFAULT_V_LATENCY}

    @property
    def label(self) -> str:
        return (f"decode_{self.dtype[:2]}_d{self.head_dim}_m{self.tile_m}_n{self.tile_n}"
                f"_g{self.group_tile}{'_paged' if self.paged else ''}"
                f"{f'_p{self.pages_per_tile}' if self.pages_per_tile > 1 else ''}"
                f"{'_splits' if self.partials else ''}{'_lse' if self.write_lse else ''}"
                f"_occ{self.occupancy}")

    def kernel(self):
        return decode_kernel_for(self.occupancy)

    def signature(self):
        return _signature(DECODE_PARAMS, self.dtype, self.constants, "decode_attention")


# Elements of a split's partial output up to which the combine issues eight splits' loads at
# once (2 KB of float32: a decode step's GQA group of 4 at D=128), four splits' (4 KB); larger
# tiles load one split at a time.
COMBINE_EIGHT_ELEMENTS = 512
COMBINE_FOUR_ELEMENTS = 1024
SPLIT_CHUNKS = (1, 4, 8)


def combine_tiles(seqlen_q: int, group_tile: int, head_dim: int) -> tuple[int, int]:
    """-> (query positions per combine CTA, splits whose loads are issued together): every
    position of a short query (decode: 1) up to the attention tile's, and 8 or 4 splits where
    a split's rows are small enough (COMBINE_EIGHT_ELEMENTS, COMBINE_FOUR_ELEMENTS), else 1."""
    rows = min(next_power_of_two(seqlen_q), max(1, MAX_TILE_M // group_tile))
    elements = rows * group_tile * head_dim
    if elements <= COMBINE_EIGHT_ELEMENTS:
        return rows, 8
    return rows, 4 if elements <= COMBINE_FOUR_ELEMENTS else 1


@dataclass(frozen=True)
class CombineSplitsVariant:
    """One binary of the split combine. Label:
    `combine_splits_<dtype>_d<D>_r<ROWS>_g<GROUP_TILE>_c<SPLIT_CHUNK>[_lse]`."""

    dtype: str
    head_dim: int
    rows: int
    group_tile: int
    split_chunk: int
    write_lse: bool = False

    def __post_init__(self):
        _check_common(self.dtype, self.head_dim)
        for name in ("rows", "group_tile"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value!r}")
        if self.rows * self.group_tile > MAX_TILE_M or self.split_chunk not in SPLIT_CHUNKS:
            raise ValueError(f"rows x group_tile must be at most {MAX_TILE_M} and split_chunk "
                             f"one of {SPLIT_CHUNKS}, got {self.rows} x {self.group_tile}, "
                             f"{self.split_chunk}")

    @property
    def constants(self) -> dict:
        return {"HEAD_DIM": self.head_dim, "ROWS": self.rows, "GROUP_TILE": self.group_tile,
                "SPLIT_CHUNK": self.split_chunk, "WRITE_LSE": self.write_lse}

    @property
    def label(self) -> str:
        return (f"combine_splits_{self.dtype[:2]}_d{self.head_dim}_r{self.rows}"
                f"_g{self.group_tile}_c{self.split_chunk}{'_lse' if self.write_lse else ''}")

    def kernel(self):
        return combine_splits

    def signature(self):
        return _signature(COMBINE_SPLITS_PARAMS, self.dtype, self.constants, "combine_splits")


@dataclass(frozen=True)
class AppendVariant:
    dtype: str
    head_dim: int
    paged: bool

    def __post_init__(self):
        _check_common(self.dtype, self.head_dim)

    @property
    def constants(self) -> dict:
        return {"HEAD_DIM": self.head_dim, "PAGED": self.paged}

    @property
    def label(self) -> str:
        return f"append_kv_{self.dtype[:2]}_d{self.head_dim}{'_paged' if self.paged else ''}"

    def kernel(self):
        return append_kv

    def signature(self):
        return _signature(APPEND_PARAMS, self.dtype, self.constants, "append_kv")


def variants_for(problem, dtype: str, num_splits: int, write_lse: bool,
                 appends: bool, occupancy: int = DECODE_OCCUPANCY) -> tuple:
    """The binaries a cache call of `problem` (a `DecodeProblem`) runs, in launch order:
    (append or None, attention compiled for `occupancy` CTAs per SM, combine or None)."""
    paged = problem.page_size is not None
    attention = DecodeVariant(dtype, problem.head_dim, problem.tile_m, problem.tile_n,
                              problem.group_tile, paged, num_splits > 1,
                              write_lse and num_splits == 1, problem.pages_per_tile,
                              occupancy)
    combine = None
    if num_splits > 1:
        rows, chunk = combine_tiles(problem.seqlen_q, problem.group_tile, problem.head_dim)
        combine = CombineSplitsVariant(dtype, problem.head_dim, rows, problem.group_tile,
                                       chunk, write_lse)
    append = AppendVariant(dtype, problem.head_dim, paged) if appends else None
    return append, attention, combine


def all_decode_variants(dtypes=DTYPES, head_dims=HEAD_DIMS):
    """The binaries `wavefront compile --all` (and the slow CPU test) builds for the cache call:
    per dtype and head dim, every code path once (contiguous, paged and paged by 16-key pages,
    one split and several, the LSE; the combine with and without the LSE; the append,
    contiguous and paged), and at bfloat16, D=128, 32-key pages and the tiles of GQA groups
    1 and 8. Other groups a call picks are the same code at other sizes, compiled on first
    use."""
    for dtype in dtypes:
        for head_dim in head_dims:
            yield DecodeVariant(dtype, head_dim, 64, 64, 4, False)
            yield DecodeVariant(dtype, head_dim, 64, 64, 4, True, partials=True)
            yield DecodeVariant(dtype, head_dim, 64, 64, 4, True, write_lse=True,
                                pages_per_tile=4)
            yield DecodeVariant(dtype, head_dim, 64, 64, 4, False, partials=True)
            # the combine of a decode step (one position: 8 splits a load at a group of 4,
            # 4 at a group of 8) and of a chunked prefill (the attention tile's positions, one
            # split a load), with and without the LSE
            for seqlen_q, group_tile in ((1, 4), (1, 8), (64, 4)):
                rows, chunk = combine_tiles(seqlen_q, group_tile, head_dim)
                for lse in (False, True):
                    yield CombineSplitsVariant(dtype, head_dim, rows, group_tile, chunk, lse)
            for paged in (False, True):
                yield AppendVariant(dtype, head_dim, paged)
    if "bfloat16" in dtypes and 128 in head_dims:
        yield DecodeVariant("bfloat16", 128, 64, 64, 4, True, partials=True, pages_per_tile=2)
        for group_tile in (1, 8):
            yield DecodeVariant("bfloat16", 128, 64, 64, group_tile, False)
