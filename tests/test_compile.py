"""Ahead-of-time compilation of every kernel specialisation, with no GPU."""
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

pytest.importorskip("cuda.tile", reason="compiling needs cuda-tile (the gpu extra)")

from wavefront.kernel.attention import (  # noqa: E402
    ATTENTION_PARAMS,
    COMBINE_PARAMS,
    KernelVariant,
    all_combine_variants,
    all_variants,
    compile_variant,
    launch_args,
)
from wavefront.kernel.cubin import kernel_resources  # noqa: E402
from wavefront.point import DTYPES, HEAD_DIMS, TILE_SHAPES  # noqa: E402
from wavefront.schedules import schedule_names  # noqa: E402

pytestmark = pytest.mark.compile


def _compile(args):
    variant, arch = args
    try:
        cubin = compile_variant(variant, arch)
    except Exception as exc:  # reported with the variant's name below
        return variant.label, None, f"{type(exc).__name__}: {exc}"
    return variant.label, kernel_resources(cubin), None


def _compile_all(variants, arch):
    with ProcessPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(_compile, [(v, arch) for v in variants]))
    failed = [(label, err) for label, _, err in results if err]
    assert not failed, failed[:3]
    return results


@pytest.mark.slow
def test_every_specialisation_compiles_for_sm90():
    variants = list(all_variants(write_lse=(False, True)))
    # dtype x head_dim x tiles x causal x (every schedule; LSE on/off except tiled, which
    # writes partial states and never the LSE)
    schedules = schedule_names()
    tiled = sum(s.endswith("+tiled") for s in schedules)
    per_shape = 2 * (len(schedules) - tiled) + tiled
    assert len(variants) == len(DTYPES) * len(HEAD_DIMS) * len(TILE_SHAPES) * 2 * per_shape
    # Compiled: every schedule x dtype x head dim x tile x mask; the LSE store (a few lines at
    # the end) at the default tile only, to keep a 2-core CI run within minutes.
    compiled = [v for v in variants if not v.write_lse or (v.tile_m, v.tile_n) == (128, 64)]
    compiled += list(all_combine_variants())
    for label, resources, _ in _compile_all(compiled, "sm_90"):
        (kernel,) = resources
        assert kernel.name.startswith(("flash_attention_fwd", "combine_partials"))
        # Hopper has 255 registers per thread at most and 227 KiB of shared memory per block.
        assert kernel.registers is not None and 0 < kernel.registers <= 255, label
        assert 0 < kernel.shared_bytes <= 227 * 1024, label


def test_blackwell_builds_ahead_of_time():
    """`wavefront compile --arch sm_100` on a CPU: one specialisation of each schedule."""
    variants = [KernelVariant("bfloat16", 128, 128, 64, causal, s, 2)
                for s in schedule_names() for causal in (False, True)]
    variants.append(next(all_combine_variants(dtypes=("bfloat16",), head_dims=(128,))))
    for label, resources, _ in _compile_all(variants, "sm_100"):
        assert resources and resources[0].registers, label


def test_variant_validation():
    with pytest.raises(ValueError, match="head_dim"):
        KernelVariant("bfloat16", 96, 128, 64, False, "persistent+linear", 2)
    with pytest.raises(ValueError, match="tiles"):
        KernelVariant("bfloat16", 64, 32, 64, False, "persistent+linear", 2)
    with pytest.raises(ValueError, match="dtype"):
        KernelVariant("float32", 64, 128, 64, False, "persistent+linear", 2)
    with pytest.raises(ValueError, match="schedule"):
        KernelVariant("bfloat16", 64, 128, 64, False, "persistent+diagonal", 2)


def test_launch_contract_follows_the_kernel_signatures():
    """The argument order is the kernels' own; the AOT signature and the launch tuple both come
    from it, so a parameter added to the kernel cannot be forgotten in either."""
    import inspect

    from wavefront.kernel.attention import combine_partials, flash_attention_fwd
    assert [p.name for p in ATTENTION_PARAMS] == list(
        inspect.signature(flash_attention_fwd).parameters)
    assert [p.name for p in COMBINE_PARAMS] == list(
        inspect.signature(combine_partials._pyfunc).parameters)
    v = KernelVariant("bfloat16", 64, 128, 64, True, "grouped+sawtooth", 2)
    assert len(v.signature().parameters) == len(ATTENTION_PARAMS)
    values = {p.name: i for i, p in enumerate(ATTENTION_PARAMS)}
    assert launch_args(ATTENTION_PARAMS, values) == tuple(range(len(ATTENTION_PARAMS)))
    with pytest.raises(TypeError, match="missing"):
        launch_args(ATTENTION_PARAMS, {})


def test_the_one_binary_and_the_order_recorder_build():
    """SCHEDULE_AT_RUN_TIME gives every non-tiled schedule of a shape the same constants (one
    binary) and moves the schedule to run-time arguments; RECORD_ORDER and the shared binary
    both compile for sm_90, each into code different from the default specialisation's."""
    from wavefront.kernel.cubin import kernel_resources
    shared = {s: KernelVariant("bfloat16", 64, 128, 64, True, s, 2, schedule_at_run_time=True)
              for s in schedule_names() if not s.endswith("+tiled")}
    assert len({tuple(sorted(v.constants.items())) for v in shared.values()}) == 1
    codes = {tuple(v.run_time_codes.values()) for v in shared.values()}
    assert len(codes) == len(shared)  # the schedule travels at run time instead
    plain = KernelVariant("bfloat16", 64, 128, 64, True, "persistent+sawtooth", 2)
    base = kernel_resources(compile_variant(plain, "sm_90"))[0]
    for variant in (shared["persistent+sawtooth"],
                    KernelVariant("bfloat16", 64, 128, 64, True, "persistent+sawtooth", 2,
                                  record_order=True)):
        res = kernel_resources(compile_variant(variant, "sm_90"))[0]
        assert res.registers and res.code_bytes != base.code_bytes, variant.label
