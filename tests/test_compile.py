"""Ahead-of-time compilation of every kernel specialisation, with no GPU."""
import os
from dataclasses import replace
from concurrent.futures import ProcessPoolExecutor

import numpy as np
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
from wavefront.point import DTYPES, HEAD_DIMS, TILE_SHAPES, GpuShape, Point  # noqa: E402
from wavefront.schedules import cta_schedule, kv_schedule, schedule_names  # noqa: E402

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


def test_every_schedule_of_a_shape_runs_one_of_four_binaries():
    """The schedule is data (the work table): every static CTA schedule and K/V direction of a
    shape runs one binary, the dynamic ones a second, the tiled partial-state writers a third
    (float32 partials) and a fourth (bfloat16); and `all_variants` holds exactly the binaries
    the registry's schedules need."""
    gpu = GpuShape(132, 50 << 20)
    binaries = {}
    for schedule in schedule_names():
        launch = Point(seqlen=1000, head_dim=64, schedule=schedule).launch(gpu)
        binaries.setdefault(KernelVariant.for_launch(launch, "bfloat16"), set()).add(schedule)
    assert len(binaries) == 4, binaries
    static = [s for s in schedule_names() if not kv_schedule(s.split("+")[1]).writes_partials
              and not cta_schedule(s.split("+")[0]).dynamic]
    assert any(set(static) == names for names in binaries.values())
    listed = set(all_variants(dtypes=("bfloat16",), head_dims=(64,), tiles=((128, 64),)))
    assert {v for v in binaries if not v.causal} <= listed


@pytest.mark.slow
def test_every_binary_compiles_for_sm90():
    variants = list(all_variants(write_lse=(False, True)))
    # dtype x head_dim x tiles x causal x (static, dynamic) x (LSE off, LSE on, packed
    # variable-length), plus the tiled writers (float32 and bfloat16 partial outputs)
    assert len(variants) == len(DTYPES) * len(HEAD_DIMS) * len(TILE_SHAPES) * 2 * (2 * 3 + 2)
    compiled = variants + list(all_combine_variants())
    for label, resources, _ in _compile_all(compiled, "sm_90"):
        (kernel,) = resources
        assert kernel.name.startswith(("flash_attention_fwd", "combine_partials"))
        # Hopper has 255 registers per thread at most and 227 KiB of shared memory per block.
        assert kernel.registers is not None and 0 < kernel.registers <= 255, label
        assert kernel.shared_bytes <= 227 * 1024, label
        # the attention kernel stages its tiles in shared memory (TMA); the combine kernel
        # may not (with bfloat16 partials it loads straight into registers)
        assert kernel.shared_bytes > 0 or kernel.name.startswith("combine_partials"), label


def test_blackwell_builds_ahead_of_time():
    """`wavefront compile --arch sm_100` on a CPU: the binaries of every schedule at D=128.
    (Not the packed variable-length ones: tileiras 13.4 fails on their `Array.slice` for
    sm_100, "Return code 5"; they are Hopper-only for now.)"""
    variants = [v for v in all_variants(dtypes=("bfloat16",), head_dims=(128,),
                                        tiles=((128, 64),)) if not v.varlen]
    variants.append(next(all_combine_variants(dtypes=("bfloat16",), head_dims=(128,))))
    for label, resources, _ in _compile_all(variants, "sm_100"):
        assert resources and resources[0].registers, label


def test_variant_validation():
    with pytest.raises(ValueError, match="head_dim"):
        KernelVariant("bfloat16", 96, 128, 64, False, 2)
    with pytest.raises(ValueError, match="tiles"):
        KernelVariant("bfloat16", 64, 32, 64, False, 2)
    with pytest.raises(ValueError, match="dtype"):
        KernelVariant("float32", 64, 128, 64, False, 2)
    with pytest.raises(ValueError, match="partial"):
        KernelVariant("bfloat16", 64, 128, 64, False, 2, partials=True, write_lse=True)
    with pytest.raises(ValueError, match="variable-length"):
        KernelVariant("bfloat16", 64, 128, 64, False, 2, partials=True, varlen=True)


