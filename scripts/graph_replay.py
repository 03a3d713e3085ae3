"""The public call with the host taken away (GPU host): each contender's per-call time eager
(calls back to back, as `wavefront bench` times them) and replayed from a CUDA graph that holds
the same calls, in the same interleaved rounds. Where a launch is as short as issuing it (B1 H8
S1k) the eager call is host-bound; replay leaves the GPU's work: whether the public call adds
any, and what a graph-capturing caller (torch.compile's CUDA graphs, a serving loop) gets.

    python scripts/graph_replay.py [--shape 1,8,1024,64] [--rounds 15] [--calls 20] [--json F]
        [--variant tiles=64x64,occupancy=2 ...]

Contenders: `api` (`wavefront.attention(q, k, v, causal=...)` on torch tensors, a new output
each call), `bound` (the launcher that call resolves to, on a fixed output), cuDNN and FA2
through torch SDPA. One fixed input set (L2 warm: the same for all). Every output is checked
against float32 SDPA first (the bound launcher's output poisoned with NaN), and each replay's
last output against its eager output. Printed: per-call microseconds, median [95%], and paired
ratios against `bound` and cuDNN.
"""
import argparse
import json
import random
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import wavefront
from wavefront.device import current_device
from wavefront.kernel.launcher import launcher_for, resolve_config
from wavefront.point import KERNEL_LEVERS
from wavefront.results.measurement import median_ci95, paired_ratio

TOLERANCE = 2e-2  # relative, bf16 against float32


def contenders(q, k, v, causal, variants=()):
    """name -> call() returning the output, each on torch's current stream. `variants`:
    {field: value} changes to the resolved configuration, each a bound contender of its own."""
    config = resolve_config(tuple(q.shape), tuple(k.shape), causal, None, None, None,
                            dict.fromkeys(KERNEL_LEVERS))
    bound_calls = {}
    for change in ({}, *variants):
        launcher, _ = launcher_for(q, k, v, causal=causal, **{**config, **change})
        bound_out = torch.full_like(q, float("nan"))

        def bound(launcher=launcher, bound_out=bound_out):
            launcher(q, k, v, bound_out, launcher.current_stream())
            return bound_out
        name = "bound" + "".join(f" {f}={x}" for f, x in change.items())
        bound_calls[name] = bound

    def peer(backend):
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return call
    return {"api": lambda: wavefront.attention(q, k, v, causal=causal), **bound_calls,
            "cudnn": peer(SDPBackend.CUDNN_ATTENTION),
            "fa2": peer(SDPBackend.FLASH_ATTENTION)}, config


def _value(text):
    return None if text == "None" else int(text) if text.lstrip("-").isdigit() else text


def check(name, out, reference):
    err = ((out.float() - reference).norm() / reference.norm()).item()
    if not err < TOLERANCE:  # NaN (an element never written) fails too
        raise SystemExit(f"{name}: relative error {err:.3g} against float32 SDPA")


def measure(shape, causal, rounds, calls, variants=(), seed=0):
    b, h, s, d = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                   is_causal=causal)
    calls_of, config = contenders(q, k, v, causal, variants)
    graphs = {}
    for name, call in calls_of.items():
        check(name, call(), reference)  # eager, and warms every launcher and library
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                out = call()
        graph.replay()
        torch.cuda.synchronize()
        eager = call().clone()
        torch.cuda.synchronize()
        if not torch.equal(out, eager):
            raise SystemExit(f"{name}: the replayed output differs from the eager one")
        graphs[name] = graph

    def eager_batch(name):
        for _ in range(calls):
            calls_of[name]()
    runs = {(n, "eager"): (lambda n=n: eager_batch(n)) for n in calls_of}
    runs.update({(n, "graph"): graphs[n].replay for n in calls_of})
    samples = {key: [] for key in runs}
    order = list(runs)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for key in order:
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            runs[key]()
            stop.record()
            stop.synchronize()
            samples[key].append(start.elapsed_time(stop) * 1e3 / calls)  # us per call
    return samples, config


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1,8,1024,64", help="B,H,S,D")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20, help="calls per timed batch and graph")
    ap.add_argument("--variant", action="append", default=[], metavar="FIELD=V[,FIELD=V]",
                    help="also the resolved configuration with these changes (repeatable; "
                         "e.g. tiles=64x64,occupancy=2)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    variants = [{f: _value(x) for f, _, x in (kv.partition("=") for kv in text.split(","))}
                for text in args.variant]
    shape = tuple(int(x) for x in args.shape.split(","))
    gpu = current_device().name
    results = []
    for causal in (False, True):
        samples, config = measure(shape, causal, args.rounds, args.calls, variants)
        print(f"\n{gpu}, B{shape[0]} H{shape[1]} S{shape[2]} D{shape[3]} bf16 "
              f"{'causal' if causal else 'non-causal'}, {args.rounds} rounds x {args.calls} "
              f"calls, us per call median [95%]; ratios paired by round; config {config}")
        for mode in ("eager", "graph"):
            for name in dict.fromkeys(n for n, _ in samples):
                ms = samples[name, mode]
                row = {"gpu": gpu, "shape": shape, "causal": causal, "mode": mode,
                       "contender": name, "us_per_call": ms, "config": config,
                       "vs_bound_ci95": paired_ratio(samples["bound", mode], ms),
                       "x_cudnn_ci95": paired_ratio(samples["cudnn", mode], ms)}
                results.append(row)
                lo, hi = median_ci95(ms)
                med = statistics.median(ms)
                vb, vc = row["vs_bound_ci95"], row["x_cudnn_ci95"]
                print(f"  {mode:5s} {name:22s} {med:8.2f} [{lo:.2f}, {hi:.2f}]  "
                      f"vs bound {vb[0]:.3f} [{vb[1]:.3f}, {vb[2]:.3f}]  "
                      f"x cuDNN {vc[0]:.2f} [{vc[1]:.2f}, {vc[2]:.2f}]")
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in results)


if __name__ == "__main__":
    main()
