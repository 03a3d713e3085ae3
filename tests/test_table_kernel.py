"""The work table's GPU kernel is printed from the schedule's own formulas run on traced values.
On the CPU: the trace, worked out by NumPy, is the host table row for row; one printed kernel
serves every shape that branches alike and none that does not; the printed source, compiled by
the host's C++ compiler, writes the host table. (The GPU tests compile it with NVRTC and run
it on the GPU.)"""
import random
import shutil
import subprocess

import numpy as np
import pytest

from wavefront.kernel import table_kernel as tk
from wavefront.point import plan
from wavefront.schedules import WORK_DIAGONAL, schedule_names

SHAPES = [  # (q, k): GQA and not, ragged Q tiles, head groups that do not divide the units
    ((2, 6, 333, 64), (2, 3, 333, 64)),
    ((1, 4, 1000, 128), (1, 1, 1000, 128)),
    ((3, 8, 4133, 128), (3, 2, 4133, 128)),
    ((5, 3, 257, 64), (5, 3, 200, 64)),
]


def launch_of(q, k, schedule, causal, sms=5, l2_bytes=1 << 20):
    return plan(q, k, sms=sms, l2_bytes=l2_bytes, causal=causal, schedule=schedule,
                chunk_tiles=3 if "tiled" in schedule else None)


def traced_rows(launch):
    table = tk.table_kernel(launch)
    return table.evaluate(launch.table_shape, np.arange(launch.num_items))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("schedule", schedule_names())
def test_the_traced_table_is_the_host_table(schedule, causal):
    for q, k in SHAPES:
        launch = launch_of(q, k, schedule, causal)
        rows = traced_rows(launch)
        assert rows.dtype == np.int32
        assert np.array_equal(rows, launch.work_table), (schedule, q, k)


def test_one_kernel_serves_every_shape_that_branches_alike():
    """The launch's integers are the kernel's arguments, not constants in its source: shapes
    that take the formulas' branches alike share one source; here, random shapes of each
    schedule, each checked row for row through the kernel it was given."""
    rng = random.Random(5)
    tk._tables.clear()
    launches = 0
    for schedule in schedule_names():
        for _ in range(12):
            kv_heads = rng.choice([1, 2, 3])
            heads = kv_heads * rng.choice([1, 2, 4])
            batch, seqlen = rng.randint(1, 4), rng.randint(1, 3000)
            launch = launch_of((batch, heads, seqlen, 64), (batch, kv_heads, seqlen, 64),
                               schedule, rng.random() < 0.5, sms=rng.randint(1, 9),
                               l2_bytes=rng.choice([1 << 18, 1 << 20, 50 << 20]))
            assert np.array_equal(traced_rows(launch), launch.work_table), (schedule, launch)
            launches += 1
    sources = {k.source for kernels in tk._tables.values() for k in kernels}
    # Each (schedule, mask) prints a few variants (branches on the launch's integers), far
    # fewer than the shapes it served.
    assert len(sources) < launches / 2
    assert all(len(kernels) <= 8 for kernels in tk._tables.values())


def _serves_by_walking(kernel, shape) -> bool:
    """`serves` worked out by walking the recorded conditions: the reference for the printed
    function."""
    done: dict = {}
    return all(bool(tk._value_of(condition, vars(shape), done)) == went
               for condition, went in kernel.branches)


def test_the_printed_branch_test_agrees_with_the_trace():
    """`serves` calls a Python function printed from the recorded conditions; walking the
    record itself is the reference. Random shapes against every kernel printed so far, so
    both answers occur (a kernel that serves none would test nothing)."""
    rng = random.Random(11)
    tk._tables.clear()
    kernels, shapes = [], []
    for schedule in schedule_names():
        for causal in (False, True):
            for _ in range(6):
                batch, kv_heads = rng.randint(1, 3), rng.choice([1, 2, 3])
                seqlen = rng.randint(1, 5000)
                launch = launch_of((batch, kv_heads * rng.choice([1, 2, 4]), seqlen, 128),
                                   (batch, kv_heads, seqlen, 128), schedule, causal,
                                   sms=rng.randint(1, 9), l2_bytes=rng.choice([1 << 18, 1 << 20]))
                kernels.append(tk.table_kernel(launch))
                shapes.append(launch.table_shape)
    answers = [(kernel.serves(shape), _serves_by_walking(kernel, shape))
               for kernel in set(kernels) for shape in shapes]
    assert all(printed == traced for printed, traced in answers)
    assert {printed for printed, _ in answers} == {True, False}
    assert any(kernel.branches for kernel in kernels)


def test_a_kernel_is_not_reused_where_a_branch_goes_the_other_way():
    """`n_chunks == 1` is a Python branch of the tiled schedule's formulas: a launch with one
    chunk and one with several print different kernels, each correct."""
    tk._tables.clear()
    one = plan((1, 4, 1000, 64), (1, 4, 1000, 64), sms=5, l2_bytes=1 << 20,
               schedule="persistent+tiled", chunk_tiles=1000)
    several = plan((1, 4, 1000, 64), (1, 4, 1000, 64), sms=5, l2_bytes=1 << 20,
                   schedule="persistent+tiled", chunk_tiles=3)
    assert one.n_chunks == 1 and several.n_chunks > 1
    assert tk.table_kernel(one) is not tk.table_kernel(several)
    assert not tk.table_kernel(one).serves(several.table_shape)
    for launch in (one, several):
        assert np.array_equal(traced_rows(launch), launch.work_table)


