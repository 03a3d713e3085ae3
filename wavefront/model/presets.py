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

    def with_overrides(self, **kw) -> "GPUSpec":
        kw = {k: v for k, v in kw.items() if v is not None}
        return replace(self, **kw) if kw else self


_MEASURED = "reported by the device (cudaGetDeviceProperties) on the lent hosts"
_HOPPER_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (two L2 partitions)"

PRESETS: dict[str, GPUSpec] = {
    "h100": GPUSpec("H100 SXM", sms=132, l2_bytes=50 * MiB, l2_partitions=2,
                    dram_bytes_per_s=3.35e12, peak_bf16_flops=989e12, sources=(
                        ("sms", _MEASURED), ("l2_bytes", _MEASURED),
                        ("l2_partitions", _HOPPER_WP),
                        ("dram_bytes_per_s", "NVIDIA H100 SXM datasheet (3.35 TB/s HBM3)"),
                        ("peak_bf16_flops", "NVIDIA H100 SXM datasheet (989 TFLOPS BF16 "
                                            "dense)"))),
    "h200": GPUSpec("H200", sms=132, l2_bytes=60 * MiB, l2_partitions=2,
                    dram_bytes_per_s=4.8e12, peak_bf16_flops=989e12, sources=(
                        ("sms", _MEASURED), ("l2_bytes", _MEASURED),
                        ("l2_partitions", _HOPPER_WP + "; the H200 is the same die"),
                        ("dram_bytes_per_s", "NVIDIA H200 datasheet (4.8 TB/s HBM3e)"),
                        ("peak_bf16_flops", "NVIDIA H200 datasheet (989 TFLOPS BF16 dense)"))),
    "b200": GPUSpec("B200", sms=148, l2_bytes=126 * MiB, l2_partitions=2,
                    dram_bytes_per_s=8.0e12, peak_bf16_flops=2250e12, sources=(
                        ("sms", "guess: 148 SMs as widely reported for B200; not checked"),
                        ("l2_bytes", "guess: 126 MB as widely reported; MB vs MiB not checked"),
                        ("l2_partitions", "guess: one L2 per die of the two-die package"),
                        ("dram_bytes_per_s", "NVIDIA DGX B200 datasheet (8 TB/s HBM3e per "
                                             "GPU)"),
                        ("peak_bf16_flops", "NVIDIA B200 datasheet (2.25 PFLOPS BF16 dense, "
                                            "half the sparse figure)"))),
    "gb10": GPUSpec("GB10", sms=48, l2_bytes=24 * MiB, l2_partitions=1,
                    dram_bytes_per_s=273e9, peak_bf16_flops=100e12, sources=(
                        ("sms", "Zhu et al., arXiv 2601.16032 (48 SMs)"),
                        ("l2_bytes", "Zhu et al., arXiv 2601.16032 (24 MiB L2)"),
                        ("l2_partitions", "guess: one L2 partition on a single die"),
                        ("dram_bytes_per_s", "NVIDIA DGX Spark datasheet (273 GB/s LPDDR5X)"),
                        ("peak_bf16_flops", "guess: ~100 TFLOPS BF16 dense, scaled from the "
                                            "1 PFLOP sparse FP4 figure of the DGX Spark"))),
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
