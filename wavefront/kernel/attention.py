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

import inspect
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import cuda.tile as ct

from wavefront.point import DEFAULT_OCCUPANCY, DTYPES, HEAD_DIMS, TILE_SHAPES, parse_schedule
from wavefront.schedules import (
    KV_TILED,
    chunk_tile_range,
    cta_schedule,
    decode_work_item,
    is_persistent,
    kv_schedule,
    kv_tile_span,
    local_iteration,
    scans_backward,
    schedule_names,
    split_chunk,
)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

LOG2_E = 1.0 / math.log(2.0)
LN_2 = math.log(2.0)
# Running row maximum starts finite: a row whose first visited tile is fully masked (a reversed
# causal scan with tile_m > tile_n) would otherwise compute -inf - -inf = NaN.
ROW_MAX_START = -1.0e30



def _online_softmax_step(q, K, V, batch, kv_head, j, m_i, l_i, acc, qk_scale_log2, rows,
                         seqlen_kv, HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                         MASKED: ConstBool, CAUSAL: ConstBool):
    """Fold K/V tile j into the running (row max, row sum, output) of one Q tile."""
    k = ct.load(K, index=(batch, kv_head, 0, j), shape=(1, 1, HEAD_DIM, TILE_N),
                order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO, latency=2)
    k = k.reshape((HEAD_DIM, TILE_N))  # [HEAD_DIM, TILE_N]: K^T, transposed by the load
    qk = ct.mma(q, k, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))  # [TILE_M, TILE_N]
    if MASKED:
        cols = j * TILE_N + ct.arange(TILE_N, dtype=ct.int32)[None, :]  # [1, TILE_N]
        keep = cols < seqlen_kv
        if CAUSAL:
            keep = keep & (rows >= cols)
        qk = ct.where(keep, qk, -np.inf)
    # Scale after the row max: one multiply per row instead of one per element.
    m_new = max(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2)  # [TILE_M, 1]
    p = ct.exp2(qk * qk_scale_log2 - m_new, flush_to_zero=True)  # [TILE_M, TILE_N]
    alpha = ct.exp2(m_i - m_new, flush_to_zero=True)  # [TILE_M, 1]
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
    # Zero padding matters here: a ragged V tile's rows meet p = 0, and 0 * garbage may be NaN.
    v = ct.load(V, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO, latency=4)
    v = v.reshape((TILE_N, HEAD_DIM))  # [TILE_N, HEAD_DIM]
    acc = ct.mma(p.astype(q.dtype), v, acc * alpha)  # [TILE_M, HEAD_DIM]
    return m_new, l_i, acc


def _scan_tiles(q, K, V, batch, kv_head, lo, hi, m_i, l_i, acc, qk_scale_log2, rows,
                seqlen_kv, HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                BACKWARD: ConstBool, MASKED: ConstBool, CAUSAL: ConstBool):
    """Fold K/V tiles [lo, hi) into the running state, first to last or last to first.

    The direction is a compile-time constant and each direction is its own loop: a direction
    chosen at run time inside one loop measured ~8% slower where K/V fits in L2, and a forward
    scan written as `lo + step` compiled to up to 19% more code than a plain induction variable.
    """
    if BACKWARD:
        for step in range(hi - lo):
            m_i, l_i, acc = _online_softmax_step(q, K, V, batch, kv_head, hi - 1 - step, m_i,
                                                 l_i, acc, qk_scale_log2, rows, seqlen_kv,
                                                 HEAD_DIM, TILE_M, TILE_N, MASKED, CAUSAL)
    else:
        for j in range(lo, hi):
            m_i, l_i, acc = _online_softmax_step(q, K, V, batch, kv_head, j, m_i, l_i, acc,
                                                 qk_scale_log2, rows, seqlen_kv, HEAD_DIM,
                                                 TILE_M, TILE_N, MASKED, CAUSAL)
    return m_i, l_i, acc