def test_launch_contract_follows_the_kernel_signatures():
    """The argument order is the kernels' own; the AOT signature and the launch tuple both come
    from it, so a parameter added to the kernel cannot be forgotten in either."""
    import inspect

    from wavefront.kernel.attention import combine_partials, flash_attention_fwd
    assert [p.name for p in ATTENTION_PARAMS] == list(
        inspect.signature(flash_attention_fwd).parameters)
    assert [p.name for p in COMBINE_PARAMS] == list(
        inspect.signature(combine_partials._pyfunc).parameters)
    v = KernelVariant("bfloat16", 64, 128, 64, True, 2, dynamic=True)
    assert len(v.signature().parameters) == len(ATTENTION_PARAMS)
    values = {p.name: i for i, p in enumerate(ATTENTION_PARAMS)}
    assert launch_args(ATTENTION_PARAMS, values) == tuple(range(len(ATTENTION_PARAMS)))
    with pytest.raises(TypeError, match="missing"):
        launch_args(ATTENTION_PARAMS, {})


def test_the_table_driven_binary_keeps_the_wgmma_pipeline():
    """The regression that made schedules cost: wherever both scan directions were compiled into
    a persistent loop, the compiler serialised the wgmma pipeline (a WARPGROUP.DEPBAR after
    every HGMMA) and spilled. The table-driven binaries, static and dynamic, causal or not,
    must wait on the tensor cores only a few times per loop and never touch local memory.
    Needs cuobjdump (the nvidia-cuda-cuobjdump wheel of the gpu extra)."""
    from wavefront.kernel.sass import find_cuobjdump, sass_summary
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    for causal in (False, True):
        for dynamic in (False, True):
            v = KernelVariant("bfloat16", 128, 128, 64, causal, 2, dynamic)
            summary = sass_summary(compile_variant(v, "sm_90"))
            assert summary.hgmma > 0 and summary.depbar <= summary.hgmma // 4, (v.label, summary)
            assert summary.local_loads == summary.local_stores == 0, (v.label, summary)


def test_the_varlen_binaries_keep_the_wgmma_pipeline():
    """Slicing each item's sequence out of the packed arrays (VARLEN) must not serialise the
    tensor cores. Each sliced array's base and bounds live in registers for the whole item, and
    the varlen binaries keep a few values in local memory (measured at 128x64: causal static 1
    load and 1 store, non-causal dynamic 2 of each, causal dynamic 6 of each); the bench
    measures what that costs against the dense binary (`wavefront bench-varlen`)."""
    from wavefront.kernel.sass import find_cuobjdump, sass_summary
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    for causal in (False, True):
        for dynamic in (False, True):
            v = KernelVariant("bfloat16", 128, 128, 64, causal, 2, dynamic, varlen=True)
            summary = sass_summary(compile_variant(v, "sm_90"))
            assert summary.hgmma > 0 and summary.depbar <= summary.hgmma // 4, (v.label, summary)
            assert summary.local_loads <= 8 and summary.local_stores <= 8, (v.label, summary)


def test_the_order_recorder_builds():
    """RECORD_ORDER compiles for sm_90 into code different from the plain binary's."""
    plain = KernelVariant("bfloat16", 64, 128, 64, True, 2)
    base = kernel_resources(compile_variant(plain, "sm_90"))[0]
    res = kernel_resources(compile_variant(
        KernelVariant("bfloat16", 64, 128, 64, True, 2, record_order=True), "sm_90"))[0]
    assert res.registers and res.code_bytes != base.code_bytes


