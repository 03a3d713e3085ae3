"""One measured point: the parameters of an attention launch, and how they become a `Launch`.

`Point` is the one type for a configuration. A sweep expands a spec into Points, the worker
measures a Point, a results row is `Point.to_record(gpu)` plus its measurement, the model
rebuilds the launch with `Point.from_record(row).launch(gpu)`. Each parameter field declares
itself (`Param`: check, help, results columns); the results columns (`PARAMETER_COLUMNS`), the
point key, sweep grid keys and CLI options derive from those declarations. The kernel levers
are declared once each in `LEVERS`.

The parameter space (dtypes, head dims, tile shapes, their default occupancy) lives here too:
the kernel compiles it, the model and the CLI validate against it without importing cuTile.
"""
from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Callable

from wavefront.schedules import (
    AttentionProblem,
    DeviceVarlenLaunch,
    Launch,
    TiledScan,
    VarlenLaunch,
    cta_schedule,
    kv_schedule,
)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2}
DTYPES = tuple(DTYPE_BYTES)
HEAD_DIMS = (64, 128)
TILE_SHAPES = ((64, 64), (128, 64), (128, 128), (128, 256))
DEFAULT_TILES = {64: (128, 64), 128: (128, 64)}
# CTAs per SM asked of the compiler: two 128x64 CTAs fit an SM's registers, one 128x128 or
# 128x256 (whose K and V tiles take 128 KB of shared memory at D=128).
DEFAULT_OCCUPANCY = {(64, 64): 2, (128, 64): 2, (128, 128): 1, (128, 256): 1}
# Every L2 counter and every model count is in sectors of this size (Hopper and Blackwell).
SECTOR_BYTES = 32


@dataclass(frozen=True)
class GpuShape:
    """What a launch needs to know of a GPU. A model preset (`GPUSpec`) and a measured device
    (`DeviceInfo`) have the same two fields and can be passed wherever this is expected."""

    sms: int
    l2_bytes: int

    @classmethod
    def of(cls, record) -> "GpuShape":
        """The GPU a results row or a sweep task was measured on."""
        return cls(int(record["sms"]), int(record["l2_bytes"]))


def parse_schedule(schedule) -> tuple[str, str]:
    """'persistent+sawtooth' -> ('persistent', 'sawtooth'); a bare CTA name scans linearly."""
    if not isinstance(schedule, str) or not schedule:
        raise ValueError(f"schedule must be a string like 'persistent+sawtooth', got {schedule!r}")
    cta, plus, kv = schedule.partition("+")
    if plus and not kv:  # "persistent+": a scan was meant and not named
        raise ValueError(f"schedule {schedule!r} names no K/V scan after '+': write "
                         f"'{cta}+linear' (or '{cta}' alone, which scans linearly)")
    cta_schedule(cta)
    kv_schedule(kv or "linear")
    return cta, kv or "linear"


def parse_tiles(tiles) -> tuple[int, int]:
    """'128x64' or (128, 64) -> (128, 64), one of TILE_SHAPES."""
    if isinstance(tiles, str):
        try:
            m, n = (int(x) for x in tiles.lower().split("x"))
        except ValueError:
            raise ValueError(f"tiles must look like '128x64', got {tiles!r}") from None
        tiles = (m, n)
    try:
        tiles = tuple(tiles)
    except TypeError:
        raise ValueError(f"tiles must look like '128x64', got {tiles!r}") from None
    if tiles not in TILE_SHAPES:
        raise ValueError(f"tiles must be one of {['%dx%d' % t for t in TILE_SHAPES]}, "
                         f"got {tiles!r}")
    return tiles


def _shape(name: str, shape, layout: str, rank: int = 4) -> tuple:
    """A shape of `rank` entries (what each means: `layout`), else an error naming it."""
    try:
        shape = tuple(shape)
    except TypeError:
        shape = None
    if shape is None or len(shape) != rank:
        raise ValueError(f"{name} must be {rank} sizes {layout}, got {shape!r}")
    return shape


