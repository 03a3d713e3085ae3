"""FlashAttention forward in cuTile, with pluggable CTA and K/V scan schedules.

The kernel takes the schedule codes as compile-time constants, so every schedule combination
is its own specialisation and carries no run-time branching on the schedule. The mapping from
CTA to work item and from work item to K/V order is the one in `wavefront.schedules`: the
kernel calls those functions directly.

Layout: Q, O are (batch, heads, seqlen_q, head_dim); K, V are (batch, kv_heads, seqlen_kv,
head_dim); the last dimension is contiguous. The optional LSE is (batch, heads, seqlen_q) float32,
natural log.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import cuda.tile as ct

from wavefront.schedules import (
    CTA_GRID,
    KV_TILED,
    chunk_tile_range,
    decode_work_item,
    kv_tile_span,
    local_iteration,
    scans_backward,
    split_chunk,
)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

LOG2_E = 1.0 / math.log(2.0)
LN_2 = math.log(2.0)
# Running row maximum starts finite: a row whose first visited tile is fully masked (a reversed
# causal scan with tile_m > tile_n) would otherwise compute -inf - -inf = NaN.
ROW_MAX_START = -1.0e30

HEAD_DIMS = (64, 128)
TILE_SHAPES = ((64, 64), (128, 64), (128, 128))
DEFAULT_TILES = {64: (128, 64), 128: (128, 64)}
DEFAULT_OCCUPANCY = {(64, 64): 2, (128, 64): 2, (128, 128): 1}


def _online_softmax_step(q, K, V, batch, kv_head, j, m_i, l_i, acc, qk_scale_log2, rows,
                         seqlen_kv, HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                         MASKED: ConstBool, CAUSAL: ConstBool):
    """Fold K/V tile j into the running (row max, row sum, output) of one Q tile."""
    k = ct.load(K, index=(batch, kv_head, 0, j), shape=(1, 1, HEAD_DIM, TILE_N),
                order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO, latency=2)
    k = k.reshape((HEAD_DIM, TILE_N))
    qk = ct.mma(q, k, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
    if MASKED:
        cols = j * TILE_N + ct.arange(TILE_N, dtype=ct.int32)[None, :]
        keep = cols < seqlen_kv
        if CAUSAL:
            keep = keep & (rows >= cols)
        qk = ct.where(keep, qk, -np.inf)
    # Scale after the row max: one multiply per row instead of one per element.
    m_new = max(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2)
    p = ct.exp2(qk * qk_scale_log2 - m_new, flush_to_zero=True)
    alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
    # Zero padding matters here: a ragged V tile's rows meet p = 0, and 0 * garbage may be NaN.
    v = ct.load(V, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO, latency=4)
    v = v.reshape((TILE_N, HEAD_DIM))
    acc = ct.mma(p.astype(q.dtype), v, acc * alpha)
    return m_new, l_i, acc


def _store_normalised(Out, Lse, acc, row_max, row_sum, batch, head, q_tile,
                      HEAD_DIM: ConstInt, TILE_M: ConstInt, WRITE_LSE: ConstBool):
    """Output = acc / row sum in the output dtype; LSE (natural log) if asked."""
    out = ct.truediv(acc, row_sum, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    ct.store(Out, index=(batch, head, q_tile, 0),
             tile=out.reshape((1, 1, TILE_M, HEAD_DIM)).astype(Out.dtype))
    if WRITE_LSE:
        lse = (row_max + ct.log2(row_sum)) * LN_2
        ct.store(Lse, index=(batch, head, q_tile), tile=lse.reshape((1, 1, TILE_M)))


def _attend_work_item(Q, K, V, Out, Lse, PartO, PartM, PartL, item, local_iter,
                      qk_scale_log2, group_units, n_chunks, chunk_tiles,
                      HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                      CAUSAL: ConstBool, CTA_ORDER: ConstInt, KV_ORDER: ConstInt,
                      WRITE_LSE: ConstBool):
    batch_size = Q.shape[0]
    heads = Q.shape[1]
    seqlen_q = Q.shape[2]
    kv_heads = K.shape[1]
    seqlen_kv = K.shape[2]
    q_tiles = (seqlen_q + TILE_M - 1) // TILE_M
    inner, chunk = split_chunk(item, q_tiles, heads, kv_heads, n_chunks)
    batch, head, q_tile = decode_work_item(inner, q_tiles, heads, kv_heads,
                                           batch_size * kv_heads, group_units, CTA_ORDER)
    kv_head = head // (heads // kv_heads)
    visited, first_masked = kv_tile_span(q_tile, TILE_M, TILE_N, seqlen_q, seqlen_kv, CAUSAL)
    lo, mid, hi = chunk_tile_range(chunk, chunk_tiles, visited, first_masked)

    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))
    rows = q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]
    m_i = ct.full((TILE_M, 1), ROW_MAX_START, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32)

    # Each direction gets its own loops with a plain induction variable: a reversed index
    # computed inside one shared loop measured ~8% slower where K/V fits in L2.
    if scans_backward(local_iter, KV_ORDER) == 1:
        for step in range(hi - mid):
            m_i, l_i, acc = _online_softmax_step(
                q, K, V, batch, kv_head, hi - 1 - step, m_i, l_i, acc, qk_scale_log2,
                rows, seqlen_kv, HEAD_DIM, TILE_M, TILE_N, True, CAUSAL)
        for step in range(mid - lo):
            m_i, l_i, acc = _online_softmax_step(
                q, K, V, batch, kv_head, mid - 1 - step, m_i, l_i, acc, qk_scale_log2,
                rows, seqlen_kv, HEAD_DIM, TILE_M, TILE_N, False, CAUSAL)
    else:
        for j in range(lo, mid):
            m_i, l_i, acc = _online_softmax_step(
                q, K, V, batch, kv_head, j, m_i, l_i, acc, qk_scale_log2,
                rows, seqlen_kv, HEAD_DIM, TILE_M, TILE_N, False, CAUSAL)
        for j in range(mid, hi):
            m_i, l_i, acc = _online_softmax_step(
                q, K, V, batch, kv_head, j, m_i, l_i, acc, qk_scale_log2,
                rows, seqlen_kv, HEAD_DIM, TILE_M, TILE_N, True, CAUSAL)

    if KV_ORDER == KV_TILED:
        # The chunk's partial state, unnormalised; `combine_partials` merges the chunks.
        slab = chunk * batch_size + batch
        ct.store(PartO, index=(slab, head, q_tile, 0),
                 tile=acc.reshape((1, 1, TILE_M, HEAD_DIM)))
        ct.store(PartM, index=(slab, head, q_tile), tile=m_i.reshape((1, 1, TILE_M)))
        ct.store(PartL, index=(slab, head, q_tile), tile=l_i.reshape((1, 1, TILE_M)))
    else:
        _store_normalised(Out, Lse, acc, m_i, l_i, batch, head, q_tile, HEAD_DIM, TILE_M,
                          WRITE_LSE)


def flash_attention_fwd(Q, K, V, Out, Lse, PartO, PartM, PartL, qk_scale_log2: float,
                        resident_ctas: int, group_units: int, n_chunks: int, chunk_tiles: int,
                        HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                        CAUSAL: ConstBool, CTA_ORDER: ConstInt, KV_ORDER: ConstInt,
                        WRITE_LSE: ConstBool):
    """One CTA: take work items as the CTA schedule says, attend each in its K/V order."""
    if CTA_ORDER == CTA_GRID:
        item = ct.bid(0)
        local_iter = local_iteration(item, ct.num_blocks(0), resident_ctas, CTA_ORDER)
        _attend_work_item(Q, K, V, Out, Lse, PartO, PartM, PartL, item, local_iter,
                          qk_scale_log2, group_units, n_chunks, chunk_tiles, HEAD_DIM, TILE_M,
                          TILE_N, CAUSAL, CTA_ORDER, KV_ORDER, WRITE_LSE)
    else:
        q_tiles = (Q.shape[2] + TILE_M - 1) // TILE_M
        num_items = Q.shape[0] * Q.shape[1] * q_tiles * n_chunks
        for item in range(ct.bid(0), num_items, ct.num_blocks(0)):
            local_iter = local_iteration(item, ct.num_blocks(0), resident_ctas, CTA_ORDER)
            _attend_work_item(Q, K, V, Out, Lse, PartO, PartM, PartL, item, local_iter,
                              qk_scale_log2, group_units, n_chunks, chunk_tiles, HEAD_DIM,
                              TILE_M, TILE_N, CAUSAL, CTA_ORDER, KV_ORDER, WRITE_LSE)


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
        m_new = max(m, m_c)
        alpha = ct.exp2(m - m_new, flush_to_zero=True)
        beta = ct.exp2(m_c - m_new, flush_to_zero=True)
        l_sum = l_sum * alpha + l_c * beta
        acc = acc * alpha + a_c * beta
        m = m_new
    _store_normalised(Out, Lse, acc, m, l_sum, batch, head, q_tile, HEAD_DIM, TILE_M, WRITE_LSE)


@lru_cache(maxsize=None)
def kernel_for_occupancy(occupancy: int):
    """cuTile takes occupancy as a kernel option, so each occupancy is its own kernel object."""
    if not 1 <= occupancy <= 32:
        raise ValueError(f"occupancy must be in [1, 32], got {occupancy!r}")
    return ct.kernel(flash_attention_fwd, occupancy=occupancy)


@dataclass(frozen=True)
class KernelVariant:
    """One compile-time specialisation of the kernel."""

    dtype: str  # "bfloat16" | "float16"
    head_dim: int
    tile_m: int
    tile_n: int
    causal: bool
    cta_order: int
    kv_order: int
    occupancy: int
    write_lse: bool = False

    def __post_init__(self):
        if self.dtype not in ("bfloat16", "float16"):
            raise ValueError(f"dtype must be 'bfloat16' or 'float16', got {self.dtype!r}")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim!r}")
        if (self.tile_m, self.tile_n) not in TILE_SHAPES:
            raise ValueError(f"tiles must be one of {TILE_SHAPES}, got "
                             f"{(self.tile_m, self.tile_n)!r}")

    @property
    def constants(self) -> tuple:
        return (self.head_dim, self.tile_m, self.tile_n, self.causal, self.cta_order,
                self.kv_order, self.write_lse)

    @property
    def label(self) -> str:
        from wavefront.schedules import CTA_SCHEDULES, KV_SCHEDULES
        cta = next(k for k, v in CTA_SCHEDULES.items() if v.code == self.cta_order)
        kv = next(k for k, v in KV_SCHEDULES.items() if v.code == self.kv_order)
        return (f"{self.dtype[:2]}_d{self.head_dim}_{self.tile_m}x{self.tile_n}"
                f"_{'causal' if self.causal else 'full'}_{cta}+{kv}_occ{self.occupancy}"
                f"{'_lse' if self.write_lse else ''}")


def all_variants(dtypes=("bfloat16", "float16"), head_dims=HEAD_DIMS, tiles=TILE_SHAPES,
                 write_lse=(False,)):
    """Every specialisation `wavefront compile --all` builds."""
    from wavefront.schedules import CTA_GROUPED, CTA_SCHEDULES, KV_SCHEDULES
    for dtype in dtypes:
        for head_dim in head_dims:
            for tile in tiles:
                for causal in (False, True):
                    for cta in CTA_SCHEDULES.values():
                        for kv in KV_SCHEDULES.values():
                            if cta.code == CTA_GROUPED and kv.code == KV_TILED:
                                continue  # not a schedule (Launch refuses it)
                            for lse in write_lse:
                                yield KernelVariant(dtype, head_dim, tile[0], tile[1], causal,
                                                    cta.code, kv.code, DEFAULT_OCCUPANCY[tile],
                                                    lse)


def _array_constraint(dtype, ndim):
    from cuda.tile.compilation import ArrayConstraint
    return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False,
                           stride_constant=(None,) * (ndim - 1) + (1,),
                           stride_divisible_by=(8,) * (ndim - 1) + (1,),
                           shape_divisible_by=(1,) * (ndim - 1) + (16 if ndim == 4 else 1,),
                           base_addr_divisible_by=16)


def signature(variant: KernelVariant):
    """The general signature of a variant: contiguous inputs, any batch, heads and length.

    The JIT may specialise further for the arrays it is given (e.g. it bakes in dimensions of
    size 1 and divisibility of the sequence length); this is the variant that serves them all.
    """
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint
    dtype = getattr(ct, variant.dtype)
    params = [_array_constraint(dtype, 4) for _ in range(4)]
    params.append(_array_constraint(ct.float32, 3))  # LSE
    params.append(_array_constraint(ct.float32, 4))  # partial outputs (tiled)
    params += [_array_constraint(ct.float32, 3) for _ in range(2)]  # partial row max, sum
    params += [ScalarConstraint(ct.float32)] + [ScalarConstraint(ct.int32)] * 4
    params += list(variant.constants)
    sig = KernelSignature(params, CallingConvention.cutile_python_v2())
    return sig.with_mangled_symbol("flash_attention_fwd")


@dataclass(frozen=True)
class CombineVariant:
    """One specialisation of the tiled schedule's combine kernel."""

    dtype: str
    head_dim: int
    tile_m: int
    write_lse: bool = False

    @property
    def constants(self) -> tuple:
        return (self.head_dim, self.tile_m, self.write_lse)

    @property
    def label(self) -> str:
        return (f"combine_{self.dtype[:2]}_d{self.head_dim}_m{self.tile_m}"
                f"{'_lse' if self.write_lse else ''}")

    def signature(self):
        from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint
        params = [_array_constraint(ct.float32, 4), _array_constraint(ct.float32, 3),
                  _array_constraint(ct.float32, 3), _array_constraint(getattr(ct, self.dtype), 4),
                  _array_constraint(ct.float32, 3), ScalarConstraint(ct.int32),
                  *self.constants]
        sig = KernelSignature(params, CallingConvention.cutile_python_v2())
        return sig.with_mangled_symbol("combine_partials")


# Rows per combine CTA: the partials are indexed by row, so this need not match the attention
# tile; 64 rows keep the fp32 accumulator of D=128 in registers.
COMBINE_TILE_M = 64


def all_combine_variants(dtypes=("bfloat16", "float16"), head_dims=HEAD_DIMS,
                         write_lse=(False, True)):
    for dtype in dtypes:
        for head_dim in head_dims:
            for lse in write_lse:
                yield CombineVariant(dtype, head_dim, COMBINE_TILE_M, lse)


def compile_variant(variant, arch: str = "sm_90") -> bytes:
    """Compile one variant (attention or combine) ahead of time to a cubin: tileiras, no GPU."""
    import io

    from cuda.tile.compilation import export_kernel
    buf = io.BytesIO()
    if isinstance(variant, CombineVariant):
        export_kernel(combine_partials, [variant.signature()], buf, gpu_code=arch,
                      output_format="cubin")
    else:
        export_kernel(kernel_for_occupancy(variant.occupancy), [signature(variant)], buf,
                      gpu_code=arch, output_format="cubin")
    return buf.getvalue()
