"""Backward speed: `wavefront.attention_backward` against cuDNN's and FlashAttention-2's backward
through torch SDPA (and the flash_attn package's where it imports), in interleaved rounds
(`wavefront.measure.rounds.run_rounds`: each round times every contender in a new random order;
medians with distribution-free 95% intervals, ratios paired by round); and the backward
schedules (CTA order x Q scan) against each other, with their DRAM bytes from one cold launch
each under Nsight Compute.

    python scripts/backward_bench.py                      # the issue's shapes, D64/128, both masks
    python scripts/backward_bench.py --shapes "B1 H32 S8k" --head-dims 128 --causal-only
    python scripts/backward_bench.py --schedules --json out.jsonl   # + every backward schedule
    python scripts/backward_bench.py --dram --shapes "B1 H32 S8k" --head-dims 128
        # DRAM read/write bytes of the K/V-major kernel per schedule (runs itself under ncu)
    python scripts/backward_bench.py --predict      # the lock-step model's DRAM reads (CPU)

Every contender is timed as called: wavefront's call from (q, k, v, out, lse, dout) to
(dq, dk, dv), its preprocessing and dQ conversion included; the peers' `torch.autograd.grad`
of an SDPA output made under their backend (the autograd engine's call included). FLOPs are
FlashAttention's convention, 2.5x the forward's (five matrix products against two), halved by
the causal mask. Before timing, wavefront's gradients are checked against the first peer's
(relative norm errors printed and recorded).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SHAPES = {  # the forward's bench shapes (issue 53): (batch, heads, kv_heads, seqlen)
    "B1 H32 S8k": (1, 32, 32, 8192),
    "B4 H32 KV8 S4k": (4, 32, 8, 4096),
    "B2 H8 S32k": (2, 8, 8, 32768),
}
# The K/V-major kernel alone (the atomic mode launches no other kernel of this name); its
# records are named by their NVTX range (`--print-nvtx-rename kernel`), not by the kernel.
KERNEL_FILTER = "regex:flash_attention_bwd_kv"


def backward_flops(batch, heads, seqlen, head_dim, causal) -> float:
    forward = 4.0 * batch * heads * seqlen * seqlen * head_dim
    return 2.5 * forward * (0.5 if causal else 1.0)


def _inputs(shape, head_dim, seed, torch):
    batch, heads, kv_heads, seqlen = shape
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(h):
        return torch.randn(batch, h, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                           generator=g)
    return randn(heads), randn(kv_heads), randn(kv_heads), randn(heads)


def _sdpa_backward(backend_name, q, k, v, do, causal, torch):
    """-> (a call that runs the backward once, its gradients, a note) for torch SDPA under
    `backend_name`; GQA through `enable_gqa`, else K/V expanded to every query head (the
    note says so: that backward also sums the expansion's gradient)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)
    gqa = q.shape[1] != k.shape[1]
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    note = ""
    with sdpa_kernel(backend):
        try:
            out = torch.nn.functional.scaled_dot_product_attention(
                *leaves, is_causal=causal, enable_gqa=gqa)
        except RuntimeError:
            if not gqa:
                raise
            rep = q.shape[1] // k.shape[1]
            ks, vs = (x.repeat_interleave(rep, 1) for x in leaves[1:])
            out = torch.nn.functional.scaled_dot_product_attention(leaves[0], ks, vs,
                                                                   is_causal=causal)
            note = "K/V expanded to every query head (no enable_gqa under this backend)"

    def run():
        return torch.autograd.grad(out, leaves, do, retain_graph=True)
    return run, run(), note


def _flash_attn_backward(q, k, v, do, causal, torch):
    from flash_attn import flash_attn_func  # (batch, seqlen, heads, head_dim)
    leaves = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
    out = flash_attn_func(*leaves, causal=causal)
    dout = do.transpose(1, 2).contiguous()

    def run():
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return run, [g.transpose(1, 2) for g in run()], ""


def _error(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def contenders_for(shape, head_dim, causal, schedules, torch):
    """[(name, call of launch number i, note)], the gradients' errors against the first peer."""
    import wavefront
    from wavefront.backward_schedules import BACKWARD_CTA_SCHEDULES, BACKWARD_SCANS
    from wavefront.measure.timing import input_sets_needed
    batch, heads, kv_heads, seqlen = shape
    per_set = 2 * (3 * heads + 2 * kv_heads) * batch * seqlen * head_dim * 2
    props = torch.cuda.get_device_properties(0)
    n_sets = input_sets_needed(per_set, props.L2_cache_size)
    sets = []
    for s in range(n_sets):
        q, k, v, do = _inputs(shape, head_dim, 100 + s, torch)
        out, lse = wavefront.attention(q, k, v, causal=causal, return_lse=True)
        sets.append((q, k, v, out, lse, do))
    # named as in data/backward_bench (measured when the atomic mode was the default)
    ours = {"wavefront": {"deterministic": False}, "wavefront_det": {"deterministic": True}}
    if schedules:
        for cta in BACKWARD_CTA_SCHEDULES:
            for scan in BACKWARD_SCANS:
                ours[f"wavefront {cta}+{scan}"] = {"schedule": f"{cta}+{scan}"}
    found = []
    for name, options in ours.items():
        def run(i, options=options):
            q, k, v, out, lse, do = sets[i % n_sets]
            return wavefront.attention_backward(q, k, v, out, lse, do, causal=causal,
                                                **options)
        found.append((name, run, ""))
    peers, errors = [], {}
    q, k, v, _, _, do = sets[0]
    for name, make in (("cudnn", lambda: _sdpa_backward("CUDNN_ATTENTION", q, k, v, do,
                                                        causal, torch)),
                       ("fa2", lambda: _sdpa_backward("FLASH_ATTENTION", q, k, v, do,
                                                      causal, torch)),
                       ("flash_attn", lambda: _flash_attn_backward(q, k, v, do, causal,
                                                                   torch))):
        try:
            call, grads, note = make()
        except (ImportError, RuntimeError) as exc:
            print(f"  {name}: not run ({type(exc).__name__}: {str(exc).splitlines()[0]})")
            continue
        peers.append((name, lambda i, call=call: call(), note))
        if not errors:
            mine = wavefront.attention_backward(*sets[0], causal=causal)
            errors = {f"{g}_vs_{name}": _error(a, b)
                      for g, a, b in zip(("dq", "dk", "dv"), mine, grads)}
    return found + peers, errors


def bench(args, torch) -> list[dict]:
    from wavefront.measure.rounds import Contender, run_rounds
    from wavefront.results.measurement import paired_ratio
    records = []
    for shape_name in args.shapes:
        shape = SHAPES[shape_name]
        for head_dim in args.head_dims:
            for causal in args.masks:
                label = f"{shape_name} D{head_dim} {'causal' if causal else 'full'}"
                print(label, flush=True)
                found, errors = contenders_for(shape, head_dim, causal, args.schedules, torch)
                print("  gradient errors:", {k: f"{v:.2e}" for k, v in errors.items()})
                flops = backward_flops(shape[0], shape[1], shape[3], head_dim, causal)
                results = run_rounds([Contender(n, run, flops) for n, run, _ in found],
                                     rounds=args.rounds, per_round=args.per_round)
                by = {r.name: r for r in results}
                notes = {n: note for n, _, note in found}
                for r in results:
                    record = {"shape": shape_name, "head_dim": head_dim, "causal": causal,
                              "gpu": torch.cuda.get_device_name(0), **r.as_dict(),
                              "note": notes[r.name], "grad_errors": errors}
                    for peer in ("cudnn", "fa2"):
                        if peer in by and peer != r.name:
                            record[f"x_{peer}"] = paired_ratio(by[peer].samples_ms,
                                                               r.samples_ms)
                    records.append(record)
                    ratio = record.get("x_cudnn")
                    print(f"  {r.name:34s} {r.median_ms:8.3f} ms [{r.ci95_ms[0]:.3f}, "
                          f"{r.ci95_ms[1]:.3f}]  {r.tflops:6.1f} TFLOP/s"
                          + (f"  x cuDNN {ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}]"
                             if ratio else "")
                          + (f"  ({r.throttled_rounds} throttled)" if r.throttled_rounds
                             else "") + (f"  {notes[r.name]}" if notes[r.name] else ""),
                          flush=True)
    return records


def profile_once(args, torch) -> None:
    """Inside ncu: one warm call per schedule, then one profiled call in NVTX range wf:<n>."""
    import wavefront
    from wavefront.backward_schedules import BACKWARD_CTA_SCHEDULES, BACKWARD_SCANS
    from wavefront.measure.profiling import tag_for
    schedules = [f"{c}+{s}" for c in BACKWARD_CTA_SCHEDULES for s in BACKWARD_SCANS]
    n = 0
    for shape_name in args.shapes:
        for head_dim in args.head_dims:
            for causal in args.masks:
                q, k, v, do = _inputs(SHAPES[shape_name], head_dim, 7, torch)
                out, lse = wavefront.attention(q, k, v, causal=causal, return_lse=True)
                for schedule in schedules:
                    # the atomic mode: its K/V-major kernel's accesses are what
                    # `--predict` models (the dQ atomics included)
                    call = (lambda: wavefront.attention_backward(
                        q, k, v, out, lse, do, causal=causal, schedule=schedule,
                        deterministic=False))
                    call()
                    torch.cuda.synchronize()
                    torch.cuda.profiler.start()
                    torch.cuda.nvtx.range_push(tag_for(n))
                    call()
                    torch.cuda.nvtx.range_pop()
                    torch.cuda.synchronize()
                    torch.cuda.profiler.stop()
                    print(json.dumps({"tag": tag_for(n), "shape": shape_name,
                                      "head_dim": head_dim, "causal": causal,
                                      "schedule": schedule}), flush=True)
                    n += 1


def dram(args) -> list[dict]:
    """Runs this script's `--profile-once` under ncu (cold L2 per replay) and reads the DRAM
    bytes and duration of the K/V-major kernel of each schedule."""
    import tempfile

    from wavefront.device import find_ncu
    from wavefront.measure.profiling import COLD_REPLAY, csv_command, parse_ncu_csv
    from wavefront.results.measurement import METRIC_SETS
    ncu = find_ncu()
    if ncu is None:
        raise SystemExit("--dram needs Nsight Compute (ncu) on PATH")
    report = os.path.join(tempfile.mkdtemp(), "backward.ncu-rep")
    program = [sys.executable, os.path.abspath(__file__), "--profile-once", *args.passed]
    cmd = [ncu, *COLD_REPLAY, "--nvtx", "--kernel-name", KERNEL_FILTER,
           "--metrics", ",".join(METRIC_SETS["dram"]), "--export", report,
           "--force-overwrite", *program]
    ran = subprocess.run(cmd, capture_output=True, text=True)
    if ran.returncode:
        raise SystemExit(f"ncu failed ({ran.returncode}):\n{ran.stdout[-3000:]}"
                         f"\n{ran.stderr[-3000:]}")
    tags = {}
    for line in ran.stdout.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            tags[entry["tag"]] = entry
    kernels = parse_ncu_csv(subprocess.run(csv_command(ncu, report), capture_output=True,
                                           text=True, check=True).stdout)
    records = []
    for record in kernels:
        if record.tag in tags:
            row = {**tags[record.tag], **record.metrics}
            records.append(row)
            print(json.dumps(row), flush=True)
    return records


def predict(args) -> list[dict]:
    """The lock-step L2 model's DRAM reads of the K/V-major kernel per schedule (no GPU):
    `wavefront.model.backward_simulation`, on `--sms` SMs and an L2 of `--l2-mb` (default: an
    H100's 132 and 50 MB), fitted to nothing (a prediction, to hold against `--dram`)."""
    from wavefront.backward_schedules import (BACKWARD_CTA_SCHEDULES, BACKWARD_SCANS,
                                              DEFAULT_BACKWARD_TILES, BackwardLaunch)
    from wavefront.model.backward_simulation import predict_backward_l2
    from wavefront.schedules import AttentionProblem
    records = []
    for shape_name in args.shapes:
        batch, heads, kv_heads, seqlen = SHAPES[shape_name]
        for head_dim in args.head_dims:
            for causal in args.masks:
                problem = AttentionProblem(batch, heads, kv_heads, seqlen, seqlen, head_dim,
                                           causal, *DEFAULT_BACKWARD_TILES[head_dim])
                for cta in BACKWARD_CTA_SCHEDULES:
                    for scan in BACKWARD_SCANS:
                        launch = BackwardLaunch.of(problem, f"{cta}+{scan}", args.sms, 1,
                                                   int(args.l2_mb * (1 << 20)))
                        got = predict_backward_l2(launch)
                        row = {"shape": shape_name, "head_dim": head_dim, "causal": causal,
                               "schedule": launch.name, "sms": args.sms, "l2_mb": args.l2_mb,
                               "predicted_dram_read_bytes": got.dram_read_sectors * 32,
                               "predicted_l2_read_bytes": got.tex_read_sectors * 32}
                        records.append(row)
                        print(json.dumps(row), flush=True)
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"comma-separated, of {list(SHAPES)}")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--causal-only", action="store_true")
    parser.add_argument("--full-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=3)
    parser.add_argument("--schedules", action="store_true",
                        help="also time every backward schedule (CTA order x Q scan)")
    parser.add_argument("--dram", action="store_true",
                        help="DRAM bytes per schedule under ncu, instead of timing")
    parser.add_argument("--predict", action="store_true",
                        help="the lock-step L2 model's DRAM reads per schedule (no GPU)")
    parser.add_argument("--sms", type=int, default=132, help="--predict: SMs (H100: 132)")
    parser.add_argument("--l2-mb", type=float, default=50.0, help="--predict: L2 MiB")
    parser.add_argument("--profile-once", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="append the records to this JSON-lines file")
    raw = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(raw)
    args.passed = [a for a in raw if a not in ("--dram", "--schedules", "--predict")]
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; expected names among {list(SHAPES)}")
    args.head_dims = [int(d) for d in args.head_dims.split(",")]
    args.masks = [m for m in (False, True)
                  if not (args.causal_only and not m) and not (args.full_only and m)]
    if args.predict:
        records = predict(args)
    else:
        import torch
        if args.profile_once:
            profile_once(args, torch)
            return 0
        records = dram(args) if args.dram else bench(args, torch)
    if args.json:
        with open(args.json, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