def _launch_choices(head_dim, causal, schedule, tiles, occupancy):
    """-> (tile_m, tile_n, occupancy, cta name, kv name): the caller's choices checked, the
    defaults where the caller chose nothing."""
    tile_m, tile_n = (parse_tiles(tiles) if tiles is not None
                      else DEFAULT_TILES.get(head_dim, (128, 64)))
    if occupancy is None:
        occupancy = DEFAULT_OCCUPANCY[(tile_m, tile_n)]
    if isinstance(occupancy, bool) or not isinstance(occupancy, int) or not 1 <= occupancy <= 32:
        raise ValueError(f"occupancy must be an integer in [1, 32], got {occupancy!r}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    return (tile_m, tile_n, occupancy, *parse_schedule(schedule))


def _check_ctas(ctas) -> None:
    """The CTA cap within a grid's x dimension (10**12 passed and sized the work table by
    it); its other checks are the launch's."""
    if isinstance(ctas, int) and not isinstance(ctas, bool) and ctas > MAX_CTAS:
        raise ValueError(f"ctas must be a positive integer up to {MAX_CTAS} (a grid's x "
                         f"dimension), got {ctas!r}")


def plan(q_shape, k_shape, *, sms: int, l2_bytes: int, causal=False,
         schedule="persistent+linear", tiles=None, occupancy=None, element_bytes=2,
         ctas=None, chunk_tiles=None, causal_alignment="top_left") -> Launch:
    """The `Launch` the kernel runs for these shapes on a GPU of `sms` SMs and `l2_bytes` of
    L2 (no GPU needed: the model calls this with a preset). `causal_alignment`: "top_left"
    or "bottom_right" (`schedules.causal_diagonal`)."""
    b, h, sq, d = _shape("q_shape", q_shape, "(batch, heads, seqlen, head_dim)")
    bk, hkv, skv, dk = _shape("k_shape", k_shape, "(batch, kv_heads, seqlen, head_dim)")
    if (bk, dk) != (b, d):
        raise ValueError(f"k_shape must have q's batch ({b}) and head_dim ({d}), got "
                         f"{tuple(k_shape)}")
    tile_m, tile_n, occupancy, cta, kv = _launch_choices(d, causal, schedule, tiles, occupancy)
    _check_ctas(ctas)
    problem = AttentionProblem(b, h, hkv, sq, skv, d, causal, tile_m, tile_n, element_bytes,
                               causal_alignment)
    kv_sched = kv_schedule(kv)
    if chunk_tiles is not None:
        if not isinstance(kv_sched, TiledScan):
            raise ValueError(f"chunk_tiles applies to the tiled schedule only, got schedule "
                             f"{schedule!r}")
        kv_sched = replace(kv_sched, tiles_per_chunk=chunk_tiles)
    return Launch(problem, cta_schedule(cta), kv_sched, sms, occupancy, l2_bytes, ctas)


def seqlens_of(name: str, cu_seqlens, total_rows: int) -> tuple[int, ...]:
    """Sequence lengths from FlashAttention's cumulative form [0, s0, s0 + s1, ...], checked:
    integers, starting at 0, never decreasing, ending at the packed rows; an error names the
    argument and the first bad index."""
    try:
        bounds = [int(x) for x in cu_seqlens]
        if any(b != x for b, x in zip(bounds, cu_seqlens)):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of integers (host list, NumPy or CPU "
                         f"tensor), got {cu_seqlens!r}") from None
    if any(isinstance(x, bool) for x in cu_seqlens):
        raise ValueError(f"{name} must hold integers, not booleans, got {cu_seqlens!r}")
    if len(bounds) < 2:
        raise ValueError(f"{name} must hold at least two entries (batch + 1), got {bounds}")
    if bounds[0] != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0] = {bounds[0]}")
    lengths = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    for i, length in enumerate(lengths):
        if length < 0:
            raise ValueError(f"{name} must not decrease, got {name}[{i + 1}] = {bounds[i + 1]} "
                             f"after {name}[{i}] = {bounds[i]}")
        if bounds[i + 1] > total_rows:
            raise ValueError(f"{name} must stay within the packed rows ({total_rows}), got "
                             f"{name}[{i + 1}] = {bounds[i + 1]}")
    if bounds[-1] != total_rows:
        raise ValueError(f"{name} must end at the packed rows ({total_rows}), got "
                         f"{name}[{len(bounds) - 1}] = {bounds[-1]}")
    return lengths


