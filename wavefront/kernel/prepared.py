"""A prepared launch: a launcher's kernel exported once for its arguments and launched through
the CUDA driver from an argument buffer packed once.

`ct.launch` derives every argument's constraints anew on each launch, to find (or compile) the
specialisation they fit: 8.4 us of host time for the attention kernel's 28 arguments on the
H100 hosts (data/public_call/launch_cost/), about what the kernel runs at B1 H8 S1k. A
launcher's arguments keep their shapes, strides and dtypes from launch to launch (the public
call's cache key says so), and only the addresses of q, k, v, out and the LSE change. So:

- the signature is the one the JIT derives from the launcher's arguments
  (`KernelSignature.from_kernel_args`, in cuTile's documented calling convention
  `cutile_python_v2`);
- its binary is the one the JIT compiled for it, recorded as the JIT made it
  (`record_jit_binaries`), else exported as a cubin (`export_kernel`: the same bytecode, which
  cuTile's disk cache holds once the JIT has compiled it, but its front end runs again to make
  it); either is loaded once per signature, GPU and process;
- the argument buffer is packed once in that calling convention (an array is its base address,
  then its shape, then its strides; a scalar is its value; constants are left out);
- a launch checks the new addresses against what the signature assumes of them (their
  alignment), writes them into the buffer and calls `cuLaunchKernel`.

What this does not cover (other constraint kinds, another calling convention, a binary not
recorded while cuTile's disk cache is off, where the export would compile again) raises
`Unprepared` when preparing, and the launcher keeps `ct.launch`; so do cluster launches, which
the launcher does not prepare (`cuLaunchKernel` takes no cluster shape).
"""
from __future__ import annotations

import ctypes
import functools
import io
import operator
import threading
from collections import OrderedDict


class Unprepared(Exception):
    """This launch cannot be prepared; the caller launches with `ct.launch`."""


# The calling convention's C type of a scalar or index, by cuTile dtype name.
_C_TYPES = {"int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint32": ctypes.c_uint32,
            "uint64": ctypes.c_uint64, "float32": ctypes.c_float, "float64": ctypes.c_double,
            "bool_": ctypes.c_bool, "bool": ctypes.c_bool}

# A tile kernel's block is the compiler's to choose: it is launched with a block of one
# thread and no dynamic shared memory (as cuTile's own test of an exported cubin launches it).
_BLOCK = (1, 1, 1)
_SHARED_BYTES = 0


def _c_type(dtype):
    found = _C_TYPES.get(getattr(dtype, "name", str(dtype)))
    if found is None:
        raise Unprepared(f"no C type for a {dtype} argument")
    return found


