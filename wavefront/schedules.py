"""The schedule vocabulary: which CTA takes which work item, and in which order it scans K/V.

One vocabulary serves the kernel, the cache simulator and the docs. A *work item* is one
(batch, query head, Q tile): the unit of split-Q FlashAttention (the tiled schedule also splits
each item's K/V into chunks, each chunk its own work item). A CTA schedule orders the items and
says how CTAs take them; a K/V schedule says in which order an item visits its K/V tiles.

Everything a launch does is written down once, in `Launch.work_table()`: one int32 row per work
item, in the order items are handed out, holding the item's coordinates and its K/V scan
(`WORK_*` columns). The kernel reads those rows and has no schedule code of its own (the public
call writes them on the GPU, by one kernel printed from the same formulas); the simulator
replays the same rows; `Launch.work_item` describes them for people and
tests. The small integer functions below (`decode_work_item`, `split_chunk`, `kv_tile_span`,
`chunk_tile_range`, `local_iteration`, `scans_backward`, `scan_plan`) build the rows.

Style follows flash-attention's tile schedulers: each schedule is a small frozen dataclass
holding its host-side parameters, the grid shape is computed on the host (`Launch`), and the
device side is "current work item / advance" (`for item in range(bid, items, num_ctas)`, or
the next row from an atomic counter for the dynamic schedules).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, Protocol

import numpy as np

# Codes that name each schedule's order (the host-side mapping below).
CTA_GRID = 0  # one work item per CTA, hardware dispatch order
CTA_PERSISTENT = 1  # persistent grid-stride: CTA c takes items c, c+P, c+2P, ...
CTA_GROUPED = 2  # persistent, items ordered in L2-sized head groups, heads fastest
CTA_LONGEST_FIRST = 3  # persistent, longest work items first (causal: last Q tiles), heads fastest
CTA_DYNAMIC = 4  # longest first, each CTA takes the next item from an atomic counter
CTA_GROUPED_DYNAMIC = 5  # L2 head groups, longest first inside a group, atomic counter

KV_LINEAR = 0  # every work item scans K/V forward
KV_SAWTOOTH = 1  # a CTA's successive work items alternate forward / backward
KV_TILED = 2  # L2-blocked split-KV: chunk-major (Q tile, K/V chunk) items, partials combined
KV_TILED_FIT = 3  # tiled, chunks fitted to two partition copies plus the round's stream
KV_TILED_FIT_BF16 = 4  # tiled_fit with bfloat16 partial outputs (half the partial traffic)

# Bytes of a partial-state row besides its output: the fp32 row maximum and row sum.
PARTIAL_ROW_STATS_BYTES = 8

# The work table's columns: what the kernel reads of each work item. The unmasked K/V tiles are
# visited as SCAN_START + SCAN_STEP x t for t < SCAN_COUNT (STEP = +1 forward, -1 backward),
# then the tiles that need a mask, [MASKED_LO, MASKED_HI), forward.
(WORK_BATCH, WORK_HEAD, WORK_KV_HEAD, WORK_Q_TILE, WORK_SCAN_START, WORK_SCAN_STEP,
 WORK_SCAN_COUNT, WORK_MASKED_LO, WORK_MASKED_HI, WORK_CHUNK) = range(10)
# Variable-length batches (packed sequences): where the item's sequence starts in the packed
# Q/O and K/V rows, and its two lengths. WORK_BATCH then holds the sequence's number.
WORK_Q_START, WORK_KV_START, WORK_SEQLEN_Q, WORK_SEQLEN_KV = range(10, 14)
# The causal diagonal: query row r of the item's sequence sees key columns c <= r + DIAGONAL.
# 0 (top-left alignment, torch's `is_causal`) is the padding's own value, so only
# bottom-right launches write it (seqlen_kv - seqlen_q, per sequence in a packed batch).
WORK_DIAGONAL = 14
WORK_COLUMNS = 16  # padded: 64-byte rows, a stride the ahead-of-time signature accepts


# --------------------------------------------------------------------------------------------
# The mapping: plain integer functions, from which `Launch.work_table` builds the rows. Each
# takes Python ints (one item, for people and tests), integer arrays of NumPy (every item at
# once, on the host) or traced values (printed as one kernel that builds the table on the GPU:
# what the public call does), by the same code.
# --------------------------------------------------------------------------------------------

def _array_module(*values):
    """The array library of the first array among `values`: NumPy (every item at once, on the
    host), a registered library's (torch's: a packed batch's table written on the GPU from its
    lengths there, `DeviceVarlenLaunch`), or the trace that prints the formulas as one GPU kernel
    (`wavefront.kernel.table_kernel`), or None when all are plain ints."""
    for value in values:
        if isinstance(value, np.ndarray):
            return np
        library = _ARRAY_LIBRARIES.get(type(value).__module__)
        if library is not None:
            return library
        module = getattr(value, "array_module", None)  # a traced value names its trace
        if module is not None:
            return module
    return None


class NumpyArrays:
    """The few operations beyond arithmetic that the packed-batch orders need, on NumPy: the
    orders are written once against these methods, which a registered library provides too
    (`register_array_library`), so a table is built where its lengths live, host or GPU."""

    minimum, maximum, where, cumsum = np.minimum, np.maximum, np.where, np.cumsum

    @staticmethod
    def divmod(a, b):
        return np.divmod(a, b)

    @staticmethod
    def arange(n: int, like):
        return np.arange(n, dtype=np.int64)

    @staticmethod
    def int64(x):
        return np.asarray(x, dtype=np.int64)

    @staticmethod
    def int32(x):
        return np.asarray(x, dtype=np.int32)

    @staticmethod
    def searchsorted_right(sorted_values, values):
        return np.searchsorted(sorted_values, values, side="right")

    @staticmethod
    def argsort_stable(keys):
        return np.argsort(keys, kind="stable")

    @staticmethod
    def expand(counts, total: int):
        """-> (which count each of `total` slots belongs to, the slot's place in it): counts[i]
        slots for each i in turn; slots past the counts' sum (padding) belong to the last."""
        owner = np.repeat(np.arange(len(counts)), counts)
        if owner.size < total:
            owner = np.concatenate([owner, np.full(total - owner.size, len(counts) - 1)])
        return owner, np.arange(total) - (np.cumsum(counts) - counts)[owner]

    @staticmethod
    def scatter(size: int, index, values):
        """An array of `size` with values[i] at index[i]; an index of `size` drops its value."""
        out = np.zeros(size + 1, dtype=np.int64)
        out[index] = values
        return out[:size]

    @staticmethod
    def group_by_budget(unit_bytes, budget: float):
        return group_by_budget(unit_bytes, budget)


# Array libraries the formulas run on besides NumPy, by their arrays' module: registered by
# the layer that may import them (`wavefront.kernel.torch_arrays` for torch), so that the
# vocabulary itself needs no GPU stack.
_ARRAY_LIBRARIES: dict = {}


def register_array_library(module: str, operations) -> None:
    """Run the formulas on arrays whose type's module is `module` with `operations` (the
    methods of `NumpyArrays`)."""
    _ARRAY_LIBRARIES[module] = operations


def _minimum(a, b):
    """min() for ints, elementwise for arrays: one spelling for both uses of the mapping."""
    xp = _array_module(a, b)
    return min(a, b) if xp is None else xp.minimum(a, b)


def _maximum(a, b):
    xp = _array_module(a, b)
    return max(a, b) if xp is None else xp.maximum(a, b)


def _divmod(a, b):
    """(a // b, a % b) in one pass."""
    xp = _array_module(a, b)
    return divmod(a, b) if xp is None else xp.divmod(a, b)


def _choose(condition, if_true, if_false):
    """`if_true if condition else if_false`, elementwise where `condition` is an array."""
    xp = _array_module(condition)
    if xp is None:
        return if_true if condition else if_false
    return xp.where(condition, if_true, if_false)


def linear_order(item, q_tiles, heads):
    """Grid and persistent: Q tiles fastest, then heads, then batch, so the CTAs of one wave
    share the K/V of as few heads as possible."""
    batch_head, q_tile = _divmod(item, q_tiles)
    batch, head = _divmod(batch_head, heads)
    return batch, head, q_tile


def grouped_order(item, q_tiles, heads, kv_heads, kv_units, group_units):
    """Grouped: the (batch, K/V head) units are cut into groups of `group_units` whose K/V fits
    the L2 budget and, inside a group, query heads run fastest (FlashAttention-3's L2 swizzle):
    concurrent CTAs spread over the group's heads, whose K/V all stays in L2. The query heads of
    one K/V head are adjacent, so GQA siblings run together.

    (Longest-first order for causal was tried here and dropped: with static grid-stride
    assignment it hands the long tiles to the same CTAs round after round. The dynamic
    variant, `grouped_longest_first_order`, has it: there the next free CTA takes the next item.)
    """
    qheads_per_kv = heads // kv_heads
    items_per_group = group_units * qheads_per_kv * q_tiles
    group, within = _divmod(item, items_per_group)
    # The last group may hold fewer units; its items still start at group * items_per_group.
    heads_here = group_units * qheads_per_kv
    if kv_units % group_units:
        heads_here = _minimum(group_units, kv_units - group * group_units) * qheads_per_kv
    q_tile, head_in_group = _divmod(within, heads_here)
    unit_in_group, head_in_unit = _divmod(head_in_group, qheads_per_kv)
    batch, kv_head = _divmod(group * group_units + unit_in_group, kv_heads)
    return batch, kv_head * qheads_per_kv + head_in_unit, q_tile


def grouped_longest_first_order(item, q_tiles, heads, kv_heads, kv_units, group_units):
    """Grouped, with the Q tiles of a group in decreasing order (heads fastest inside a group):
    the L2 head groups of `grouped_order`, and inside each group the longest items first, so
    that CTAs taking items dynamically finish a group together."""
    batch, head, q_tile = grouped_order(item, q_tiles, heads, kv_heads, kv_units, group_units)
    return batch, head, (q_tiles - 1) - q_tile


def longest_first_order(item, q_tiles, heads, batch_heads):
    """Longest first: Q tiles in decreasing order, every (batch, head) of one Q tile before the
    next. Under a causal mask a Q tile's work grows with its index, so the persistent CTAs take
    the longest items in their first round and the shortest last, and finish together (the
    order FlashAttention-3 uses for causal). GQA siblings stay adjacent (heads fastest)."""
    rank, batch_head = _divmod(item, batch_heads)
    batch, head = _divmod(batch_head, heads)
    return batch, head, (q_tiles - 1) - rank


def decode_work_item(item, q_tiles, heads, kv_heads, kv_units, group_units, cta_order):
    """Work item number -> (batch, query head, Q tile), by the CTA schedule's own order.

    A new CTA schedule adds its order function above and one branch here.
    """
    if cta_order == CTA_GROUPED:
        return grouped_order(item, q_tiles, heads, kv_heads, kv_units, group_units)
    if cta_order == CTA_GROUPED_DYNAMIC:
        return grouped_longest_first_order(item, q_tiles, heads, kv_heads, kv_units,
                                           group_units)
    if cta_order in (CTA_LONGEST_FIRST, CTA_DYNAMIC):
        return longest_first_order(item, q_tiles, heads, kv_units * (heads // kv_heads))
    return linear_order(item, q_tiles, heads)


def split_chunk(item, q_tiles, heads, kv_heads, n_chunks):
    """Tiled schedule: work item -> (item in linear order, K/V chunk).

    Items run unit-major, then chunk-major: every Q tile of a (batch, K/V head) unit, its query
    heads included, takes chunk 0, then all take chunk 1, ... so the CTAs in flight work inside
    one chunk, which the chunk size keeps in L2. With one chunk this is the identity.
    """
    if n_chunks == 1:
        return item, 0
    per_block = (heads // kv_heads) * q_tiles
    block = item // per_block
    unit = block // n_chunks
    chunk = block - unit * n_chunks
    return unit * per_block + (item - block * per_block), chunk


def chunk_tile_range(chunk, chunk_tiles, visited, first_masked):
    """-> (lo, mid, hi): the item scans tiles [lo, mid) unmasked and [mid, hi) masked.

    A chunk past the causal diagonal is empty (lo == hi): its partial state is the identity.
    """
    lo = chunk * chunk_tiles
    hi = _maximum(_minimum(lo + chunk_tiles, visited), lo)
    mid = _minimum(_maximum(first_masked, lo), hi)
    return lo, mid, hi


def kv_tile_span(q_tile, tile_m, tile_n, seqlen_q, seqlen_kv, causal, diagonal=0):
    """-> (K/V tiles visited, first tile that needs a mask).

    Tiles [0, first_masked) are fully visible; tiles [first_masked, visited) need the causal
    mask or the ragged-end mask. Under the causal mask query row r sees keys c <= r +
    `diagonal`: 0 is top-left alignment (torch's `is_causal`), seqlen_kv - seqlen_q bottom-right
    (FlashAttention >= 2.1's; `causal_diagonal`). A Q tile whose rows all see nothing (bottom-
    right with seqlen_q > seqlen_kv) visits no tile: its output is 0.
    """
    visited = (seqlen_kv + tile_n - 1) // tile_n
    first_masked = seqlen_kv // tile_n
    if causal:
        # Keys seen by the tile's last real row (a ragged tile's padding rows need nothing),
        # and by its first row: every tile before the latter's is fully visible.
        seen = _maximum(_minimum(_minimum((q_tile + 1) * tile_m, seqlen_q) + diagonal,
                                 seqlen_kv), 0)
        visited = (seen + tile_n - 1) // tile_n
        first_masked = _minimum(_maximum(q_tile * tile_m + diagonal, 0) // tile_n,
                                seqlen_kv // tile_n)
    return visited, first_masked


CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def check_causal_alignment(value) -> str:
    """`value` if it names a causal alignment, else a ValueError naming the argument."""
    if not isinstance(value, str) or value not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}, got {value!r}")
    return value


def causal_diagonal(seqlen_q, seqlen_kv, alignment: str):
    """The causal mask's diagonal (`kv_tile_span`, `WORK_DIAGONAL`): 0 for "top_left" (query
    row r sees keys 0..r, torch's `is_causal`), seqlen_kv - seqlen_q for "bottom_right" (the
    last query row sees every key: FlashAttention >= 2.1, a chunk of queries against a cache);
    ints or arrays of lengths (one per sequence)."""
    return seqlen_kv - seqlen_q if check_causal_alignment(alignment) == "bottom_right" else 0


def local_iteration(item, num_ctas, resident_ctas, cta_order):
    """How many work items this CTA slot has taken before `item` (0, 1, 2, ...).

    Persistent CTA c takes items c, c+P, ...: its local iteration is item // P. A grid launch
    has one item per CTA, so the slot's iteration is the wave the CTA belongs to in dispatch
    order: item // resident CTAs.
    """
    per_round = num_ctas
    if cta_order == CTA_GRID:
        per_round = resident_ctas
    return item // per_round


def scan_plan(lo, mid, hi, backward):
    """-> (start, step, count, masked_lo, masked_hi): the order in which an item visits its K/V
    tiles. The unmasked tiles [lo, mid) in the scan's direction, then the masked ones
    [mid, hi) forward: every direction ends on the masked tiles, so the kernel compiles one
    unmasked loop (affine in its counter) and one masked loop for all schedules."""
    return (_choose(backward, mid - 1, lo), _choose(backward, -1, 1), mid - lo, mid, hi)


def scans_backward(local_iter, kv_order):
    """1 if this iteration scans K/V from the last tile to the first, else 0.

    Sawtooth flips on the CTA's *own* iteration parity, so all CTAs of a wave share a
    direction and wave w+1 starts on the tiles wave w just left in L2. (Flipping on the global
    item parity makes neighbours scan opposite ways; measured, far worse.)
    """
    backward = 0
    if kv_order == KV_SAWTOOTH:
        backward = local_iter % 2
    return backward


def fill_rows(rows: np.ndarray, columns) -> None:
    """Write the first columns of `rows` (a work table or a slice of one, `WORK_COLUMNS` wide)
    from arrays of one value per row or one int for every row, and zero its padding. NumPy
    writes a column of a row-major table one strided element at a time, which took most of a
    100k-item table's build: the columns are stacked (contiguous writes) and transposed in one
    compiled pass instead."""
    columns = list(columns)
    stacked = np.empty((len(columns), len(rows)), dtype=np.int32)
    for column, values in enumerate(columns):
        stacked[column] = values  # a scalar (the same for every item) broadcasts
    _compiled("transpose", _transpose_into)(stacked, rows)


def _transpose_into(columns, rows):
    """rows[i, j] = columns[j, i], and the padding columns 0."""
    for i in range(rows.shape[0]):
        for j in range(columns.shape[0]):
            rows[i, j] = columns[j, i]
        for j in range(columns.shape[0], rows.shape[1]):
            rows[i, j] = 0


_COMPILED = {}

# Items per slice of a work table built on several threads (below twice this: one slice).
TABLE_SLICE_ITEMS = 16384


def table_chunks(n_items: int, per_slice: int = TABLE_SLICE_ITEMS) -> list[tuple[int, int]]:
    """[lo, hi) slices of a table of `n_items` rows: one, or as many as the table-building
    threads, each at least `per_slice` rows."""
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    threads = int(os.environ.get("WAVEFRONT_TABLE_THREADS", TABLE_THREADS))
    n = max(1, min(workers, threads, n_items // per_slice))
    bounds = [n_items * k // n for k in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


TABLE_THREADS = 8  # WAVEFRONT_TABLE_THREADS=1 builds every table in one slice


def _table_threads():
    """The thread pool work tables are built on, made on first use."""
    if "threads" not in _COMPILED:
        from concurrent.futures import ThreadPoolExecutor
        _COMPILED["threads"] = ThreadPoolExecutor(TABLE_THREADS,
                                                  thread_name_prefix="work-table")
    return _COMPILED["threads"]


def _gather_rows(per_row, direction, row, head, kv_head, rows):
    """rows[i] = per_row[direction[i], row[i]] with the item's head and K/V head, and the
    padding 0."""
    for i in range(rows.shape[0]):
        source = per_row[direction[i], row[i]]
        for j in range(per_row.shape[2]):
            rows[i, j] = source[j]
        for j in range(per_row.shape[2], rows.shape[1]):
            rows[i, j] = 0
        rows[i, WORK_HEAD] = head[i]
        rows[i, WORK_KV_HEAD] = kv_head[i]


def _compiled(name, function):
    """`function`, compiled once per process (numba is imported on the first table, not with
    the vocabulary; its machine code is cached on disk)."""
    if name not in _COMPILED:
        import numba
        _COMPILED[name] = numba.njit(cache=True, nogil=True)(function)
    return _COMPILED[name]


# --------------------------------------------------------------------------------------------
# Host-side description of a problem and a launch
# --------------------------------------------------------------------------------------------

def positive_int(name: str, value, *, optional: bool = False):
    """`value` if it is a positive int (None too, when optional), else a ValueError naming it."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class AttentionProblem:
    """Shape of one attention launch; everything a schedule needs to know about the data."""

    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_kv: int
    head_dim: int
    causal: bool = False
    tile_m: int = 128
    tile_n: int = 64
    element_bytes: int = 2
    # where the causal mask's diagonal sits when seqlen_q != seqlen_kv (`causal_diagonal`)
    causal_alignment: str = "top_left"

    def __post_init__(self):
        for name in ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_kv", "head_dim",
                     "tile_m", "tile_n", "element_bytes"):
            positive_int(name, getattr(self, name))
        check_causal_alignment(self.causal_alignment)
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")

    @property
    def q_tiles(self) -> int:
        return -(-self.seqlen_q // self.tile_m)

    @property
    def kv_tiles(self) -> int:
        return -(-self.seqlen_kv // self.tile_n)

    @property
    def qheads_per_kv(self) -> int:
        return self.heads // self.kv_heads

    @property
    def kv_units(self) -> int:
        """(batch, K/V head) pairs: the units whose K/V is shared."""
        return self.batch * self.kv_heads

    @cached_property
    def num_items(self) -> int:
        return self.batch * self.heads * self.q_tiles

    @property
    def kv_bytes_per_unit(self) -> int:
        """K and V of one (batch, K/V head)."""
        return 2 * self.seqlen_kv * self.head_dim * self.element_bytes

    @property
    def diagonal(self) -> int:
        """The causal diagonal of a dense batch (`causal_diagonal`); 0 without the mask."""
        if not self.causal:
            return 0
        return causal_diagonal(self.seqlen_q, self.seqlen_kv, self.causal_alignment)

    def kv_span(self, q_tile: int) -> tuple[int, int]:
        return kv_tile_span(q_tile, self.tile_m, self.tile_n, self.seqlen_q, self.seqlen_kv,
                            self.causal, self.diagonal)


class CtaSchedule(Protocol):
    """Which CTA takes which work item. Host side: grid size and the group size.

    `code` selects the order in `decode_work_item`; `persistent` says whether CTAs loop over
    items (else one item per CTA); `dynamic` whether a CTA takes the next item from an atomic
    counter when it finishes one (else grid-stride: CTA c takes c, c + P, ...);
    `takes_chunks` whether the tiled K/V schedule's chunk-major items may be handed out in this
    order.
    """

    name: str
    code: int
    persistent: bool
    dynamic: bool
    takes_chunks: bool

    def num_ctas(self, num_items: int, resident_ctas: int) -> int: ...

    def group_units(self, problem: AttentionProblem, l2_bytes: int) -> int: ...


@dataclass(frozen=True)
class GridSchedule:
    """One work item per CTA; the hardware dispatches CTAs in index order."""

    name: str = field(default="grid", init=False)
    code: int = field(default=CTA_GRID, init=False)
    persistent: bool = field(default=False, init=False)
    dynamic: bool = field(default=False, init=False)
    takes_chunks: bool = field(default=True, init=False)

    def num_ctas(self, num_items, resident_ctas):
        return num_items

    def group_units(self, problem, l2_bytes):
        return 1


@dataclass(frozen=True)
class PersistentSchedule:
    """P = resident CTAs (SMs x CTAs per SM) loop over the work items grid-stride."""

    name: str = field(default="persistent", init=False)
    code: int = field(default=CTA_PERSISTENT, init=False)
    persistent: bool = field(default=True, init=False)
    dynamic: bool = field(default=False, init=False)
    takes_chunks: bool = field(default=True, init=False)

    def num_ctas(self, num_items, resident_ctas):
        return min(num_items, resident_ctas)

    def group_units(self, problem, l2_bytes):
        return 1


@dataclass(frozen=True)
class GroupedSchedule:
    """Persistent, with heads taken in groups whose K/V fits `l2_fraction` of the L2.

    Group size (in (batch, K/V head) units) is the largest power of two whose K/V bytes fit the
    budget, at least 1 and at most all units. The default budget is half the L2: data read by
    every SM falls out of Hopper's L2 well before its nominal size (the knee experiment).
    """

    l2_fraction: float = 0.5
    name: str = field(default="grouped", init=False)
    code: int = field(default=CTA_GROUPED, init=False)
    persistent: bool = field(default=True, init=False)
    dynamic: bool = field(default=False, init=False)
    takes_chunks: bool = field(default=False, init=False)

    def __post_init__(self):
        if not (0.0 < self.l2_fraction <= 4.0):
            raise ValueError(f"l2_fraction must be in (0, 4], got {self.l2_fraction!r}")

    def num_ctas(self, num_items, resident_ctas):
        return min(num_items, resident_ctas)

    def group_units(self, problem, l2_bytes):
        budget = self.l2_fraction * l2_bytes
        units = 1
        while units * 2 <= problem.kv_units and units * 2 * problem.kv_bytes_per_unit <= budget:
            units *= 2
        return units


@dataclass(frozen=True)
class LongestFirstSchedule:
    """Persistent, longest work items first: Q tiles in decreasing order, heads fastest.

    Causal work items shrink with the Q tile index; handing them out longest first under
    grid-stride assignment keeps every round's items about equally long, so no CTA is left with
    the long tail. Non-causal items are all equally long and the order is heads-fastest. It
    spreads the CTAs in flight over every head's K/V, so it trades L2 locality for balance.
    """

    name: str = field(default="longest_first", init=False)
    code: int = field(default=CTA_LONGEST_FIRST, init=False)
    persistent: bool = field(default=True, init=False)
    dynamic: bool = field(default=False, init=False)
    takes_chunks: bool = field(default=False, init=False)

    def num_ctas(self, num_items, resident_ctas):
        return min(num_items, resident_ctas)

    def group_units(self, problem, l2_bytes):
        return 1


@dataclass(frozen=True)
class DynamicSchedule(LongestFirstSchedule):
    """Persistent, longest items first, and each CTA takes the next item from a global atomic
    counter when it finishes one (FlashAttention-3's dynamic scheduler).

    Static grid-stride assignment balances only when items are equally long; here a CTA that
    drew short items simply takes more, so causal launches end together. The order is
    longest-first's (heads fastest), which spreads the CTAs in flight over every head's K/V.
    Which CTA takes which item is decided at run time: the simulator assumes the lock-step
    assignment (the next free CTA slot takes the next item), and RECORD_ORDER records the real
    one. With sawtooth a CTA alternates on its own count of items.
    """

    name: str = field(default="dynamic", init=False)
    code: int = field(default=CTA_DYNAMIC, init=False)
    dynamic: bool = field(default=True, init=False)


@dataclass(frozen=True)
class GroupedDynamicSchedule(GroupedSchedule):
    """Grouped's L2 head groups, longest items first inside each group, and each CTA takes the
    next item from a global atomic counter (balanced without losing the L2 order).

    Groups follow one another in the counter's order, so the CTAs in flight stay within one or
    two groups whose K/V fits the L2 budget (half the L2 by default), as with `grouped`; inside
    a group the longest items go first and a free CTA takes the next one, so causal launches do
    not end on a tail of long items. The simulator assumes the lock-step assignment; RECORD_ORDER
    records the real one.
    """

    name: str = field(default="grouped_dynamic", init=False)
    code: int = field(default=CTA_GROUPED_DYNAMIC, init=False)
    dynamic: bool = field(default=True, init=False)


class KvSchedule(Protocol):
    """In which order a work item visits its K/V tiles; `writes_partials`: split into chunks
    whose partial states a combine kernel merges (the tiled family)."""

    name: str
    code: int
    writes_partials: bool
    partial_output_bytes: int  # bytes per element of a partial output (tiled family), else 0

    def chunk_tiles(self, problem: AttentionProblem, l2_bytes: int,
                    resident_ctas: int) -> int: ...


@dataclass(frozen=True)
class LinearScan:
    """Every work item scans its K/V tiles forward, first to last."""

    name: str = field(default="linear", init=False)
    code: int = field(default=KV_LINEAR, init=False)
    writes_partials: bool = field(default=False, init=False)
    partial_output_bytes: int = field(default=0, init=False)

    def chunk_tiles(self, problem, l2_bytes, resident_ctas):
        return problem.kv_tiles  # one chunk: the whole K/V


@dataclass(frozen=True)
class SawtoothScan:
    """A CTA's successive work items alternate forward / backward (grid launches: by wave).

    All CTAs of a wave share the parity, so wave w+1 starts on the tiles wave w just left in
    L2 (Zhu et al.'s sawtooth). Flipping on the global item parity instead is a different
    scheme and, measured, far worse.
    """

    name: str = field(default="sawtooth", init=False)
    code: int = field(default=KV_SAWTOOTH, init=False)
    writes_partials: bool = field(default=False, init=False)
    partial_output_bytes: int = field(default=0, init=False)

    def chunk_tiles(self, problem, l2_bytes, resident_ctas):
        return problem.kv_tiles


def partial_row_bytes(head_dim: int, partial_output_bytes: int = 4) -> int:
    """One row of a partial state: the unnormalised output, then fp32 row maximum and sum."""
    return head_dim * partial_output_bytes + PARTIAL_ROW_STATS_BYTES


def round_stream_bytes(problem: AttentionProblem, resident_ctas: int,
                       partial_output_bytes: int = 4) -> int:
    """What one round of the CTAs in flight streams through the L2 besides K/V: each reads its
    Q tile and writes its partial state (row max and sum, unnormalised output)."""
    p = problem
    return resident_ctas * p.tile_m * (p.head_dim * p.element_bytes
                                       + partial_row_bytes(p.head_dim, partial_output_bytes))


@dataclass(frozen=True)
class TiledScan:
    """K/V cut into chunks that fit the L2 (or `tiles_per_chunk` K/V tiles each).

    Every work item scans one chunk forward and leaves a partial softmax state (row max, row
    sum, unnormalised output, fp32); a combine kernel merges the chunks exactly. Each chunk is
    read from DRAM about once; the price is the partial-state traffic.

    The chunk gets `l2_fraction` of the L2 less what streams through it while the chunk is
    reused: each round of the CTAs in flight reads their Q tiles and writes their partial
    states, and under LRU a chunk plus that stream must fit. Where the stream would take more
    than half the budget (large tiles, D=128) the chunk keeps the whole budget instead: smaller
    chunks would multiply the partial-state traffic, which grows with the number of chunks.
    """

    l2_fraction: float = 0.4
    tiles_per_chunk: int | None = None
    name: str = field(default="tiled", init=False)
    code: int = field(default=KV_TILED, init=False)
    partial_output_bytes: int = field(default=4, init=False)  # fp32

    def __post_init__(self):
        if not (0.0 < self.l2_fraction <= 4.0):
            raise ValueError(f"l2_fraction must be in (0, 4], got {self.l2_fraction!r}")
        if self.tiles_per_chunk is not None:
            positive_int("tiles_per_chunk", self.tiles_per_chunk)

    def chunk_tiles(self, problem, l2_bytes, resident_ctas):
        if self.tiles_per_chunk is not None:
            return min(self.tiles_per_chunk, problem.kv_tiles)
        p = problem
        tile_bytes = 2 * p.tile_n * p.head_dim * p.element_bytes  # K + V
        chunk_bytes = self.chunk_bytes(self.l2_fraction * l2_bytes,
                                       round_stream_bytes(p, resident_ctas,
                                                          self.partial_output_bytes))
        return max(1, min(p.kv_tiles, int(chunk_bytes // tile_bytes)))

    def chunk_bytes(self, budget: float, stream: int) -> float:
        """The chunk's share of the budget: less the stream, unless the stream would take more
        than half of it (then the whole budget)."""
        return budget - stream if stream <= budget / 2 else budget

    @property
    def writes_partials(self) -> bool:
        return True


@dataclass(frozen=True)
class TiledFitScan(TiledScan):
    """Tiled, with chunks fitted to Hopper's two L2 partitions and the round's stream.

    A chunk is read by SMs of both partitions, so it holds a copy in each (the
    partition model, which predicts the fabric counters); the Q tiles read and partial states
    written by one round of the CTAs in flight pass through once. The chunk is therefore
    (l2_fraction x L2 - stream) / 2. `tiled` sized the chunk at 40% of the L2 and, at D=128,
    ignored a stream larger than the chunk: its chunks fell out of the L2 between rounds
    (DRAM reads 4.1x the minimum on the H100 at 256k). Smaller chunks mean more partial-state
    traffic, which is small next to the compute at these lengths.
    """

    l2_fraction: float = 0.8
    name: str = field(default="tiled_fit", init=False)
    code: int = field(default=KV_TILED_FIT, init=False)

    def chunk_bytes(self, budget: float, stream: int) -> float:
        # Never less than an eighth of the budget: past that, the stream alone misses anyway.
        return max(budget - stream, budget / 8) / 2


@dataclass(frozen=True)
class TiledFitBf16Scan(TiledFitScan):
    """tiled_fit with each chunk's unnormalised output stored in bfloat16 instead of float32:
    half the partial-state traffic, and a smaller stream so larger chunks.

    Not exact, but bounded: bfloat16 keeps float32's exponent range (no overflow, unlike
    float16) and rounds each element of a chunk's output acc_c = sum_j p_j v_j with relative
    error at most u = 2^-8. The combine forms o = sum_c beta_c acc_c / L, so the rounding adds
    at most u * sum_j w_j |v_j| (w the softmax weights) to each output element: no more than
    the bfloat16 rounding of P the kernel already makes before its PV product, and of the size
    of the output's own rounding. The row maxima and sums stay float32.
    """

    name: str = field(default="tiled_fit_bf16", init=False)
    code: int = field(default=KV_TILED_FIT_BF16, init=False)
    partial_output_bytes: int = field(default=2, init=False)


CTA_SCHEDULES: dict[str, CtaSchedule] = {
    "grid": GridSchedule(),
    "persistent": PersistentSchedule(),
    "grouped": GroupedSchedule(),
    "longest_first": LongestFirstSchedule(),
    "dynamic": DynamicSchedule(),
    "grouped_dynamic": GroupedDynamicSchedule(),
}
KV_SCHEDULES: dict[str, KvSchedule] = {
    "linear": LinearScan(),
    "sawtooth": SawtoothScan(),
    "tiled": TiledScan(),
    "tiled_fit": TiledFitScan(),
    "tiled_fit_bf16": TiledFitBf16Scan(),
}


def cta_schedule(name: str | CtaSchedule) -> CtaSchedule:
    if not isinstance(name, str):
        return name
    try:
        return CTA_SCHEDULES[name]
    except KeyError:
        raise ValueError(f"cta schedule must be one of {sorted(CTA_SCHEDULES)}, "
                         f"got {name!r}") from None


def schedule_names() -> list[str]:
    """Every supported 'cta+kv' combination, in registry order."""
    return [f"{c}+{k}" for c, cs in CTA_SCHEDULES.items() for k in KV_SCHEDULES
            if cs.takes_chunks or not KV_SCHEDULES[k].writes_partials]


def kv_schedule(name: str | KvSchedule) -> KvSchedule:
    if not isinstance(name, str):
        return name
    try:
        return KV_SCHEDULES[name]
    except KeyError:
        raise ValueError(f"kv schedule must be one of {sorted(KV_SCHEDULES)}, "
                         f"got {name!r}") from None


def check_placement(launch) -> None:
    """What places a launch on a GPU: SMs, CTAs per SM, L2 bytes, the optional CTA cap."""
    positive_int("sms", launch.sms)
    positive_int("ctas_per_sm", launch.ctas_per_sm)
    positive_int("l2_bytes", launch.l2_bytes)
    if launch.ctas is not None:
        positive_int("ctas", launch.ctas)


@dataclass(frozen=True)
class TableShape:
    """The integers a launch's work table depends on, besides its schedules and its mask. The
    formulas read them from here, so that a table built on the GPU takes them as a kernel's
    arguments: one compiled kernel then serves every shape of a schedule that takes the
    formulas' branches alike."""

    q_tiles: int
    heads: int
    kv_heads: int
    kv_units: int
    group_units: int
    n_chunks: int
    chunk_tiles: int
    num_ctas: int
    resident_ctas: int
    tile_m: int
    tile_n: int
    seqlen_q: int
    seqlen_kv: int
    diagonal: int = 0  # the causal diagonal (`AttentionProblem.diagonal`)


@dataclass(frozen=True)
class WorkItem:
    cta: int
    local_iter: int
    item: int
    batch: int
    head: int
    q_tile: int
    kv_tiles: tuple[int, ...]  # in visiting order
    chunk: int = 0  # K/V chunk (tiled schedule)


class Placed:
    """What follows from a launch's schedules and placement, the same for a dense batch
    (`Launch`) and a packed one (`VarlenLaunch`, `DeviceVarlenLaunch`): each has `cta`, `kv`,
    `sms`, `ctas_per_sm`, `ctas` and `num_items`."""

    @property
    def name(self) -> str:
        return f"{self.cta.name}+{self.kv.name}"

    @cached_property
    def resident_ctas(self) -> int:
        if self.ctas is not None:
            return self.ctas
        return self.sms * self.ctas_per_sm

    @cached_property
    def num_ctas(self) -> int:
        return self.cta.num_ctas(max(self.num_items, 1), self.resident_ctas)

    @property
    def alternate(self) -> int:
        """1 where CTAs alternate their scan on their own count of items at run time (sawtooth
        under a dynamic CTA schedule, whose item-to-CTA assignment is not known in advance)."""
        return int(self.cta.dynamic and self.kv.code == KV_SAWTOOTH)


def check_packed(launch) -> None:
    """What a packed batch's launch needs of its placement and K/V schedule."""
    check_placement(launch)
    if launch.kv.writes_partials:
        raise ValueError(f"kv schedule {launch.kv.name!r} does not apply to variable-length "
                         "batches; use linear or sawtooth")


@dataclass(frozen=True)
class Launch(Placed):
    """A problem, a CTA schedule and a K/V schedule placed on a GPU: what one kernel launch does.

    `resident_ctas` is how many CTAs run at once (SMs x CTAs per SM, or `ctas` when given: a
    persistent grid of fewer CTAs than the GPU holds, e.g. to study CTAs in flight); the kernel
    wrapper builds the same object and takes its grid from it.
    """

    problem: AttentionProblem
    cta: CtaSchedule
    kv: KvSchedule
    sms: int
    ctas_per_sm: int
    l2_bytes: int
    ctas: int | None = None

    def __post_init__(self):
        check_placement(self)
        if self.kv.writes_partials and not self.cta.takes_chunks:
            raise ValueError(f"schedule '{self.cta.name}+{self.kv.name}' is not supported: the "
                             "tiled schedules order their work chunk-major themselves; use a CTA "
                             "schedule "
                             f"among {[c for c, s in CTA_SCHEDULES.items() if s.takes_chunks]}")

    @cached_property
    def chunk_tiles(self) -> int:
        return self.kv.chunk_tiles(self.problem, self.l2_bytes, self.resident_ctas)

    @cached_property
    def n_chunks(self) -> int:
        return -(-self.problem.kv_tiles // self.chunk_tiles)

    @property
    def partial_row_bytes(self) -> int:
        """Bytes of one row of a partial state (read only where the K/V schedule writes them)."""
        return partial_row_bytes(self.problem.head_dim, self.kv.partial_output_bytes)

    @cached_property
    def num_items(self) -> int:
        """Work items of the launch: (batch, head, Q tile), times the K/V chunks if tiled."""
        return self.problem.num_items * self.n_chunks

    @cached_property
    def group_units(self) -> int:
        return self.cta.group_units(self.problem, self.l2_bytes)

    varlen = False  # a packed variable-length batch: see VarlenLaunch

    def items_of_cta(self, cta: int) -> range:
        """The items CTA `cta` takes: one (grid), or grid-stride. For a dynamic schedule this
        is the lock-step assignment, what a free CTA takes when all items are equally long."""
        if not self.cta.persistent:
            return range(cta, cta + 1)
        return range(cta, self.num_items, self.num_ctas)

    @cached_property
    def table_shape(self) -> TableShape:
        p = self.problem
        return TableShape(p.q_tiles, p.heads, p.kv_heads, p.kv_units, self.group_units,
                          self.n_chunks, self.chunk_tiles, self.num_ctas, self.resident_ctas,
                          p.tile_m, p.tile_n, p.seqlen_q, p.seqlen_kv, p.diagonal)

    def _diagonal(self, shape):
        """The causal diagonal the formulas use: 0 (top-left, the table's padding) as a plain
        int, so a top-left table is printed and built as before; the shape's otherwise."""
        p = self.problem
        return shape.diagonal if p.causal and p.causal_alignment == "bottom_right" else 0

    def _plan(self, item, backward=None, iteration_unused=False, shape=None):
        """-> (batch, head, q_tile, chunk, local iteration, lo, mid, hi, backward) of `item`
        (an int, or an array of item numbers: every column is then an array); `backward`
        given is passed through, else the item's own direction. `iteration_unused`: the
        caller does not read the local iteration (None then, unless the direction needs it).
        `shape`: the launch's integers (default: `table_shape`; traced values, to write the
        formulas out as a kernel that takes them as arguments)."""
        s = self.table_shape if shape is None else shape
        inner, chunk = split_chunk(item, s.q_tiles, s.heads, s.kv_heads, s.n_chunks)
        batch, head, q_tile = decode_work_item(inner, s.q_tiles, s.heads, s.kv_heads,
                                               s.kv_units, s.group_units, self.cta.code)
        it = None
        if not iteration_unused or (backward is None and self.kv.code == KV_SAWTOOTH):
            it = local_iteration(item, s.num_ctas, s.resident_ctas, self.cta.code)
        xp = _array_module(q_tile)
        # Each NumPy operation is a pass over all items, and spans depend on the Q tile alone:
        # worked out once per Q tile (a few hundred values), then looked up for every item.
        # (The GPU kernel works each item's span out where it stands.)
        look_up = xp is not None and not getattr(xp, "fused", False)
        visited, first_masked = kv_tile_span(
            np.arange(s.q_tiles, dtype=np.int32) if look_up else q_tile, s.tile_m, s.tile_n,
            s.seqlen_q, s.seqlen_kv, self.problem.causal, self._diagonal(s))
        if look_up and _array_module(visited, first_masked) is not None:
            spans = np.stack(np.broadcast_arrays(visited, first_masked)).astype(np.int32)
            visited, first_masked = spans[:, q_tile]
        lo, mid, hi = chunk_tile_range(chunk, s.chunk_tiles, visited, first_masked)
        if backward is None:
            backward = scans_backward(it, self.kv.code)
        return batch, head, q_tile, chunk, it, lo, mid, hi, backward

    def item_plan(self, item: int) -> tuple[int, ...]:
        """-> (batch, head, q_tile, chunk, local iteration, first tile, tiles, 1 if backward);
        a dynamic schedule's local iteration and direction are the lock-step assignment's."""
        batch, head, q_tile, chunk, it, lo, _, hi, backward = self._plan(item)
        return batch, head, q_tile, chunk, it, lo, hi - lo, backward

    def _row(self, item: int, backward: int | None = None, shape=None) -> tuple[int, ...]:
        """Item `item`'s work-table row (`backward`: the unmasked scan's direction; default:
        the item's own, lock-step for a dynamic schedule). `item` may be an array of items;
        `shape`: as for `_plan`."""
        batch, head, q_tile, chunk, _, lo, mid, hi, backward = self._plan(
            item, backward, iteration_unused=True, shape=shape)
        start, step, count, masked_lo, masked_hi = scan_plan(lo, mid, hi, backward)
        s = self.table_shape if shape is None else shape
        per_kv = s.heads // s.kv_heads
        kv_head = head if per_kv == 1 else head // per_kv
        row = (batch, head, kv_head, q_tile, start, step, count, masked_lo, masked_hi, chunk)
        diagonal = self._diagonal(s)
        if isinstance(diagonal, int) and diagonal == 0:
            return row  # the padding holds it
        return row + (0,) * (WORK_DIAGONAL - WORK_CHUNK - 1) + (diagonal,)

    def table_columns(self, items, shape=None) -> tuple:
        """The work table's columns (WORK_BATCH .. WORK_CHUNK, and up to WORK_DIAGONAL where
        the causal mask is bottom-right aligned) for item numbers `items`, as the table holds
        them: static schedules carry each item's direction, a dynamic one's
        rows scan forward (the kernel reverses a CTA's odd-numbered items, `alternate`).
        `shape`: as for `_plan`. A column the schedule fixes is a plain int."""
        return self._row(items, 0 if self.cta.dynamic else None, shape)

    def _check_table_size(self):
        if self.num_items >= 1 << 31:
            raise ValueError(f"a launch of {self.num_items} work items does not fit the int32 "
                             "work table (at most 2^31 - 1)")

    @cached_property
    def work_table(self) -> np.ndarray:
        """The kernel's input: one int32 row (`WORK_*` columns) per work item, in the order
        items are handed out. Static schedules carry each item's direction; a dynamic one's
        rows scan forward and the kernel reverses a CTA's odd-numbered items (`alternate`).

        Built for all items at once: `_row` on an array of item numbers is the same mapping
        as on one item. The public call builds the same rows on the GPU, by one kernel
        printed from these formulas (`wavefront.kernel.table_kernel`)."""
        self._check_table_size()
        items = np.arange(self.num_items, dtype=np.int32)
        rows = np.empty((self.num_items, WORK_COLUMNS), dtype=np.int32)
        spans = table_chunks(self.num_items)
        if len(spans) == 1:
            fill_rows(rows, self.table_columns(items))
        else:
            # A long table is built in slices on a few threads: NumPy's integer arithmetic
            # and the compiled transpose run without the GIL. The first slice goes alone, so
            # every cached property the mapping reads is settled before the threads share
            # the launch.
            def build(span):
                lo, hi = span
                fill_rows(rows[lo:hi], self.table_columns(items[lo:hi]))
            build(spans[0])
            list(_table_threads().map(build, spans[1:]))
        rows.setflags(write=False)
        return rows

    def kv_order(self, item: int, backward: int | None = None) -> tuple[int, ...]:
        """Item `item`'s K/V tiles in visiting order (`backward`: the unmasked scan's direction;
        default: the item's own, lock-step for a dynamic schedule)."""
        row = self._row(item, backward)
        start, step, count = row[WORK_SCAN_START], row[WORK_SCAN_STEP], row[WORK_SCAN_COUNT]
        return (tuple(start + step * t for t in range(count))
                + tuple(range(row[WORK_MASKED_LO], row[WORK_MASKED_HI])))

    def work_item(self, cta: int, item: int) -> WorkItem:
        batch, head, q_tile, chunk, it, _, _, _ = self.item_plan(item)
        return WorkItem(cta, it, item, batch, head, q_tile, self.kv_order(item), chunk)

    def work_of_cta(self, cta: int) -> Iterator[WorkItem]:
        for item in self.items_of_cta(cta):
            yield self.work_item(cta, item)

    def all_work(self) -> Iterator[WorkItem]:
        for cta in range(self.num_ctas):
            yield from self.work_of_cta(cta)


# --------------------------------------------------------------------------------------------
# Variable-length batches: packed sequences, one work table across all of them
# --------------------------------------------------------------------------------------------

def group_by_budget(unit_bytes: np.ndarray, budget: float) -> np.ndarray:
    """Group number of each unit: consecutive units fill a group while their bytes fit the
    budget (a unit larger than the budget is a group of its own). Ragged units cannot use the
    power-of-two group of `GroupedSchedule`, whose units are all the same size."""
    groups = np.empty(len(unit_bytes), dtype=np.int64)
    group, filled = 0, 0.0
    for i, size in enumerate(unit_bytes.tolist()):
        if filled and filled + size > budget:
            group, filled = group + 1, 0.0
        groups[i] = group
        filled += size
    return groups


@dataclass(frozen=True)
class TileRows:
    """A packed batch's Q tiles as its orders see them, as arrays of one library (NumPy, or a
    registered one's on the GPU). Tile rows are listed sequence by sequence, Q tiles
    ascending: `q_tile`, `visited` (K/V tiles) and `valid` (None: all; else which rows are
    real among a padded list) are theirs; `q_tiles`, `first_row`, `seqlens_kv` each
    sequence's. The bounds are at least the largest `visited` and `q_tile`."""

    q_tile: object
    visited: object
    valid: object
    q_tiles: object
    first_row: object
    seqlens_kv: object
    visited_bound: int
    tile_bound: int


def _sorted_by(xp, key, bound: int):
    """Item order by `key` (in [0, bound]), then the items' own order: a stable sort, of 32-bit
    keys where they fit (a radix sort then makes half the passes: on the GPU the sorts were a
    quarter of a table's writing)."""
    return xp.argsort_stable(xp.int32(key) if bound < 1 << 31 else key)


def _argsort_by(xp, primary, secondary, primary_bound: int, secondary_bound: int):
    """Item order by `primary`, then `secondary` (each in [0, its bound]), then the items' own
    order: one sort of a combined key, or two where it would overflow."""
    span = secondary_bound + 1
    if (primary_bound + 1) * span < 1 << 62:
        return _sorted_by(xp, primary * span + secondary, (primary_bound + 1) * span)
    by_secondary = xp.argsort_stable(secondary)
    return by_secondary[xp.argsort_stable(primary[by_secondary])]


def varlen_order(xp, launch, item, tiles: TileRows):
    """-> (tile row, head) of each work item `item` of a packed batch, in the order
    `launch.cta` hands them out. `xp`: `NumpyArrays` or a registered library's operations;
    `launch`: its problem, CTA schedule and L2 bytes.

    Grid and persistent: sequence by sequence, heads then Q tiles fastest. The others sort
    blocks of one tile row and a run of its heads, then list each block's heads:
    longest_first and dynamic by work (K/V tiles visited, then Q tile, both descending, then
    sequence; a block: every head); grouped and grouped_dynamic in groups of (sequence, K/V
    head) units whose K/V fits the L2 budget, filled in order by bytes, a block being the heads
    of one sequence's units in one group (grouped: by Q tile inside a group, then sequence;
    grouped_dynamic: longest first). Every array has a size the host knows without the
    lengths, so the order can be made where the lengths live; items past the batch's last
    (padding) map to some row and head in range."""
    code, p = launch.cta.code, launch.problem
    heads, rows = p.heads, len(tiles.q_tile)
    q_tiles, first_row = tiles.q_tiles, tiles.first_row
    padded = tiles.valid is not None
    if code in (CTA_GRID, CTA_PERSISTENT):
        seq, within = xp.expand(heads * q_tiles, len(item))
        head, tile = xp.divmod(within, xp.maximum(q_tiles[seq], 1))
        if not padded:
            return first_row[seq] + tile, head
        return (xp.minimum(first_row[seq] + xp.minimum(tile, xp.maximum(q_tiles[seq] - 1, 0)),
                           rows - 1),
                xp.minimum(head, heads - 1))
    longest = (tiles.visited_bound - tiles.visited) * (tiles.tile_bound + 1) + (
        tiles.tile_bound - tiles.q_tile)
    longest_bound = (tiles.visited_bound + 1) * (tiles.tile_bound + 1) - 1
    if code in (CTA_LONGEST_FIRST, CTA_DYNAMIC):
        if padded:  # padding last
            longest = xp.where(tiles.valid, longest, longest_bound + 1)
        block, head = xp.divmod(item, heads)
        return _sorted_by(xp, longest, longest_bound + 1)[block], head
    if code not in (CTA_GROUPED, CTA_GROUPED_DYNAMIC):
        raise ValueError(f"cta schedule {launch.cta.name!r} has no order for "
                         "variable-length batches (varlen_order)")
    # Segments: the units of one sequence in one group, as a run of K/V heads. Every unit
    # may start one; `segment` numbers each unit's.
    kv_heads, qpk = p.kv_heads, p.qheads_per_kv
    units = len(q_tiles) * kv_heads
    unit = xp.arange(units, like=item)
    unit_seq, unit_kv = xp.divmod(unit, kv_heads)
    group = xp.group_by_budget(2 * tiles.seqlens_kv[unit_seq] * (p.head_dim * p.element_bytes),
                               launch.cta.l2_fraction * launch.l2_bytes)
    starts = (unit_kv == 0) | (group != group[xp.maximum(unit - 1, 0)])
    segment = xp.cumsum(starts) - 1
    segments = segment[units - 1] + 1
    seg_first = xp.scatter(units, xp.where(starts, segment, units), unit)
    seg = xp.arange(units, like=item)
    seg_real = seg < segments
    seg_seq, seg_kv_lo = xp.divmod(seg_first, kv_heads)
    seg_kv_count = xp.where(seg + 1 < segments, seg_first[xp.minimum(seg + 1, units - 1)],
                            units) - seg_first
    # Blocks: every Q tile of a segment's sequence; a sequence has at most a segment per K/V
    # head, so there are at most kv_heads x rows.
    seg_blocks = xp.where(seg_real, q_tiles[seg_seq], 0)
    block_seg, block_tile = xp.expand(seg_blocks, kv_heads * rows if padded
                                      else int(seg_blocks.sum()))
    block_real = xp.arange(len(block_seg), like=item) < xp.cumsum(seg_blocks)[units - 1]
    block_row = xp.minimum(first_row[seg_seq[block_seg]] + block_tile, rows - 1)
    order = _argsort_by(
        xp, xp.where(block_real, group[seg_first[block_seg]], units),
        tiles.q_tile[block_row] if code == CTA_GROUPED else longest[block_row], units,
        tiles.tile_bound if code == CTA_GROUPED else longest_bound)
    block_seg, block_row = block_seg[order], block_row[order]
    taken, within = xp.expand(xp.where(block_real[order], seg_kv_count[block_seg] * qpk, 0),
                              len(item))
    return (block_row[taken],
            xp.minimum(seg_kv_lo[block_seg[taken]] * qpk + within, heads - 1))


def sequence_diagonals(problem: AttentionProblem, seqlens_q, seqlens_kv):
    """Each sequence's causal diagonal in a packed batch (`causal_diagonal`: bottom-right
    aligns each sequence's own last query with its own last key), an array like the lengths;
    0 without the mask."""
    if not problem.causal:
        return seqlens_q * 0
    return seqlens_q * 0 + causal_diagonal(seqlens_q, seqlens_kv, problem.causal_alignment)


@dataclass(frozen=True)
class VarlenLaunch(Placed):
    """A packed batch of sequences of different lengths (FlashAttention's varlen layout: the
    rows of every sequence one after another, `cu_seqlens` their boundaries) run as one
    launch: one work table across all sequences, each row carrying its sequence (number,
    start rows, lengths), so every CTA and K/V schedule applies across the batch.

    The CTA schedules order the items of the whole batch: grid and persistent sequence by
    sequence (heads, then Q tiles fastest); longest_first and dynamic by work, longest first
    (heads fastest among equals); grouped and grouped_dynamic in groups of (sequence, K/V
    head) units whose K/V fits the L2 budget, filled in order by bytes, heads fastest inside
    a group (grouped_dynamic: longest first inside a group). The tiled K/V schedules do not
    apply (their partial states are laid out per (batch, head) of equal length).

    `problem` describes the packed arrays as the kernel sees them: batch 1, seqlen = total
    rows. Causal masks are aligned per sequence as `problem.causal_alignment` says: top-left
    (torch's `is_causal`) or bottom-right (diagonal seqlen_k(s) - seqlen_q(s), `WORK_DIAGONAL`).
    """

    problem: AttentionProblem
    seqlens_q: tuple[int, ...]
    seqlens_kv: tuple[int, ...]
    cta: CtaSchedule
    kv: KvSchedule
    sms: int
    ctas_per_sm: int
    l2_bytes: int
    ctas: int | None = None
    varlen = True

    def __post_init__(self):
        check_packed(self)
        if len(self.seqlens_q) != len(self.seqlens_kv) or not self.seqlens_q:
            raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number "
                             f"(>= 1) of sequences, got {len(self.seqlens_q)} and "
                             f"{len(self.seqlens_kv)}")
        for i, (sq, sk) in enumerate(zip(self.seqlens_q, self.seqlens_kv)):
            if sq < 0 or sk < 0:
                raise ValueError(f"cu_seqlens must not decrease: sequence {i} has lengths "
                                 f"{sq} (q) and {sk} (k)")
            if sq > 0 and sk == 0:
                raise ValueError(f"cu_seqlens_k: sequence {i} has {sq} queries and no keys "
                                 "(its softmax would be over nothing)")
        p = self.problem
        if sum(self.seqlens_q) != p.seqlen_q or sum(self.seqlens_kv) != p.seqlen_kv:
            raise ValueError(f"cu_seqlens must end at the packed rows: q has {p.seqlen_q} "
                             f"rows, cu_seqlens_q ends at {sum(self.seqlens_q)}; k has "
                             f"{p.seqlen_kv}, cu_seqlens_k ends at {sum(self.seqlens_kv)}")

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    n_chunks = 1
    group_units = 1  # varlen groups are ragged: see `group_by_budget`

    @cached_property
    def num_items(self) -> int:
        # heads x Q tiles of each sequence (what `_items` lists), counted without listing them
        return self.problem.heads * sum(-(-n // self.problem.tile_m) for n in self.seqlens_q)

    def _tile_rows(self):
        """(sequence, Q tile, K/V tiles visited, first masked tile) of every Q tile of every
        sequence, sequence by sequence: all of a work item's row but its head, which the
        heads of one Q tile share (so the table's order is worked out on these, a heads-th
        of the items, and then spread over the heads)."""
        p = self.problem
        sq = np.asarray(self.seqlens_q, dtype=np.int64)
        sk = np.asarray(self.seqlens_kv, dtype=np.int64)
        q_tiles = -(-sq // p.tile_m)
        seq = np.repeat(np.arange(len(sq)), q_tiles)
        q_tile = np.arange(seq.size) - np.repeat(np.cumsum(q_tiles) - q_tiles, q_tiles)
        visited, first_masked = kv_tile_span(q_tile, p.tile_m, p.tile_n, sq[seq], sk[seq],
                                             p.causal, sequence_diagonals(p, sq, sk)[seq])
        return seq, q_tile, np.asarray(visited), np.asarray(first_masked)


    def _order(self, seq, q_tile, visited) -> tuple[np.ndarray, np.ndarray]:
        """-> (tile row, head) of every work item, in the order the CTA schedule hands the
        items out (tile rows as `_tile_rows` lists them): `varlen_order` on NumPy, the code
        that makes the order on the GPU from lengths there (`DeviceVarlenLaunch`)."""
        q_tiles = np.bincount(seq, minlength=self.batch)
        tiles = TileRows(q_tile, visited, None, q_tiles, np.cumsum(q_tiles) - q_tiles,
                         np.asarray(self.seqlens_kv, dtype=np.int64),
                         int(visited.max(initial=0)), int(q_tile.max(initial=0)))
        return varlen_order(NumpyArrays, self, np.arange(self.problem.heads * seq.size), tiles)

    @cached_property
    def work_table(self) -> np.ndarray:
        """One int32 row per work item in hand-out order (`WORK_*` columns, sequences' starts
        and lengths included); the same scan rules as `Launch.work_table`."""
        rows = np.empty((self.num_items, WORK_COLUMNS), dtype=np.int32)
        self.write_work_table(rows)
        rows.setflags(write=False)
        return rows

    def write_work_table(self, rows: np.ndarray) -> None:
        """Write `work_table` into `rows` (num_items x WORK_COLUMNS int32), wherever they
        live: each new batch of lengths builds its table on the host, and the public call
        writes it straight into the pinned buffer it copies to the GPU from."""
        if rows.shape != (self.num_items, WORK_COLUMNS) or rows.dtype != np.int32:
            raise ValueError(f"rows must be int32 of shape {(self.num_items, WORK_COLUMNS)}, "
                             f"got {rows.dtype} {rows.shape}")
        seq, q_tile, visited, first_masked = self._tile_rows()
        row, head = self._order(seq, q_tile, visited)
        it = local_iteration(np.arange(row.size), self.num_ctas, self.resident_ctas,
                             self.cta.code)
        backward = 0 if self.cta.dynamic else scans_backward(it, self.kv.code)
        lo, mid, hi = chunk_tile_range(0, max(int(visited.max(initial=0)), 1), visited,
                                       first_masked)
        sq = np.asarray(self.seqlens_q, dtype=np.int64)
        sk = np.asarray(self.seqlens_kv, dtype=np.int64)
        q_start, kv_start = np.cumsum(sq) - sq, np.cumsum(sk) - sk
        if max(self.problem.seqlen_q, self.problem.seqlen_kv) >= 1 << 31:
            raise ValueError("packed sequences of 2^31 rows or more do not fit the int32 work "
                             "table")
        # Everything but the item's head and scan direction belongs to its tile row: each
        # tile row's columns are written for both directions, and the items copy theirs
        # (one compiled pass, with no item-sized temporaries: a 16k-item table built column
        # by column spent most of its time in page faults on NumPy's temporaries).
        per_row = np.empty((2, seq.size, WORK_DIAGONAL + 1), dtype=np.int32)  # no padding
        diagonal = sequence_diagonals(self.problem, sq, sk)
        for direction in (0, 1):
            start, step, count, masked_lo, masked_hi = scan_plan(lo, mid, hi, direction)
            columns = {WORK_BATCH: seq, WORK_HEAD: 0, WORK_KV_HEAD: 0, WORK_Q_TILE: q_tile,
                       WORK_SCAN_START: start, WORK_SCAN_STEP: step, WORK_SCAN_COUNT: count,
                       WORK_MASKED_LO: masked_lo, WORK_MASKED_HI: masked_hi, WORK_CHUNK: 0,
                       WORK_Q_START: q_start[seq], WORK_KV_START: kv_start[seq],
                       WORK_SEQLEN_Q: sq[seq], WORK_SEQLEN_KV: sk[seq],
                       WORK_DIAGONAL: diagonal[seq]}
            fill_rows(per_row[direction], [columns[c] for c in range(len(columns))])
        direction = (np.zeros(row.size, dtype=np.int8) if np.ndim(backward) == 0
                     else backward.astype(np.int8))
        _compiled("gather_rows", _gather_rows)(per_row, direction, row, head,
                                               head // self.problem.qheads_per_kv, rows)


# The bits of `DeviceVarlenLaunch.length_errors`, each shifted left by 0 for cu_seqlens_q and
# max_seqlen_q, by 1 for cu_seqlens_k and max_seqlen_k.
LENGTHS_MALFORMED = 1  # not starting at 0, decreasing, or past the packed rows
LENGTHS_ABOVE_MAX = 4  # a sequence longer than max_seqlen


def length_error_text(errors: int) -> str:
    """What `length_errors` bits say, naming the arguments."""
    said = []
    for shift, side in ((0, "q"), (1, "k")):
        if errors & (LENGTHS_MALFORMED << shift):
            said.append(f"cu_seqlens_{side} must start at 0, never decrease and end within "
                        f"the packed rows of {side}")
        if errors & (LENGTHS_ABOVE_MAX << shift):
            said.append(f"max_seqlen_{side} must be at least the longest sequence of "
                        f"cu_seqlens_{side}")
    return "; ".join(said)


@dataclass(frozen=True)
class DeviceVarlenLaunch(Placed):
    """A packed batch whose `cu_seqlens` stay where the caller keeps them, on the GPU
    (FlashAttention's varlen interface, as training and serving loops call it): the host
    knows the packed rows and the number of sequences, never the lengths. The table has a row
    for every item the lengths could make, `num_items` = heads x `tile_rows`, an upper bound;
    each call writes the real items first and their count (`table_columns`), on the GPU, and
    the kernel reads the count there, so nothing waits for the GPU and a CUDA graph replays
    the call for whatever lengths the tensors hold then.

    Orders: every CTA schedule's, as `VarlenLaunch` makes them, by the same code
    (`varlen_order`). Lengths are clamped to the packed rows, so bad ones give wrong rows,
    never a read or write outside the arrays; `length_errors` says, where the lengths are,
    what was malformed (the public call raises on it without waiting for the GPU)."""

    problem: AttentionProblem
    batch: int
    cta: CtaSchedule
    kv: KvSchedule
    sms: int
    ctas_per_sm: int
    l2_bytes: int
    ctas: int | None = None
    varlen = True
    lengths_on_device = True
    n_chunks = 1
    group_units = 1

    def __post_init__(self):
        check_packed(self)
        positive_int("batch", self.batch)

    @cached_property
    def tile_rows(self) -> int:
        """Most Q tiles the lengths can make: a sequence's tiles are its whole tiles and at most
        one ragged one, and the whole tiles of all sequences fit the packed rows."""
        return self.problem.seqlen_q // self.problem.tile_m + self.batch

    @cached_property
    def num_items(self) -> int:
        return self.problem.heads * self.tile_rows

    def length_errors(self, cu_seqlens_q, cu_seqlens_kv, rows_q=None, rows_kv=None,
                      max_seqlen_q=None, max_seqlen_kv=None):
        """What is malformed about lengths on the GPU, worked out there (nothing read back):
        a 0-d integer array of the cu_seqlens' library, the sum of the LENGTHS_* bits of
        `LENGTH_ERRORS` (0: none). cu_seqlens must start at 0, never decrease and end within
        the packed rows (`rows_*`, default the problem's); `max_seqlen_*` (ints or 0-d arrays;
        None: not checked) must be at least every sequence's length. The table is written
        from the clamped lengths whatever this says (`table_columns`): no read or write
        leaves the arrays, and the call raises where this is not 0."""
        xp = _array_module(cu_seqlens_q)
        if xp is None:
            raise ValueError(f"cu_seqlens must be NumPy arrays or arrays of a registered "
                             f"library, got {type(cu_seqlens_q).__name__}")
        if xp is np:
            xp = NumpyArrays
        p = self.problem
        errors = 0
        for bit, cu, rows, longest, packed in (
                (0, cu_seqlens_q, rows_q, max_seqlen_q, p.seqlen_q),
                (1, cu_seqlens_kv, rows_kv, max_seqlen_kv, p.seqlen_kv)):
            bounds = xp.int64(cu)
            steps = bounds[1:] - bounds[:-1]
            bad = ((bounds[0] != 0) | (steps < 0).any()
                   | (bounds[-1] > (packed if rows is None else rows)))
            errors = errors + bad * (LENGTHS_MALFORMED << bit)
            if longest is not None:
                errors = errors + (steps.max() > longest) * (LENGTHS_ABOVE_MAX << bit)
        return errors

    def table_columns(self, cu_seqlens_q, cu_seqlens_kv, rows_q=None, rows_kv=None):
        """-> (the table's columns WORK_BATCH .. WORK_DIAGONAL, each an int or one value per
        row of `num_items`, the real items first; how many are real), as arrays of the
        cu_seqlens' library (NumPy or torch) on their device. The rows after the real ones are
        padding that no CTA reads. `rows_q`, `rows_kv`: this call's packed rows, at most the
        problem's (ints or 0-d arrays; default: the problem's), to which the lengths are
        clamped."""
        xp = _array_module(cu_seqlens_q)
        if xp is None:
            raise ValueError(f"cu_seqlens must be NumPy arrays or arrays of a registered "
                             f"library ({sorted(_ARRAY_LIBRARIES)}), got "
                             f"{type(cu_seqlens_q).__name__}")
        if xp is np:
            xp = NumpyArrays
        p, n, heads = self.problem, self.batch, self.problem.heads
        bounds_q = xp.minimum(xp.maximum(xp.int64(cu_seqlens_q), 0),
                              p.seqlen_q if rows_q is None else rows_q)
        bounds_kv = xp.minimum(xp.maximum(xp.int64(cu_seqlens_kv), 0),
                               p.seqlen_kv if rows_kv is None else rows_kv)
        rows_q, rows_kv = p.seqlen_q, p.seqlen_kv  # bounds of what follows
        start_q, start_kv = bounds_q[:n], bounds_kv[:n]
        seqlen_q = xp.maximum(bounds_q[1:] - start_q, 0)
        seqlen_kv = xp.maximum(bounds_kv[1:] - start_kv, 0)
        q_tiles = (seqlen_q + p.tile_m - 1) // p.tile_m
        tile_ends = xp.cumsum(q_tiles)
        tile_row = xp.arange(self.tile_rows, like=bounds_q)
        seq = xp.minimum(xp.searchsorted_right(tile_ends, tile_row), n - 1)
        q_tile = tile_row - (tile_ends[seq] - q_tiles[seq])
        diagonal = sequence_diagonals(p, seqlen_q, seqlen_kv)
        visited, first_masked = kv_tile_span(q_tile, p.tile_m, p.tile_n, seqlen_q[seq],
                                             seqlen_kv[seq], p.causal, diagonal[seq])
        item = xp.arange(self.num_items, like=bounds_q)
        row, head = varlen_order(xp, self, item, TileRows(
            q_tile, visited, tile_row < tile_ends[n - 1], q_tiles, tile_ends - q_tiles,
            seqlen_kv, -(-rows_kv // p.tile_n) + 1, -(-rows_q // p.tile_m)))
        backward = (0 if self.cta.dynamic else scans_backward(
            local_iteration(item, self.num_ctas, self.resident_ctas, self.cta.code),
            self.kv.code))
        item_seq = seq[row]
        lo, mid, hi = chunk_tile_range(0, 1 << 30, visited[row], first_masked[row])
        start, step, count, masked_lo, masked_hi = scan_plan(lo, mid, hi, backward)
        columns = {WORK_BATCH: item_seq, WORK_HEAD: head,
                   WORK_KV_HEAD: head // p.qheads_per_kv, WORK_Q_TILE: q_tile[row],
                   WORK_SCAN_START: start, WORK_SCAN_STEP: step, WORK_SCAN_COUNT: count,
                   WORK_MASKED_LO: masked_lo, WORK_MASKED_HI: masked_hi, WORK_CHUNK: 0,
                   WORK_Q_START: start_q[item_seq], WORK_KV_START: start_kv[item_seq],
                   WORK_SEQLEN_Q: seqlen_q[item_seq], WORK_SEQLEN_KV: seqlen_kv[item_seq],
                   WORK_DIAGONAL: diagonal[item_seq]}
        return [columns[c] for c in range(len(columns))], heads * tile_ends[n - 1]