def check_max_seqlen(name: str, max_seqlen, lengths) -> None:
    """`max_seqlen` (None: not given) must be an integer at least every one of `lengths`."""
    if max_seqlen is None:
        return
    try:
        if isinstance(max_seqlen, bool):
            raise TypeError
        max_seqlen = operator.index(max_seqlen)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {max_seqlen!r}") from None
    longest = max(lengths, default=0)
    if max_seqlen < longest:
        raise ValueError(f"{name} must be at least the longest sequence ({longest}, sequence "
                         f"{list(lengths).index(longest)}), got {max_seqlen}")


def plan_varlen(q_shape, k_shape, cu_seqlens_q, cu_seqlens_k, *, sms: int, l2_bytes: int,
                causal=False, schedule="persistent+linear", tiles=None, occupancy=None,
                element_bytes=2, ctas=None, causal_alignment="top_left", max_seqlen_q=None,
                max_seqlen_k=None) -> VarlenLaunch:
    """The `VarlenLaunch` for packed q (total_q, heads, D) and k (total_k, kv_heads, D),
    the lengths checked (`seqlens_of`, `check_max_seqlen`)."""
    problem, cta, kv, occupancy = _packed_problem(q_shape, k_shape, causal, schedule, tiles,
                                                  occupancy, element_bytes, causal_alignment)
    _check_ctas(ctas)
    seqlens_q = seqlens_of("cu_seqlens_q", cu_seqlens_q, problem.seqlen_q)
    seqlens_k = seqlens_of("cu_seqlens_k", cu_seqlens_k, problem.seqlen_kv)
    check_max_seqlen("max_seqlen_q", max_seqlen_q, seqlens_q)
    check_max_seqlen("max_seqlen_k", max_seqlen_k, seqlens_k)
    return VarlenLaunch(problem, seqlens_q, seqlens_k, cta, kv, sms, occupancy, l2_bytes, ctas)


def _packed_problem(q_shape, k_shape, causal, schedule, tiles, occupancy, element_bytes,
                    causal_alignment="top_left"):
    """-> (the problem of packed q (total_q, heads, D) and k (total_k, kv_heads, D) as the
    kernel sees it, batch 1; its CTA and K/V schedules; CTAs per SM), checked."""
    total_q, h, d = _shape("q_shape", q_shape, "(total_q, heads, head_dim)", 3)
    total_k, hkv, dk = _shape("k_shape", k_shape, "(total_k, kv_heads, head_dim)", 3)
    if dk != d:
        raise ValueError(f"k_shape must have q's head_dim ({d}), got {tuple(k_shape)}")
    tile_m, tile_n, occupancy, cta, kv = _launch_choices(d, causal, schedule, tiles, occupancy)
    problem = AttentionProblem(1, h, hkv, total_q, total_k, d, causal, tile_m, tile_n,
                               element_bytes, causal_alignment)
    return problem, cta_schedule(cta), kv_schedule(kv), occupancy


def plan_varlen_on_device(q_shape, k_shape, batch: int, *, sms: int, l2_bytes: int,
                          causal=False, schedule="persistent+linear", tiles=None,
                          occupancy=None, element_bytes=2, ctas=None,
                          causal_alignment="top_left") -> DeviceVarlenLaunch:
    """The `DeviceVarlenLaunch` for packed q (total_q, heads, D) and k (total_k, kv_heads, D)
    of `batch` sequences whose lengths stay on the GPU."""
    problem, cta, kv, occupancy = _packed_problem(q_shape, k_shape, causal, schedule, tiles,
                                                  occupancy, element_bytes, causal_alignment)
    _check_ctas(ctas)
    return DeviceVarlenLaunch(problem, batch, cta, kv, sms, occupancy, l2_bytes, ctas)


