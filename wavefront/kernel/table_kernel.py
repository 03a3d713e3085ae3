"""The work table built on the GPU by one kernel written out from the schedule's own formulas.

A new shape's first call needs its work table on the GPU. Building it with CuPy, operation by
operation, costs ten to twenty kernel launches at 20-80 us of host time each. Here the same
Python formulas (`Launch.table_columns`) run once on *traced* values instead of arrays: every
operation records itself, and the record is printed as the body of one CUDA kernel, one thread
per work item. The schedule is still written once, in `wavefront.schedules`; this module only
knows integer arithmetic.

The launch's integers (`TableShape`: Q tiles, heads, group size, ...) are traced as the kernel's
arguments, so one compiled kernel serves many shapes. Where the formulas branch on one of them
in Python (`if n_chunks == 1`), the trace takes the branch its value picks and records it; the
printed kernel holds only that branch. `table_kernel` keeps each printed kernel with the
branches it took: a later launch of the same schedules and mask reuses it where its integers
take every branch alike, and is traced anew where one goes the other way. The printed source
is the compiled kernel's key.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import threading
from typing import Callable

import numpy as np

from wavefront.schedules import WORK_COLUMNS, Launch, TableShape

# Python's floor division and modulo (C's round toward zero): the formulas are Python's.
_PREAMBLE = r"""
__device__ __forceinline__ long long wf_div(long long a, long long b) {
    long long q = a / b;
    return q - ((a % b != 0) && ((a < 0) != (b < 0)));
}
__device__ __forceinline__ long long wf_mod(long long a, long long b) {
    long long r = a % b;
    return r + (((r != 0) && ((r < 0) != (b < 0))) ? b : 0);
}
"""
KERNEL_NAME = "wavefront_work_table"
THREADS_PER_BLOCK = 256


class Traced:
    """One value of the traced formulas: an operation on earlier values, the item number or a
    launch integer. `value`: the number it stands for where it does not depend on the item
    (a Python branch on it reads it), else None."""

    __slots__ = ("array_module", "op", "args", "value")

    def __init__(self, trace: "Trace", op: str, args: tuple, value):
        # `array_module`: where the formulas find this trace's operations
        # (`schedules._array_module`), as they find NumPy's for an array.
        self.array_module, self.op, self.args, self.value = trace, op, args, value

    def __divmod__(self, other): return self // other, self % other
    def __rdivmod__(self, other): return other // self, other % self
    def __neg__(self): return self.array_module.node("neg", (self,))
    __hash__ = object.__hash__

    def __bool__(self):
        # A branch on a launch integer is taken as its value says; the printed source then
        # holds that branch only, and is the compiled kernel's key.
        if self.value is None:
            raise TypeError("a schedule formula branches in Python on a value that depends on "
                            "the work item; write it with _choose so that it can be traced")
        self.array_module.branches.append((self, bool(self.value)))
        return bool(self.value)


def _operator(op: str, reflected: bool = False):
    if reflected:
        return lambda self, other: self.array_module.node(op, (other, self))
    return lambda self, other: self.array_module.node(op, (self, other))


# Python's operators on traced values record themselves (reflected too: `2 * heads`).
for _name, _op in (("add", "+"), ("sub", "-"), ("mul", "*"), ("floordiv", "//"), ("mod", "%")):
    setattr(Traced, f"__{_name}__", _operator(_op))
    setattr(Traced, f"__r{_name}__", _operator(_op, reflected=True))
for _name, _op in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"),
                   ("ge", ">=")):
    setattr(Traced, f"__{_name}__", _operator(_op))


@dataclasses.dataclass(frozen=True)
class _Op:
    apply: Callable  # on ints and on NumPy arrays alike
    spelling: str  # in C, `{0}`, `{1}`, `{2}` standing for the arguments (long long each)


# Every operation a trace records: how it is worked out, and how it is printed.
_OPS = {
    "+": _Op(operator.add, "{0} + {1}"), "-": _Op(operator.sub, "{0} - {1}"),
    "*": _Op(operator.mul, "{0} * {1}"), "neg": _Op(operator.neg, "-{0}"),
    "//": _Op(operator.floordiv, "wf_div({0}, {1})"),
    "%": _Op(operator.mod, "wf_mod({0}, {1})"),
    "min": _Op(np.minimum, "min({0}, {1})"), "max": _Op(np.maximum, "max({0}, {1})"),
    "where": _Op(np.where, "({0} != 0 ? {1} : {2})"),
    **{op: _Op(compare, f"(long long)({{0}} {op} {{1}})") for op, compare in (
        ("==", np.equal), ("!=", np.not_equal), ("<", np.less), ("<=", np.less_equal),
        (">", np.greater), (">=", np.greater_equal))},
}


# The same operations printed as Python, for `TableKernel.serves` (Python's `//` and `%` are
# the formulas' own).
_PYTHON_SPELLING = {
    "+": "({0} + {1})", "-": "({0} - {1})", "*": "({0} * {1})", "neg": "(-{0})",
    "//": "({0} // {1})", "%": "({0} % {1})", "min": "min({0}, {1})", "max": "max({0}, {1})",
    "where": "({1} if {0} else {2})",
    **{op: f"int({{0}} {op} {{1}})" for op in ("==", "!=", "<", "<=", ">", ">=")},
}


class Trace:
    """The operations recorded while the formulas run on traced values, and the array library
    those values name (`minimum`, `maximum`, `divmod`, `where`). `fused`: each item's K/V span
    is worked out where it stands, not looked up (`Launch._plan`)."""

    fused = True

    def __init__(self, shape: TableShape):
        self.nodes: list[Traced] = []
        self.branches: list[tuple[Traced, bool]] = []  # (condition, the way it went)
        self._known: dict = {}
        self.item = self._leaf("item", None)
        self.parameters = tuple(f.name for f in dataclasses.fields(shape))
        self.shape = TableShape(**{name: self._leaf(name, getattr(shape, name))
                                   for name in self.parameters})

    def _leaf(self, name, value):
        node = Traced(self, "leaf", (name,), value)
        self.nodes.append(node)
        return node

    def node(self, op: str, args: tuple):
        """The value `op(*args)`: a plain int where every argument is one, else recorded once
        (the same operation on the same values is the same node)."""
        if not any(isinstance(a, Traced) for a in args):
            return _OPS[op].apply(*args)
        key = (op, *((id(a),) if isinstance(a, Traced) else int(a) for a in args))
        known = self._known.get(key)
        if known is None:
            values = [a.value if isinstance(a, Traced) else int(a) for a in args]
            known = Traced(self, op, args, None if None in values else _OPS[op].apply(*values))
            self.nodes.append(known)
            self._known[key] = known
        return known

    # What `_minimum`, `_maximum`, `_divmod` and `_choose` call on an array's library.
    def minimum(self, a, b): return self.node("min", (a, b))
    def maximum(self, a, b): return self.node("max", (a, b))
    def divmod(self, a, b): return self.node("//", (a, b)), self.node("%", (a, b))
    def where(self, condition, if_true, if_false):
        return self.node("where", (condition, if_true, if_false))


def _value_of(x, values: dict, done: dict):
    """What traced value `x` comes to for the item number(s) and launch integers in `values`
    (ints or NumPy arrays)."""
    if not isinstance(x, Traced):
        return x
    if id(x) not in done:
        done[id(x)] = (values[x.args[0]] if x.op == "leaf" else
                       _OPS[x.op].apply(*(_value_of(a, values, done) for a in x.args)))
    return done[id(x)]


@dataclasses.dataclass(frozen=True)
class TableKernel:
    """The table kernel of the launches whose formulas branch as `branches` record: its CUDA
    source, and the launch integers it takes, in order."""

    source: str
    parameters: tuple[str, ...]
    branches: tuple  # (traced condition on launch integers, the way it went)
    columns: tuple  # the traced columns (WORK_BATCH .. WORK_CHUNK or WORK_DIAGONAL)
    # `branches` printed as one Python function of the launch integers (`_branch_test`)
    takes_branches: Callable = dataclasses.field(compare=False, repr=False)

    def serves(self, shape: TableShape) -> bool:
        """Whether the formulas, run for `shape`, take the branches this source was printed
        from: one call of a printed function (a new shape's first call asks; walking the
        recorded conditions cost 7-13 us on the CPU, ten times that on a cold first call)."""
        return self.takes_branches(**vars(shape))

    def arguments(self, shape: TableShape) -> tuple[int, ...]:
        return tuple(getattr(shape, name) for name in self.parameters)

    def evaluate(self, shape: TableShape, items: np.ndarray) -> np.ndarray:
        """The rows the kernel writes for `shape` and item numbers `items`, worked out by NumPy
        from the record the source was printed from (the CPU tests compare them with the host
        table)."""
        values = {"item": np.asarray(items, dtype=np.int64), **vars(shape)}
        done: dict = {}
        rows = np.zeros((len(items), WORK_COLUMNS), dtype=np.int64)
        for column, traced in enumerate(self.columns):
            rows[:, column] = _value_of(traced, values, done)
        return rows.astype(np.int32)


def _needed(columns) -> set[int]:
    """ids of the nodes the columns are computed from (a comparison made only for a Python
    branch is not printed)."""
    needed: set[int] = set()
    stack = [c for c in columns if isinstance(c, Traced)]
    while stack:
        x = stack.pop()
        if id(x) not in needed:
            needed.add(id(x))
            stack.extend(a for a in x.args if isinstance(a, Traced))
    return needed


def _branch_test(parameters: tuple[str, ...], nodes: list, branches: tuple) -> Callable:
    """A Python function of the launch integers (by name) that is True where every recorded
    branch goes the way it went: the conditions' operations printed in recording order (each
    argument before its use), compiled once."""
    conditions = [condition for condition, _ in branches]
    needed = _needed(conditions)
    names: dict[int, str] = {}
    lines = []

    def spelled(x):
        return names[id(x)] if isinstance(x, Traced) else repr(int(x))
    for node in nodes:
        if id(node) not in needed:
            continue
        if node.op == "leaf":
            names[id(node)] = node.args[0]
            continue
        names[id(node)] = f"v{len(lines)}"
        lines.append(f"    v{len(lines)} = "
                     + _PYTHON_SPELLING[node.op].format(*map(spelled, node.args)))
    test = " and ".join(f"{'' if went else 'not '}{spelled(condition)}"
                        for condition, went in branches) or "True"
    source = (f"def takes_branches({', '.join(parameters)}):\n"
              + "".join(line + "\n" for line in lines) + f"    return bool({test})\n")
    namespace: dict = {}
    exec(compile(source, "<table_kernel branches>", "exec"), namespace)
    return namespace["takes_branches"]


def trace_table(launch: Launch) -> TableKernel:
    """Run the launch's table formulas on traced values and print them as one kernel (about
    0.2 ms of host time: `table_kernel` keeps what it printed)."""
    trace = Trace(launch.table_shape)
    columns = launch.table_columns(trace.item, trace.shape)
    needed = _needed(columns)
    names: dict[int, str] = {}
    lines = []

    def spelled(x):
        return names[id(x)] if isinstance(x, Traced) else f"{int(x)}LL"
    # Nodes are recorded as they are made: every argument before its use.
    for node in trace.nodes:
        if id(node) not in needed:
            continue
        if node.op == "leaf":
            names[id(node)] = node.args[0]
            continue
        expression = _OPS[node.op].spelling.format(*map(spelled, node.args))
        names[id(node)] = f"v{len(lines)}"
        lines.append(f"        const long long {names[id(node)]} = {expression};")
    values = [spelled(c) for c in columns] + ["0LL"] * (WORK_COLUMNS - len(columns))
    stores = [f"        row[{i}] = make_int4(" + ", ".join(
        f"(int){v}" for v in values[4 * i:4 * i + 4]) + ");" for i in range(WORK_COLUMNS // 4)]
    used = tuple(name for name in trace.parameters
                 if id(getattr(trace.shape, name)) in needed)
    signature = "".join(f", const long long {name}" for name in used)
    source = (_PREAMBLE
              + f'extern "C" __global__ void {KERNEL_NAME}(int4* __restrict__ rows, '
              f"const long long num_items{signature}) {{\n"
              "    for (long long item = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
              "         item < num_items; item += (long long)gridDim.x * blockDim.x) {\n"
              + "".join(line + "\n" for line in lines)
              + f"        int4* row = rows + item * {WORK_COLUMNS // 4};\n"
              + "".join(line + "\n" for line in stores) + "    }\n"
              # The row after the table: the dynamic schedules' counter, zeroed here.
              "    if (blockIdx.x == 0 && threadIdx.x == 0) {\n"
              f"        rows[num_items * {WORK_COLUMNS // 4}] = make_int4(0, 0, 0, 0);\n"
              "    }\n}\n")
    branches = tuple(trace.branches)
    return TableKernel(source, used, branches, tuple(columns),
                       _branch_test(trace.parameters, trace.nodes, branches))


_tables: dict = {}


def table_kernel(launch: Launch) -> TableKernel:
    """The table kernel that serves `launch`: one traced before for the same schedules and
    mask whose branches the launch's integers take alike, else a new trace. (Besides
    `table_shape`, the formulas read only the schedules and the mask.)"""
    key = (launch.cta, launch.kv, launch.problem.causal, launch.problem.causal_alignment)
    for kernel in _tables.get(key, ()):
        if kernel.serves(launch.table_shape):
            return kernel
    kernel = trace_table(launch)
    _tables.setdefault(key, []).append(kernel)  # a list's append holds under the GIL
    return kernel


_compiled: dict = {}
_compiled_lock = threading.Lock()


def _kernel(source: str, device: int):
    """The compiled kernel of `source` on `device` (the current one): CuPy's `Function`,
    compiled by NVRTC once, kept on disk by CuPy across processes and here for this one. The
    function itself, not its `RawKernel`, so that a launch does not look it up again: on a
    new shape's first call, every step costs ten times what it costs warm."""
    kernel = _compiled.get((source, device))
    if kernel is None:
        import cupy
        with _compiled_lock:
            kernel = _compiled.get((source, device))
            if kernel is None:
                kernel = _compiled[(source, device)] = cupy.RawKernel(source,
                                                                      KERNEL_NAME).kernel
    return kernel


@functools.lru_cache(maxsize=None)
def _blocks_for(device: int) -> int:
    """Enough blocks to fill the GPU a few times over; more items loop (grid-stride)."""
    import cupy
    return 8 * cupy.cuda.Device(device).attributes["MultiProcessorCount"]


def build_on_gpu(launch: Launch, device: int):
    """The launch's work table, then one row whose first two numbers are the dynamic
    schedules' item counter, zeroed: a new CuPy array on `device` (the current one), written
    by one kernel on CuPy's current stream; the host does not wait. (One allocation and one
    launch, where a counter of its own cost a second allocation and a memset.)"""
    import cupy
    launch._check_table_size()
    table = table_kernel(launch)
    n = launch.num_items
    rows = cupy.empty((n + 1, WORK_COLUMNS), dtype=cupy.int32)
    blocks = max(1, min(-(-n // THREADS_PER_BLOCK), _blocks_for(device)))
    _kernel(table.source, device)(
        (blocks,), (THREADS_PER_BLOCK,),
        (rows, np.int64(n), *map(np.int64, table.arguments(launch.table_shape))))
    return rows
