"""Host time of the public call: this tree's package against another commit's, in one
process (GPU host).

Processes of one GPU host ran the same code up to 1.6x apart in speed
(data/public_call/4448846/), so two versions timed in two processes cannot show a change of a
few microseconds. Here the other commit's whole `wavefront` package is imported beside this
one: each version's modules are put in `sys.modules` before its calls and taken out after (so
what a version imports lazily, mid-call, is its own), and batches of calls of each version
alternate in random order.

    git archive 519b952 wavefront | tar -x -C /tmp/old
    python scripts/ab_call.py /tmp/old [--shape 1,8,1024,64] [--rounds 25] [--causal] [--public]
        [--cupy]
    python scripts/ab_call.py /tmp/old --first --shape 4,32,24576,128   # a new shape's first call
"""
import argparse
import contextlib
import importlib
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from wavefront.point import LEVERS


def public_call_arguments(causal: bool) -> tuple:
    """`attention_positional`'s arguments after q, k, v for a call that names only the mask:
    its options in order, then every kernel lever unset (the public call's path)."""
    return (causal, None, None, None, None, False, None, None, None, None, None,
            *(None,) * len(LEVERS))


def _ours(modules) -> dict:
    return {name: module for name, module in modules.items()
            if name == "wavefront" or name.startswith("wavefront.")}


class Version:
    """One version's `wavefront` modules, put in place for its calls. A version with
    `wavefront.kernel.call` (the public call split out of launcher.py, options as one
    `CallOptions` values tuple) is called there; an older one through launcher.py's
    `attention_positional`."""

    def __init__(self, modules: dict):
        self.modules = modules
        self.launcher = modules["wavefront.kernel.launcher"]
        self.call = modules.get("wavefront.kernel.call")

    def with_options(self, q, k, v, arguments):
        """The public call's options path (`arguments`: `public_call_arguments`)."""
        if self.call is None:
            return self.launcher.attention_positional(q, k, v, *arguments)
        values = arguments[:6] + arguments[8:]  # no out, stream
        names = getattr(self.modules.get("wavefront.kernel.plan"), "CALL_OPTIONS", ())
        if "causal_alignment" in names:  # (a version with the option: its default)
            at = names.index("causal_alignment")
            values = values[:at] + ("top_left",) + values[at:]
        return self.call.attention_with(q, k, v, values)

    def clear_launcher_cache(self):
        (self.call or self.launcher).clear_launcher_cache()

    def a_bound_launcher(self):
        """The launcher of the first entry of the public call's cache."""
        if self.call is None:
            return next(iter(self.launcher._launchers.values()))
        return next(iter(self.call._plans.values())).launcher

    @contextlib.contextmanager
    def active(self):
        for name in _ours(sys.modules):
            del sys.modules[name]
        sys.modules.update(self.modules)
        try:
            yield self.launcher
        finally:
            self.modules.update(_ours(sys.modules))  # and what it imported meanwhile


def load_versions(tree: Path) -> tuple[Version, Version]:
    """(the other tree's package, this tree's), each imported once."""
    if not (tree / "wavefront" / "kernel" / "launcher.py").is_file():
        raise SystemExit(f"{tree}: no wavefront/kernel/launcher.py there (extract a commit's "
                         f"wavefront/)")
    _import_the_call()
    this = Version(_ours(sys.modules))
    for name in this.modules:
        del sys.modules[name]
    sys.path.insert(0, str(tree.resolve()))
    try:
        # later imports of its submodules follow its package's own path, not sys.path
        _import_the_call()
        other = Version(_ours(sys.modules))
    finally:
        sys.path.remove(str(tree.resolve()))
    for name in _ours(sys.modules):
        del sys.modules[name]
    sys.modules.update(this.modules)
    if Path(other.launcher.__file__).resolve().parent == Path(
            this.launcher.__file__).resolve().parent:
        raise SystemExit(f"{tree}: imported this tree's package, not the other's")
    return other, this