def _store_normalised(Out, Lse, acc, row_max, row_sum, batch, head, q_tile,
                      HEAD_DIM: ConstInt, TILE_M: ConstInt, WRITE_LSE: ConstBool):
    """Output = acc / row sum in the output dtype; LSE (natural log) if asked."""
    out = ct.truediv(acc, row_sum, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    ct.store(Out, index=(batch, head, q_tile, 0),
             tile=out.reshape((1, 1, TILE_M, HEAD_DIM)).astype(Out.dtype))
    if WRITE_LSE:
        lse = (row_max + ct.log2(row_sum)) * LN_2  # [TILE_M, 1]
        ct.store(Lse, index=(batch, head, q_tile), tile=lse.reshape((1, 1, TILE_M)))


def _take_ticket(Order, slot):
    """Order[slot] = the next value of the global counter Order[0]: where this event falls in
    the launch's interleaving. The counter is never reset, so back-to-back launches need no
    memset; the host subtracts the launch's first ticket.

    Relaxed: a ticket needs atomicity, not ordering. The default acquire-release order made each
    item wait for the previous item's stores, measured up to 6x slower (causal, one CTA per SM)
    and a different interleaving from the plain kernel's."""
    ticket = ct.atomic_add(Order, 0, 1, memory_order=ct.MemoryOrder.RELAXED)
    ct.scatter(Order, slot, ticket)


def _attend_work_item(Q, K, V, Out, Lse, PartO, PartM, PartL, Order, item, local_iter,
                      qk_scale_log2, group_units, n_chunks, chunk_tiles,
                      HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                      CAUSAL: ConstBool, cta_order, kv_order, KV_LAYOUT: ConstInt,
                      WRITE_LSE: ConstBool, RECORD_ORDER: ConstBool):
    """cta_order and kv_order select the mapping and the scan (constants, or run-time values
    in a SCHEDULE_AT_RUN_TIME binary); KV_LAYOUT, always a constant, says whether the item
    writes a partial state (tiled) or the output."""
    if RECORD_ORDER:
        _take_ticket(Order, 1 + 2 * item)
    batch_size = Q.shape[0]
    heads = Q.shape[1]
    seqlen_q = Q.shape[2]
    kv_heads = K.shape[1]
    seqlen_kv = K.shape[2]
    q_tiles = (seqlen_q + TILE_M - 1) // TILE_M
    inner, chunk = split_chunk(item, q_tiles, heads, kv_heads, n_chunks)
    batch, head, q_tile = decode_work_item(inner, q_tiles, heads, kv_heads,
                                           batch_size * kv_heads, group_units, cta_order)
    kv_head = head // (heads // kv_heads)
    visited, first_masked = kv_tile_span(q_tile, TILE_M, TILE_N, seqlen_q, seqlen_kv, CAUSAL)
    lo, mid, hi = chunk_tile_range(chunk, chunk_tiles, visited, first_masked)

    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))  # [TILE_M, HEAD_DIM]
    rows = q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]  # [TILE_M, 1]
    m_i = ct.full((TILE_M, 1), ROW_MAX_START, dtype=ct.float32)  # running row max (log2 units)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)  # running row sum
    acc = ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32)  # unnormalised output

    # Unmasked tiles [lo, mid), masked tiles [mid, hi); a backward scan takes the masked first.
    if scans_backward(local_iter, kv_order) == 1:
        m_i, l_i, acc = _scan_tiles(q, K, V, batch, kv_head, mid, hi, m_i, l_i, acc,
                                    qk_scale_log2, rows, seqlen_kv, HEAD_DIM, TILE_M, TILE_N,
                                    True, True, CAUSAL)
        m_i, l_i, acc = _scan_tiles(q, K, V, batch, kv_head, lo, mid, m_i, l_i, acc,
                                    qk_scale_log2, rows, seqlen_kv, HEAD_DIM, TILE_M, TILE_N,
                                    True, False, CAUSAL)
    else:
        m_i, l_i, acc = _scan_tiles(q, K, V, batch, kv_head, lo, mid, m_i, l_i, acc,
                                    qk_scale_log2, rows, seqlen_kv, HEAD_DIM, TILE_M, TILE_N,
                                    False, False, CAUSAL)
        m_i, l_i, acc = _scan_tiles(q, K, V, batch, kv_head, mid, hi, m_i, l_i, acc,
                                    qk_scale_log2, rows, seqlen_kv, HEAD_DIM, TILE_M, TILE_N,
                                    False, True, CAUSAL)

    if KV_LAYOUT == KV_TILED:
        # The chunk's partial state, unnormalised; `combine_partials` merges the chunks.
        slab = chunk * batch_size + batch
        ct.store(PartO, index=(slab, head, q_tile, 0),
                 tile=acc.reshape((1, 1, TILE_M, HEAD_DIM)))
        ct.store(PartM, index=(slab, head, q_tile), tile=m_i.reshape((1, 1, TILE_M)))
        ct.store(PartL, index=(slab, head, q_tile), tile=l_i.reshape((1, 1, TILE_M)))
    else:
        _store_normalised(Out, Lse, acc, m_i, l_i, batch, head, q_tile, HEAD_DIM, TILE_M,
                          WRITE_LSE)
    if RECORD_ORDER:
        _take_ticket(Order, 2 + 2 * item)


