"""GPU time of a model's attention layers over one packed batch whose cu_seqlens are on the GPU:
this tree's package against another commit's, in one process (GPU host).

A model calls `attention_varlen` once a layer with the same cu_seqlens tensors. Each call with
lengths on the GPU wrote the launcher's work table from them (a hundred and more small
kernels), which on a small batch took more GPU time than the attention kernel itself. A step
here is `--layers` calls with the same q, k, v and cu_seqlens tensors, timed by CUDA events
around the step (GPU ms, so the host's issue rate does not hide the writing), for each version
in random order per round; and, in this tree, the same step with a new cu_seqlens tensor per
layer (what a model that makes them per layer pays: a table written per layer).

    git archive 2be2aa6 wavefront | tar -x -C /tmp/old
    python scripts/varlen_layers.py /tmp/old [--layers 32 --rounds 15] [--out DIR]
"""
import argparse
import random
import statistics
from itertools import accumulate
from pathlib import Path

import torch

from ab_call import load_versions
from wavefront.measure.sink import JsonlSink
from wavefront.measure.varlen_bench import long_tailed_lengths

# (label, sequences, tokens): a serving step's small batch, and issue 20's packed batch.
BATCHES = (("8 sequences, 4k tokens", 8, 4096), ("16 sequences, 64k tokens", 16, 65536))


def step_ms(launcher, q, k, v, cu_seqlens, layers: int, causal: bool) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for cu in cu_seqlens(layers):
        launcher.attention_varlen(q, k, v, cu, cu, causal=causal)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="a tree holding the other commit's wavefront/")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--out", type=Path, help="write varlen_layers.jsonl and a manifest here")
    args = parser.parse_args()
    other, this = load_versions(args.other)
    sink = JsonlSink(args.out, "varlen_layers.jsonl")  # rows as measured, with a manifest
    print(f"{torch.cuda.get_device_name()}: GPU ms per step of {args.layers} layers, "
          f"H{args.heads} KV{args.kv_heads} D{args.head_dim} bf16, cu_seqlens on the GPU, "
          f"median [min, max] of {args.rounds} rounds")
    for label, sequences, tokens in BATCHES:
        for causal in (True, False):
            lengths = long_tailed_lengths(sequences, tokens, seed=sequences)
            shared = torch.tensor(list(accumulate(lengths, initial=0)), dtype=torch.int32,
                                  device="cuda")
            gen = torch.Generator(device="cuda").manual_seed(tokens)
            q = torch.randn(tokens, args.heads, args.head_dim, device="cuda",
                            dtype=torch.bfloat16, generator=gen)
            k, v = (torch.randn(tokens, args.kv_heads, args.head_dim, device="cuda",
                                dtype=torch.bfloat16, generator=gen) for _ in range(2))
            cases = {
                "other, one cu_seqlens": (other, lambda n: [shared] * n),
                "this tree, one cu_seqlens": (this, lambda n: [shared] * n),
                "this tree, new cu_seqlens a layer": (
                    this, lambda n: [shared.clone() for _ in range(n)]),
            }
            samples = {name: [] for name in cases}
            for name, (version, cu_seqlens) in cases.items():  # warm-up: launcher, writer
                with version.active() as launcher:
                    step_ms(launcher, q, k, v, cu_seqlens, 2, causal)
            for _ in range(args.rounds):
                for name in random.sample(list(cases), len(cases)):
                    version, cu_seqlens = cases[name]
                    with version.active() as launcher:
                        samples[name].append(step_ms(launcher, q, k, v, cu_seqlens,
                                                     args.layers, causal))
            base = statistics.median(samples["other, one cu_seqlens"])
            print(f"{label}, {'causal' if causal else 'non-causal'}:")
            for name, values in samples.items():
                median = statistics.median(values)
                print(f"  {name:36s} {median:8.3f} [{min(values):.3f}, {max(values):.3f}]"
                      f"  x{base / median:.2f} against other")
                sink.write({"gpu": torch.cuda.get_device_name(), "batch": label,
                             "sequences": sequences, "tokens": tokens, "causal": causal,
                             "heads": args.heads, "kv_heads": args.kv_heads,
                             "head_dim": args.head_dim, "layers": args.layers, "case": name,
                             "other": str(args.other), "step_ms": values})
    sink.close()


if __name__ == "__main__":
    main()
