"""Work tables of the KV-cache call (decode and chunked prefill against a cache).

The prefill vocabulary (`wavefront.schedules`) orders (batch, query head, Q tile) items of one
dense problem whose lengths the host knows. A cache call differs in three ways that change the
unit of work, so it gets this small module beside it, in the same style (frozen dataclasses
holding host parameters, the table built on the host, persistent CTAs taking rows
grid-stride as the prefill's `CTA_PERSISTENT` schedule does):

- *GQA packing*: an item is one (batch, K/V head), and its Q tile holds the query rows of every
  query head of that K/V head (`group` of them) for `rows_per_tile` query positions: row r is
  query position `q_tile * rows_per_tile + r // group_tile`, head `kv_head * group + r %
  group_tile`. Each K/V byte is then read once per group instead of once per query head.
- *Split-KV*: each item's keys are divided into `num_splits` parts of equal share, each a work
  item writing a partial (output, row max, row sum) that a second kernel merges (the tiled
  prefill schedule's combine, keyed by split instead of chunk).
- *Lengths on the GPU*: `cache_seqlens` may live on the GPU, where the host must not read them.
  So a row names its split, not its K/V tiles; the kernel divides the item's own key count
  (read there) into the splits with `split_tiles` below, the function the host's columns use
  for the cache's capacity. A sequence shorter than the capacity thus keeps its splits'
  shares equal, and a table serves every step of a decode loop.

`cta_order` names the order rows are handed out (`CTA_ORDERS`): "batch_major" (sequence by
sequence, K/V heads inside), "kv_head_major" (one K/V head of every sequence, then the next),
"prefix_grouped" (sequences that share their first page, as a system prompt or parallel
samples do, next to each other, their items of one K/V head and split adjacent, so the pages
they share are read while still in L2).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from wavefront.schedules import positive_int

# One row per work item, 8 int32 (32-byte rows, a stride the ahead-of-time signature accepts).
DECODE_BATCH = 0
DECODE_KV_HEAD = 1
DECODE_Q_TILE = 2
DECODE_SPLIT = 3
DECODE_SPLITS = 4
# The split's K/V tiles for the cache's capacity (the kernel recomputes them for the item's
# real length: `split_tiles`); read by the model and the tests, not by the kernel.
DECODE_KV_START = 5
DECODE_KV_COUNT = 6
DECODE_COLUMNS = 8

CTA_ORDERS = ("batch_major", "kv_head_major", "prefix_grouped")
DEFAULT_CTA_ORDER = "batch_major"

# Page sizes of a paged cache: powers of two, so that a K/V tile of 64 keys holds whole pages
# (pages of 16 or 32 keys: 4 or 2, each its own load) or lies within one page.
PAGE_SIZES = (16, 32, 64, 128, 256)
# Keys per K/V tile. Tiles of a 16-key page's size compiled to code with register spills
# (D=128: 177 local loads and 197 stores with splits; D=64: 391/426 and no pipelined MMAs),
# so a small page is read as sub-tiles of a 64-key tile instead.
DEFAULT_TILE_N = 64
# Query rows per tile (GQA packed rows x query positions): 64, for decode and chunked prefill
# alike. Decode fills 4 of them at GQA 4, yet tileiras 13.4 compiles a 16-row tile (D=128,
# 64-key K/V tiles, two CTAs per SM) to mma.sync with 257 local loads and 385 local stores
# (register spills), and a 128-row one to serialised warpgroup MMAs with 221/217 spills; the
# 64-row one to pipelined warpgroup MMAs without a spill (SASS of each, sm_90). Decode stays
# bound by memory: 64 rows make 64 FLOP per K/V byte, a fifth of the H100's ridge point.
MIN_TILE_M = 64
MAX_TILE_M = 64
# A split below this many K/V tiles costs more in its partial state than it saves.
MIN_TILES_PER_SPLIT = 4
MAX_SPLITS = 128
# A split count whose waves are this full of the best's is good enough (FlashAttention's
# num_splits_heuristic: fewer splits, fewer partial states to merge).
SPLIT_EFFICIENCY = 0.85


def split_tiles(split, splits, tiles):
    """[first, last) K/V tile of `split` of `splits` over `tiles` tiles: equal shares, every
    tile in exactly one split. Plain integer arithmetic: the kernel calls the same function
    on its own scalars."""
    return split * tiles // splits, (split + 1) * tiles // splits


def key_span(seqlen_k, seqlen_q, causal, first_row, rows):
    """-> (offset, keys some row sees, keys every row sees) of the query rows [first_row,
    first_row + rows) of a sequence of `seqlen_k` keys and `seqlen_q` queries. Query s sees
    the keys below min(s + offset, seqlen_k): bottom-right causal (query s at key position
    seqlen_k - seqlen_q + s) with causal = 1, every key with causal = 0. Plain integer
    arithmetic: the kernel calls it on its own scalars."""
    offset = seqlen_k - seqlen_q + 1 + (1 - causal) * seqlen_q
    last_row = min(first_row + rows, seqlen_q) - 1
    keys_any = min(seqlen_k, max(offset + last_row, 0))
    keys_all = min(seqlen_k, max(offset + first_row, 0))
    return offset, keys_any, keys_all


def page_slot(j, tiles_per_page):
    """-> (block table slot, tile within that page) of a sequence's K/V tile j."""
    slot = j // tiles_per_page
    return slot, j - slot * tiles_per_page


