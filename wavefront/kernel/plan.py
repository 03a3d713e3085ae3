"""What a call runs, held: the call's options (`CallOptions`) and the `Plan` made from them.

A `Plan` is FlashInfer's plan()/run() split, and FlashAttention-3's scheduler metadata: the
configuration chosen for one problem (schedule, tiles, levers), its `Launch` (CTAs, work items,
the work table), and where it was made from GPU arrays, the bound launcher (the binary, the work
table on the GPU, the buffers). `plan.run(q, k, v)` launches it; `wavefront.attention` looks a
Plan up in its cache (or makes one) and runs it. A Plan prints what it runs and what the cache
model predicts it reads from DRAM. Made from shapes (no GPU needed), it is for the model only
and refuses to run.

Importing this module loads no GPU library.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from wavefront.kernel.arrays import _call_key, _check_inputs
from wavefront.point import LEVERS, check_levers, parse_schedule, parse_tiles, plan
from wavefront.schedules import Launch, check_causal_alignment, positive_int


def _with_unchosen_levers(cls):
    """A class decorator, under @dataclass: one field per kernel lever (`point.LEVERS`), in
    declaration order, None (not chosen: the tuned table or the lever's default decides)."""
    annotations = cls.__dict__.get("__annotations__", {})
    cls.__annotations__ = annotations
    for lever in LEVERS:
        annotations[lever.name] = "int | None"
        setattr(cls, lever.name, None)
    return cls


@dataclass(frozen=True)
@_with_unchosen_levers
class CallOptions:
    """Every option of `wavefront.attention` but the arrays, `out` and `stream`, then one field
    per kernel lever (`point.LEVERS`), None where not chosen. What a launcher is built from,
    and (as `values()`) what the public call's cache keys on. Checked on construction, each
    error naming the argument."""

    causal: bool = False
    schedule: str | None = None
    tiles: object = None  # "MxN" or (M, N)
    occupancy: int | None = None
    scale: float | None = None
    return_lse: bool = False
    l2_bytes: int | None = None
    ctas: int | None = None
    chunk_tiles: int | None = None
    causal_alignment: str = "top_left"  # or "bottom_right" (`schedules.causal_diagonal`)

    def __post_init__(self):
        for name in ("causal", "return_lse"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.schedule is not None:
            parse_schedule(self.schedule)
        if self.tiles is not None:
            parse_tiles(self.tiles)
        if self.occupancy is not None and (isinstance(self.occupancy, bool) or not isinstance(
                self.occupancy, int) or not 1 <= self.occupancy <= 32):
            raise ValueError(f"occupancy must be an integer in [1, 32], got {self.occupancy!r}")
        scale = self.scale
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not math.isfinite(scale) or scale <= 0):
            raise ValueError(f"scale must be a positive finite number, got {scale!r}")
        for name in ("l2_bytes", "ctas", "chunk_tiles"):
            positive_int(name, getattr(self, name), optional=True)
        check_causal_alignment(self.causal_alignment)
        check_levers(**self.levers())
        # made once: the torch op and `plan_for` key on them every call
        object.__setattr__(self, "_values", tuple(getattr(self, f.name) for f in fields(self)))

    def values(self) -> tuple:
        """The fields' values in declaration order (`CALL_OPTIONS`): the public call's key."""
        return self._values

    def levers(self) -> dict:
        """The kernel levers chosen, by name (those not chosen left out)."""
        return {lever.name: getattr(self, lever.name) for lever in LEVERS
                if getattr(self, lever.name) is not None}

    def choices(self) -> dict:
        """What `tuning.resolve_config` takes: schedule, tiles, occupancy and every lever, None
        where not chosen."""
        return {"schedule": self.schedule, "tiles": self.tiles, "occupancy": self.occupancy,
                **{lever.name: getattr(self, lever.name) for lever in LEVERS}}

    def launcher_options(self) -> dict:
        """What a launcher takes beside its configuration (`AttentionLauncher.planned`)."""
        return {"causal": self.causal, "scale": self.scale, "return_lse": self.return_lse,
                "l2_bytes": self.l2_bytes, "ctas": self.ctas, "chunk_tiles": self.chunk_tiles,
                "causal_alignment": self.causal_alignment}

    def chose_nothing(self) -> bool:
        """Whether the configuration is left to the tuned table (no schedule, tiles, occupancy
        or lever chosen)."""
        return all(value is None for value in self.choices().values())


# The options' names in order: `CallOptions.values()` and the public call's values tuple.
CALL_OPTIONS = tuple(f.name for f in fields(CallOptions))
# The options of a call that names only the mask, by mask.
PLAIN_OPTIONS = {causal: CallOptions(causal=causal) for causal in (False, True)}

# A launch of more accesses than this is not simulated just to print its Plan (about a second
# of the model's time per 2e7 accesses on this machine's CPU): `Plan.prediction()` still does.
PRINT_PREDICTION_ACCESSES = 20_000_000
# Bounds no GPU reaches, for a Plan of shapes: past them the model's integers overflow (an
# l2_bytes of 1e20 failed in the simulator's compiled code) or its work table would not fit.
MAX_SMS = 1 << 16
MAX_L2_BYTES = 1 << 40
# A prediction simulates about 2e7 accesses a second on this machine's CPU: past this (about
# 20 s) it would run on with nothing to show; `prediction(max_accesses=None)` runs it anyway.
MAX_PREDICTION_ACCESSES = 400_000_000


class Plan:
    """One problem's configuration, launch and (made from GPU arrays) bound launcher.

    `launch`: the `schedules.Launch` (CTAs, work items, the work table); `config`: the schedule,
    tiles, occupancy and levers chosen (`source` says by whom: "caller", "tuned" or
    "defaults"); `options`: the `CallOptions` it was made for; `gpu`: the GPU it was planned
    for (name, sms, l2_bytes); `launcher`: the bound launcher (None: made from shapes, for the
    model only). `run(q, k, v)` launches it; `prediction()` runs the cache model."""

    __slots__ = ("launch", "config", "source", "options", "gpu", "dtype", "k_shape",
                 "launcher", "recently_used", "_arrays", "_prediction")

    def __init__(self, launch: Launch, config: dict, source: str, options: CallOptions, gpu,
                 dtype: str, k_shape: tuple, launcher=None, arrays_key=None):
        self.launch, self.config, self.source, self.options = launch, config, source, options
        self.gpu, self.dtype, self.k_shape = gpu, dtype, tuple(k_shape)
        self.launcher = launcher
        self.recently_used = False  # called since the cache last looked (`call._keep`)
        self._arrays = arrays_key  # the layout of the arrays it was made from
        self._prediction = None

    # -- running ---------------------------------------------------------------------------

    def run(self, q, k, v, out=None, stream=None):
        """Launch on q, k, v (the shapes, dtype and device this Plan was made for) into `out`
        (None: a new output) on `stream` (a raw handle, a torch or a CuPy stream; None: the
        current one). Returns the output, and the LSE where the Plan was made with
        `return_lse=True`. q, k, v of other strides than those it was made from run too,
        checked here and launched by `ct.launch` (not the prepared launch, which fixes the
        strides it was prepared with)."""
        launcher = self.launcher
        if launcher is None:
            raise RuntimeError(
                "this Plan was made from shapes, for the model only: it holds no binary or work "
                "table to run. Make it from GPU arrays, wavefront.plan(q, k, v, ...), to run it")
        if _call_key(q, k, v, ()) == self._arrays:
            if out is None and stream is None and launcher.plain_ready:
                return launcher.launch_plain(q, k, v)  # the plain call's one frame
            return launcher.launch_call(q, k, v, out, stream)
        q, k, v = self._checked(q, k, v)
        return launcher.launch_call(q, k, v, out, stream, vouched=False)

    def _checked(self, q, k, v) -> tuple:
        """q, k, v as cuTile takes them, checked against this Plan: its shapes, dtype, device
        and library (strides may differ); else an error naming the argument."""
        vq, arrays = _check_inputs(q, k, v)
        mine = self.launcher.view
        for what, got, wanted in (("library", vq.library, mine.library),
                                  ("shape", vq.shape, mine.shape),
                                  ("dtype", vq.dtype, mine.dtype),
                                  ("device", vq.device, mine.device)):
            if got != wanted:
                raise ValueError(f"q {what} must be this Plan's ({wanted}), got {got}: make "
                                 f"another Plan for other arrays")
        if tuple(arrays[1].shape) != self.k_shape:
            raise ValueError(f"k shape must be this Plan's {self.k_shape}, got "
                             f"{tuple(arrays[1].shape)}: make another Plan for other arrays")
        return arrays

    # -- what it is ------------------------------------------------------------------------

    @property
    def schedule(self) -> str:
        return self.launch.name

    @property
    def tiles(self) -> str:
        return f"{self.launch.problem.tile_m}x{self.launch.problem.tile_n}"

    @property
    def ctas(self) -> int:
        return self.launch.num_ctas

    @property
    def work_items(self) -> int:
        return self.launch.num_items

    def prediction(self, max_accesses: int | None = MAX_PREDICTION_ACCESSES):
        """The lock-step cache model's prediction for this launch, as `wavefront simulate
        --no-clock` makes it (`wavefront.model.fits.predict`: the lock-step trace through the
        partition model, per partition an LRU of the L2 over its partitions; one LRU of the
        whole L2 on a GPU of one partition), made once. Good where
        CTAs move together (non-causal: within a few percent); it misses where CTA timing
        decides (causal, grouped, GQA with many heads in flight). A launch of more than
        `max_accesses` accesses to simulate (minutes of CPU) is refused by name; None runs
        any."""
        if self._prediction is None:
            from wavefront.model.fits import predict
            from wavefront.model.simulation import access_upper_bound
            accesses = access_upper_bound(self.launch)
            if max_accesses is not None and accesses > max_accesses:
                raise ValueError(
                    f"this Plan's launch has up to {accesses:.3g} accesses to simulate, more "
                    f"than max_accesses={max_accesses:.3g} (about {accesses / 2e7:,.0f} s of "
                    "CPU): call plan.prediction(max_accesses=None) to run it anyway")
            gpu = model_gpu(self.gpu)
            partitions = gpu.l2_partitions
            self._prediction = predict(self.launch, gpu,
                                       capacity_bytes=gpu.l2_bytes / partitions,
                                       partitions=partitions if partitions > 1 else None)
        return self._prediction

    @property
    def predicted_dram_bytes(self) -> int:
        """DRAM bytes read, as the model predicts them (`prediction`): the partitioned cache's
        where it ran."""
        from wavefront.point import SECTOR_BYTES
        p = self.prediction()
        if p.partitioned:
            return p.partitioned["dram_read_sectors"] * SECTOR_BYTES
        return p.dram_read_bytes

    def _prediction_text(self) -> str:
        if self._prediction is None:
            from wavefront.model.simulation import access_upper_bound
            accesses = access_upper_bound(self.launch)
            if accesses > PRINT_PREDICTION_ACCESSES:
                return (f"not predicted for printing (up to {accesses:.3g} accesses to "
                        f"simulate): call plan.prediction()")
        compulsory = self.prediction().compulsory_read_bytes
        caveat = "; causal: the model misses where CTAs drift apart" if (
            self.launch.problem.causal) else ""
        return (f"{self.predicted_dram_bytes / 1e6:,.1f} MB (compulsory "
                f"{compulsory / 1e6:,.1f} MB; lock-step partition model{caveat})")

    def _problem_text(self) -> str:
        p = self.launch.problem
        return (f"q ({p.batch}, {p.heads}, {p.seqlen_q}, {p.head_dim}) k/v ({p.batch}, "
                f"{p.kv_heads}, {p.seqlen_kv}, {p.head_dim}) {self.dtype}"
                f"{' causal' if p.causal else ''}"
                f"{' bottom-right' if p.causal and p.causal_alignment == 'bottom_right' else ''}")

    def __repr__(self) -> str:
        bound = "bound" if self.launcher is not None else "shapes only"
        return (f"<Plan {self.schedule} tiles {self.tiles} occupancy "
                f"{self.launch.ctas_per_sm}, {self.ctas} CTAs, {self.work_items} work items; "
                f"{self._problem_text()}; {_gpu_text(self.gpu)}; predicted DRAM reads "
                f"{self._prediction_text()}; {bound}>")

    def __str__(self) -> str:
        levers = {k: v for k, v in self.config.items()
                  if k not in ("schedule", "tiles", "occupancy")}
        if self.launcher is not None:
            bound = (f"binary {self.launcher.variant.label}, work table of "
                     f"{self.work_items} rows on cuda:{self.launcher.view.device}"
                     f"{', tiled partial states' if self.launcher.tiled else ''}"
                     f"{', LSE' if self.options.return_lse else ''}")
        else:
            bound = "none: made from shapes, for the model only (run() refuses)"
        lines = [
            f"Plan for {self._problem_text()} on {_gpu_text(self.gpu)}",
            f"  schedule     {self.schedule} ({self.source})",
            f"  tiles        {self.tiles}, occupancy {self.launch.ctas_per_sm}",
            f"  levers       {', '.join(f'{k}={v}' for k, v in levers.items()) or '-'}",
            f"  CTAs         {self.ctas} ({self.launch.resident_ctas} resident)",
            f"  work items   {self.work_items}",
            f"  DRAM reads   {self._prediction_text()}",
            f"  bound        {bound}",
        ]
        return "\n".join(lines)


def _gpu_text(gpu) -> str:
    return f"{gpu.name} ({gpu.sms} SMs, {gpu.l2_bytes / 2**20:g} MiB L2)"


def model_gpu(gpu):
    """The cache model's GPU (`model.presets.GPUSpec`) for a Plan's: its preset where the name
    matches one, with the Plan's SMs and L2; else the SMs and L2 alone (the model's
    DRAM-bytes prediction needs no more)."""
    from wavefront.model.presets import GPUSpec, preset_for_device
    if isinstance(gpu, GPUSpec):
        return gpu
    preset = preset_for_device(gpu.name)
    if preset is not None:
        return preset.with_overrides(name=gpu.name, sms=gpu.sms, l2_bytes=gpu.l2_bytes)
    return GPUSpec(gpu.name, sms=gpu.sms, l2_bytes=gpu.l2_bytes, l2_partitions=1,
                   dram_bytes_per_s=0.0, peak_bf16_flops=0.0)


@dataclass(frozen=True)
class PlannedGpu:
    """A GPU a Plan of shapes is made for: the name the tuned table knows it by (None: none of
    its entries apply), its SMs and its L2."""

    name: str
    sms: int
    l2_bytes: int
    tuned_name: str | None = None


def _bounded(name: str, value, upper: int):
    if value is not None and positive_int(name, value) > upper:
        raise ValueError(f"{name} must be a positive integer up to {upper}, got {value!r}")
    return value


def gpu_for_shapes(gpu=None, sms=None, l2_bytes=None) -> PlannedGpu:
    """The GPU a Plan of shapes is made for: a preset by name ("h100", "h200", "b200", "gb10")
    or a `GPUSpec`, `sms` and `l2_bytes` overriding it; or `sms` and `l2_bytes` alone; or the
    GPU this process sees. A preset takes the tuned entries of the table's GPU it matches."""
    from wavefront.kernel.tuning import load_table
    from wavefront.model.presets import GPUSpec, gpu_preset, preset_for_device
    _bounded("sms", sms, MAX_SMS)
    _bounded("l2_bytes", l2_bytes, MAX_L2_BYTES)
    if gpu is None and sms is None and l2_bytes is None:
        from wavefront.device import current_device
        dev = current_device()
        if dev is None:
            raise ValueError("gpu must name a preset (h100, h200, b200, gb10) or sms and "
                             "l2_bytes be given: no GPU is visible to plan for")
        return PlannedGpu(dev.name, dev.sms, dev.l2_bytes, dev.name)
    if gpu is None:
        if sms is None or l2_bytes is None:
            raise ValueError(f"sms and l2_bytes must both be given without gpu, got sms={sms!r} "
                             f"l2_bytes={l2_bytes!r}")
        spec = GPUSpec(f"a GPU of {sms} SMs", positive_int("sms", sms),
                       positive_int("l2_bytes", l2_bytes), 1, 0.0, 0.0)
    elif isinstance(gpu, str):
        spec = gpu_preset(gpu)
    elif isinstance(gpu, GPUSpec):
        spec = gpu
    else:
        raise ValueError(f"gpu must be a preset name (h100, h200, b200, gb10) or a "
                         f"wavefront.model.presets.GPUSpec, got {type(gpu).__name__}")
    tuned = None
    if gpu is not None:  # the table's GPU of this preset, by name ('NVIDIA H100 ...': h100)
        tuned = next((name for name in sorted(load_table()) if preset_for_device(name) == spec),
                     None)
    spec = spec.with_overrides(sms=positive_int("sms", sms, optional=True),
                               l2_bytes=positive_int("l2_bytes", l2_bytes, optional=True))
    return PlannedGpu(spec.name, spec.sms, spec.l2_bytes, tuned)


def chosen_config(options: CallOptions, q_shape, k_shape, measure=None, dev=None):
    """-> (the configuration a call with `options` runs for these shapes, who chose it:
    "caller", "tuned" (the tuned table, `tuning.resolve_config`) or "defaults"). `dev`: the
    GPU whose tuned entries apply (default the current one); `measure`: the measured
    carry-over's timing (`resolve_config`)."""
    from wavefront.kernel.tuning import DEFAULT_SCHEDULE, resolve_config
    choices = options.choices()
    config = resolve_config(tuple(q_shape), tuple(k_shape), options.causal,
                            choices.pop("schedule"), choices.pop("tiles"),
                            choices.pop("occupancy"), choices, measure, dev)
    if not options.chose_nothing():
        return config, "caller"
    defaults = {"schedule": DEFAULT_SCHEDULE, "tiles": None, "occupancy": None,
                **{lever.name: lever.default for lever in LEVERS}}
    return config, "defaults" if config == defaults else "tuned"


def plan_of_shapes(q_shape, k_shape, options: CallOptions, gpu: PlannedGpu,
                   dtype: str = "bfloat16") -> Plan:
    """A Plan for the model only, of shapes on `gpu` (no GPU needed): the configuration a call
    would take there (the tuned table's entry of the GPU it matches, where the options choose
    nothing), its launch, no launcher."""
    from wavefront.point import DTYPES
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    # the shapes checked (each error names q_shape or k_shape) before the table reads them
    plan(q_shape, k_shape, sms=gpu.sms, l2_bytes=gpu.l2_bytes)
    # a GPU the table does not know gets a name no entry has: the defaults, not this host's
    tuned_gpu = replace(gpu, name=gpu.tuned_name or f"(untuned) {gpu.name}")
    config, source = chosen_config(options, q_shape, k_shape, dev=tuned_gpu)
    launch = plan(tuple(q_shape), tuple(k_shape), sms=gpu.sms,
                  l2_bytes=options.l2_bytes if options.l2_bytes is not None else gpu.l2_bytes,
                  causal=options.causal, schedule=config["schedule"], tiles=config["tiles"],
                  occupancy=config["occupancy"], ctas=options.ctas,
                  chunk_tiles=options.chunk_tiles, causal_alignment=options.causal_alignment)
    return Plan(launch, config, source, options, gpu, dtype, k_shape)
