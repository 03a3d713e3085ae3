"""Where a new shape's first public call spends its host time: each step of
`wavefront.attention` timed (inclusive), summed per call, median [20%, 80%] over calls. Each
call starts as `ab_call.py --first`'s: launcher cache cleared, GPU idle, kernels built. The
timers cost ~1 us a step.

    python scripts/first_call_steps.py [--shape 4,32,24576,128] [--calls 15] [--causal]
"""
import argparse
import functools
import statistics
import time
from collections import defaultdict

import cupy
import torch

from ab_call import public_call_arguments
from wavefront.kernel import launcher as L
from wavefront.kernel import table_kernel as T

spent: dict = defaultdict(float)


def timer(label, fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - began
    return timed


def wrap(owner, name, label=None):
    setattr(owner, name, timer(label or name, getattr(owner, name)))


class _TimedLaunches:
    """cuda.tile as the launcher module sees it, its `launch` timed."""

    def __init__(self, module):
        self._module = module
        self.launch = timer("ct.launch", module.launch)

    def __getattr__(self, name):
        return getattr(self._module, name)


def install_timers():
    for name in ("_call_key", "_cached", "_check_inputs", "resolve_config", "plan",
                 "_new_launcher", "check_levers", "_device_work_table", "_stand_in",
                 "_workspace", "launch_args", "_stream_getter", "_output_maker", "_empty"):
        wrap(L, name)
    wrap(L.AttentionLauncher, "__init__", "AttentionLauncher.__init__")
    wrap(L.AttentionLauncher, "__call__", "AttentionLauncher.__call__ (launch)")
    wrap(L.AttentionLauncher, "_wait_for_table")
    L.KernelVariant = type("TimedVariant", (L.KernelVariant,), {})  # for_launch timed below
    L.KernelVariant.for_launch = classmethod(timer(
        "KernelVariant.for_launch", L.KernelVariant.for_launch.__func__))
    L.build_on_gpu = timer("build_on_gpu", T.build_on_gpu)
    wrap(T, "table_kernel", "choose table kernel")
    kernel_of = T._kernel
    T._kernel = lambda *args: timer("table kernel launch (CuPy)", kernel_of(*args))
    cupy.empty = timer("cupy.empty (table)", cupy.empty)
    L.ct = _TimedLaunches(L.ct)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="4,32,24576,128", help="batch,heads,seqlen,head_dim")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    arguments = public_call_arguments(args.causal)
    L.attention_positional(q, k, v, *arguments)  # compiles; traces the table kernel
    install_timers()
    per_call = defaultdict(list)
    for _ in range(args.calls):
        L.clear_launcher_cache()
        torch.cuda.synchronize()
        spent.clear()
        began = time.perf_counter()
        L.attention_positional(q, k, v, *arguments)
        total = time.perf_counter() - began
        torch.cuda.synchronize()
        per_call["whole call"].append(total)
        for label, seconds in spent.items():
            per_call[label].append(seconds)
    lo, hi = args.calls // 5, args.calls - 1 - args.calls // 5
    print(f"{torch.cuda.get_device_name()}, shape {shape}, causal={args.causal}: host us of a "
          f"first call, inclusive, median [20%, 80%] of {args.calls} calls")
    for label, samples in sorted(per_call.items(), key=lambda kv: -statistics.median(kv[1])):
        ordered = sorted(s * 1e6 for s in samples)
        print(f"  {label:40s} {statistics.median(ordered):8.1f} "
              f"[{ordered[lo]:.1f}, {ordered[hi]:.1f}]")


if __name__ == "__main__":
    main()