@dataclass(frozen=True)
class Lever:
    """A kernel lever, declared once: the Point field and its check, the CLI option, what
    `wavefront tune` searches, the tuned table's field and the kernel variant's field all follow
    from this; the kernel reads the variant's field (`kernel.attention.KernelVariant`)."""

    name: str
    default: int | None
    values: tuple  # every value the kernel compiles; anything else is refused
    expected: str  # `values` in words, for messages
    help: str
    searched: tuple  # what `wavefront tune` tries
    label: str  # its mark in a binary's name where not at its default (`_ww8`)
    stage: str = "levers"  # tune: "levers" (searched together), "softmax" (around the winner)

    def check(self, value) -> None:
        if isinstance(value, bool) or value not in self.values:
            raise ValueError(f"{self.name} must be {self.expected}, got {value!r}")


LEVERS = (
    Lever("worker_warps", None, (None, 4, 8), "None, 4 or 8",
          "Consumer warps per CTA (8: two consumer warpgroups, FlashAttention-3's layout); "
          "default: the compiler's choice.", searched=(None, 8), label="ww"),
    Lever("cluster", 1, (1, 2), "1 or 2", "CTAs per cluster.", searched=(1, 2), label="cluster"),
    Lever("kv_latency", 0, tuple(range(11)), "an integer in [0, 10] (0: default)",
          "The K/V loads' latency hint (0: the kernel's defaults).", searched=(0, 8),
          label="lat"),
    # FlashAttention-4's softmax levers: FA4 rescales when a maximum grew by more than 2^8;
    # the polynomial takes a quarter or half of the columns.
    Lever("rescale_threshold", 0, tuple(range(17)),
          "an integer in [0, 16] (log2 units; 0: always rescale)",
          "FlashAttention-4's conditional rescale: only when a row maximum grew by more than "
          "2^this (0: every tile).", searched=(0, 8), label="resc", stage="softmax"),
    Lever("exp2_poly", 0, tuple(range(5)),
          "an integer in [0, 4] (quarters of the columns exponentiated on the FMA units)",
          "Quarters of the score columns exponentiated by a polynomial on the FMA units "
          "(FlashAttention-4; 0: none).", searched=(0, 1, 2), label="poly", stage="softmax"),
    # Searched with the pipeline levers, not around their winner: it needs a second score
    # tile of registers, so it pays at one CTA per SM where it loses at two (H100, D=128).
    Lever("qk_ahead", 0, (0, 1), "0 or 1",
          "Issue the next K/V tile's QK^T before this tile's softmax (FlashAttention-3's "
          "intra-warpgroup overlap; 0: off).", searched=(0, 1), label="ahead"),
)
LEVER_BY_NAME = {lever.name: lever for lever in LEVERS}
# `lever_values` of no levers: what a call that names none passes (building it costs a call
# microseconds, a tenth of a short launch's host time)
NO_LEVER_VALUES = (None,) * len(LEVERS)
# The levers' defaults by name, in declaration order (the public call's positional order).
KERNEL_LEVERS = {lever.name: lever.default for lever in LEVERS}
# whose counter the RECORD_ORDER binary's tickets come from (`kernel.attention._take_ticket`):
# one shared by the launch, or one per CTA
ORDER_COUNTERS = ("shared", "per_cta")


def lever_values(levers: dict) -> tuple:
    """The values of `levers` (by name) in declaration order, None where not named; a name
    that is no lever is a TypeError, as an unknown keyword is."""
    unknown = set(levers) - set(LEVER_BY_NAME)
    if unknown:
        raise TypeError(f"unknown kernel levers {sorted(unknown)}; known: {list(LEVER_BY_NAME)}")
    return tuple(levers.get(name) for name in LEVER_BY_NAME)


