"""Host time of the public call's hot path: this tree's launcher module against another
commit's, in one process (GPU host).

Processes of one GPU host ran the same code up to 1.6x apart in speed
(data/public_call/4448846/), so two versions timed in two processes cannot show a change of a
few microseconds. Here the other commit's `wavefront/kernel/launcher.py` is loaded beside this
one under another name (its own launcher cache and launcher class; what it imports is this
tree's), and batches of calls of each version alternate in random order. Compares changes to
the launcher module only.

    git archive 519b952 wavefront | tar -x -C /tmp/old
    python scripts/ab_call.py /tmp/old [--shape 1,8,1024,64] [--rounds 25] [--causal]
    python scripts/ab_call.py /tmp/old --first --shape 4,32,24576,128   # a new shape's first call
"""
import argparse
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from wavefront.kernel import launcher as this
from wavefront.point import LEVERS


def load_other(tree: Path):
    path = tree / "wavefront" / "kernel" / "launcher.py"
    if not path.is_file():
        raise SystemExit(f"{path}: no launcher module there (extract a commit's wavefront/)")
    spec = importlib.util.spec_from_file_location("other_launcher", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="a tree holding the other commit's wavefront/")
    parser.add_argument("--shape", default="1,8,1024,64", help="batch,heads,seqlen,head_dim")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--calls", type=int, default=200, help="calls per timed batch")
    parser.add_argument("--first", action="store_true",
                        help="time a new shape's first call instead: one call per version and "
                             "round, each version's launcher cache cleared before it (the "
                             "kernel compiled, the table kernel traced: what a model's new "
                             "shape costs)")
    args = parser.parse_args()
    other = load_other(args.other)
    shape = tuple(int(x) for x in args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    # attention_positional's options in order, then every lever unset: the public call's path
    options = (args.causal, None, None, None, None, False, None, None, None, None, None)
    no_levers = (None,) * len(LEVERS)
    for module in (other, this):
        module.attention_positional(q, k, v, *options, *no_levers)
    if args.first:
        return first_calls(other, args.other.name, q, k, v, options + no_levers, args)
    bound = next(iter(this._launchers.values()))
    out = torch.empty_like(q)
    raw = torch._C._cuda_getCurrentRawStream(q.device.index)
    bound(q, k, v, out, raw)
    variants = {
        f"other ({args.other.name})": lambda: other.attention_positional(q, k, v, *options,
                                                                          *no_levers),
        "this tree": lambda: this.attention_positional(q, k, v, *options, *no_levers),
        "bound launch (this tree, same out)": lambda: bound(q, k, v, out, raw),
    }
    samples = {name: [] for name in variants}
    torch.cuda.synchronize()
    for _ in range(args.rounds):
        order = list(variants)
        random.shuffle(order)
        for name in order:
            fn = variants[name]
            began = time.perf_counter()
            for _ in range(args.calls):
                fn()
            samples[name].append((time.perf_counter() - began) / args.calls * 1e6)
            torch.cuda.synchronize()
    report(samples, args, f"host us per call ({args.calls} calls a round)", shape)


def first_calls(other, other_name, q, k, v, arguments, args):
    """Host milliseconds of one first call per version and round, in random order."""
    versions = {f"other ({other_name})": other, "this tree": this}
    samples = {name: [] for name in versions}
    for _ in range(args.rounds):
        order = list(versions)
        random.shuffle(order)
        for name in order:
            module = versions[name]
            module.clear_launcher_cache()
            torch.cuda.synchronize()
            began = time.perf_counter()
            module.attention_positional(q, k, v, *arguments)
            samples[name].append((time.perf_counter() - began) * 1e3)
            torch.cuda.synchronize()
    report(samples, args, "host ms of a first call", tuple(q.shape))


def report(samples: dict, args, what: str, shape: tuple):
    reference = next(iter(samples.values()))
    lo, hi = args.rounds // 5, args.rounds - 1 - args.rounds // 5
    print(f"{torch.cuda.get_device_name()}, shape {shape}, causal={args.causal}: {what}, "
          f"median [20%, 80%] of {args.rounds} rounds")
    for name, s in samples.items():
        paired = sorted(a - b for a, b in zip(s, reference))
        ordered = sorted(s)
        print(f"{name:36s} {statistics.median(s):7.2f} [{ordered[lo]:.2f}, {ordered[hi]:.2f}]"
              f"   minus other, paired: {statistics.median(paired):+6.2f} "
              f"[{paired[lo]:+.2f}, {paired[hi]:+.2f}]")


if __name__ == "__main__":
    main()
