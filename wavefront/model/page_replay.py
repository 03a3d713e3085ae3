"""Decode over a paged KV cache whose sequences share a prefix: the block tables, the order the
kernel's work items run in, and an LRU replay of the page stream that predicts DRAM bytes.

A batch of `batch` sequences in groups of `group` shares a prompt of `prefix` tokens per group
(a system prompt, parallel samples, beams): the block tables of one group point at the same
physical pages for the prefix, each sequence has private pages after it. `layout` says where
sharers sit in the batch: "interleaved" (sequence b in group b mod groups: requests of
several prompts arriving in turn) or "adjacent" (group b // group).

Work items (as `wavefront.attention_with_kvcache` cuts them, `wavefront.decode_schedules`):
one item per (sequence, K/V head, split) for one query token; with GQA packing an item reads
its K/V head's pages once for all the query heads that share it. The orders (`cta_order`),
as the cache call's work table hands items out:
- "batch_major": sequence outermost, K/V head, split innermost (the default);
- "kv_head_major": K/V head outermost, then sequence, then split;
- "prefix_grouped": sequences grouped by their first physical page (groups in order of first
  appearance); per group K/V head, then split, then the group's sequences: the sharers' items
  of one page range are handed out together.

`replay` runs them as a persistent launch does: CTA c takes items c, c + P, c + 2P, ... (P
CTAs), all CTAs advancing one page per round in lock-step (the simulator's rounds,
`model.simulation`), each page step reading the item's K and V slices of that page for its
K/V head, an item first reading its queries. The stream feeds the shared LRU L2
(`simulation.LruL2`, one or two partitions); its DRAM read sectors are the prediction. What
it leaves out: the split combine's partial reads (none with one split), output writes, CTA
drift (sharers more than a few pages apart hit only if the L2 holds what lies between).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wavefront.decode_schedules import (CTA_ORDERS, DECODE_BATCH, DECODE_KV_HEAD, DECODE_SPLIT,
                                        DecodeLaunch, DecodeProblem)
from wavefront.model.simulation import KIND_Q, LruL2, Trace
from wavefront.point import SECTOR_BYTES
from wavefront.schedules import positive_int

LAYOUTS = ("interleaved", "adjacent")


@dataclass(frozen=True)
class SharedPrefixBatch:
    """A decode batch: `batch` sequences of `context` tokens each (prefix included), in
    groups of `group` sharing their first `prefix` tokens' pages; one query token each."""

    batch: int
    group: int
    prefix: int
    context: int
    page_size: int = 64
    kv_heads: int = 8
    heads: int = 32
    head_dim: int = 128
    element_bytes: int = 2
    layout: str = "interleaved"

    def __post_init__(self):
        for name in ("batch", "group", "context", "page_size", "kv_heads", "heads", "head_dim",
                     "element_bytes"):
            positive_int(name, getattr(self, name))
        if isinstance(self.prefix, bool) or not isinstance(self.prefix, int) or self.prefix < 0:
            raise ValueError(f"prefix must be a non-negative integer, got {self.prefix!r}")
        if self.batch % self.group:
            raise ValueError(f"group must divide batch, got group={self.group} for "
                             f"batch={self.batch}")
        if self.prefix % self.page_size:
            raise ValueError(f"prefix must be a multiple of page_size ({self.page_size}): only "
                             f"whole pages are shared, got prefix={self.prefix}")
        if not self.prefix <= self.context:
            raise ValueError(f"context must hold the prefix, got prefix={self.prefix}, "
                             f"context={self.context}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads, got {self.kv_heads} and {self.heads}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def groups(self) -> int:
        return self.batch // self.group

    @property
    def prefix_pages(self) -> int:
        return self.prefix // self.page_size

    @property
    def pages_per_sequence(self) -> int:
        return -(-self.context // self.page_size)

    @property
    def num_pages(self) -> int:
        """Physical pages in the pool: each group's prefix once, each sequence's own rest."""
        return (self.groups * self.prefix_pages
                + self.batch * (self.pages_per_sequence - self.prefix_pages))

    @property
    def page_head_bytes(self) -> int:
        """Bytes of one page's K (or V) for one K/V head."""
        return self.page_size * self.head_dim * self.element_bytes

    def group_of(self) -> np.ndarray:
        """The group of each sequence (int64, batch)."""
        b = np.arange(self.batch)
        return b % self.groups if self.layout == "interleaved" else b // self.group

    def block_table(self) -> np.ndarray:
        """int32 (batch, pages_per_sequence): sequence b's pages in order, prefix pages of its
        group first (pages [g * prefix_pages, (g + 1) * prefix_pages)), then its own."""
        pp, n = self.prefix_pages, self.pages_per_sequence
        table = np.empty((self.batch, n), np.int32)
        table[:, :pp] = self.group_of()[:, None] * pp + np.arange(pp)
        own = n - pp
        first_own = self.groups * pp
        table[:, pp:] = first_own + np.arange(self.batch)[:, None] * own + np.arange(own)
        return table

    def cache_seqlens(self) -> np.ndarray:
        return np.full(self.batch, self.context, np.int32)

    def compulsory_kv_bytes(self) -> int:
        """K and V of every page some sequence reads, once, for every K/V head."""
        return 2 * self.num_pages * self.kv_heads * self.page_head_bytes

    def label(self) -> str:
        return (f"B{self.batch} G{self.group} P{self.prefix} C{self.context} "
                f"pg{self.page_size} {self.layout}")

    def as_dict(self) -> dict:
        from dataclasses import asdict
        return asdict(self)


def item_order(batch: SharedPrefixBatch, order: str, splits: int = 1) -> np.ndarray:
    """The work items in the order the kernel hands them out: int64 (items, 3) rows of
    (sequence, K/V head, split), read from the cache call's own work table
    (`decode_schedules.DecodeLaunch`, one query token: one Q tile), sharing keyed by each
    sequence's first page as the call keys it."""
    if order not in CTA_ORDERS:
        raise ValueError(f"cta_order must be one of {CTA_ORDERS}, got {order!r}")
    positive_int("splits", splits)
    problem = DecodeProblem(batch=batch.batch, heads=batch.heads, kv_heads=batch.kv_heads,
                            seqlen_q=1, capacity=batch.pages_per_sequence * batch.page_size,
                            head_dim=batch.head_dim, page_size=batch.page_size,
                            element_bytes=batch.element_bytes)
    sharing = tuple(int(x) for x in batch.block_table()[:, 0])
    table = DecodeLaunch(problem, splits, 1, order, sharing).work_table()
    return table[:, [DECODE_BATCH, DECODE_KV_HEAD, DECODE_SPLIT]].astype(np.int64)


def page_trace(batch: SharedPrefixBatch, order: str, ctas: int, splits: int = 1,
               stagger: int = 0, seed: int = 0) -> Trace:
    """The L2 access stream of the launch in lock-step rounds: round r, CTA by CTA, each
    CTA's r-th access of its own stream (its items in turn: the queries, then per page the
    K slice and the V slice of its K/V head). `stagger` > 0 starts each CTA a random number
    of rounds (uniform below `stagger`) late: CTAs that drift apart, so that sharers read a
    page rounds apart and hit only if the L2 keeps it that long."""
    positive_int("ctas", ctas)
    if isinstance(stagger, bool) or not isinstance(stagger, int) or stagger < 0:
        raise ValueError(f"stagger must be a non-negative integer, got {stagger!r}")
    items = item_order(batch, order, splits)
    table = batch.block_table().astype(np.int64)
    n_pages = batch.pages_per_sequence
    per_split = -(-n_pages // splits)
    kv_ids = batch.num_pages * batch.kv_heads * 2
    q_bytes = batch.heads // batch.kv_heads * batch.head_dim * batch.element_bytes
    addresses, sizes, kinds, slots, steps = [], [], [], [], []
    step_of_cta = (np.random.default_rng(seed).integers(0, stagger, ctas) if stagger
                   else np.zeros(ctas, np.int64))
    for i, (b, h, s) in enumerate(items):
        cta = i % ctas
        pages = table[b, s * per_split:min(n_pages, (s + 1) * per_split)]
        kv = ((pages * batch.kv_heads + h) * 2)[:, None] + np.arange(2)  # K then V
        address = np.concatenate([[kv_ids + b * batch.kv_heads + h], kv.ravel()])
        kind = np.concatenate([[KIND_Q], np.tile(np.arange(2), len(pages))])
        size = np.concatenate([[q_bytes], np.full(2 * len(pages), batch.page_head_bytes)])
        # a CTA issues its queries and then one page (K and V) per round
        step = np.concatenate([[0], np.repeat(np.arange(len(pages)), 2)]) + step_of_cta[cta]
        step_of_cta[cta] += max(1, len(pages))
        addresses.append(address)
        sizes.append(size)
        kinds.append(kind)
        slots.append(np.full(len(address), cta))
        steps.append(step)
    address, nbytes = np.concatenate(addresses), np.concatenate(sizes)
    kind, slot, step = np.concatenate(kinds), np.concatenate(slots), np.concatenate(steps)
    # round by round, CTAs in turn within a round, a CTA's accesses in its own order
    ranks = np.lexsort((np.arange(len(address)), slot, step))
    return Trace(address[ranks].astype(np.int64), nbytes[ranks].astype(np.int32),
                 kind[ranks].astype(np.int8), slot[ranks].astype(np.int32), ctas)


@dataclass(frozen=True)
class ReplayPrediction:
    order: str
    dram_read_bytes: int
    l2_read_bytes: int
    compulsory_bytes: int  # K/V pages read at all, once, plus the queries

    def as_dict(self) -> dict:
        return {"cta_order": self.order, "predicted_dram_read_bytes": self.dram_read_bytes,
                "l2_read_bytes": self.l2_read_bytes, "compulsory_bytes": self.compulsory_bytes}


def replay(batch: SharedPrefixBatch, order: str, *, ctas: int, l2_bytes: float,
           partitions: int = 2, sms: int | None = None, splits: int = 1,
           stagger: int = 0) -> ReplayPrediction:
    """DRAM read bytes of one decode launch, predicted by the LRU replay (`page_trace` into
    `simulation.LruL2`)."""
    trace = page_trace(batch, order, ctas, splits, stagger)
    n_ids = int(trace.address.max()) + 1
    result = LruL2(l2_bytes, n_ids, partitions=partitions,
                   sms=sms or ctas).feed(trace).result()
    q_total = batch.batch * batch.heads * batch.head_dim * batch.element_bytes
    return ReplayPrediction(order, result.dram_read_sectors * SECTOR_BYTES,
                            result.tex_read_sectors * SECTOR_BYTES,
                            batch.compulsory_kv_bytes() + q_total)