def check_levers(**values) -> None:
    """Each lever named is known and within its values; a clear error otherwise."""
    lever_values(values)
    for name, value in values.items():
        LEVER_BY_NAME[name].check(value)


def with_lever_fields(cls):
    """A class decorator, under @dataclass: one field per lever, at its default, after the
    class's own fields (Point, the kernel variant)."""
    annotations = cls.__dict__.get("__annotations__", {})
    cls.__annotations__ = annotations
    for lever in LEVERS:
        annotations[lever.name] = "int | None"
        setattr(cls, lever.name, lever.default)
    return cls


# The longest sequence a point may name, 2^24 rows, a sweep grid's limit too: one head's K and
# V at D=128 already take 8 GB there.
MAX_POINT_SEQLEN = 1 << 24
# Batch and heads, and the CTA and chunk caps: a launch's work items must fit the kernel's int32
# work table, and a grid's CTAs CUDA's grid limit.
MAX_BATCH_HEADS = 1 << 16
MAX_CTAS = (1 << 31) - 1
MAX_CHUNK_TILES = 1 << 24


def _int_in(low: int, high: int) -> Callable[[object], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _parses(parse) -> Callable[[object], bool]:
    def valid(v) -> bool:
        try:
            parse(v)
            return True
        except (ValueError, TypeError):
            return False
    return valid


@dataclass(frozen=True)
class Param:
    """A Point parameter, declared once with its field: what a valid value is (the Point, a
    sweep grid and the CLI check with it), what it means, and the results columns it becomes on
    a GPU. A new parameter is one field with one of these."""

    help: str
    expected: str  # a valid value, in words
    valid: Callable[[object], bool]
    # Results columns, resolved on a GPU (tiles -> tile_m, tile_n); a column named as the field
    # records the field's value. Their order across fields is the results file's.
    columns: tuple[str, ...] = ()
    column_type: str = "int"
    optional: bool = False  # a column (and part of the point key) only where set
    none_ok: bool = False  # None means "the default"
    zero_default: bool = False  # a sweep grid writes 0 for the default (None)
    grid_required: bool = False  # a sweep grid must list it
    many: bool = False  # the CLI takes a comma-separated list
    parse: Callable | None = None  # raises the specific error a bad value deserves

    def check(self, name: str, value) -> None:
        if value is None and self.none_ok:
            return
        if self.parse is not None:
            self.parse(value)
        if not self.valid(value):
            raise ValueError(f"{name} must be {self.expected}, got {value!r}")


def param(default, help: str, expected: str, valid, **kw):
    """A Point field: its default and its `Param`."""
    return field(default=default, metadata={"param": Param(help, expected, valid, **kw)})


def _positive(limit: int, what: str = "a positive integer") -> dict:
    return dict(expected=f"{what} up to {limit}", valid=_int_in(1, limit))


@dataclass(frozen=True)
@with_lever_fields
class Point:
    """One attention configuration. Defaults (tiles, occupancy, K/V heads) resolve as the kernel
    resolves them; `ctas` caps the persistent grid (None: SMs x occupancy). Each parameter
    field carries its `Param`; the kernel levers follow them, one field per `Lever`."""

    batch: int = param(1, "Batch size.", **_positive(MAX_BATCH_HEADS), columns=("batch",))
    heads: int = param(32, "Query heads.", **_positive(MAX_BATCH_HEADS), columns=("heads",))
    kv_heads: int | None = param(None, "K/V heads (GQA); default: heads.",
                                 **_positive(MAX_BATCH_HEADS), columns=("kv_heads",),
                                 none_ok=True)
    seqlen: int = param(8192, "Sequence length.", **_positive(MAX_POINT_SEQLEN),
                        columns=("seqlen",), grid_required=True, many=True)
    head_dim: int = param(128, "Head dim.", f"one of {list(HEAD_DIMS)}",
                          lambda v: v in HEAD_DIMS and not isinstance(v, bool),
                          columns=("head_dim",), grid_required=True, many=True)
    dtype: str = param("bfloat16", "Element type.", f"one of {list(DTYPES)}",
                       lambda v: v in DTYPES, columns=("dtype",), column_type="str")
    causal: bool = param(False, "Causal mask (top-left).",
                         "True or False (a boolean, not a string)",
                         lambda v: isinstance(v, bool), columns=("causal",), column_type="bool")
    # a string: a TOML array ([128, 64]) would parse but cannot key a point
    tiles: str | None = param(None, "Tile shape MxN (Q rows x K/V rows); default per head dim.",
                              "a tile shape like '128x64' (64x64, 128x64, 128x128)",
                              _parses(lambda v: parse_tiles(v if isinstance(v, str) else None)),
                              columns=("tile_m", "tile_n"), none_ok=True, parse=parse_tiles)
    occupancy: int | None = param(None, "CTAs per SM (default per tile shape).",
                                  "an integer in [1, 32]", _int_in(1, 32),
                                  columns=("occupancy",), none_ok=True)
    schedule: str = param("persistent+linear", "'cta+kv' schedule.",
                          "a schedule like 'persistent+sawtooth'", _parses(parse_schedule),
                          columns=("cta_schedule", "kv_schedule"), column_type="str",
                          grid_required=True, many=True, parse=parse_schedule)
    # `resident_ctas` stands for the `ctas` cap: what the launch ran with, whatever the default.
    ctas: int | None = param(None, "Persistent grid size / CTAs in flight (default: SMs x "
                                   "occupancy).", **_positive(MAX_CTAS),
                             columns=("resident_ctas",), none_ok=True, zero_default=True)
    # Most points leave it at its default: it joins the key only where set, so every key
    # written before it stays what it was.
    chunk_tiles: int | None = param(None, "The tiled schedule's K/V tiles per chunk (default: "
                                          "from the L2).", **_positive(MAX_CHUNK_TILES),
                                    columns=("chunk_tiles",), optional=True, none_ok=True,
                                    zero_default=True)

    def __post_init__(self):
        for name, p in PARAMS.items():
            p.check(name, getattr(self, name))
        if self.heads % self.kv_heads_:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads_})")
        check_levers(**self.levers)

    @property
    def levers(self) -> dict:
        """The kernel levers of this point, by name (KERNEL_LEVERS)."""
        return {name: getattr(self, name) for name in KERNEL_LEVERS}

    @property
    def has_default_levers(self) -> bool:
        return self.levers == KERNEL_LEVERS

    @property
    def kv_heads_(self) -> int:
        return self.kv_heads or self.heads

    def replace(self, **changes) -> "Point":
        return replace(self, **changes)

    def problem_only(self) -> "Point":
        """The problem alone (batch, heads, length, D, dtype, mask): the default schedule,
        tiles, occupancy and kernel levers. Bench and tune group their contenders by it."""
        return replace(self, schedule="persistent+linear", tiles=None, occupancy=None,
                       **KERNEL_LEVERS)

    def launch(self, gpu: GpuShape) -> Launch:
        return plan((self.batch, self.heads, self.seqlen, self.head_dim),
                    (self.batch, self.kv_heads_, self.seqlen, self.head_dim),
                    causal=self.causal, schedule=self.schedule, tiles=self.tiles,
                    occupancy=self.occupancy, sms=gpu.sms, l2_bytes=gpu.l2_bytes,
                    element_bytes=DTYPE_BYTES[self.dtype], ctas=self.ctas,
                    chunk_tiles=self.chunk_tiles)

    def attention_kwargs(self) -> dict:
        """Everything `wavefront.attention` takes from a point (no arrays)."""
        return dict(causal=self.causal, schedule=self.schedule, tiles=self.tiles,
                    occupancy=self.occupancy, ctas=self.ctas, chunk_tiles=self.chunk_tiles,
                    **self.levers)

    def parameters(self, gpu: GpuShape) -> dict:
        """The PARAMETER_COLUMNS (and OPTIONAL_PARAMETER_COLUMNS) of this point on `gpu`,
        defaults resolved."""
        launch = self.launch(gpu)
        p = launch.problem
        resolved = {"kv_heads": p.kv_heads, "causal": p.causal, "tile_m": p.tile_m,
                    "tile_n": p.tile_n, "occupancy": launch.ctas_per_sm,
                    "cta_schedule": launch.cta.name, "kv_schedule": launch.kv.name,
                    "resident_ctas": launch.resident_ctas}
        return {c: resolved[c] if c in resolved else getattr(self, c)
                for c in (*PARAMETER_COLUMNS, *OPTIONAL_PARAMETER_COLUMNS)}

    def key(self, gpu: GpuShape) -> str:
        return point_key(self.parameters(gpu))

    def to_record(self, gpu: GpuShape, gpu_name: str) -> dict:
        """Parameters, launch-derived columns and the key: a results row without a measurement."""
        if not self.has_default_levers:
            raise ValueError(f"results rows record the default kernel levers only "
                             f"({', '.join(KERNEL_LEVERS)}): measure levers with `wavefront tune` or "
                             "`wavefront bench`, which record them in their own files")
        launch = self.launch(gpu)
        params = self.parameters(gpu)
        return {**params, "point": point_key(params), "gpu": gpu_name, "sms": gpu.sms,
                "l2_bytes": gpu.l2_bytes, "num_ctas": launch.num_ctas,
                "group_units": launch.group_units}

    @classmethod
    def from_record(cls, rec) -> "Point":
        """The point of a sweep point or a results row (they share the parameter columns).
        `ctas` is set only where the CTAs in flight differ from SMs x occupancy."""
        sms, occupancy, resident = int(rec["sms"]), int(rec["occupancy"]), int(rec["resident_ctas"])
        cast = {"int": int, "str": str, "bool": bool}
        values = {}
        for name, p in PARAMS.items():
            if p.columns == (name,):  # recorded as it is
                value = rec.get(name) if hasattr(rec, "get") else rec[name]
                values[name] = None if is_unset(value) else cast[p.column_type](value)
        return cls(**{**values, "schedule": f"{rec['cta_schedule']}+{rec['kv_schedule']}",
                      "tiles": f"{int(rec['tile_m'])}x{int(rec['tile_n'])}",
                      "occupancy": occupancy,
                      "ctas": None if resident == sms * occupancy else resident})

    def as_dict(self) -> dict:
        return asdict(self)


