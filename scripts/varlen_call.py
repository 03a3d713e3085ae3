"""Host time of `attention_varlen` when every call brings new sequence lengths, as a training or
serving loop does: this tree's package against another commit's, in one process (GPU host).

Each call gets a packed batch of the same total length but new long-tailed lengths (so a new
launcher and work table), with the GPU idle (synchronised before the call) or busy (a kernel
of `--busy-ms` queued on the caller's stream first: a call that waits for the GPU then costs
the rest of that kernel). Versions alternate in random order, one call each per round.

    git archive 2e0fd8a wavefront | tar -x -C /tmp/old
    python scripts/varlen_call.py /tmp/old [--sequences 16 --tokens 65536 --rounds 15]

`--first-calls` (this tree alone, run it in several fresh processes): does a process's first
calls wait for queued GPU work while CuPy's pools grow? One call compiles and builds a first
table, then five calls bring new lengths (16, 64, 256, 16, 64 sequences of the same tokens),
each behind 200 ms of sleep queued on the caller's stream; prints each call's host ms.

    python scripts/varlen_call.py --first-calls [--causal]

`--gpu-lengths` (this tree alone): the same calls with cu_seqlens as host lists (table built on
the host, checked) against CUDA int32 tensors (table written on the GPU from them, nothing read
back), one call of each per round in random order; then the GPU ms per call of each, ten calls
with one batch (the host path's launcher cached, the GPU path writing its table every call).

    python scripts/varlen_call.py --gpu-lengths [--causal] [--vary-sequences 9]

`--vary-sequences LOW`: each call of `--gpu-lengths` brings a number of sequences drawn from
LOW to `--sequences` as well as new lengths (a serving loop's batch changes call by call); the
printout says how many launchers the GPU path built.
"""
import argparse
import random
import statistics
import time
from itertools import accumulate
from pathlib import Path

import torch

from ab_call import load_versions
from wavefront.measure.varlen_bench import long_tailed_lengths