def _array_parts(array) -> tuple[int, tuple, tuple]:
    """(base address, shape, strides in elements) of a launch argument: a torch tensor, a CuPy
    array or anything with a CUDA Array Interface (a launcher's own described arrays)."""
    if type(array).__module__.split(".")[0] == "torch":
        return array.data_ptr(), tuple(array.shape), tuple(array.stride())
    described = getattr(array, "__cuda_array_interface__", None)
    if described is None:
        raise Unprepared(f"cannot read the address of a {type(array).__name__} argument")
    shape = tuple(described["shape"])
    item = int(described["typestr"][2:])
    strides = described.get("strides")  # None: C-contiguous, as the interface defines
    strides = (contiguous_strides(shape) if strides is None
               else tuple(s // item for s in strides))
    return described["data"][0], shape, strides


def contiguous_strides(shape: tuple) -> tuple:
    """Row-major strides of `shape`, in elements (a loop: NumPy costs tens of microseconds on
    a first call, for four numbers)."""
    strides, stride = [], 1
    for size in reversed(shape):
        strides.append(stride)
        stride *= size
    return tuple(reversed(strides))


class _Driver:
    """The few driver calls a prepared launch needs, through ctypes (loading, once per
    signature and GPU) and CuPy's binding of cuLaunchKernel (each launch)."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        handle_out = ctypes.POINTER(ctypes.c_void_p)
        self.load_data = lib.cuLibraryLoadData
        self.load_data.argtypes = [handle_out, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_uint]
        self.get_kernel = lib.cuLibraryGetKernel
        self.get_kernel.argtypes = [handle_out, ctypes.c_void_p, ctypes.c_char_p]
        self.get_function = lib.cuKernelGetFunction
        self.get_function.argtypes = [handle_out, ctypes.c_void_p]
        from cupy_backends.cuda.api.driver import launchKernel
        self.launch = launchKernel

    def function(self, cubin: bytes, symbol: str, device: int) -> int:
        """The kernel `symbol` of `cubin`, as a function of `device`'s primary context: a
        function launches 0.7 us sooner than the context-free kernel handle, which the driver
        resolves on every launch (5.3 against 6.0 us on the H100 host)."""
        import cupy
        library, kernel, function = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        rc = self.load_data(ctypes.byref(library), cubin, None, None, 0, None, None, 0)
        if rc:
            raise Unprepared(f"cuLibraryLoadData failed ({rc})")
        rc = self.get_kernel(ctypes.byref(kernel), library, symbol.encode())
        if rc:
            raise Unprepared(f"cuLibraryGetKernel({symbol}) failed ({rc})")
        with cupy.cuda.Device(device):
            rc = self.get_function(ctypes.byref(function), kernel)
        if rc:
            raise Unprepared(f"cuKernelGetFunction failed ({rc})")
        return function.value


_driver: _Driver | None = None
# (kernel object, the signature's constraints, GPU) -> (the loaded function, its symbol): a
# launcher's copies (other streams, other lengths of a packed batch) and every launcher of one
# specialisation share it. Keyed by the constraints' repr (60 us on the H100 host), not by the
# mangled symbol, which spells them out too but takes cuTile 1.2 ms to work out: it is made
# only to export (the JIT's own name, so the export's bytecode is the JIT's).
_loaded: dict = {}
_loaded_lock = threading.Lock()
_UNNAMED = "unnamed"  # the symbol asked of from_kernel_args, which skips mangling
# (kernel object, the signature's constraints' repr, compute capability as "90") -> (cubin,
# symbol): what cuTile's JIT compiled for a kernel in this process (`record_jit_binaries`), the
# latest JIT_BINARIES_KEPT of them (an attention cubin is about 266 KB; a sweep compiles
# hundreds of specialisations, and one dropped is exported instead, if ever prepared).
_jit_binaries: OrderedDict = OrderedDict()
JIT_BINARIES_KEPT = 128


def record_jit_binaries(kernel) -> None:
    """Have cuTile's JIT keep, for `kernel` (a `ct.kernel`), each binary it compiles (or finds
    in its disk cache) in this process, so that preparing loads the JIT's own binary instead
    of exporting it. The export runs cuTile's whole front end again to make the bytecode its
    cache is keyed by: the 64th call of the public call took 97-165 ms on the H100 hosts, and
    with the disk cache off it compiled the kernel again (1.1-1.8 s;
    data/public_call/RUNS.md.gz#441ca57). The JIT compiles through the kernel's `_compile` method,
    looked up on the instance (seen on cuTile 1.7.0), so the instance's own wraps it; where
    cuTile has no such method, or compiled before this, the export stays. Idempotent; call it
    before the kernel's first launch."""
    compile_ = getattr(kernel, "_compile", None)
    if compile_ is None or getattr(compile_, "records_jit_binaries", False):
        return

    def compile_and_record(signature, context, compute_capability=None, *rest, **options):
        result = compile_(signature, context, compute_capability, *rest, **options)
        try:
            cubin, symbol = result[0], result[1]
            if compute_capability is None:  # the JIT's default, as `_compile` takes it
                from cuda.tile._cext import get_compute_capability
                compute_capability = get_compute_capability()
            major, minor = compute_capability
            _jit_binaries[(kernel, repr(signature.parameters), f"{major}{minor}")] = (
                bytes(cubin), str(symbol))
            while len(_jit_binaries) > JIT_BINARIES_KEPT:
                _jit_binaries.popitem(last=False)
        except Exception:  # noqa: BLE001  (recording is an optimisation: the export stays)
            pass
        return result
    compile_and_record.records_jit_binaries = True
    try:
        kernel._compile = compile_and_record
    except (AttributeError, TypeError):
        pass


def _loaded_function(kernel, signature, name: str, device: int,
                     compile_ok: bool = False) -> tuple[int, str, str, bytes]:
    """-> (the kernel's function for `signature` on `device`, its symbol, where its binary came
    from: "jit" or "export", the binary), loaded once per process. `compile_ok`: export even
    with cuTile's disk cache off (a signature the JIT never compiles)."""
    global _driver
    key = (kernel, repr(signature.parameters), device)
    found = _loaded.get(key)
    if found is not None:
        return found
    with _loaded_lock:
        if key not in _loaded:
            code = gpu_code(device)
            found = _jit_binaries.get((kernel, key[1], code[len("sm_"):]))
            if found is not None:
                cubin, symbol = found
            else:
                if not (compile_ok or disk_cache_on()):
                    raise Unprepared("cuTile's disk cache is off (CUDA_TILE_CACHE_DIR) and the "
                                     "JIT's binary was not recorded: exporting it would "
                                     "compile the kernel again, inside a call")
                from cuda.tile.compilation import export_kernel
                named = signature.with_mangled_symbol(name)
                buffer = io.BytesIO()
                export_kernel(kernel, [named], buffer, gpu_code=code, output_format="cubin")
                cubin, symbol = buffer.getvalue(), named.symbol
            if _driver is None:
                _driver = _Driver()
            _loaded[key] = (_driver.function(cubin, symbol, device), symbol,
                            "jit" if found is not None else "export", cubin)
        return _loaded[key]


def disk_cache_on() -> bool:
    """Whether cuTile keeps compiled binaries on disk, where the export finds the JIT's (its
    default; `CUDA_TILE_CACHE_DIR=off` turns it off). Read from cuTile's default context's
    configuration, which is not public API: where it cannot be read, assumed on."""
    try:
        from cuda.tile._cext import default_tile_context
        return default_tile_context.config.cache_dir is not None
    except (ImportError, AttributeError):
        return True


def pack_arguments(signature, args: tuple, per_call: int):
    """The launch's arguments in `signature`'s calling convention (cutile_python_v2): ->
    (C values in order, one C array of the first `per_call` parameters' addresses, which the
    values include, the alignment the signature assumes of each of those addresses)."""
    from cuda.tile.compilation import ArrayConstraint, ConstantConstraint, ScalarConstraint
    if signature.calling_convention.name != "cutile_python_v2":
        raise Unprepared(f"calling convention {signature.calling_convention.name}")
    # One array for the per-call addresses, so that a launch writes them in one assignment.
    addresses = (ctypes.c_uint64 * per_call)()
    values, alignment = [], []
    for i, (constraint, arg) in enumerate(zip(signature.parameters, args, strict=True)):
        if isinstance(constraint, ConstantConstraint):
            continue
        if isinstance(constraint, ScalarConstraint):
            values.append(_c_type(constraint.dtype)(arg))
        elif isinstance(constraint, ArrayConstraint):
            address, shape, strides = _array_parts(arg)
            if len(shape) != constraint.ndim:
                raise Unprepared(f"parameter {i}: {len(shape)} dimensions, signature "
                                 f"{constraint.ndim}")
            index = _c_type(constraint.index_dtype)
            if i < per_call:
                slot = ctypes.c_uint64.from_buffer(addresses, 8 * i)
                alignment.append(constraint.base_addr_divisible_by)
            else:
                slot = ctypes.c_uint64(address)
            slot.value = address
            values += [slot, *map(index, shape), *map(index, strides)]
        else:
            raise Unprepared(f"a {type(constraint).__name__} parameter")
    if len(alignment) != per_call:
        raise Unprepared("every per-call parameter must be an array")
    return values, addresses, alignment


class PreparedLaunch:
    """One launcher's kernel and argument buffer; `launch` takes the per-call arrays'
    addresses. `per_call` leading parameters change from call to call (their addresses only)."""

    def __init__(self, kernel, name: str, args: tuple, per_call: int, grid: tuple,
                 device: int, free_shapes: tuple[int, ...] = ()):
        """`kernel` (a `ct.kernel`) of the Python function called `name`, launched with
        `args` on `grid` on GPU `device`. Takes about 0.4 ms of host time (cuTile derives the
        signature: 0.27 ms on the H100 host), so launchers prepare only once used a while.

        `free_shapes`: parameters (indices) whose shapes the binary must not bake in. The JIT
        compiles a dimension it sees of size 1 (one head, a batch of one) as a constant, and
        that alone can change the compiler's register allocation (`experiments/binary_spills.py`);
        these parameters' shape constants are dropped from the signature the binary is
        exported for (compiled here, not the JIT's). The argument buffer is the same: the
        calling convention passes every array's shape whatever the binary assumes of it."""
        from cuda.tile.compilation import CallingConvention, KernelSignature
        signature = KernelSignature.from_kernel_args(
            kernel, args, CallingConvention.cutile_python_v2(), symbol=_UNNAMED)
        binary_signature = signature
        if free_shapes:
            import dataclasses
            params = list(signature.parameters)
            for i in free_shapes:
                params[i] = dataclasses.replace(params[i], shape_constant=None)
            binary_signature = dataclasses.replace(signature, parameters=params)
        values, addresses, alignment = pack_arguments(signature, args, per_call)
        # Each address must be divisible by what the signature assumes (powers of two): a
        # launch tests them all at once against the largest, then one by one if that fails.
        if any(a & (a - 1) for a in alignment):
            raise Unprepared(f"alignments {alignment} are not powers of two")
        self.signature = binary_signature
        # binary_from: "jit" (the binary the JIT compiled, recorded) or "export"
        self.function, self.symbol, self.binary_from, self.cubin = _loaded_function(
            kernel, binary_signature, name, device, compile_ok=bool(free_shapes))
        self._values = values  # the buffer points into these: they live as long as it does
        self._buffer = (ctypes.c_void_p * len(values))(*map(ctypes.addressof, values))
        self._buffer_address = ctypes.addressof(self._buffer)
        self._addresses = addresses
        self._masks = tuple(a - 1 for a in alignment)
        self._mask = max(self._masks)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self._lock = threading.Lock()
        self._launch = _driver.launch

    def launch(self, stream: int, addresses: tuple) -> bool:
        """Launch on the raw stream handle `stream` with these per-call addresses (in
        parameter order) -> True; False, launching nothing, where an address breaks the
        signature's alignment assumption (the caller launches with `ct.launch`)."""
        if functools.reduce(operator.or_, addresses) & self._mask and any(
                a & m for a, m in zip(addresses, self._masks)):
            return False
        gx, gy, gz = self.grid
        with self._lock:  # the buffer is shared: written and launched as one
            self._addresses[:] = addresses
            self._launch(self.function, gx, gy, gz, *_BLOCK, _SHARED_BYTES, stream,
                         self._buffer_address, 0)
        return True


def gpu_code(device: int) -> str:
    """The JIT's target name for `device` (e.g. "sm_90"): the export must match it, or the
    binary is another compile."""
    import cupy
    return f"sm_{cupy.cuda.Device(device).compute_capability}"
