"""Host cost of the public call's first use of a shape: the work table alone (built on the host
by NumPy, and on the GPU by the kernel printed from the same formulas, as the public call
builds it), and the whole first call (launcher and table; the kernels compiled beforehand) on
an idle GPU, behind queued work, and for shapes never called before.

    python scripts/call_cost.py [--json PATH]

Prints medians of 7 tries. The repeated call's cost is measured by `wavefront bench` (column
"host us/call", contender "api"), in the same rounds as the bound launcher and cuDNN.
"""
import json
import statistics
import sys
import time

from wavefront.point import plan

SHAPES = {  # about 100k work items each (128-row Q tiles)
    "B4 H32 S96k D128": ((4, 32, 98304, 128), (4, 32, 98304, 128)),
    "B8 H32 KV8 S48k D128": ((8, 32, 49152, 128), (8, 8, 49152, 128)),
}
SCHEDULES = ("persistent+linear", "grouped_dynamic+sawtooth", "longest_first+linear")


def median_ms(fn, tries=7):
    times = []
    for _ in range(tries):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def table_rows():
    rows = []
    for shape, (q, k) in SHAPES.items():
        for schedule in SCHEDULES:
            for causal in (False, True):
                def build():
                    return plan(q, k, sms=132, l2_bytes=50 << 20, causal=causal,
                                schedule=schedule).work_table
                items = len(build())
                rows.append({"what": "work table (host, NumPy)", "shape": shape,
                             "schedule": schedule, "causal": causal, "items": items,
                             "ms": median_ms(build)})
    return rows


def gpu_table_rows():
    """The same tables written on the GPU by the kernel printed from the formulas: the host's
    time to trace and print a new variant; the first use of its source in this process (NVRTC,
    or CuPy's disk cache); the host's time to issue a build whose kernel is known; the time
    until the table is there (issue + GPU); and the build as the launcher makes it (with the
    counter's memset and the event), each checked against the host table first."""
    import cupy
    import numpy as np

    from wavefront.kernel import launcher as L
    from wavefront.kernel import table_kernel as tk
    rows = []
    stream = cupy.cuda.Stream(non_blocking=True)
    for shape, (q, k) in SHAPES.items():
        view = L._ArrayView("cupy", q, "bfloat16", 0, ())
        for schedule in SCHEDULES:
            for causal in (False, True):
                launch = plan(q, k, sms=132, l2_bytes=50 << 20, causal=causal,
                              schedule=schedule)

                def first_use():
                    tk._tables.clear()
                    tk._compiled.clear()
                    with stream:
                        tk.build_on_gpu(launch, 0)
                    stream.synchronize()
                began = time.perf_counter()
                first_use()
                first_ms = (time.perf_counter() - began) * 1e3
                with stream:
                    built = tk.build_on_gpu(launch, 0).get()
                stream.synchronize()
                assert np.array_equal(built[:-1], launch.work_table), (shape, schedule)
                assert built[-1, :2].tolist() == [0, 0]

                def issue():
                    with stream:
                        return tk.build_on_gpu(launch, 0)

                def ready():
                    issue()
                    stream.synchronize()

                def as_launcher_builds():
                    return L._device_work_table(view, launch)
                base = {"shape": shape, "schedule": schedule, "causal": causal,
                        "items": launch.num_items}
                rows.append({"what": "table kernel: first use in a process (once)", **base,
                             "ms": first_ms})
                for what, fn in (("table kernel: trace and print (host)",
                                  lambda: tk.trace_table(launch)),
                                 ("table kernel: host issue", issue),
                                 ("table kernel: until ready", ready),
                                 ("table kernel: as the launcher builds it",
                                  as_launcher_builds)):
                    rows.append({"what": what, **base, "ms": median_ms(fn)})
                    stream.synchronize()
    return rows


