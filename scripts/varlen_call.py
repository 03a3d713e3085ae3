"""Host time of `attention_varlen` when every call brings new sequence lengths, as a training or
serving loop does: this tree's package against another commit's, in one process (GPU host).

Each call gets a packed batch of the same total length but new long-tailed lengths (so a new
launcher and work table), with the GPU idle (synchronised before the call) or busy (a kernel
of `--busy-ms` queued on the caller's stream first: a call that waits for the GPU then costs
the rest of that kernel). Versions alternate in random order, one call each per round.

    git archive 2e0fd8a wavefront | tar -x -C /tmp/old
    python scripts/varlen_call.py /tmp/old [--sequences 16 --tokens 65536 --rounds 15]
"""
import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from ab_call import load_versions
from wavefront.measure.varlen_bench import long_tailed_lengths


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="a tree holding the other commit's wavefront/")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--busy-ms", type=float, default=30.0)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    other, this = load_versions(args.other)
    versions = {f"other ({args.other.name})": other, "this tree": this}
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(args.tokens, args.heads, args.head_dim, device="cuda",
                    dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(args.tokens, args.kv_heads, args.head_dim, device="cuda",
                        dtype=torch.bfloat16, generator=gen) for _ in range(2))

    def bounds_of(seed):
        lengths = long_tailed_lengths(args.sequences, args.tokens, seed=seed)
        bounds = [0]
        for n in lengths:
            bounds.append(bounds[-1] + n)
        return bounds
    # One batch of lengths per call, made before any timing; seed 0 warms each version up.
    batches = iter([bounds_of(seed) for seed in range(1, 2 * len(versions) * args.rounds + 1)])
    for version in versions.values():
        with version.active() as launcher:
            launcher.attention_varlen(q, k, v, bounds_of(0), bounds_of(0), causal=args.causal)
    # The sleep kernel counts cycles: calibrate them to milliseconds on this GPU.
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    stop.record()
    stop.synchronize()
    cycles = int(args.busy_ms / start.elapsed_time(stop) * 10_000_000)
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