def _import_the_call():
    importlib.import_module("wavefront.kernel.launcher")
    importlib.import_module("wavefront.api")
    try:
        importlib.import_module("wavefront.kernel.call")
    except ModuleNotFoundError:  # a version from before the split
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="a tree holding the other commit's wavefront/")
    parser.add_argument("--shape", default="1,8,1024,64", help="batch,heads,seqlen,head_dim")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--calls", type=int, default=200, help="calls per timed batch")
    parser.add_argument("--public", action="store_true",
                        help="time `wavefront.attention(q, k, v, causal=...)` as users call it "
                             "(each version's wavefront.api), not attention_positional")
    parser.add_argument("--cupy", action="store_true",
                        help="q, k, v as CuPy arrays (the same memory) instead of torch tensors")
    parser.add_argument("--first", action="store_true",
                        help="time a new shape's first call instead: one call per version and "
                             "round, each version's launcher cache cleared before it (the "
                             "kernel compiled, the table kernel traced: what a model's new "
                             "shape costs)")
    args = parser.parse_args()
    other, this = load_versions(args.other)
    shape = tuple(int(x) for x in args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    if args.cupy:
        import cupy
        q, k, v = (cupy.from_dlpack(x) for x in (q, k, v))
    arguments = public_call_arguments(args.causal)
    for version in (other, this):
        with version.active():
            version.with_options(q, k, v, arguments)
    versions = {f"other ({args.other.name})": other, "this tree": this}
    if args.first:
        return first_calls(versions, q, k, v, arguments, args)
    bound = this.a_bound_launcher()
    out = cupy.empty_like(q) if args.cupy else torch.empty_like(q)
    raw = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
    bound(q, k, v, out, raw)
    if args.public:
        calls = {name: (version, lambda _, api=version.modules["wavefront.api"]: api.attention(
            q, k, v, causal=args.causal)) for name, version in versions.items()}
    else:
        calls = {name: (version, lambda _, version=version: version.with_options(
            q, k, v, arguments)) for name, version in versions.items()}
    # vouched (prepared_ok=True), as the bench's bound launcher is: no per-call layout check
    calls["bound launch (this tree, same out)"] = (this, lambda _: bound(q, k, v, out, raw,
                                                                         None, True))
    samples = {name: [] for name in calls}
    torch.cuda.synchronize()
    for _ in range(args.rounds):
        order = list(calls)
        random.shuffle(order)
        for name in order:
            version, fn = calls[name]
            with version.active() as launcher:
                began = time.perf_counter()
                for _ in range(args.calls):
                    fn(launcher)
                samples[name].append((time.perf_counter() - began) / args.calls * 1e6)
            torch.cuda.synchronize()
    report(samples, args, f"host us per call ({args.calls} calls a round)", shape)


def first_calls(versions: dict, q, k, v, arguments, args):
    """Host milliseconds of one first call per version and round, in random order."""
    samples = {name: [] for name in versions}
    for _ in range(args.rounds):
        order = list(versions)
        random.shuffle(order)
        for name in order:
            version = versions[name]
            with version.active():
                version.clear_launcher_cache()
                torch.cuda.synchronize()
                began = time.perf_counter()
                version.with_options(q, k, v, arguments)
                samples[name].append((time.perf_counter() - began) * 1e3)
            torch.cuda.synchronize()
    report(samples, args, "host ms of a first call", tuple(q.shape))


def report(samples: dict, args, what: str, shape: tuple):
    reference = next(iter(samples.values()))
    lo, hi = args.rounds // 5, args.rounds - 1 - args.rounds // 5
    arrays = "CuPy arrays" if getattr(args, "cupy", False) else "torch tensors"
    print(f"{torch.cuda.get_device_name()}, shape {shape}, causal={args.causal}, {arrays}: {what}, "
          f"median [20%, 80%] of {args.rounds} rounds")
    for name, s in samples.items():
        paired = sorted(a - b for a, b in zip(s, reference))
        ordered = sorted(s)
        print(f"{name:36s} {statistics.median(s):7.2f} [{ordered[lo]:.2f}, {ordered[hi]:.2f}]"
              f"   minus other, paired: {statistics.median(paired):+6.2f} "
              f"[{paired[lo]:+.2f}, {paired[hi]:+.2f}]")


if __name__ == "__main__":
    main()
