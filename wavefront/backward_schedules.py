"""Schedules of the FlashAttention backward, in the forward's vocabulary.

The backward's main kernel is K/V-major (FlashAttention-2): one *work item* is one (batch,
K/V head, K/V tile); it keeps its K and V tile and its dK, dV accumulators on chip and scans
the Q tiles that see it, for every query head of its group (GQA), re-reading Q, dO, the LSE and
the row sums dO.O each time. So the roles of the forward swap: what CTAs in flight share is a
query head's Q and dO, and the order of the Q scan inside an item decides what the next item
finds in L2, as the K/V scan does in the forward.

The same names apply:
- CTA schedules (`wavefront.schedules.CTA_SCHEDULES`): `grid` and `persistent` take items in
  linear order (K/V tiles fastest, then K/V heads, then batch: the CTAs of a wave share one
  head group's Q and dO); `grouped` cuts the (batch, K/V head) units into groups whose Q and
  dO fit `l2_fraction` of the L2 and runs the units of a group fastest; `longest_first` hands
  out the K/V tiles with the most Q tiles first (causal: the first K/V tiles), units fastest.
  The dynamic schedules are not offered here (the backward kernel has no atomic counter).
- Q scans: `linear` (every item scans its Q tiles first to last) and `sawtooth` (a CTA's
  successive items alternate direction, heads of the group included, so wave w+1 starts on the
  Q tiles wave w just left in L2).

`BackwardLaunch.work_table()` writes it all down, one int32 row per item in the order items
are handed out (`BWD_*` columns): the kernel has no schedule code (static assignment: CTA c
takes rows c, c + P, ...). The deterministic dQ pass is Q-major, exactly the forward's work
(one item = (batch, head, Q tile) scanning K/V), so it runs the forward's `Launch` table.

Causal masks of either alignment (`AttentionProblem.causal_alignment`: top-left, or bottom-
right, FlashAttention >= 2.1's): each row carries its diagonal (`BWD_DIAGONAL`, from
`schedules.causal_diagonal`, per sequence in a packed batch), and the Q tiles a K/V tile visits
are the forward's K/V spans turned around (`q_tile_span`), so both passes visit the same pairs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator

import numpy as np

from wavefront.schedules import (
    CTA_GROUPED,
    CTA_LONGEST_FIRST,
    AttentionProblem,
    CtaSchedule,
    KvSchedule,
    Launch,
    VarlenLaunch,
    check_placement,
    cta_schedule,
    kv_schedule,
    kv_tile_span,
    local_iteration,
    scans_backward,
    sequence_diagonals,
)

# The backward work table's columns. An item's Q tiles are visited, for each query head
# HEAD_FIRST + HEAD_STEP x g of its group in turn: first the tiles that need a mask,
# [MASKED_LO, MASKED_HI) forward (the causal diagonal, or every tile of a ragged last K/V
# tile), then the unmasked ones as SCAN_START + SCAN_STEP x t for t < SCAN_COUNT.
(BWD_BATCH, BWD_KV_HEAD, BWD_KV_TILE, BWD_HEAD_FIRST, BWD_HEAD_STEP, BWD_SCAN_START,
 BWD_SCAN_STEP, BWD_SCAN_COUNT, BWD_MASKED_LO, BWD_MASKED_HI) = range(10)
# Packed variable-length batches: where the item's sequence starts in the packed Q and K/V
# rows, and its two lengths; BWD_BATCH then holds the sequence's number.
BWD_Q_START, BWD_KV_START, BWD_SEQLEN_Q, BWD_SEQLEN_KV = range(10, 14)
# The causal diagonal, as the forward's WORK_DIAGONAL: query row r of the item's sequence sees
# key columns c <= r + DIAGONAL (0, the padding's value, top-left; `causal_diagonal`).
BWD_DIAGONAL = 14
BWD_COLUMNS = 16  # padded to 64-byte rows, as the forward's table (a stride the AOT signature takes)

BACKWARD_SCANS = ("linear", "sawtooth")
BACKWARD_CTA_SCHEDULES = ("grid", "persistent", "grouped", "longest_first")
# Q tile x K/V tile of the backward kernels. Each K/V-major CTA keeps two float32
# accumulators of TILE_N x D (dK, dV) besides its K and V tile, so 64-row K/V tiles at D=128.
BACKWARD_TILE_SHAPES = ((64, 64), (64, 128), (128, 64), (128, 128))
# The first cut's tiles (one warpgroup per kernel), as data/backward_bench's first runs measured
FIRST_CUT_BACKWARD_TILES = {64: (128, 64), 128: (64, 64)}
# Packed batches at D=128 take 128-row Q tiles: tileiras 13.4 fails ("failed to compile Tile IR
# program", return code 5) on the deterministic binaries with 64x64 tiles there (sm_90).
DEFAULT_VARLEN_BACKWARD_TILES = {64: (128, 64), 128: (128, 64)}
DEFAULT_BACKWARD_SCHEDULE = "persistent+linear"


@dataclass(frozen=True)
class BackwardConfig:
    """How the backward's two tiled kernels are cut and built, for one head dim: the K/V-major
    kernel's (Q rows, K/V rows) tiles and the deterministic dQ kernel's (its own work table, so
    its tiles need not be the K/V-major kernel's), and each one's `num_worker_warps` hint (None:
    the compiler's choice; 8: two consumer warpgroups split the tile's rows, as
    FlashAttention-3's backward runs two MMA warpgroups). Every config computes the same
    gradients (the same arithmetic, cut otherwise)."""

    kv_tiles: tuple[int, int]
    dq_tiles: tuple[int, int]
    kv_worker_warps: int | None = None
    dq_worker_warps: int | None = None
    dq_masked_first: bool = False  # the dQ kernel's masked K/V tiles before the others
    q_latency: int = 0  # the K/V-major kernel's load latency hint on Q and dO (0: none)
    # the atomic mode's dQ accumulator tile-major, column-major tiles, so each warp's float
    # adds cover whole sectors (`wavefront.kernel.backward._add_dq_tile`); no effect on the
    # deterministic mode
    dq_coalesced: bool = False

    def __post_init__(self):
        for name in ("kv_tiles", "dq_tiles"):
            if tuple(getattr(self, name)) not in BACKWARD_TILE_SHAPES:
                raise ValueError(f"{name} must be one of {BACKWARD_TILE_SHAPES}, got "
                                 f"{getattr(self, name)!r}")
        for name in ("kv_worker_warps", "dq_worker_warps"):
            if getattr(self, name) not in (None, 8):
                raise ValueError(f"{name} must be None or 8, got {getattr(self, name)!r}")
        if isinstance(self.q_latency, bool) or self.q_latency not in range(11):
            raise ValueError(f"q_latency must be an integer in [0, 10], got {self.q_latency!r}")
        for name in ("dq_masked_first", "dq_coalesced"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")


# Named configs per head dim, measured against each other by `scripts/backward_bench.py
# --variants all`, chosen from what each compiled to (sm_90, tileiras 13.4, bfloat16, full mask;
# `--sass` prints every binary, causal within a few instructions; 2026-11-27). regs: per
# thread; spills: local loads/stores in the kernel; the steady (unmasked) MMA loop, one
# warpgroup's trip: instructions, HGMMAs, Ki multiply-accumulates, barriers, spills.
#   kernel D    tiles    ww regs smem KiB spills   loop instr HGMMA KiMAC bar spills
#   kv     64   128x64   -  255   85      0/0      658        24    2048  22  0/0    first cut
#   kv     64   64x128   8  168  137      0/0      401        16    1024  15  0/0
#   kv     64   128x128  8  168  117      2/2      712        24    2048  22  1/1
#   kv     128  64x64    -  255  100      0/0      405        24    2048  18  0/0    first cut
#   kv     128  64x128   8  168  163      0/0      478        24    2048  18  0/0
#   dq     64   128x64   -  255   83     64/104    739        24    1536  51  16/16  first cut
#   dq     64   128x64 mf-  255   83     62/107    608        24    1536  51  16/16
#   dq     64   64x128 mf-  255   67      0/0      432        16    1536  11  0/0
#   dq     64   128x128mf8  168   99     10/6      462        16    1536  11  4/0
#   dq     128  64x64    -  255  211     51/91     513        20    1536  11  51/51  first cut
#   dq     128  64x64  mf-  255  211     51/91     322        20    1536  11  0/0
#   dq     128  128x128mf8  168  131    160/224    639        24    3072  51  32/32
# (mf: masked K/V tiles first. One warpgroup over 128 K/V rows spills hundreds of values at
# either D; the dQ kernel with two warpgroups over 64-row Q tiles at D=128 takes 227.3 KiB of
# shared memory, over a CTA's 227: left out.) The atomic mode's K/V kernel: 168 regs at every
# cut; the first cut spills 2/2 (D64) and 79/68 (D128), FlashAttention-3's 64x128 cut none, with
# twice the K/V rows per dQ reduction (half the REDG traffic).
BACKWARD_CONFIGS = {
    "first_cut": {d: BackwardConfig(t, t) for d, t in FIRST_CUT_BACKWARD_TILES.items()},
    # the dQ kernel's masked K/V tiles first: its unmasked loop (nearly all the work) comes
    # second and keeps nothing in local memory at D=128 (`flash_attention_bwd_dq`)
    "dq_masked_first": {d: BackwardConfig(t, t, dq_masked_first=True)
                        for d, t in FIRST_CUT_BACKWARD_TILES.items()},
    # the K/V-major kernel alone changed, to FlashAttention-3's cut: 64-row Q tiles, 128 K/V
    # rows split between two consumer warpgroups (the dQ kernel as the first cut's)
    "kv_two_warpgroups": {64: BackwardConfig((64, 128), (128, 64), 8),
                          128: BackwardConfig((64, 128), (64, 64), 8)},
    # at D=64, two warpgroups over 128x128 (more tensor work per barrier: 24 HGMMAs a trip,
    # spills 2/2); at D=128 that cut spills hundreds, so FlashAttention-3's 64x128 there
    "kv_wide": {64: BackwardConfig((128, 128), (128, 64), 8),
                128: BackwardConfig((64, 128), (64, 64), 8)},
    # both kernels with two consumer warpgroups
    "two_warpgroups": {64: BackwardConfig((64, 128), (128, 128), 8, 8, True),
                       128: BackwardConfig((64, 128), (128, 128), 8, 8, True)},
    # cuTile's load latency hint on the K/V-major kernel's Q and dO (the first cut): it
    # moves the shared memory the compiler stages them in (D=128 64x64: 100 KiB without,
    # 132 KiB at 1, 67 KiB at 10), the loop's code barely
    "q_latency_low": {d: BackwardConfig(t, t, q_latency=1)
                      for d, t in FIRST_CUT_BACKWARD_TILES.items()},
    "q_latency_high": {d: BackwardConfig(t, t, q_latency=10)
                       for d, t in FIRST_CUT_BACKWARD_TILES.items()},
    # what the SASS favours, per kernel: no spill in the steady loop, then the most tensor
    # work per barrier. D=64: the first cut's K/V kernel (2 Mi MACs per 22 barriers a trip against
    # 1 Mi per 15 with two warpgroups; unsure, so kept) and the dQ kernel at 64x128 with the
    # masked tiles first (no spills, 11 barriers, against 16/16 spills and 51); D=128: two
    # warpgroups over 64x128 for K/V (168 registers, no spills, each Q/dO tile serving 128
    # K/V rows) and the masked-first 64x64 dQ kernel (no spills in its steady loop).
    "sass_pick": {64: BackwardConfig((128, 64), (64, 128), None, None, True),
                  128: BackwardConfig((64, 128), (64, 64), 8, None, True)},
}
# The default: per head dim, the fastest config of the H200 bench (data/backward_bench,
# variants_c30b860: first_cut, two_warpgroups, sass_pick over B1 H32 S8k and B4 H32 KV8 S4k, both
# masks, 6 interleaved rounds): at D=64 two_warpgroups (0.70-0.76x cuDNN, against sass_pick's
# 0.53-0.59x and the first cut's 0.44-0.54x), at D=128 sass_pick (0.62-0.65x, against
# two_warpgroups' 0.57-0.58x and the first cut's 0.40-0.42x).
BACKWARD_CONFIGS["measured_pick"] = {64: BACKWARD_CONFIGS["two_warpgroups"][64],
                                     128: BACKWARD_CONFIGS["sass_pick"][128]}
# The default's cut with the atomic mode's dQ accumulator coalesced (`dq_coalesced`): sm_90,
# tileiras 13.4, bfloat16, both masks: 168 registers, no spills, shared memory as the row-major
# accumulate's (D64 151,992 B, D128 199,904 B); each warp's float add covers 4 whole sectors
# instead of 16 half-used ones (D128; ~8.6 at D64); the steady loop 818 instructions against
# 927 (D128), 577 against 618 (D64). Its deterministic mode is the default's.
BACKWARD_CONFIGS["atomic_coalesced"] = {
    d: dataclasses.replace(c, dq_coalesced=True)
    for d, c in BACKWARD_CONFIGS["measured_pick"].items()}
# The default: measured_pick's binaries for the deterministic mode, the coalesced accumulate
# for the atomic one (`deterministic=False`): on an H200 the coalesced atomic mode ran
# 0.69-0.79x cuDNN over the 12 bench configurations against the row-major one's 0.38-0.53x
# (data/backward_bench/variants_f9eaca9.log.gz, 6 interleaved rounds).
DEFAULT_BACKWARD_CONFIG = "atomic_coalesced"
# The K/V-major kernel's tiles of the default config (what the model and the experiments cut
# the default backward at)
DEFAULT_BACKWARD_TILES = {d: c.kv_tiles
                          for d, c in BACKWARD_CONFIGS[DEFAULT_BACKWARD_CONFIG].items()}


def backward_config(config, head_dim: int) -> BackwardConfig:
    """A config's name (of BACKWARD_CONFIGS), a BackwardConfig, or None (the default) -> the
    BackwardConfig for `head_dim`."""
    if config is None:
        config = DEFAULT_BACKWARD_CONFIG
    if isinstance(config, BackwardConfig):
        return config
    if not isinstance(config, str) or config not in BACKWARD_CONFIGS:
        raise ValueError(f"config must be a BackwardConfig or one of {list(BACKWARD_CONFIGS)}, "
                         f"got {config!r}")
    by_dim = BACKWARD_CONFIGS[config]
    if head_dim not in by_dim:
        raise ValueError(f"config {config!r} has no entry for head_dim {head_dim}; it has "
                         f"{sorted(by_dim)}")
    return by_dim[head_dim]


def _least_q_tile(holds, q_tiles):
    """Elementwise: the least Q tile i in [0, q_tiles) for which `holds(i)` (false, then true
    as i grows), else q_tiles; by bisection over NumPy arrays."""
    lo, hi = np.zeros_like(q_tiles), q_tiles
    while True:
        open_ = lo < hi
        if not open_.any():
            return lo
        mid = (lo + hi) // 2
        found = holds(mid)
        lo, hi = np.where(open_ & ~found, mid + 1, lo), np.where(open_ & found, mid, hi)


def q_tile_span(kv_tile, tile_m, tile_n, seqlen_q, seqlen_kv, causal, diagonal=0):
    """-> (first Q tile, first Q tile that needs no mask, Q tiles): the Q tiles that see K/V
    tile `kv_tile`, [first, end), of which [first, unmasked) need a mask.

    The forward's rule turned around, not a second copy of it: Q tile i visits K/V tile j iff
    j < visited(i), unmasked iff j < first_masked(i) (`schedules.kv_tile_span`, with the
    causal mask's `diagonal`: 0 top-left, seqlen_kv - seqlen_q bottom-right, from
    `schedules.causal_diagonal`). Both grow with i, so each bound is the least Q tile that
    meets it, and the K/V-major and the Q-major (dQ) passes visit the same pairs, masked
    alike. A K/V tile no query row sees (top-left, keys from seqlen_q on) has first == Q
    tiles, and a Q tile none of whose rows sees the K/V tile's keys (bottom-right with
    seqlen_q > seqlen_kv: the first rows see no key) is not visited; a ragged last K/V tile
    takes the mask on every Q tile. Ints, or NumPy arrays of K/V tiles (and of
    lengths and diagonals, one per tile: packed batches)."""
    scalar = all(np.ndim(x) == 0 for x in (kv_tile, seqlen_q, seqlen_kv, diagonal))
    q_tiles = -(-seqlen_q // tile_m)  # (returned as given: one count for one length)
    kv_tile, seqlen_q, seqlen_kv, diagonal = np.broadcast_arrays(
        *(np.asarray(x, dtype=np.int64) for x in (kv_tile, seqlen_q, seqlen_kv, diagonal)))

    def spans(q_tile):
        return kv_tile_span(q_tile, tile_m, tile_n, seqlen_q, seqlen_kv, causal, diagonal)
    each = np.broadcast_to(q_tiles, kv_tile.shape)
    first = _least_q_tile(lambda i: kv_tile < spans(i)[0], each)
    unmasked = np.maximum(_least_q_tile(lambda i: kv_tile < spans(i)[1], each), first)
    if scalar:
        return int(first), int(unmasked), int(q_tiles)
    return first, unmasked, q_tiles


def backward_group_units(problem: AttentionProblem, l2_fraction: float, l2_bytes: int) -> int:
    """Units of a `grouped` backward group: the largest power of two of (batch, K/V head)
    units whose query heads' Q, dO and float32 dQ accumulator (the atomic mode's) fit
    `l2_fraction` of the L2 (at least 1, at most all)."""
    p = problem
    unit_bytes = p.qheads_per_kv * p.seqlen_q * p.head_dim * (2 * p.element_bytes + 4)
    units = 1
    while units * 2 <= p.kv_units and units * 2 * unit_bytes <= l2_fraction * l2_bytes:
        units *= 2
    return units


def backward_order(item, kv_tiles, kv_units, group_units, cta_code):
    """Item number -> ((batch x kv_heads + kv_head) unit, K/V tile) in the CTA schedule's order.
    Ints or NumPy arrays."""
    if cta_code == CTA_GROUPED:
        per_group = group_units * kv_tiles
        group, within = np.divmod(item, per_group)
        units_here = np.minimum(group_units, kv_units - group * group_units)
        kv_tile, unit_in_group = np.divmod(within, units_here)
        return group * group_units + unit_in_group, kv_tile
    if cta_code == CTA_LONGEST_FIRST:
        # Causal (either alignment): the first K/V tiles are seen by the most Q tiles.
        kv_tile, unit = np.divmod(item, kv_units)
        return unit, kv_tile
    unit, kv_tile = np.divmod(item, kv_tiles)
    return unit, kv_tile


def backward_schedule(schedule: str) -> tuple[CtaSchedule, KvSchedule]:
    """'<cta>+<scan>' -> (CTA schedule, Q scan), each from the forward's registries."""
    if not isinstance(schedule, str) or schedule.count("+") != 1:
        raise ValueError(f"schedule must be '<cta>+<scan>' with cta one of "
                         f"{list(BACKWARD_CTA_SCHEDULES)} and scan one of "
                         f"{list(BACKWARD_SCANS)}, got {schedule!r}")
    cta, scan = schedule.split("+")
    return cta_schedule(cta), kv_schedule(scan)