def sleep_cycles(ms: float) -> int:
    """The cycles `torch.cuda._sleep` spins for about `ms` on this GPU (it counts cycles)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    stop.record()
    stop.synchronize()
    return int(ms / start.elapsed_time(stop) * 10_000_000)


def first_calls(args, q, k, v, bounds_of):
    from wavefront.kernel.launcher import attention_varlen
    attention_varlen(q, k, v, bounds_of(0), bounds_of(0), causal=args.causal)  # compiled
    torch.cuda.synchronize()
    cycles = sleep_cycles(200)
    out = []
    for i, n in enumerate((16, 64, 256, 16, 64)):
        batch = bounds_of(100 + i, n)
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        began = time.perf_counter()
        attention_varlen(q, k, v, batch, batch, causal=args.causal)
        out.append(f"{n} seqs: {(time.perf_counter() - began) * 1e3:.2f} ms")
    torch.cuda.synchronize()
    print(f"fresh process, GPU busy (200 ms queued){', causal' if args.causal else ''}:",
          "; ".join(out))


def gpu_lengths(args, q, k, v, bounds_of):
    from wavefront.kernel.launcher import attention_varlen

    def as_argument(bounds, path):
        return bounds if path == "host lists" else torch.tensor(bounds, dtype=torch.int32,
                                                                 device="cuda")
    paths = ("host lists", "GPU tensors")
    for path in paths:  # compiled, launchers built
        attention_varlen(q, k, v, as_argument(bounds_of(0), path),
                         as_argument(bounds_of(0), path), causal=args.causal)
    cycles = sleep_cycles(args.busy_ms)
    seeds = iter(range(1, 4 * args.rounds + 1))
    samples = {(path, busy): [] for path in paths for busy in (False, True)}
    for _ in range(args.rounds):
        for busy in (False, True):
            for path in random.sample(paths, len(paths)):
                sequences = (random.randint(args.vary_sequences, args.sequences)
                             if args.vary_sequences else args.sequences)
                cu = as_argument(bounds_of(next(seeds), sequences), path)
                torch.cuda.synchronize()
                if busy:
                    torch.cuda._sleep(cycles)
                began = time.perf_counter()
                attention_varlen(q, k, v, cu, cu, causal=args.causal)
                samples[(path, busy)].append((time.perf_counter() - began) * 1e3)
                torch.cuda.synchronize()
    gpu_ms = {}
    for path in paths:
        cu = as_argument(bounds_of(0), path)
        start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        runs = []
        for _ in range(5):
            start.record()
            for _ in range(10):
                attention_varlen(q, k, v, cu, cu, causal=args.causal)
            stop.record()
            stop.synchronize()
            runs.append(start.elapsed_time(stop) / 10)
        gpu_ms[path] = runs
    # The GPU path's table writing alone: its launcher's graph, replayed.
    from wavefront.kernel import launcher as kernel_launcher
    writers = [made._table_writer[0] for made in kernel_launcher._varlen_launchers.values()
               if made._table_writer is not None]
    print(f"launchers with their table written on the GPU, built by then: {len(writers)}")
    writer = writers[-1]
    writes = []
    for _ in range(5):
        start.record()
        for _ in range(10):
            writer.replay()
        stop.record()
        stop.synchronize()
        writes.append(start.elapsed_time(stop) / 10)
    lo, hi = args.rounds // 5, args.rounds - 1 - args.rounds // 5
    print(f"{torch.cuda.get_device_name()}, {args.sequences} sequences, {args.tokens} tokens, "
          f"H{args.heads} KV{args.kv_heads} D{args.head_dim} causal={args.causal}: host ms "
          f"of a call with new lengths, median [20%, 80%] of {args.rounds}; GPU ms per call, "
          f"median [min, max] of 5 x 10 calls")
    print(f"  table writing alone (its graph replayed)  GPU ms {statistics.median(writes):.3f} "
          f"[{min(writes):.3f}, {max(writes):.3f}]")
    for (path, busy), s in samples.items():
        ordered = sorted(s)
        state = f"GPU busy ({args.busy_ms:g} ms queued)" if busy else "GPU idle"
        print(f"  cu_seqlens as {path:12s} {state:26s} host {statistics.median(s):7.3f} "
              f"[{ordered[lo]:.3f}, {ordered[hi]:.3f}]")
    for path, runs in gpu_ms.items():
        print(f"  cu_seqlens as {path:12s} GPU ms per call {statistics.median(runs):.3f} "
              f"[{min(runs):.3f}, {max(runs):.3f}]")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, nargs="?",
                        help="a tree holding the other commit's wavefront/")
    parser.add_argument("--first-calls", action="store_true",
                        help="this tree alone: a fresh process's first calls, GPU busy")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--busy-ms", type=float, default=30.0)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--vary-sequences", type=int, default=0, metavar="LOW",
                        help="--gpu-lengths: each call's number of sequences from LOW to "
                             "--sequences")
    parser.add_argument("--gpu-lengths", action="store_true",
                        help="this tree alone: cu_seqlens as host lists against CUDA tensors")
    args = parser.parse_args()
    if (args.other is None) != (args.first_calls or args.gpu_lengths):
        parser.error("give the other tree, or --first-calls, or --gpu-lengths")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(args.tokens, args.heads, args.head_dim, device="cuda",
                    dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(args.tokens, args.kv_heads, args.head_dim, device="cuda",
                        dtype=torch.bfloat16, generator=gen) for _ in range(2))

    def bounds_of(seed, sequences=args.sequences):
        return list(accumulate(long_tailed_lengths(sequences, args.tokens, seed=seed),
                               initial=0))
    if args.first_calls:
        return first_calls(args, q, k, v, bounds_of)
    if args.gpu_lengths:
        return gpu_lengths(args, q, k, v, bounds_of)
    other, this = load_versions(args.other)
    versions = {f"other ({args.other.name})": other, "this tree": this}
    # One batch of lengths per call, made before any timing; seed 0 warms each version up.
    batches = iter([bounds_of(seed) for seed in range(1, 2 * len(versions) * args.rounds + 1)])
    for version in versions.values():
        with version.active() as launcher:
            launcher.attention_varlen(q, k, v, bounds_of(0), bounds_of(0), causal=args.causal)
    cycles = sleep_cycles(args.busy_ms)
    samples = {(name, busy): [] for name in versions for busy in (False, True)}
    for _ in range(args.rounds):
        for busy in (False, True):
            order = list(versions)
            random.shuffle(order)
            for name in order:
                bounds = next(batches)
                with versions[name].active() as launcher:
                    torch.cuda.synchronize()
                    if busy:
                        torch.cuda._sleep(cycles)
                    began = time.perf_counter()
                    launcher.attention_varlen(q, k, v, bounds, bounds, causal=args.causal)
                    samples[(name, busy)].append((time.perf_counter() - began) * 1e3)
                torch.cuda.synchronize()
    # For scale: the GPU time of one call of this tree on one batch (its launcher cached).
    bounds = bounds_of(0)
    with this.active() as launcher:
        launcher.attention_varlen(q, k, v, bounds, bounds, causal=args.causal)
        start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        for _ in range(10):
            launcher.attention_varlen(q, k, v, bounds, bounds, causal=args.causal)
        stop.record()
        stop.synchronize()
    lo, hi = args.rounds // 5, args.rounds - 1 - args.rounds // 5
    print(f"{torch.cuda.get_device_name()}, {args.sequences} sequences, {args.tokens} tokens, "
          f"H{args.heads} KV{args.kv_heads} D{args.head_dim} causal={args.causal}: host ms "
          f"of a call with new lengths, median [20%, 80%] of {args.rounds}")
    print(f"  GPU ms per call (this tree, launcher cached): {start.elapsed_time(stop) / 10:.2f}")
    for (name, busy), s in samples.items():
        ordered = sorted(s)
        state = f"GPU busy ({args.busy_ms:g} ms queued)" if busy else "GPU idle"
        print(f"  {name:24s} {state:26s} {statistics.median(s):7.2f} "
              f"[{ordered[lo]:.2f}, {ordered[hi]:.2f}]")


if __name__ == "__main__":
    main()
