"""GPU presets for the cache model: what the simulator and the models need to know of a chip.

Datasheet figures are nominal (leads, not measurements); `l2_bytes` for H100/H200 is what the
device reports. Each preset names its source per field in `sources`; a value marked "guess"
has no source we could check. Any field can be overridden from the CLI (`--sms`, `--l2-mib`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

MiB = 1 << 20


@dataclass(frozen=True)
class GPUSpec:
    name: str
    sms: int
    l2_bytes: int
    l2_partitions: int
    dram_bytes_per_s: float
    peak_bf16_flops: float  # dense tensor-core rate
    sources: tuple[tuple[str, str], ...] = ()  # (field, where the value comes from)
    # The timed model's memory system (`model.timed.MemoryTiming`): an L2 hit, a DRAM miss
    # (unloaded) and the sustained DRAM read rate, as `wavefront microbench` measured them
    l2_latency_ns: float = 0.0
    dram_latency_ns: float = 0.0
    dram_read_bytes_per_s: float = 0.0

    def with_overrides(self, **kw) -> "GPUSpec":
        kw = {k: v for k, v in kw.items() if v is not None}
        return replace(self, **kw) if kw else self


_MEASURED = "reported by the device (cudaGetDeviceProperties) on the lent hosts"
# medians of data/microbench (3 runs per GPU, commit 676e75e); a test checks they still are
_MICROBENCH = "wavefront microbench, data/microbench (median of 3 runs)"
_HOPPER_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (two L2 partitions)"

PRESETS: dict[str, GPUSpec] = {
    "h100": GPUSpec("H100 SXM", sms=132, l2_bytes=50 * MiB, l2_partitions=2,
                    dram_bytes_per_s=3.35e12, peak_bf16_flops=989e12, sources=(
                        ("sms", _MEASURED), ("l2_bytes", _MEASURED),
                        ("l2_partitions", _HOPPER_WP),
                        ("dram_bytes_per_s", "NVIDIA H100 SXM datasheet (3.35 TB/s HBM3)"),
                        ("peak_bf16_flops", "NVIDIA H100 SXM datasheet (989 TFLOPS BF16 "
                                            "dense)"),
                        ("l2_latency_ns", _MICROBENCH), ("dram_latency_ns", _MICROBENCH),
                        ("dram_read_bytes_per_s", _MICROBENCH)),
                    l2_latency_ns=143.4, dram_latency_ns=367.2, dram_read_bytes_per_s=3.092e12),
    "h200": GPUSpec("H200", sms=132, l2_bytes=60 * MiB, l2_partitions=2,
                    dram_bytes_per_s=4.8e12, peak_bf16_flops=989e12, sources=(
                        ("sms", _MEASURED), ("l2_bytes", _MEASURED),
                        ("l2_partitions", _HOPPER_WP + "; the H200 is the same die"),
                        ("dram_bytes_per_s", "NVIDIA H200 datasheet (4.8 TB/s HBM3e)"),
                        ("peak_bf16_flops", "NVIDIA H200 datasheet (989 TFLOPS BF16 dense)"),
                        ("l2_latency_ns", _MICROBENCH), ("dram_latency_ns", _MICROBENCH),
                        ("dram_read_bytes_per_s", _MICROBENCH)),
                    l2_latency_ns=147.0, dram_latency_ns=363.4, dram_read_bytes_per_s=4.637e12),
    "b200": GPUSpec("B200", sms=148, l2_bytes=126 * MiB, l2_partitions=2,
                    dram_bytes_per_s=8.0e12, peak_bf16_flops=2250e12, sources=(
                        ("sms", "guess: 148 SMs as widely reported for B200; not checked"),
                        ("l2_bytes", "guess: 126 MB as widely reported; MB vs MiB not checked"),
                        ("l2_partitions", "guess: one L2 per die of the two-die package"),
                        ("dram_bytes_per_s", "NVIDIA DGX B200 datasheet (8 TB/s HBM3e per "
                                             "GPU)"),
                        ("peak_bf16_flops", "NVIDIA B200 datasheet (2.25 PFLOPS BF16 dense, "
                                            "half the sparse figure)"),
                        ("l2_latency_ns", "guess: the H200's measured 147 ns"),
                        ("dram_latency_ns", "guess: the H200's measured 363 ns (HBM3e too)"),
                        ("dram_read_bytes_per_s", "guess: 0.97 of the datasheet rate, the "
                                                  "H200's measured fraction")),
                    l2_latency_ns=147.0, dram_latency_ns=363.4, dram_read_bytes_per_s=7.76e12),
    "gb10": GPUSpec("GB10", sms=48, l2_bytes=24 * MiB, l2_partitions=1,
                    dram_bytes_per_s=273e9, peak_bf16_flops=125e12, sources=(
                        ("sms", "Zhu et al., arXiv 2601.16032 (48 SMs)"),
                        ("l2_bytes", "Zhu et al., arXiv 2601.16032 (24 MiB L2)"),
                        ("l2_partitions", "guess: one L2 partition on a single die"),
                        ("dram_bytes_per_s", "NVIDIA DGX Spark datasheet (273 GB/s LPDDR5X)"),
                        ("peak_bf16_flops", "NVIDIA cudnn-frontend's benchmark: 1024 dense "
                                            "BF16 FLOP/clk/SM for compute capability 12.x, "
                                            "x 48 SMs x 2.55 GHz (DGX Spark boost clock) = "
                                            "125 TFLOP/s; FA2 measured 93-95 TFLOP/s there "
                                            "(FlashInfer PR 3897)"),
                        ("l2_latency_ns", "guess: the H100's measured 143 ns"),
                        ("dram_latency_ns", "guess: 600 ns, LPDDR5X behind a CPU-shared "
                                            "memory controller; no published figure"),
                        ("dram_read_bytes_per_s", "guess: 0.9 of the 273 GB/s datasheet rate")),
                    l2_latency_ns=143.4, dram_latency_ns=600.0, dram_read_bytes_per_s=246e9),
}


def gpu_preset(name: str) -> GPUSpec:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"gpu must be one of {sorted(PRESETS)}, got {name!r}") from None


def preset_for_device(device_name: str) -> GPUSpec | None:
    """The preset that matches a measured device name ('NVIDIA H200' -> h200)."""
    lowered = device_name.lower()
    for key in ("h200", "h100", "b200", "gb10"):
        if key in lowered:
            return PRESETS[key]
    return None