@dataclass(frozen=True)
class BackwardLaunch:
    """A problem, a CTA schedule and a Q scan placed on a GPU: what the backward's K/V-major
    kernel does. `q_scan` is a K/V schedule of the forward's registry by name (`linear` or
    `sawtooth`), here ordering the Q tiles an item visits."""

    problem: AttentionProblem
    cta: CtaSchedule
    q_scan: KvSchedule
    sms: int
    ctas_per_sm: int
    l2_bytes: int
    ctas: int | None = None

    def __post_init__(self):
        check_placement(self)
        if self.cta.name not in BACKWARD_CTA_SCHEDULES:
            raise ValueError(f"the backward's CTA schedule must be one of "
                             f"{list(BACKWARD_CTA_SCHEDULES)}, got {self.cta.name!r}")
        if self.q_scan.name not in BACKWARD_SCANS:
            raise ValueError(f"the backward's Q scan must be one of {list(BACKWARD_SCANS)}, "
                             f"got {self.q_scan.name!r}")

    @classmethod
    def of(cls, problem: AttentionProblem, schedule: str, sms: int, ctas_per_sm: int,
           l2_bytes: int, ctas: int | None = None) -> "BackwardLaunch":
        """From a '<cta>+<scan>' name, e.g. 'persistent+sawtooth'."""
        cta, scan = backward_schedule(schedule)
        return cls(problem, cta, scan, sms, ctas_per_sm, l2_bytes, ctas)

    @property
    def name(self) -> str:
        return f"{self.cta.name}+{self.q_scan.name}"

    @cached_property
    def resident_ctas(self) -> int:
        return self.ctas if self.ctas is not None else self.sms * self.ctas_per_sm

    @cached_property
    def num_items(self) -> int:
        return self.problem.kv_units * self.problem.kv_tiles

    @cached_property
    def num_ctas(self) -> int:
        return self.cta.num_ctas(self.num_items, self.resident_ctas)

    @cached_property
    def group_units(self) -> int:
        if self.cta.code != CTA_GROUPED:
            return 1
        return backward_group_units(self.problem, self.cta.l2_fraction, self.l2_bytes)

    def items_of_cta(self, cta: int) -> range:
        if not self.cta.persistent:
            return range(cta, cta + 1)
        return range(cta, self.num_items, self.num_ctas)

    def _columns(self, items: np.ndarray) -> tuple:
        p = self.problem
        unit, kv_tile = backward_order(items, p.kv_tiles, p.kv_units, self.group_units,
                                       self.cta.code)
        batch, kv_head = np.divmod(unit, p.kv_heads)
        first, unmasked, q_tiles = q_tile_span(kv_tile, p.tile_m, p.tile_n, p.seqlen_q,
                                               p.seqlen_kv, p.causal, p.diagonal)
        backward = scans_backward(local_iteration(items, self.num_ctas, self.resident_ctas,
                                                  self.cta.code), self.q_scan.code)
        group = p.qheads_per_kv
        head_first = kv_head * group + backward * (group - 1)
        head_step = 1 - 2 * backward
        scan_start = np.where(backward, q_tiles - 1, unmasked)
        return {BWD_BATCH: batch, BWD_KV_HEAD: kv_head, BWD_KV_TILE: kv_tile,
                BWD_HEAD_FIRST: head_first, BWD_HEAD_STEP: head_step,
                BWD_SCAN_START: scan_start, BWD_SCAN_STEP: head_step,
                BWD_SCAN_COUNT: q_tiles - unmasked, BWD_MASKED_LO: first,
                BWD_MASKED_HI: unmasked, BWD_DIAGONAL: p.diagonal}

    @cached_property
    def work_table(self) -> np.ndarray:
        """The K/V-major kernel's input: one int32 row (`BWD_*` columns) per item, in the order
        items are handed out. A simulator replays it as: CTA c takes rows c, c + P, ...; an
        item reads its K and V tile once, then for each query head of the row and each Q tile
        in visiting order (`q_order`) reads the Q and dO tiles and their LSE and row-sum
        rows, and (atomic mode) adds into the float32 dQ tile; it writes dK and dV once."""
        if self.num_items >= 1 << 31:
            raise ValueError(f"a backward launch of {self.num_items} work items does not fit "
                             "the int32 work table")
        items = np.arange(self.num_items, dtype=np.int64)
        rows = np.zeros((self.num_items, BWD_COLUMNS), dtype=np.int32)
        for column, values in self._columns(items).items():
            rows[:, column] = values
        rows.setflags(write=False)
        return rows

    def q_order(self, item: int) -> tuple[tuple[int, int], ...]:
        """Item `item`'s (query head, Q tile) visits in order, as the kernel makes them."""
        row = self.work_table[item]
        tiles = (tuple(range(row[BWD_MASKED_LO], row[BWD_MASKED_HI]))
                 + tuple(row[BWD_SCAN_START] + row[BWD_SCAN_STEP] * t
                         for t in range(row[BWD_SCAN_COUNT])))
        heads = [row[BWD_HEAD_FIRST] + row[BWD_HEAD_STEP] * g
                 for g in range(self.problem.qheads_per_kv)]
        return tuple((int(h), int(i)) for h in heads for i in tiles)

    def work_of_cta(self, cta: int) -> Iterator[tuple[int, int, int, int]]:
        """(item, batch, kv_head, kv_tile) of the items CTA `cta` takes, in order."""
        for item in self.items_of_cta(cta):
            row = self.work_table[item]
            yield item, int(row[BWD_BATCH]), int(row[BWD_KV_HEAD]), int(row[BWD_KV_TILE])

    @cached_property
    def dq_launch(self) -> Launch:
        """The deterministic dQ pass: Q-major, the forward's work (and its table), under the
        same CTA schedule, with the scan over K/V tiles in the same direction rule."""
        return Launch(self.problem, self.cta, self.q_scan, self.sms, self.ctas_per_sm,
                      self.l2_bytes, self.ctas)


