"""Point's parameter fields and the kernel levers are each declared once; everything else that
lists them is derived, so a new parameter is one field and a new lever one declaration plus its
use in the kernel. These tests hold the derivations to the declarations."""
import dataclasses
import os

import pytest

from wavefront.cli import main
from wavefront.point import (KERNEL_LEVERS, LEVERS, OPTIONAL_PARAMETER_COLUMNS,
                             PARAMETER_COLUMNS, PARAMS, GpuShape, Point, point_key)
from wavefront.results.store import COLUMNS
from wavefront.results.sweep import GRID_KEYS, REQUIRED_GRID_KEYS, expand_points, parse_spec


def _options(command: str) -> set[str]:
    return {o for p in main.commands[command].params for o in p.opts}


def test_every_parameter_is_a_grid_key_a_results_column_and_a_cli_option():
    assert set(GRID_KEYS) == set(PARAMS)
    assert set(REQUIRED_GRID_KEYS) == {"seqlen", "head_dim", "schedule"}
    for column in (*PARAMETER_COLUMNS, *OPTIONAL_PARAMETER_COLUMNS):
        assert column in COLUMNS
    for command in ("run", "bench", "profile", "simulate"):
        options = _options(command)
        for name in PARAMS:
            assert f"--{name.replace('_', '-')}" in options or (
                name == "tiles" and "--tile" in options), (command, name)


def test_the_point_key_and_the_columns_keep_the_committed_order():
    """Keys in committed results were written in this order; the derived one must match."""
    assert PARAMETER_COLUMNS == ("batch", "heads", "kv_heads", "seqlen", "head_dim", "dtype",
                                 "causal", "tile_m", "tile_n", "occupancy", "cta_schedule",
                                 "kv_schedule", "resident_ctas")
    assert OPTIONAL_PARAMETER_COLUMNS == ("chunk_tiles",)
    gpu = GpuShape(132, 50 << 20)
    point = Point(heads=1, seqlen=4096, head_dim=64)
    assert point.key(gpu) == ("batch=1,heads=1,kv_heads=1,seqlen=4096,head_dim=64,"
                              "dtype=bfloat16,causal=False,tile_m=128,tile_n=64,occupancy=2,"
                              "cta_schedule=persistent,kv_schedule=linear,resident_ctas=264")
    record = {**point.to_record(gpu, "G"), "sms": 132, "l2_bytes": 50 << 20}
    assert Point.from_record(record).key(gpu) == point.key(gpu)
    chunked = Point(seqlen=65536, head_dim=64, schedule="persistent+tiled", chunk_tiles=16)
    assert point_key(chunked.parameters(gpu)).endswith(",chunk_tiles=16")


@pytest.mark.parametrize("name", list(PARAMS))
def test_a_grid_and_the_point_refuse_the_same_values(name):
    """One check per parameter: what Point refuses, a grid refuses too (a zero that means the
    default aside)."""
    p = PARAMS[name]
    for bad in (-1, "x", 1.5, True, [128, 64], 1 << 40):
        if p.zero_default and bad == 0:
            continue
        refused_by_point = True
        try:
            p.check(name, bad)
            refused_by_point = False
        except (ValueError, TypeError):
            pass
        assert refused_by_point == (GRID_KEYS[name](bad) is not None), (name, bad)


def test_every_lever_is_a_point_field_a_variant_field_an_option_and_searched():
    from wavefront.kernel.tuning import CONFIG_FIELDS
    from wavefront.measure.tune import ALL_LEVERS
    point_fields = {f.name: f.default for f in dataclasses.fields(Point)}
    options = _options("bench")
    for lever in LEVERS:
        assert point_fields[lever.name] == lever.default == KERNEL_LEVERS[lever.name]
        assert f"--{lever.name.replace('_', '-')}" in options
        assert lever.name in ALL_LEVERS and lever.name in CONFIG_FIELDS
        assert set(lever.searched) <= set(lever.values) and lever.default in lever.values
        with pytest.raises(ValueError, match=lever.name):
            Point(**{lever.name: max(v for v in lever.values if v is not None) + 1})
    pytest.importorskip("cuda.tile")
    from wavefront.kernel.attention import KernelVariant
    variant_fields = {f.name for f in dataclasses.fields(KernelVariant)}
    assert {lever.name for lever in LEVERS} <= variant_fields
    v = KernelVariant("bfloat16", 64, 128, 64, False, 2, cluster=2, exp2_poly=1)
    assert v.label.endswith("_cluster2_poly1") and v.constants["EXP2_POLY"] == 1


def test_a_chunk_tiles_sweep_expands_to_two_points():
    spec = parse_spec('[grid]\nseqlen = [65536]\nhead_dim = [64]\n'
                      'schedule = ["persistent+tiled"]\nchunk_tiles = [16, 64]\n')
    assert [p.chunk_tiles for p in expand_points(spec)] == [16, 64]


def test_tune_warms_in_as_many_processes_as_the_gpu_memory_holds(monkeypatch):
    """The warming processes are capped by the GPU's free memory as well as the CPUs this
    process may use; never fewer than one."""
    cupy = pytest.importorskip("cupy")
    from wavefront.device import usable_cpus
    from wavefront.measure.tune import WARM_PROCESS_BYTES, _processes_the_gpu_holds
    assert 1 <= usable_cpus() <= (os.cpu_count() or 1)
    gib = 1 << 30
    monkeypatch.setattr(cupy.cuda.runtime, "memGetInfo", lambda: (80 * gib, 80 * gib))
    gqa = Point(batch=4, heads=32, kv_heads=8, seqlen=4096, head_dim=128)
    small = Point(batch=1, heads=2, seqlen=256, head_dim=64)
    assert 1 < _processes_the_gpu_holds(gqa) < _processes_the_gpu_holds(small)
    assert _processes_the_gpu_holds(small) <= 80 * gib // WARM_PROCESS_BYTES
    assert _processes_the_gpu_holds(gqa) * 8 * gib < 80 * gib  # its check took 7.4 GB
    monkeypatch.setattr(cupy.cuda.runtime, "memGetInfo", lambda: (gib // 2, 80 * gib))
    assert _processes_the_gpu_holds(gqa) == 1