def next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pages_per_tile(page_size: int | None, tile_n: int = DEFAULT_TILE_N) -> int:
    """Pages in one K/V tile: 1 where a tile lies within a page (or the cache is contiguous),
    else the tile's loads, one per page."""
    return 1 if page_size is None else max(1, tile_n // page_size)


def sub_tile_page(j, part, parts, subs_per_page):
    """-> (block table slot, sub-tile within that page) of part `part` of `parts` of a
    sequence's K/V tile j, sub-tiles being a page (`parts` > 1) or the tile (`parts` == 1)
    and `subs_per_page` of them filling a page."""
    return page_slot(j * parts + part, subs_per_page)


@dataclass(frozen=True)
class DecodeProblem:
    """One cache call's shape. `capacity`: keys a sequence can hold (S_max, or the block
    table's pages x page size); `seqlen_new`: keys appended in the call; `page_size`: None for
    a contiguous cache."""

    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    capacity: int
    head_dim: int
    seqlen_new: int = 0
    page_size: int | None = None
    element_bytes: int = 2

    def __post_init__(self):
        for name in ("batch", "heads", "kv_heads", "seqlen_q", "capacity", "head_dim",
                     "element_bytes"):
            positive_int(name, getattr(self, name))
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")
        if self.group_tile > MAX_TILE_M:
            raise ValueError(f"heads / kv_heads must be at most {MAX_TILE_M}, got "
                             f"{self.group}")
        if self.page_size is not None and self.page_size not in PAGE_SIZES:
            raise ValueError(f"page_size must be one of {PAGE_SIZES}, got {self.page_size!r}")

    @functools.cached_property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.heads // self.kv_heads

    @functools.cached_property
    def group_tile(self) -> int:
        """The group padded to a power of two: a tile's rows are (position, head) pairs."""
        return next_power_of_two(self.group)

    @functools.cached_property
    def tile_m(self) -> int:
        """Rows per Q tile: every packed row of the call where they fit in MAX_TILE_M, at
        least MIN_TILE_M (the smallest warpgroup MMA)."""
        rows = next_power_of_two(self.seqlen_q * self.group_tile)
        return max(MIN_TILE_M, self.group_tile, min(MAX_TILE_M, rows))

    @functools.cached_property
    def rows_per_tile(self) -> int:
        """Query positions per Q tile."""
        return self.tile_m // self.group_tile

    @functools.cached_property
    def tile_n(self) -> int:
        return DEFAULT_TILE_N

    @functools.cached_property
    def pages_per_tile(self) -> int:
        return pages_per_tile(self.page_size, self.tile_n)

    @functools.cached_property
    def q_tiles(self) -> int:
        return -(-self.seqlen_q // self.rows_per_tile)

    @functools.cached_property
    def kv_tiles(self) -> int:
        """K/V tiles of a full cache (the most an item scans)."""
        return -(-self.capacity // self.tile_n)

    @functools.cached_property
    def units(self) -> int:
        """(batch, K/V head, Q tile) triples: the items without a split."""
        return self.batch * self.kv_heads * self.q_tiles

    def kv_bytes(self, seqlens) -> int:
        """K and V bytes an attention over keys `seqlens` (per sequence) reads once."""
        keys = int(np.minimum(np.asarray(seqlens, dtype=np.int64), self.capacity).sum())
        return 2 * keys * self.kv_heads * self.head_dim * self.element_bytes


def choose_splits(problem: DecodeProblem, slots: int, seqlen_hint: int | None = None) -> int:
    """Splits per item, FlashAttention's rule: of the split counts that keep at least
    MIN_TILES_PER_SPLIT tiles of `seqlen_hint` keys (default the capacity) in a split, the
    smallest whose last wave of items fills at least SPLIT_EFFICIENCY of the best one's over
    `slots` (SMs x CTAs per SM). 1 where the (batch, K/V head, Q tile) items alone fill the
    slots."""
    positive_int("slots", slots)
    if seqlen_hint is not None and (isinstance(seqlen_hint, bool) or not isinstance(
            seqlen_hint, int) or seqlen_hint < 0):
        raise ValueError(f"seqlen_hint must be an integer >= 0 or None, got {seqlen_hint!r}")
    if problem.units >= slots:
        return 1
    keys = problem.capacity if seqlen_hint is None else max(1, min(seqlen_hint,
                                                                   problem.capacity))
    most = max(1, min(-(-keys // problem.tile_n) // MIN_TILES_PER_SPLIT, MAX_SPLITS))
    return _fewest_good_splits(problem.units, slots, most, SPLIT_EFFICIENCY)


@functools.lru_cache(maxsize=1024)
def _fewest_good_splits(units: int, slots: int, most: int, good_enough: float) -> int:
    """`choose_splits`' rule over 1..`most` splits, remembered: a cache that grows plans a
    step anew, and its candidates change only every MIN_TILES_PER_SPLIT tiles."""
    def efficiency(splits):
        waves = units * splits / slots
        return waves / math.ceil(waves)
    best = max(efficiency(s) for s in range(1, most + 1))
    return next(s for s in range(1, most + 1) if efficiency(s) >= good_enough * best)


@dataclass(frozen=True)
class DecodeLaunch:
    """A cache call's work: its problem, splits, CTA order and persistent CTAs.

    `sharing`: for "prefix_grouped", one key per sequence (equal keys share their prefix, e.g.
    a block table's first page id); None puts each sequence in a group of its own."""

    problem: DecodeProblem
    num_splits: int
    ctas: int
    cta_order: str = DEFAULT_CTA_ORDER
    sharing: tuple | None = None

    def __post_init__(self):
        positive_int("num_splits", self.num_splits)
        positive_int("ctas", self.ctas)
        if self.num_splits > MAX_SPLITS:
            raise ValueError(f"num_splits must be at most {MAX_SPLITS}, got {self.num_splits}")
        if self.cta_order not in CTA_ORDERS:
            raise ValueError(f"cta_order must be one of {CTA_ORDERS}, got {self.cta_order!r}")
        if self.sharing is not None and len(self.sharing) != self.problem.batch:
            raise ValueError(f"sharing must hold one key per sequence ({self.problem.batch}), "
                             f"got {len(self.sharing)}")

    @property
    def num_items(self) -> int:
        return self.problem.units * self.num_splits

    @property
    def grid(self) -> int:
        """Persistent CTAs: no more than there are items."""
        return min(self.ctas, self.num_items)

    def _batch_order(self) -> np.ndarray:
        """Sequences in hand-out order, and a group number per position (prefix_grouped:
        sequences of equal `sharing` key share a group, in order of first appearance)."""
        batch = self.problem.batch
        if self.cta_order != "prefix_grouped" or self.sharing is None:
            return np.arange(batch), np.arange(batch)
        first_seen: dict = {}
        groups = np.array([first_seen.setdefault(key, len(first_seen)) for key in self.sharing])
        order = np.argsort(groups, kind="stable")
        return order, groups[order]

    def work_table(self) -> np.ndarray:
        """(num_items, DECODE_COLUMNS) int32: one row per work item in hand-out order."""
        p = self.problem
        batches, groups = self._batch_order()
        kv_heads, q_tiles, splits = (np.arange(n) for n in (p.kv_heads, p.q_tiles,
                                                             self.num_splits))
        if self.cta_order == "batch_major":
            # (batch, K/V head, Q tile, split), split fastest: one sequence's head at a time
            b, h, t, s = np.meshgrid(batches, kv_heads, q_tiles, splits, indexing="ij")
        elif self.cta_order == "kv_head_major":
            h, b, t, s = np.meshgrid(kv_heads, batches, q_tiles, splits, indexing="ij")
        else:
            # group, K/V head, split, Q tile, then the group's sequences: the sharers' items
            # of one page range are handed out together
            rows = []
            for group in np.unique(groups):
                members = batches[groups == group]
                h, s, t, b = np.meshgrid(kv_heads, splits, q_tiles, members, indexing="ij")
                rows.append(np.stack([x.ravel() for x in (b, h, t, s)], axis=1))
            b, h, t, s = np.concatenate(rows).T
        table = np.zeros((self.num_items, DECODE_COLUMNS), dtype=np.int32)
        table[:, DECODE_BATCH] = np.ravel(b)
        table[:, DECODE_KV_HEAD] = np.ravel(h)
        table[:, DECODE_Q_TILE] = np.ravel(t)
        table[:, DECODE_SPLIT] = np.ravel(s)
        table[:, DECODE_SPLITS] = self.num_splits
        first, last = split_tiles(table[:, DECODE_SPLIT].astype(np.int64), self.num_splits,
                                  p.kv_tiles)
        table[:, DECODE_KV_START] = first
        table[:, DECODE_KV_COUNT] = last - first
        return table


def plan_decode(problem: DecodeProblem, *, sms: int, ctas_per_sm: int,
                num_splits: int | None = None, cta_order: str | None = None,
                sharing: tuple | None = None, seqlen_hint: int | None = None) -> DecodeLaunch:
    """The launch of a cache call on a GPU of `sms` SMs running `ctas_per_sm` CTAs each."""
    slots = positive_int("sms", sms) * positive_int("ctas_per_sm", ctas_per_sm)
    splits = (choose_splits(problem, slots, seqlen_hint) if num_splits is None
              else positive_int("num_splits", num_splits))
    return DecodeLaunch(problem, splits, slots, cta_order or DEFAULT_CTA_ORDER, sharing)