def flash_attention_fwd(Q, K, V, Out, Lse, PartO, PartM, PartL, Order, qk_scale_log2: float,
                        resident_ctas: int, group_units: int, n_chunks: int, chunk_tiles: int,
                        cta_order_at_run_time: int, kv_order_at_run_time: int,
                        HEAD_DIM: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                        CAUSAL: ConstBool, CTA_ORDER: ConstInt, KV_ORDER: ConstInt,
                        WRITE_LSE: ConstBool, RECORD_ORDER: ConstBool,
                        SCHEDULE_AT_RUN_TIME: ConstBool):
    """One CTA: take work items as the CTA schedule says, attend each in its K/V order.

    RECORD_ORDER (off by default) takes a ticket from a global atomic counter as each work
    item starts and ends, so the host learns the launch's true interleaving of work items.

    SCHEDULE_AT_RUN_TIME (off by default) takes the CTA and K/V schedule codes from the two
    run-time arguments instead of the constants: one binary then serves every CTA schedule
    and both scans (linear, sawtooth), which differ only in index arithmetic and the direction
    each item takes, so a difference between them is the schedule's, not the compiler's. The
    tiled scan keeps its own binary (it writes partial states)."""
    cta_order = CTA_ORDER
    kv_order = KV_ORDER
    if SCHEDULE_AT_RUN_TIME:
        cta_order = cta_order_at_run_time
        kv_order = kv_order_at_run_time
    if is_persistent(CTA_ORDER) == 0 and not SCHEDULE_AT_RUN_TIME:
        item = ct.bid(0)
        local_iter = local_iteration(item, ct.num_blocks(0), resident_ctas, CTA_ORDER)
        _attend_work_item(Q, K, V, Out, Lse, PartO, PartM, PartL, Order, item, local_iter,
                          qk_scale_log2, group_units, n_chunks, chunk_tiles, HEAD_DIM, TILE_M,
                          TILE_N, CAUSAL, CTA_ORDER, KV_ORDER, KV_ORDER, WRITE_LSE,
                          RECORD_ORDER)
    else:
        # Persistent grid-stride; in the shared binary a grid launch is this loop with one
        # item per CTA (as many CTAs as items).
        q_tiles = (Q.shape[2] + TILE_M - 1) // TILE_M
        num_items = Q.shape[0] * Q.shape[1] * q_tiles * n_chunks
        for item in range(ct.bid(0), num_items, ct.num_blocks(0)):
            local_iter = local_iteration(item, ct.num_blocks(0), resident_ctas, cta_order)
            _attend_work_item(Q, K, V, Out, Lse, PartO, PartM, PartL, Order, item, local_iter,
                              qk_scale_log2, group_units, n_chunks, chunk_tiles, HEAD_DIM,
                              TILE_M, TILE_N, CAUSAL, cta_order, kv_order, KV_ORDER, WRITE_LSE,
                              RECORD_ORDER)


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
    # RECORD_ORDER only: [counter, start and end ticket of each work item]
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


