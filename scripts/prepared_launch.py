"""The prepared launch against `ct.launch`, one launcher of each per shape, in one process
(GPU host): bitwise-equal outputs, host time per launch, GPU time per launch.

    python scripts/prepared_launch.py [--rounds 15] [--out DIR]

Per shape: two launchers of the same configuration (the tuned one the public call resolves
to), one made with prepared launches and one without (`launcher.PREPARED_LAUNCHES`). Each
launches twice (the prepared one prepares after its first: `PREPARE_AFTER_LAUNCHES` is set
to 1 here), then:
- outputs: each launcher's on the same fresh random inputs (outputs poisoned with NaN first)
  must be bitwise equal, and within the project's tolerance of a float32 reference;
- host us per launch: batches of 200 back-to-back launches, perf_counter around each batch,
  the two launchers' batches alternating; median [20%, 80%] of the batches;
- GPU us per launch: CUDA events around 50 launches, rounds alternating, median [20%, 80%].
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from wavefront.kernel import launcher as L
from wavefront.results.measurement import CORRECTNESS_TOLERANCE

SHAPES = [  # (batch, heads, kv_heads, seqlen, head_dim, causal)
    (1, 8, 8, 1024, 64, False), (1, 8, 8, 1024, 64, True),
    (1, 32, 32, 8192, 128, False), (1, 32, 32, 8192, 128, True),
    (4, 32, 8, 4096, 128, False),
]
CONFIGS = {"tuned": None, "dynamic+sawtooth": dict(schedule="dynamic+sawtooth"),
           "persistent+tiled": dict(schedule="persistent+tiled")}


def quantiles(xs):
    xs = sorted(xs)
    pick = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return statistics.median(xs), pick(0.2), pick(0.8)


def build(q, k, v, causal, config, prepared):
    L.PREPARED_LAUNCHES = prepared
    try:
        if config is None:
            config = L.resolve_config(tuple(q.shape), tuple(k.shape), causal, None, None, None,
                                      dict.fromkeys(L.KERNEL_LEVERS))
        launcher, _ = L.launcher_for(q, k, v, causal=causal, **config)
    finally:
        L.PREPARED_LAUNCHES = True
    return launcher, config


def main():
    L.PREPARE_AFTER_LAUNCHES = 1  # prepared after its first launch: the comparison here
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for (b, h, kvh, s, d, causal) in SHAPES:
        for name, config in CONFIGS.items():
            if name != "tuned" and s > 1024:
                continue
            q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, kvh, s, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(b, kvh, s, d, device="cuda", dtype=torch.bfloat16)
            stream = torch.cuda.current_stream().cuda_stream
            prepared, resolved = build(q, k, v, causal, config, True)
            plain, _ = build(q, k, v, causal, config, False)
            outs = {}
            t_second = None
            for label, launcher in (("prepared", prepared), ("ct.launch", plain)):
                out = torch.full_like(q, float("nan"))
                launcher(q, k, v, out, stream)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = torch.full_like(q, float("nan"))
                launcher(q, k, v, out, stream)
                torch.cuda.synchronize()
                if label == "prepared":
                    t_second = time.perf_counter() - t0  # its first prepared launch, synchronised
                outs[label] = out
            assert prepared.launches_prepared, prepared.prepare_failure
            assert not plain.launches_prepared
            bitwise = torch.equal(outs["prepared"], outs["ct.launch"])
            rep = k.repeat_interleave(h // kvh, 1).float(), v.repeat_interleave(h // kvh, 1).float()
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), *rep,
                                                                   is_causal=causal)
            err = ((outs["prepared"].float() - ref).abs().max() / ref.abs().max()).item()
            host = {"prepared": [], "ct.launch": []}
            gpu = {"prepared": [], "ct.launch": []}
            per_batch = 200 if s <= 1024 else 20
            for r in range(args.rounds):
                order = [("prepared", prepared), ("ct.launch", plain)]
                if r % 2:
                    order.reverse()
                for label, launcher in order:
                    out = torch.empty_like(q)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(per_batch):
                        launcher(q, k, v, out, stream)
                    host[label].append((time.perf_counter() - t0) / per_batch * 1e6)
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                    start.record()
                    for _ in range(50):
                        launcher(q, k, v, out, stream)
                    end.record()
                    end.synchronize()
                    gpu[label].append(start.elapsed_time(end) / 50 * 1e3)
            row = dict(shape=f"B{b} H{h} KV{kvh} S{s} D{d}", causal=causal, config=name,
                       resolved=str(resolved), bitwise_equal=bitwise, rel_err=err,
                       tolerance=CORRECTNESS_TOLERANCE, second_launch_s=t_second,
                       symbol=prepared._prepared.symbol[:60],
                       host_us={k_: quantiles(x) for k_, x in host.items()},
                       gpu_us={k_: quantiles(x) for k_, x in gpu.items()},
                       host_raw=host, gpu_raw=gpu)
            rows.append(row)
            print(f"{row['shape']} {'causal' if causal else 'full':6} {name:18} "
                  f"bitwise={bitwise} err={err:.2e} second launch={t_second * 1e3:.1f} ms | "
                  "host us "
                  f"prepared {row['host_us']['prepared'][0]:.2f} ct.launch "
                  f"{row['host_us']['ct.launch'][0]:.2f} | GPU us prepared "
                  f"{row['gpu_us']['prepared'][0]:.1f} ct.launch "
                  f"{row['gpu_us']['ct.launch'][0]:.1f}",
                  flush=True)
            if not bitwise or err > CORRECTNESS_TOLERANCE:
                print("  FAILED", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), rows=rows),
                                             indent=1))


if __name__ == "__main__":
    main()