def test_flashattention4_softmax_levers_build_pipelined_and_without_spills():
    """The conditional rescale (a CTA-wide branch inside the K/V loop) and the polynomial exp2
    (sub-tiles cut and concatenated) must not cost the wgmma pipeline or spill; and each lever
    makes code of its own (a lever that compiled to the same binary would measure nothing)."""
    from wavefront.kernel.sass import find_cuobjdump, sass_summary
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    base = KernelVariant("bfloat16", 64, 128, 128, False, 2, worker_warps=8)
    seen = {compile_variant(base, "sm_90")}
    for levers in (dict(rescale_threshold=8), dict(exp2_poly=2), dict(exp2_poly=4),
                   dict(rescale_threshold=8, exp2_poly=1)):
        v = replace(base, **levers)
        cubin = compile_variant(v, "sm_90")
        summary = sass_summary(cubin)
        assert summary.hgmma > 0 and summary.depbar <= summary.hgmma // 2, (v.label, summary)
        assert summary.local_loads == summary.local_stores == 0, (v.label, summary)
        assert cubin not in seen, v.label
        seen.add(cubin)


def test_the_qk_ahead_lever_peels_the_loop_and_keeps_registers():
    """qk_ahead peels the K/V loop (one QK^T before it, one fold after it), so the binary has
    one more set of score MMAs and one more of P V than the plain loop's; with two consumer warpgroups at D=128 the
    second score tile fits in registers and the MMAs stay pipelined. Without them it spills,
    which the tune's screen records instead of timing."""
    from wavefront.kernel.sass import find_cuobjdump, sass_summary
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    base = KernelVariant("bfloat16", 128, 128, 128, False, 1, worker_warps=8, kv_latency=8)
    plain = sass_summary(compile_variant(base, "sm_90"))
    ahead = sass_summary(compile_variant(replace(base, qk_ahead=1), "sm_90"))
    per_set = 128 // 16  # 64x128x16 HGMMAs per warpgroup: K = D (QK^T) or N (P V) = 128
    assert ahead.hgmma == plain.hgmma + 2 * per_set, (plain, ahead)
    assert ahead.local_loads == ahead.local_stores == 0, ahead
    assert ahead.wgmma_pipelined, ahead
    one_warpgroup = sass_summary(compile_variant(
        replace(base, worker_warps=None, occupancy=2, qk_ahead=1), "sm_90"))
    assert one_warpgroup.local_stores > 0, one_warpgroup


def test_the_polynomial_exp2_is_accurate_beyond_bfloat16():
    """The kernel's 2^x on the FMA units, evaluated in float32 exactly as the kernel does it
    (clamp, floor, Horner, exponent bits), against float64: relative error far below the
    bfloat16 rounding of P (2^-9), and 2^-126 at most for a masked score."""
    from wavefront.kernel.attention import EXP2_POLY_COEFFS, EXP2_POLY_FLOOR
    x = np.concatenate([np.linspace(-140, 8, 200_001), [-np.inf, 0.0, -1.0, -0.5]])
    x = x.astype(np.float32)
    xc = np.maximum(x, np.float32(EXP2_POLY_FLOOR))
    whole = np.floor(xc)
    frac = xc - whole
    c1, c2, c3 = (np.float32(c) for c in EXP2_POLY_COEFFS)
    mantissa = np.float32(1) + frac * (c1 + frac * (c2 + frac * c3))
    bits = mantissa.view(np.int32) + (whole.astype(np.int32) << 23)
    got = bits.view(np.float32).astype(np.float64)
    want = np.exp2(x.astype(np.float64))
    normal = x >= EXP2_POLY_FLOOR
    assert np.max(np.abs(got[normal] / want[normal] - 1)) < 1.5e-4
    assert np.all(got[~normal] <= 2.0 ** EXP2_POLY_FLOOR * 1.001)
    assert got[x == 0][0] == 1.0