def compiled_shapes():
    """(shape name, q, k, v, causal) of every shape and mask, the kernel compiled for it."""
    import torch

    import wavefront
    for shape, (qs, ks) in SHAPES.items():
        q = torch.randn(qs, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(ks, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(ks, device="cuda", dtype=torch.bfloat16)
        for causal in (False, True):
            wavefront.attention(q, k, v, causal=causal)  # compiles the kernel once
            torch.cuda.synchronize()
            yield shape, q, k, v, causal


def first_call_ms(q, k, v, causal, queue_work=None):
    """Host time of one first call (launcher cache cleared, the GPU idle, then `queue_work()`
    if given), in ms."""
    import torch

    import wavefront
    from wavefront.kernel.launcher import clear_launcher_cache
    clear_launcher_cache()
    torch.cuda.synchronize()
    if queue_work is not None:
        queue_work()
    began = time.perf_counter()
    wavefront.attention(q, k, v, causal=causal)
    elapsed = (time.perf_counter() - began) * 1e3
    torch.cuda.synchronize()
    return elapsed


def first_call_rows():
    import torch
    busy = torch.randn(8192, 8192, device="cuda")

    def queue_matmuls():
        for _ in range(8):
            busy @ busy  # about 10 ms of GPU work queued
    rows = []
    for shape, q, k, v, causal in compiled_shapes():
        # On an idle GPU, and behind queued work: a model's first call finds the GPU busy with
        # earlier layers.
        for what, queue_work in (("first call (host, kernel compiled)", None),
                                 ("first call (host, GPU busy)", queue_matmuls)):
            rows.append({"what": what, "shape": shape, "schedule": "tuned", "causal": causal,
                         "ms": statistics.median(first_call_ms(q, k, v, causal, queue_work)
                                                 for _ in range(7))})
        # Shapes never called before (128 to 896 rows shorter): nothing of theirs is cached
        # but the compiled kernels, which are the same kernels as the full shape's.
        times = [first_call_ms(q[:, :, :-128 * j].contiguous(), k[:, :, :-128 * j].contiguous(),
                               v[:, :, :-128 * j].contiguous(), causal) for j in range(1, 8)]
        rows.append({"what": "first call (host, a shape never called)", "shape": shape,
                     "schedule": "tuned", "causal": causal, "ms": statistics.median(times)})
    return rows


def first_call_parts_rows():
    """Where a first call's host time goes, by part (medians of 7 first calls, each part timed
    by a wrapper around it; parts nest: the launcher's construction holds the table's)."""
    from wavefront.kernel import launcher as L
    parts = {}

    def wrap(owner, name, label):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                parts.setdefault(label, 0.0)
                parts[label] += time.perf_counter() - began
        setattr(owner, name, timed)
    for owner, name, label in (
            (L, "_check_inputs", "check inputs"), (L, "resolve_config", "tuned config"),
            (L, "plan", "plan (Launch)"), (L.AttentionLauncher, "__init__", "launcher"),
            (L, "_device_work_table", "  work table (GPU)"), (L, "_stand_in", "  stand-ins"),
            (L, "_zeros", "  zeros"), (L, "_described", "  descriptions"),
            (L.KernelVariant, "kernel", "  kernel object"),
            (L.AttentionLauncher, "__call__", "first launch")):
        wrap(owner, name, label)
    rows = []
    for shape, q, k, v, causal in compiled_shapes():
        samples = []
        for _ in range(7):
            parts.clear()
            whole_ms = first_call_ms(q, k, v, causal)
            samples.append({**{label: t * 1e3 for label, t in parts.items()},
                            "whole call": whole_ms})
        for label in samples[0]:
            rows.append({"what": f"first call part: {label}", "shape": shape,
                         "schedule": "tuned", "causal": causal,
                         "ms": statistics.median(x.get(label, 0.0) for x in samples)})
    return rows


if __name__ == "__main__":
    rows = table_rows()
    if "--no-gpu" not in sys.argv:
        rows += gpu_table_rows() + first_call_rows() + first_call_parts_rows()
    for r in rows:
        print(f"{r['what']:40s} {r['shape']:22s} {r['schedule']:26s} causal={r['causal']!s:5s} "
              f"{r.get('items', ''):>7} {r['ms']:8.2f} ms")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(rows, f, indent=1)