@dataclass(frozen=True)
class VarlenBackwardLaunch(BackwardLaunch):
    """The backward of a packed batch (FlashAttention's varlen layout; `problem` is the packed
    arrays as the kernel sees them: batch 1, seqlen = total rows). One item per (sequence, K/V
    head, K/V tile of the sequence), each row carrying its sequence's starts and lengths
    (`BWD_Q_START` ...), so the kernel slices the sequence out of the packed arrays, and its
    causal diagonal (bottom-right aligns each sequence by its own lengths). Orders:
    grid and persistent sequence by sequence (K/V tiles fastest, then K/V heads);
    longest_first by the Q tiles an item scans, most first (stable). `grouped` does not apply
    (a packed batch's units are ragged)."""

    seqlens_q: tuple[int, ...] = ()
    seqlens_kv: tuple[int, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        if self.cta.code == CTA_GROUPED:
            raise ValueError("the grouped CTA schedule does not apply to packed batches' "
                             "backward; use grid, persistent or longest_first")
        self.dq_launch  # the forward's packed launch checks the lengths, each error named

    @cached_property
    def _units(self):
        """(sequence, kv_head, kv_tile) of every item in sequence-major order."""
        p = self.problem
        sk = np.asarray(self.seqlens_kv, dtype=np.int64)
        tiles = -(-sk // p.tile_n)
        per_seq = tiles * p.kv_heads
        seq = np.repeat(np.arange(len(sk)), per_seq)
        within = np.arange(seq.size) - np.repeat(np.cumsum(per_seq) - per_seq, per_seq)
        kv_head, kv_tile = np.divmod(within, tiles[seq])
        return seq, kv_head, kv_tile

    @cached_property
    def num_items(self) -> int:
        return int(self._units[0].size)

    @cached_property
    def work_table(self) -> np.ndarray:
        p = self.problem
        seq, kv_head, kv_tile = self._units
        sq = np.asarray(self.seqlens_q, dtype=np.int64)[seq]
        sk = np.asarray(self.seqlens_kv, dtype=np.int64)[seq]
        diagonal = sequence_diagonals(p, sq, sk)
        first, unmasked, q_tiles = (np.asarray(x) for x in q_tile_span(
            kv_tile, p.tile_m, p.tile_n, sq, sk, p.causal, diagonal))
        if self.cta.code == CTA_LONGEST_FIRST:
            order = np.argsort(-(q_tiles - first), kind="stable")
            seq, kv_head, kv_tile, sq, sk, first, unmasked, q_tiles, diagonal = (
                x[order] for x in (seq, kv_head, kv_tile, sq, sk, first, unmasked, q_tiles,
                                   diagonal))
        items = np.arange(seq.size, dtype=np.int64)
        backward = scans_backward(local_iteration(items, self.num_ctas, self.resident_ctas,
                                                  self.cta.code), self.q_scan.code)
        group = p.qheads_per_kv
        step = 1 - 2 * backward
        starts_q = np.cumsum(self.seqlens_q) - self.seqlens_q
        starts_kv = np.cumsum(self.seqlens_kv) - self.seqlens_kv
        rows = np.zeros((seq.size, BWD_COLUMNS), dtype=np.int32)
        for column, values in ((BWD_BATCH, seq), (BWD_KV_HEAD, kv_head),
                               (BWD_KV_TILE, kv_tile),
                               (BWD_HEAD_FIRST, kv_head * group + backward * (group - 1)),
                               (BWD_HEAD_STEP, step), (BWD_SCAN_STEP, step),
                               (BWD_SCAN_START, np.where(backward, q_tiles - 1, unmasked)),
                               (BWD_SCAN_COUNT, q_tiles - unmasked), (BWD_MASKED_LO, first),
                               (BWD_MASKED_HI, unmasked),
                               (BWD_Q_START, np.asarray(starts_q)[seq]),
                               (BWD_KV_START, np.asarray(starts_kv)[seq]),
                               (BWD_SEQLEN_Q, sq), (BWD_SEQLEN_KV, sk),
                               (BWD_DIAGONAL, diagonal)):
            rows[:, column] = values
        rows.setflags(write=False)
        return rows

    @cached_property
    def dq_launch(self) -> VarlenLaunch:
        return VarlenLaunch(self.problem, self.seqlens_q, self.seqlens_kv, self.cta,
                            self.q_scan, self.sms, self.ctas_per_sm, self.l2_bytes, self.ctas)

