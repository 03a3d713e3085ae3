"""Ahead-of-time compilation of every kernel specialisation for sm_90, with no GPU."""
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from wavefront.cubin import kernel_resources
from wavefront.kernels import (
    KernelVariant,
    all_combine_variants,
    all_variants,
    compile_variant,
)

pytestmark = pytest.mark.compile


def _compile(variant):
    try:
        cubin = compile_variant(variant, "sm_90")
    except Exception as exc:  # reported with the variant's name below
        return variant.label, None, f"{type(exc).__name__}: {exc}"
    return variant.label, kernel_resources(cubin), None


def test_every_specialisation_compiles_for_sm90():
    variants = list(all_variants(write_lse=(False, True)))
    # dtype x head_dim x tiles x causal x (3 CTA x 3 K/V schedules less grouped+tiled) x LSE
    assert len(variants) == 2 * 2 * 3 * 2 * 8 * 2
    variants += list(all_combine_variants())
    with ProcessPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(_compile, variants))
    failed = [(label, err) for label, _, err in results if err]
    assert not failed, failed[:3]
    for label, resources, _ in results:
        (kernel,) = resources
        assert kernel.name.startswith(("flash_attention_fwd", "combine_partials"))
        # Hopper has 255 registers per thread at most and 227 KiB of shared memory per block.
        assert kernel.registers is not None and 0 < kernel.registers <= 255, label
        assert 0 < kernel.shared_bytes <= 227 * 1024, label


def test_variant_validation():
    with pytest.raises(ValueError, match="head_dim"):
        KernelVariant("bfloat16", 96, 128, 64, False, 1, 0, 2)
    with pytest.raises(ValueError, match="tiles"):
        KernelVariant("bfloat16", 64, 32, 64, False, 1, 0, 2)
    with pytest.raises(ValueError, match="dtype"):
        KernelVariant("float32", 64, 128, 64, False, 1, 0, 2)