def test_the_printed_source_takes_the_launch_integers_as_arguments():
    launch = launch_of((2, 6, 333, 64), (2, 3, 333, 64), "grouped+sawtooth", True)
    table = tk.table_kernel(launch)
    assert f"__global__ void {tk.KERNEL_NAME}(" in table.source
    for name in table.parameters:
        assert f"const long long {name}" in table.source
    assert "333" not in table.source and table.arguments(launch.table_shape)
    assert set(table.parameters) <= set(vars(launch.table_shape))


def test_a_branch_on_the_work_item_cannot_be_traced():
    """A formula that branched in Python on an item-dependent value would print one branch for
    all items: the trace refuses it (formulas must use `_choose`)."""
    launch = launch_of((1, 2, 256, 64), (1, 2, 256, 64), "persistent+linear", False)
    trace = tk.Trace(launch.table_shape)
    with pytest.raises(TypeError, match="_choose"):
        bool(trace.item % 2)
    assert bool(trace.shape.heads == 2)  # a launch integer has its value: its branch is taken


# The printed source compiled by the host's C++ compiler, CUDA's few names standing in: one
# block of one thread then walks every item (the kernel's grid-stride loop), so the source
# itself, not only its record, is checked against the host table without a GPU.
_HOST_SHIMS = r"""
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
struct int4 { int x, y, z, w; };
static inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
struct Index { long long x; };
static const Index blockIdx{0}, threadIdx{0}, blockDim{1}, gridDim{1};
using std::max;
using std::min;
"""


def _run_on_host(table, shape, num_items, workdir):
    arguments = table.arguments(shape)
    call = ", ".join(["rows", "n", *(f"atoll(argv[{2 + i}])" for i in range(len(arguments)))])
    main = (f"int main(int argc, char** argv) {{\n"
            f"    long long n = atoll(argv[1]);\n"
            f"    int4* rows = (int4*)malloc(sizeof(int4) * {tk.WORK_COLUMNS // 4} * (n + 1));\n"
            f"    memset(rows, 0xf9, sizeof(int4) * {tk.WORK_COLUMNS // 4} * (n + 1));\n"
            f"    {tk.KERNEL_NAME}({call});\n"
            f"    fwrite(rows, sizeof(int4), {tk.WORK_COLUMNS // 4} * (n + 1), stdout);\n"
            f"    return 0;\n}}\n")
    source = workdir / "table.cpp"
    source.write_text(_HOST_SHIMS + table.source + main)
    binary = workdir / "table"
    subprocess.run(["c++", "-std=c++17", "-O1", "-o", str(binary), str(source)], check=True,
                   capture_output=True)
    out = subprocess.run([str(binary), str(num_items), *map(str, arguments)], check=True,
                         capture_output=True).stdout
    return np.frombuffer(out, dtype=np.int32).reshape(num_items + 1, tk.WORK_COLUMNS)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
@pytest.mark.parametrize("causal", [False, True])
def test_the_printed_source_compiled_on_the_host_writes_the_host_table(causal, tmp_path):
    for schedule in schedule_names():
        launch = launch_of((2, 6, 333, 64), (2, 3, 333, 64), schedule, causal)
        rows = _run_on_host(tk.table_kernel(launch), launch.table_shape, launch.num_items,
                            tmp_path)
        assert np.array_equal(rows[:-1], launch.work_table), schedule
        assert rows[-1, :2].tolist() == [0, 0], schedule  # the dynamic schedules' counter


# Bottom-right causal masks: the diagonal (seqlen_kv - seqlen_q) is a launch integer of the
# trace, so the printed kernel takes it as an argument and writes it into every row.
UNEQUAL_SHAPES = [((2, 6, 333, 64), (2, 3, 1000, 64)), ((1, 4, 1000, 128), (1, 1, 257, 128)),
                  ((3, 2, 1, 64), (3, 2, 4133, 64)), ((5, 3, 257, 64), (5, 3, 257, 64))]


def bottom_right_launch(q, k, schedule, sms=5, l2_bytes=1 << 20):
    return plan(q, k, sms=sms, l2_bytes=l2_bytes, causal=True, schedule=schedule,
                chunk_tiles=3 if "tiled" in schedule else None,
                causal_alignment="bottom_right")


@pytest.mark.parametrize("schedule", schedule_names())
def test_the_traced_table_is_the_host_table_bottom_right(schedule):
    for q, k in UNEQUAL_SHAPES:
        launch = bottom_right_launch(q, k, schedule)
        rows = traced_rows(launch)
        assert np.array_equal(rows, launch.work_table), (schedule, q, k)
        assert (rows[:, WORK_DIAGONAL] == k[2] - q[2]).all()
    # one printed kernel per schedule serves other diagonals: it is an argument
    kernel = tk.table_kernel(bottom_right_launch(*UNEQUAL_SHAPES[0], schedule))
    assert "diagonal" in kernel.parameters
    top = plan(*UNEQUAL_SHAPES[0], sms=5, l2_bytes=1 << 20, causal=True, schedule=schedule,
               chunk_tiles=3 if "tiled" in schedule else None)
    assert tk.table_kernel(top) is not kernel  # the alignment is part of the kernel's key


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
def test_the_printed_bottom_right_source_compiled_on_the_host_writes_the_host_table(tmp_path):
    for schedule in schedule_names():
        for q, k in UNEQUAL_SHAPES[:2]:
            launch = bottom_right_launch(q, k, schedule)
            rows = _run_on_host(tk.table_kernel(launch), launch.table_shape, launch.num_items,
                                tmp_path)
            assert np.array_equal(rows[:-1], launch.work_table), schedule
