"""GPU presets for the cache model: what the simulator and the models need to know of a chip.

Datasheet figures are nominal (leads, not measurements); `l2_bytes` for H100/H200 is what the
device reports. Any field can be overridden from the CLI (`--sms`, `--l2-mib`, ...).
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

    def with_overrides(self, **kw) -> "GPUSpec":
        kw = {k: v for k, v in kw.items() if v is not None}
        return replace(self, **kw) if kw else self


PRESETS: dict[str, GPUSpec] = {
    "h100": GPUSpec("H100 SXM", sms=132, l2_bytes=50 * MiB, l2_partitions=2,
                    dram_bytes_per_s=3.35e12, peak_bf16_flops=989e12),
    "h200": GPUSpec("H200", sms=132, l2_bytes=60 * MiB, l2_partitions=2,
                    dram_bytes_per_s=4.8e12, peak_bf16_flops=989e12),
    "b200": GPUSpec("B200", sms=148, l2_bytes=126 * MiB, l2_partitions=2,
                    dram_bytes_per_s=8.0e12, peak_bf16_flops=2250e12),
    "gb10": GPUSpec("GB10", sms=48, l2_bytes=24 * MiB, l2_partitions=1,
                    dram_bytes_per_s=273e9, peak_bf16_flops=100e12),
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
