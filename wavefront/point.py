"""One measured point: the parameters of an attention launch, and how they become a `Launch`.

`Point` is the one type for a configuration. A sweep expands a spec into Points, the worker
measures a Point, a results row is `Point.to_record(gpu)` plus its measurement, the model
rebuilds the launch with `Point.from_record(row).launch(gpu)`. The parameter columns of a
record are listed once, in `PARAMETER_COLUMNS`.

The parameter space (dtypes, head dims, tile shapes, their default occupancy) lives here too:
the kernel compiles it, the model and the CLI validate against it without importing cuTile.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from wavefront.schedules import (
    AttentionProblem,
    Launch,
    TiledScan,
    VarlenLaunch,
    cta_schedule,
    kv_schedule,
    positive_int,
)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2}
DTYPES = tuple(DTYPE_BYTES)
HEAD_DIMS = (64, 128)
TILE_SHAPES = ((64, 64), (128, 64), (128, 128))
DEFAULT_TILES = {64: (128, 64), 128: (128, 64)}
# CTAs per SM asked of the compiler: two 128x64 CTAs fit an SM's registers, one 128x128.
DEFAULT_OCCUPANCY = {(64, 64): 2, (128, 64): 2, (128, 128): 1}
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


def plan(q_shape, k_shape, *, sms: int, l2_bytes: int, causal=False,
         schedule="persistent+linear", tiles=None, occupancy=None, element_bytes=2,
         ctas=None, chunk_tiles=None) -> Launch:
    """The `Launch` the kernel runs for these shapes on a GPU of `sms` SMs and `l2_bytes` of
    L2 (no GPU needed: the model calls this with a preset)."""
    b, h, sq, d = _shape("q_shape", q_shape, "(batch, heads, seqlen, head_dim)")
    bk, hkv, skv, dk = _shape("k_shape", k_shape, "(batch, kv_heads, seqlen, head_dim)")
    if (bk, dk) != (b, d):
        raise ValueError(f"k_shape must have q's batch ({b}) and head_dim ({d}), got "
                         f"{tuple(k_shape)}")
    tile_m, tile_n, occupancy, cta, kv = _launch_choices(d, causal, schedule, tiles, occupancy)
    problem = AttentionProblem(b, h, hkv, sq, skv, d, causal, tile_m, tile_n, element_bytes)
    kv_sched = kv_schedule(kv)
    if chunk_tiles is not None:
        if not isinstance(kv_sched, TiledScan):
            raise ValueError(f"chunk_tiles applies to the tiled schedule only, got schedule "
                             f"{schedule!r}")
        kv_sched = replace(kv_sched, tiles_per_chunk=chunk_tiles)
    return Launch(problem, cta_schedule(cta), kv_sched, sms, occupancy, l2_bytes, ctas)


def seqlens_of(name: str, cu_seqlens, total_rows: int) -> tuple[int, ...]:
    """Sequence lengths from FlashAttention's cumulative form [0, s0, s0 + s1, ...], checked:
    integers, starting at 0, never decreasing, ending at the packed rows."""
    try:
        bounds = [int(x) for x in cu_seqlens]
        if any(b != x for b, x in zip(bounds, cu_seqlens)):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of integers (host list, NumPy or CPU "
                         f"tensor), got {cu_seqlens!r}") from None
    if len(bounds) < 2 or bounds[0] != 0:
        raise ValueError(f"{name} must start at 0 and hold at least two entries, got "
                         f"{bounds[:8]}")
    lengths = tuple(b - a for a, b in zip(bounds, bounds[1:]))
    if any(isinstance(x, bool) for x in cu_seqlens):
        raise ValueError(f"{name} must hold integers, not booleans, got {cu_seqlens!r}")
    if min(lengths) < 0:
        raise ValueError(f"{name} must not decrease, got {bounds[:8]}...")
    if bounds[-1] != total_rows:
        raise ValueError(f"{name} must end at the packed rows ({total_rows}), ends at "
                         f"{bounds[-1]}")
    return lengths


def plan_varlen(q_shape, k_shape, cu_seqlens_q, cu_seqlens_k, *, sms: int, l2_bytes: int,
                causal=False, schedule="persistent+linear", tiles=None, occupancy=None,
                element_bytes=2, ctas=None) -> VarlenLaunch:
    """The `VarlenLaunch` for packed q (total_q, heads, D) and k (total_k, kv_heads, D)."""
    total_q, h, d = _shape("q_shape", q_shape, "(total_q, heads, head_dim)", 3)
    total_k, hkv, dk = _shape("k_shape", k_shape, "(total_k, kv_heads, head_dim)", 3)
    if dk != d:
        raise ValueError(f"k_shape must have q's head_dim ({d}), got {tuple(k_shape)}")
    tile_m, tile_n, occupancy, cta, kv = _launch_choices(d, causal, schedule, tiles, occupancy)
    problem = AttentionProblem(1, h, hkv, total_q, total_k, d, causal, tile_m, tile_n,
                               element_bytes)
    return VarlenLaunch(problem, seqlens_of("cu_seqlens_q", cu_seqlens_q, total_q),
                        seqlens_of("cu_seqlens_k", cu_seqlens_k, total_k), cta_schedule(cta),
                        kv_schedule(kv), sms, occupancy, l2_bytes, ctas)


# The kernel levers (`wavefront tune` searches them) and their defaults: consumer warps per CTA
# (None: the compiler's choice), CTAs per cluster, the K/V loads' latency hint (0: the kernel's
# own), FlashAttention-4's rescale threshold and exp2 share on the FMA units (0: off).
KERNEL_LEVERS = {"worker_warps": None, "cluster": 1, "kv_latency": 0, "rescale_threshold": 0,
                 "exp2_poly": 0}


def check_levers(worker_warps, cluster, kv_latency, rescale_threshold=0, exp2_poly=0) -> None:
    """The kernel levers `wavefront tune` searches, each a clear error when out of range."""
    if worker_warps not in (None, 4, 8):
        raise ValueError(f"worker_warps must be None, 4 or 8, got {worker_warps!r}")
    if cluster not in (1, 2) or isinstance(cluster, bool):
        raise ValueError(f"cluster must be 1 or 2, got {cluster!r}")
    if isinstance(kv_latency, bool) or not isinstance(kv_latency, int) \
            or not 0 <= kv_latency <= 10:
        raise ValueError(f"kv_latency must be an integer in [0, 10] (0: default), "
                         f"got {kv_latency!r}")
    check_softmax_levers(rescale_threshold, exp2_poly)


# FlashAttention-4's softmax levers (see `wavefront.kernel.attention`): the rescale threshold in
# powers of two (0: rescale on every tile; FA4 uses 8), and quarters of the columns whose exp2
# runs on the FMA units.
RESCALE_THRESHOLDS = range(0, 17)
EXP2_POLY_QUARTERS = range(0, 5)


def check_softmax_levers(rescale_threshold, exp2_poly) -> None:
    if isinstance(rescale_threshold, bool) or rescale_threshold not in RESCALE_THRESHOLDS:
        raise ValueError(f"rescale_threshold must be an integer in [0, 16] (log2 units; 0: "
                         f"always rescale), got {rescale_threshold!r}")
    if isinstance(exp2_poly, bool) or exp2_poly not in EXP2_POLY_QUARTERS:
        raise ValueError(f"exp2_poly must be an integer in [0, 4] (quarters of the columns "
                         f"exponentiated on the FMA units), got {exp2_poly!r}")


# The columns that identify a point in a results file, in file order. `resident_ctas` stands
# for the `ctas` cap: it is what the launch ran with, whatever the default was.
PARAMETER_COLUMNS = ("batch", "heads", "kv_heads", "seqlen", "head_dim", "dtype", "causal",
                     "tile_m", "tile_n", "occupancy", "cta_schedule", "kv_schedule",
                     "resident_ctas")
# Parameters most points leave at their default (empty in a results row): they join the key only
# where set, so every key written before them stays what it was. `chunk_tiles`: the tiled
# schedule's K/V tiles per chunk (default: from the L2).
OPTIONAL_PARAMETER_COLUMNS = ("chunk_tiles",)
# Derived from the launch on a GPU; recorded beside the parameters.
LAUNCH_COLUMNS = ("gpu", "sms", "l2_bytes", "num_ctas", "group_units")



# The longest sequence a point may name, 2^24 rows, a sweep grid's limit too: one head's K and
# V at D=128 already take 8 GB there.
MAX_POINT_SEQLEN = 1 << 24


@dataclass(frozen=True)
class Point:
    """One attention configuration. Defaults (tiles, occupancy, K/V heads) resolve as the kernel
    resolves them; `ctas` caps the persistent grid (None: SMs x occupancy)."""

    batch: int = 1
    heads: int = 32
    kv_heads: int | None = None
    seqlen: int = 8192
    head_dim: int = 128
    dtype: str = "bfloat16"
    causal: bool = False
    schedule: str = "persistent+linear"
    tiles: str | None = None
    occupancy: int | None = None
    ctas: int | None = None
    chunk_tiles: int | None = None  # tiled schedule: K/V tiles per chunk (default from the L2)
    # Kernel levers (`wavefront tune`); sweeps record the defaults only.
    worker_warps: int | None = None  # consumer warps per CTA, 4 or 8 (None: the compiler's)
    cluster: int = 1  # CTAs per cluster, 1 or 2
    kv_latency: int = 0  # K/V load latency hint 1-10 (0: the kernel's defaults)
    rescale_threshold: int = 0  # FA4 conditional rescale, log2 units (0: every tile)
    exp2_poly: int = 0  # FA4 exp2 on the FMA units, quarters of the columns (0: none)

    def __post_init__(self):
        for name in ("batch", "heads", "seqlen"):
            positive_int(name, getattr(self, name))
        for name in ("kv_heads", "ctas", "chunk_tiles"):
            positive_int(name, getattr(self, name), optional=True)
        if self.seqlen > MAX_POINT_SEQLEN:
            raise ValueError(f"seqlen must be at most {MAX_POINT_SEQLEN}, got {self.seqlen}")
        if self.occupancy is not None and (isinstance(self.occupancy, bool)
                                           or not isinstance(self.occupancy, int)
                                           or not 1 <= self.occupancy <= 32):
            raise ValueError(f"occupancy must be an integer in [1, 32] (or None: the tile "
                             f"shape's default), got {self.occupancy!r}")
        if self.head_dim not in HEAD_DIMS or isinstance(self.head_dim, bool):
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be True or False, got {self.causal!r}")
        parse_schedule(self.schedule)
        if self.tiles is not None:
            parse_tiles(self.tiles)
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
        return {"batch": self.batch, "heads": self.heads, "kv_heads": p.kv_heads,
                "seqlen": self.seqlen, "head_dim": self.head_dim, "dtype": self.dtype,
                "causal": p.causal, "tile_m": p.tile_m, "tile_n": p.tile_n,
                "occupancy": launch.ctas_per_sm, "cta_schedule": launch.cta.name,
                "kv_schedule": launch.kv.name, "resident_ctas": launch.resident_ctas,
                "chunk_tiles": self.chunk_tiles}

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
        chunk = rec.get("chunk_tiles") if hasattr(rec, "get") else None
        chunk = None if is_unset(chunk) else int(chunk)
        return cls(batch=int(rec["batch"]), heads=int(rec["heads"]), kv_heads=int(rec["kv_heads"]),
                   seqlen=int(rec["seqlen"]), head_dim=int(rec["head_dim"]),
                   dtype=str(rec["dtype"]), causal=bool(rec["causal"]),
                   schedule=f"{rec['cta_schedule']}+{rec['kv_schedule']}",
                   tiles=f"{int(rec['tile_m'])}x{int(rec['tile_n'])}", occupancy=occupancy,
                   ctas=None if resident == sms * occupancy else resident, chunk_tiles=chunk)

    def as_dict(self) -> dict:
        return asdict(self)


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