def test_the_wide_kv_tile_builds_without_spills_and_halves_a_steps_fixed_work():
    """128x256 tiles at D=128 (8 worker warps, one CTA per SM, no qk_ahead: the non-causal
    entries): pipelined and without spills; per key, the steady K/V step keeps its exponentials
    and halves what a step costs whatever its width (the row reductions' shuffles), against
    128x128 tiles (`kv_loop_mix`, as data/d128_limits/sass/kv_loop.json.gz counts it)."""
    from wavefront.kernel.sass import disassemble, find_cuobjdump, kv_loop_mix, summarise
    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    narrow = KernelVariant("bfloat16", 128, 128, 128, False, 1, worker_warps=8, kv_latency=8)
    sass = {n: disassemble(compile_variant(replace(narrow, tile_n=n), "sm_90"))
            for n in (128, 256)}
    wide = summarise(sass[256])
    assert wide.wgmma_pipelined and wide.local_loads == wide.local_stores == 0, wide
    per_key = {n: {k: v / n for k, v in kv_loop_mix(text).items()} for n, text in sass.items()}
    assert per_key[256]["exponential"] == pytest.approx(per_key[128]["exponential"], rel=0.05)
    assert per_key[256]["shuffle"] <= per_key[128]["shuffle"] / 2
    assert per_key[256]["all"] < per_key[128]["all"]


def test_the_kv_loop_is_the_shortest_loop_with_mmas_and_exponentials():
    """`kv_loop_mix` reads the loop a backward branch closes, takes the shortest with both
    warpgroup MMAs and exponentials (not a longer masked copy, nor a branch back from
    out-of-line code over MMAs alone) and counts its instructions by class."""
    from wavefront.kernel.sass import kv_loop_mix, loops

    def line(address, text):
        return f"        /*{address:04x}*/                   {text} ;   /* 0x0 */"
    listing = "\n".join([
        line(0x10, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT"),
        line(0x20, "MUFU.EX2 R1, R2"), line(0x30, "FFMA R3, R1, R4, R5"),
        line(0x40, "SHFL.BFLY PT, R6, R7, 0x1, 0x1f"), line(0x50, "@P0 BRA 0x10"),
        line(0x60, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT"),
        line(0x70, "MUFU.EX2 R1, R2"), line(0x80, "ISETP.GE.AND P1, PT, R8, R9, PT"),
        line(0x90, "FSEL R1, R1, -INF, P1"), line(0xa0, "FMUL R3, R1, R4"),
        line(0xb0, "WARPGROUP.DEPBAR.LE gsb0, 0x0"), line(0xc0, "@P0 BRA 0x60"),
        line(0xd0, "HGMMA.64x128x16.F32.BF16 R152, R60, gdesc[UR12].tnspB, R152"),
        line(0xe0, "@!P0 BRA 0xd0"), line(0xf0, "EXIT")])
    assert [(a, b) for a, b, _ in loops(listing)] == [(0x10, 0x50), (0x60, 0xc0), (0xd0, 0xe0)]
    mix = kv_loop_mix(listing)
    assert mix["all"] == 5 and mix["warpgroup MMA"] == 1 and mix["exponential"] == 1
    assert mix["FP32 add/mul/fma"] == 1 and mix["shuffle"] == 1 and mix["other"] == 1
    with pytest.raises(ValueError, match="no loop"):
        kv_loop_mix(line(0x10, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT"))


def test_blackwell_builds_or_refuses_by_name_the_packed_d128_binaries():
    """sm_100 (issue 55): tileiras 13.4 cannot build the packed variable-length binaries at
    D=128 with 128-row tiles (24 of `compile --all`'s 272); they are refused by name, before
    the compiler runs, and every other packed binary at D=128 builds. sm_90 is untouched."""
    from wavefront.kernel.arch_support import UnsupportedVariant, unsupported_reason
    varlen = [v for v in all_variants(dtypes=("bfloat16",), head_dims=(128,)) if v.varlen]
    refused = [v for v in varlen if unsupported_reason(v, "sm_100")]
    assert {v.tile_m for v in refused} == {128} and len(refused) == 12, [v.label for v in refused]
    assert not any(unsupported_reason(v, "sm_90") or unsupported_reason(v, "sm_121")
                   for v in varlen)
    for v in refused:
        with pytest.raises(UnsupportedVariant, match=v.label):
            compile_variant(v, "sm_100")
    builds = [v for v in varlen if v not in refused]
    builds.append(replace(refused[0], worker_warps=8))  # the workaround the message names
    for label, resources, _ in _compile_all(builds, "sm_100"):
        assert resources and resources[0].registers, label
