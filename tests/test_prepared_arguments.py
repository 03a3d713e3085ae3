"""The prepared launch's argument buffer, on the CPU: the attention kernel's ahead-of-time
signature and stand-in arrays, packed in cuTile's documented calling convention
(cutile_python_v2: an array is its address, its shape, its strides; a scalar its value;
constants are left out)."""
import ctypes

import pytest

from wavefront.kernel.attention import ATTENTION_PARAMS, KernelVariant
from wavefront.kernel.prepared import Unprepared, pack_arguments


class FakeArray:
    """An array as `ct.launch` takes it, by its CUDA Array Interface (no GPU needed)."""

    def __init__(self, address, shape, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (address, False), "strides": strides,
                                         "version": 2}


def _arguments(variant):
    args = []
    for n, p in enumerate(ATTENTION_PARAMS):
        if p.kind == "array":
            shape = (2, 3, 256, 64)[-p.ndim:] if p.ndim == 4 else (5, 7, 9)[:p.ndim]
            args.append(FakeArray(0x10000 * (n + 1), shape, "<i2" if p.dtype == "io" else "<f4"))
        elif p.kind == "scalar":
            args.append(0.125 if p.dtype == "float32" else 11 + n)
        else:
            args.append(variant.constants[p.name])
    return tuple(args)


def test_arrays_are_address_shape_strides_and_constants_are_left_out():
    variant = KernelVariant(dtype="bfloat16", head_dim=64, tile_m=128, tile_n=64, causal=True,
                            occupancy=2)
    signature = variant.signature()
    args = _arguments(variant)
    values, addresses, alignment = pack_arguments(signature, args, 5)
    expected = []
    for p, arg in zip(ATTENTION_PARAMS, args):
        if p.kind == "array":
            shape = arg.__cuda_array_interface__["shape"]
            strides, stride = [], 1
            for size in reversed(shape):
                strides.insert(0, stride)
                stride *= size
            expected += [arg.__cuda_array_interface__["data"][0], *shape, *strides]
        elif p.kind == "scalar":
            expected.append(arg)
    assert [v.value for v in values] == pytest.approx(expected)
    n_constants = sum(p.kind == "constant" for p in ATTENTION_PARAMS)
    assert n_constants > 0 and len(values) == len(expected)
    # int32 indices (the signature's index dtype), a float32 scale, 64-bit addresses
    assert {type(v) for v in values} == {ctypes.c_uint64, ctypes.c_int32, ctypes.c_float}
    # the per-call addresses are one array the values point into, in parameter order
    assert list(addresses) == [0x10000 * (n + 1) for n in range(5)]
    addresses[2] = 0x1234560
    assert 0x1234560 in [v.value for v in values]
    assert alignment == [16] * 5


def test_strides_given_in_bytes_become_elements():
    variant = KernelVariant(dtype="bfloat16", head_dim=64, tile_m=128, tile_n=64, causal=False,
                            occupancy=2)
    args = list(_arguments(variant))
    # q as a (2, 3, 256, 64) bfloat16 view of a (2, 256, 3, 64) buffer
    args[0] = FakeArray(0x40000, (2, 3, 256, 64), "<i2", (256 * 3 * 64 * 2, 64 * 2,
                                                          3 * 64 * 2, 2))
    values, _, _ = pack_arguments(variant.signature(), tuple(args), 5)
    assert [v.value for v in values[:9]] == [0x40000, 2, 3, 256, 64, 256 * 3 * 64, 64, 192, 1]


def test_a_parameter_kind_it_cannot_pack_is_refused():
    variant = KernelVariant(dtype="bfloat16", head_dim=64, tile_m=128, tile_n=64, causal=False,
                            occupancy=2)
    args = list(_arguments(variant))
    args[0] = object()  # no address to read
    with pytest.raises(Unprepared, match="address"):
        pack_arguments(variant.signature(), tuple(args), 5)


def test_what_a_direct_call_is_checked_against():
    """A bound launcher's direct call takes its prepared launch only for arrays laid out as
    those it prepared from (type, shape, strides, dtype) and an out apart from q, k and v:
    the pieces of that check, on host arrays."""
    import numpy as np

    from wavefront.kernel.arrays import _layout, _overlaps_an_input
    q = np.zeros((1, 2, 8, 4), np.float16)
    other_strides = np.zeros((1, 8, 2, 4), np.float16).transpose(0, 2, 1, 3)
    assert _layout([q]) == _layout([np.ones_like(q)])
    assert _layout([q]) != _layout([other_strides])
    assert _layout([q]) != _layout([q.astype(np.float32)])
    assert _layout([q]) != _layout([q[:, :1]])
    # byte ranges [start, end): q, k, v, then out
    apart = [(0, 100), (100, 200), (200, 300), (300, 400)]
    assert not _overlaps_an_input(apart)
    assert _overlaps_an_input(apart[:3] + [(0, 100)])  # out is q
    assert _overlaps_an_input(apart[:3] + [(299, 310)])  # one byte of v
    assert not _overlaps_an_input(apart[:3] + [(400, 500)])


