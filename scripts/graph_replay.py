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
last output against its eager output. Timed in `wavefront bench`'s rounds (`run_rounds`); the
committed runs of 2026-11-26 (data/public_call/graph_replay/) came from a first form that timed
rounds of its own, alike but without NVML's clock watch. Printed: per-call microseconds, median
[95%], paired ratios against `bound` and cuDNN, throttled rounds.
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import wavefront
from wavefront.device import current_device
from wavefront.kernel.launcher import launcher_for, resolve_config
from wavefront.measure.rounds import Contender, paired_speedup, run_rounds
from wavefront.model.counting import launch_counts
from wavefront.point import KERNEL_LEVERS, plan
from wavefront.results.measurement import CORRECTNESS_TOLERANCE


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
    if not err < CORRECTNESS_TOLERANCE:  # NaN (an element never written) fails too
        raise SystemExit(f"{name}: relative error {err:.3g} against float32 SDPA")


def once_per(calls: int, replay):
    """run(i) for `run_rounds`: the graph of `calls` calls replayed once in every `calls`
    launch numbers, so a batch of `calls` launches times one replay."""
    return lambda i: replay() if i % calls == 0 else None


def measure(shape, causal, rounds, calls, variants=(), seed=0):
    """{(contender, mode): RoundsResult} in `wavefront bench`'s rounds (`run_rounds`: the order
    shuffled per round, NVML's clocks watched), `calls` launches per batch, each mode's
    samples per call."""
    b, h, s, d = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                   is_causal=causal)
    calls_of, config = contenders(q, k, v, causal, variants)
    dev = current_device()
    flops = launch_counts(plan(shape, shape, sms=dev.sms, l2_bytes=dev.l2_bytes,
                               causal=causal).problem)
    timed = []
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
        timed += [Contender(f"{name}|eager", lambda i, call=call: call(), flops.useful_flops),
                  Contender(f"{name}|graph", once_per(calls, graph.replay),
                            flops.useful_flops)]
    results = run_rounds(timed, rounds=rounds, per_round=calls, seed=seed)
    return {tuple(r.name.split("|")): r for r in results}, config


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
    rows = []
    for causal in (False, True):
        results, config = measure(shape, causal, args.rounds, args.calls, variants)
        print(f"\n{gpu}, B{shape[0]} H{shape[1]} S{shape[2]} D{shape[3]} bf16 "
              f"{'causal' if causal else 'non-causal'}, {args.rounds} rounds x {args.calls} "
              f"calls, us per call median [95%]; ratios paired by round; config {config}")
        for mode in ("eager", "graph"):
            for name in dict.fromkeys(n for n, _ in results):
                r = results[name, mode]
                us = [1e3 * ms for ms in r.samples_ms]
                row = {"gpu": gpu, "shape": shape, "causal": causal, "mode": mode,
                       "contender": name, "us_per_call": us, "config": config,
                       "throttled_rounds": r.throttled_rounds,
                       "vs_bound_ci95": paired_speedup(results["bound", mode], r),
                       "x_cudnn_ci95": paired_speedup(results["cudnn", mode], r)}
                rows.append(row)
                lo, hi = (1e3 * x for x in r.ci95_ms)
                vb, vc = row["vs_bound_ci95"], row["x_cudnn_ci95"]
                print(f"  {mode:5s} {name:22s} {1e3 * r.median_ms:8.2f} [{lo:.2f}, {hi:.2f}]  "
                      f"vs bound {vb[0]:.3f} [{vb[1]:.3f}, {vb[2]:.3f}]  "
                      f"x cuDNN {vc[0]:.2f} [{vc[1]:.2f}, {vc[2]:.2f}]  "
                      f"throttled {r.throttled_rounds}/{r.rounds}")
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
