"""Kernel specialisations a target architecture's compiler cannot build, refused by name.

tileiras 13.4 fails on sm_100 and sm_103 (datacenter Blackwell) for every packed
variable-length binary at D=128 with 128-row Q tiles and the default four worker warps
("failed to compile Tile IR program", no location; reproduced outside cuda-tile with
`tileiras <bytecode> --gpu-name sm_100`: it fails at -O1 to -O3 and compiles at -O0, so it is the
optimiser, not the program). The same binaries compile for sm_90, sm_120 and sm_121 (GB10), and
on sm_100 with 64x64 tiles or `worker_warps=8`. Measured on 24 of the 272 specialisations of
`wavefront compile --all` (both dtypes x 128x64/128x128/128x256 x full/causal x static/dynamic);
the list below is that measurement, not a guess about others.
"""
from __future__ import annotations

# (architectures, what the variant has) -> why
_TILEIRAS_13_4_OPTIMISER = ("sm_100", "sm_100a", "sm_100f", "sm_103", "sm_103a", "sm_103f")


class UnsupportedVariant(ValueError):
    """A specialisation the target's compiler cannot build; the message names both."""


def unsupported_reason(variant, arch: str) -> str | None:
    """Why `variant` does not build for `arch`, or None where it should."""
    if (arch in _TILEIRAS_13_4_OPTIMISER and getattr(variant, "varlen", False)
            and getattr(variant, "head_dim", None) == 128
            and getattr(variant, "tile_m", None) == 128
            and getattr(variant, "worker_warps", None) in (None, 4)):
        return (f"{variant.label} does not build for {arch}: tileiras 13.4's optimiser fails on "
                "packed variable-length binaries at D=128 with 128-row tiles and four worker "
                "warps there (it builds for sm_90 and sm_120/121); on this GPU use 64x64 tiles "
                "or worker_warps=8 for packed batches at D=128")
    return None


def check_buildable(variant, arch: str) -> None:
    reason = unsupported_reason(variant, arch)
    if reason:
        raise UnsupportedVariant(reason)