def test_no_preparing_where_cutiles_disk_cache_is_off(monkeypatch):
    """With cuTile's disk cache off, exporting the binary would compile the kernel again inside
    the 64th call (seconds of tileiras): preparing refuses before exporting, naming why, and
    the launcher keeps ct.launch."""
    import types

    from cuda.tile._cext import default_tile_context

    from wavefront.kernel import prepared
    assert prepared.disk_cache_on() == (default_tile_context.config.cache_dir is not None)
    monkeypatch.setattr(default_tile_context.config, "cache_dir", None)
    assert not prepared.disk_cache_on()

    def no_export(*args, **kwargs):
        raise AssertionError("exported with the disk cache off")
    monkeypatch.setattr("cuda.tile.compilation.export_kernel", no_export)
    monkeypatch.setattr(prepared, "gpu_code", lambda device: "sm_90")
    signature = types.SimpleNamespace(parameters=("a constraint",))
    with pytest.raises(Unprepared, match="disk cache is off"):
        prepared._loaded_function(object(), signature, "flash_attention_fwd", 0)


class FakeKernel:
    """A `ct.kernel` as far as the JIT's compiling goes: its `_compile` method."""

    def __init__(self):
        self.compiled = 0

    def _compile(self, signature, context, compute_capability=None):
        self.compiled += 1
        return b"the JIT's cubin", "flash_attention_fwd_Kt2", None, ()


def test_preparing_loads_the_binary_the_jit_compiled(monkeypatch):
    """The JIT's binaries are recorded as it compiles them (its `_compile`, wrapped once
    however often asked), and preparing loads the recorded one: no export (which runs the
    front end again, or with the disk cache off compiles again), even with the cache off."""
    import types

    from cuda.tile._cext import default_tile_context

    from wavefront.kernel import prepared
    kernel = FakeKernel()
    prepared.record_jit_binaries(kernel)
    wrapped = kernel._compile
    prepared.record_jit_binaries(kernel)
    assert kernel._compile is wrapped
    signature = types.SimpleNamespace(parameters=("a constraint",))
    result = kernel._compile(signature, "a context", (9, 0))
    assert result[:2] == (b"the JIT's cubin", "flash_attention_fwd_Kt2") and kernel.compiled == 1
    assert prepared._jit_binaries[(kernel, repr(signature.parameters), "90")] == result[:2]

    loaded = []

    class FakeDriver:
        def function(self, cubin, symbol, device):
            loaded.append((cubin, symbol, device))
            return 1234

    def no_export(*args, **kwargs):
        raise AssertionError("exported a binary the JIT had compiled")
    monkeypatch.setattr("cuda.tile.compilation.export_kernel", no_export)
    monkeypatch.setattr(default_tile_context.config, "cache_dir", None)
    monkeypatch.setattr(prepared, "_driver", FakeDriver())
    monkeypatch.setattr(prepared, "gpu_code", lambda device: "sm_90")
    got = prepared._loaded_function(kernel, signature, "flash_attention_fwd", 3)
    assert got == (1234, "flash_attention_fwd_Kt2", "jit", b"the JIT's cubin")
    assert loaded == [(b"the JIT's cubin", "flash_attention_fwd_Kt2", 3)]
    # only the latest JIT_BINARIES_KEPT are kept
    monkeypatch.setattr(prepared, "JIT_BINARIES_KEPT", 2)
    for n in range(3):
        kernel._compile(types.SimpleNamespace(parameters=(f"other {n}",)), "a context", (9, 0))
    assert [key[1] for key in prepared._jit_binaries if key[0] is kernel] == [
        repr(("other 1",)), repr(("other 2",))]
    # another GPU architecture: not what the JIT compiled, so not that binary
    monkeypatch.setattr(prepared, "gpu_code", lambda device: "sm_100")
    with pytest.raises(Unprepared, match="disk cache is off"):
        prepared._loaded_function(kernel, signature, "flash_attention_fwd", 4)