# Each parameter field's declaration, in field order.
PARAMS: dict[str, Param] = {f.name: f.metadata["param"] for f in fields(Point)
                            if "param" in f.metadata}
# The columns that identify a point in a results file, in file order, and their types.
PARAMETER_COLUMNS = tuple(c for p in PARAMS.values() if not p.optional for c in p.columns)
OPTIONAL_PARAMETER_COLUMNS = tuple(c for p in PARAMS.values() if p.optional for c in p.columns)
PARAMETER_TYPES = {c: p.column_type for p in PARAMS.values() for c in p.columns}
# Derived from the launch on a GPU; recorded beside the parameters.
LAUNCH_COLUMNS = ("gpu", "sms", "l2_bytes", "num_ctas", "group_units")


def point_key(params: dict) -> str:
    """The canonical key of a point: every parameter column, then the optional ones that are
    set (None, NaN and pandas' NA count as unset)."""
    key = ",".join(f"{k}={params[k]}" for k in PARAMETER_COLUMNS)
    for k in OPTIONAL_PARAMETER_COLUMNS:
        value = params.get(k)
        if not is_unset(value):
            key += f",{k}={int(value)}"
    return key


def is_unset(value) -> bool:
    """An optional parameter left at its default: None, NaN, pandas' NA or an empty cell
    (compared as text: pandas' NA has no truth value)."""
    return str(value) in ("None", "nan", "<NA>", "")