def aot_signature(params: tuple[Param, ...], io_dtype: str, constants: dict, symbol: str):
    """The general ahead-of-time signature: contiguous arrays, any batch, heads and length.

    The JIT may specialise further for the arrays it is given (e.g. it bakes in dimensions of
    size 1 and divisibility of the sequence length); this is the variant that serves them all.
    """
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint
    out = []
    for p in params:
        if p.kind == "array":
            out.append(_array_constraint(getattr(ct, io_dtype if p.dtype == IO else p.dtype),
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

@dataclass(frozen=True)
class KernelVariant:
    """One compile-time specialisation of the attention kernel.

    Label: `<dtype>_d<D>_<M>x<N>_<full|causal>_<cta>+<kv>_occ<O>[_lse][_order][_rt]`, e.g.
    `bf_d128_128x64_causal_persistent+sawtooth_occ2` (dtype bf = bfloat16, fp = float16).
    """

    dtype: str  # "bfloat16" | "float16"
    head_dim: int
    tile_m: int
    tile_n: int
    causal: bool
    schedule: str  # "cta+kv"
    occupancy: int
    write_lse: bool = False
    record_order: bool = False  # work-item tickets (measured order); off in every timed run
    schedule_at_run_time: bool = False  # one binary for every CTA schedule and linear/sawtooth

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim!r}")
        if (self.tile_m, self.tile_n) not in TILE_SHAPES:
            raise ValueError(f"tiles must be one of {TILE_SHAPES}, got "
                             f"{(self.tile_m, self.tile_n)!r}")
        parse_schedule(self.schedule)

    @property
    def constants(self) -> dict:
        cta, kv = parse_schedule(self.schedule)
        cta_code, kv_code = cta_schedule(cta).code, kv_schedule(kv).code
        shared = self.schedule_at_run_time and kv_code != KV_TILED
        return {"HEAD_DIM": self.head_dim, "TILE_M": self.tile_m, "TILE_N": self.tile_n,
                "CAUSAL": self.causal,
                # a shared binary's constants name no schedule: the run-time arguments do
                "CTA_ORDER": 0 if shared else cta_code, "KV_ORDER": 0 if shared else kv_code,
                "WRITE_LSE": self.write_lse, "RECORD_ORDER": self.record_order,
                "SCHEDULE_AT_RUN_TIME": shared}

    @property
    def run_time_codes(self) -> dict:
        """The schedule codes the kernel reads at run time (ignored unless shared)."""
        cta, kv = parse_schedule(self.schedule)
        return {"cta_order_at_run_time": cta_schedule(cta).code,
                "kv_order_at_run_time": kv_schedule(kv).code}

    @property
    def label(self) -> str:
        return (f"{self.dtype[:2]}_d{self.head_dim}_{self.tile_m}x{self.tile_n}"
                f"_{'causal' if self.causal else 'full'}_{self.schedule}_occ{self.occupancy}"
                f"{'_lse' if self.write_lse else ''}{'_order' if self.record_order else ''}"
                f"{'_rt' if self.schedule_at_run_time else ''}")

    def kernel(self):
        return kernel_for_occupancy(self.occupancy)

    def signature(self):
        return aot_signature(ATTENTION_PARAMS, self.dtype, self.constants, "flash_attention_fwd")


def all_variants(dtypes=DTYPES, head_dims=HEAD_DIMS, tiles=TILE_SHAPES, write_lse=(False,)):
    """Every specialisation `wavefront compile --all` builds: every registered schedule."""
    for dtype in dtypes:
        for head_dim in head_dims:
            for tile in tiles:
                for causal in (False, True):
                    for schedule in schedule_names():
                        # The tiled schedule writes partial states, never the LSE itself.
                        lses = (False,) if schedule.endswith("+tiled") else write_lse
                        for lse in lses:
                            yield KernelVariant(dtype, head_dim, tile[0], tile[1], causal,
                                                schedule, DEFAULT_OCCUPANCY[tile], lse)


@dataclass(frozen=True)
class CombineVariant:
    """One specialisation of the tiled schedule's combine kernel."""

    dtype: str
    head_dim: int
    tile_m: int
    write_lse: bool = False

    @property
    def constants(self) -> dict:
        return {"HEAD_DIM": self.head_dim, "TILE_M": self.tile_m, "WRITE_LSE": self.write_lse}

    @property
    def label(self) -> str:
        return (f"combine_{self.dtype[:2]}_d{self.head_dim}_m{self.tile_m}"
                f"{'_lse' if self.write_lse else ''}")

    def kernel(self):
        return combine_partials

    def signature(self):
        return aot_signature(COMBINE_PARAMS, self.dtype, self.constants, "combine_partials")


# Rows per combine CTA: the partials are indexed by row, so this need not match the attention
# tile; 64 rows keep the fp32 accumulator of D=128 in registers.
COMBINE_TILE_M = 64


def all_combine_variants(dtypes=DTYPES, head_dims=HEAD_DIMS, write_lse=(False, True)):
    for dtype in dtypes:
        for head_dim in head_dims:
            for lse in write_lse:
                yield CombineVariant(dtype, head_dim, COMBINE_TILE_M, lse)


def compile_variant(variant, arch: str = "sm_90") -> bytes:
    """Compile one variant (attention or combine) ahead of time to a cubin: tileiras, no GPU."""
    import io

    from cuda.tile.compilation import export_kernel
    buf = io.BytesIO()
    export_kernel(variant.kernel(), [variant.signature()], buf, gpu_code=arch,
                  output_format="cubin")
    return buf.getvalue()
