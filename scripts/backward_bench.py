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


# --variants: each named config (deterministic), and these also in the atomic mode
ATOMIC_VARIANTS = ("first_cut", "two_warpgroups", "kv_wide", "atomic_coalesced")
# ... and these only in the atomic mode (their deterministic mode is another config's)
ATOMIC_ONLY = ("atomic_coalesced",)
# bf16 gradients against the float64 reference: the bound the GPU tests hold the kernel to
GRAD_TOLERANCE = 2e-2


def variant_options(names, head_dim=None) -> dict[str, dict]:
    """Contender name -> attention_backward options, for config names (of BACKWARD_CONFIGS).
    With `head_dim`: a config equal to an earlier one's at that head dim is left out (the
    same binaries; said on the console)."""
    from wavefront.backward_schedules import BACKWARD_CONFIGS, backward_config
    unknown = [n for n in names if n not in BACKWARD_CONFIGS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; expected 'all' or names among "
                         f"{list(BACKWARD_CONFIGS)}")
    found, seen = {}, {}
    for name in names:
        if head_dim is not None:
            config = backward_config(name, head_dim)
            if config in seen:
                print(f"  {name}: the same config as {seen[config]} at D{head_dim}, not timed "
                      "twice", flush=True)
                continue
            seen[config] = name
        if name not in ATOMIC_ONLY:
            found[f"det[{name}]"] = {"config": name, "deterministic": True}
        if name in ATOMIC_VARIANTS:
            found[f"atomic[{name}]"] = {"config": name, "deterministic": False}
    return found


# The check's shape: GQA 4:2, 1024 rows (a multiple of every tile, as the bench's shapes are,
# so the check builds the very binaries the bench times; ragged rows are the GPU tests')
CHECK_SHAPE = (1, 4, 2, 1024)


def _check_inputs(head_dim, causal, torch):
    batch, heads, kv_heads, seqlen = CHECK_SHAPE
    g = torch.Generator(device="cuda").manual_seed(1000 + head_dim + causal)

    def randn(h):
        return torch.randn(batch, h, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                           generator=g)
    return randn(heads), randn(kv_heads), randn(kv_heads), randn(heads)


def _warm(jobs):
    """In a worker process: build (JIT-compile into cuTile's disk cache) the binaries of each
    (head_dim, causal, options) by one call at the check's shape. -> seconds taken."""
    import time

    import torch

    import wavefront
    from wavefront.kernel.backward_call import attention_backward
    start = time.perf_counter()
    for head_dim, causal, options in jobs:
        q, k, v, do = _check_inputs(head_dim, causal, torch)
        out, lse = wavefront.attention(q, k, v, causal=causal, return_lse=True)
        try:
            attention_backward(q, k, v, out, lse, do, causal=causal, **options)
        except Exception as exc:  # the check in the main process reports it by name
            print(f"  warm-up of {options} at D{head_dim}: {type(exc).__name__}", flush=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def warm_variants(args) -> None:
    """Compile every --variants binary in parallel worker processes before the grid (cuTile
    compiles under one process-wide lock; its disk cache then serves the bench's process)."""
    import multiprocessing
    import time
    jobs = [(d, c, o) for d in args.head_dims for c in args.masks
            for o in variant_options(args.variants, d).values()]
    workers = max(1, min(len(jobs), args.compile_workers))
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_warm, [jobs[i::workers] for i in range(workers)])
    print(f"compiled {len(jobs)} variant calls in {workers} processes in "
          f"{time.perf_counter() - start:.0f} s", flush=True)


def check_variants(options: dict[str, dict], head_dim: int, causal: bool, torch) -> dict:
    """Each variant's gradients on fresh random inputs (`CHECK_SHAPE`, GQA, a shape the
    reference can hold) against the project's float64 reference
    (`measure.backward_reference`), the gradient memory poisoned with NaN first.
    -> {name: the largest of dq's, dk's and dv's relative norm errors, or the failure}."""
    from wavefront.kernel.backward_call import attention_backward
    from wavefront.measure.backward_reference import reference_attention_backward
    import wavefront
    q, k, v, do = _check_inputs(head_dim, causal, torch)
    *_, dq, dk, dv = reference_attention_backward(
        *(x.float().cpu().numpy() for x in (q, k, v, do)), causal=causal)
    want = [torch.from_numpy(x).cuda() for x in (dq, dk, dv)]
    out, lse = wavefront.attention(q, k, v, causal=causal, return_lse=True)
    found = {}
    for name, opts in options.items():
        # NaN in blocks of the gradients' sizes, all held until freed together: the
        # allocator hands them to the call's outputs and scratch next, so an output the
        # kernels fail to write shows as NaN
        poison = [torch.full_like(x, float("nan")) for x in (q, k, v, q, lse, lse)]
        del poison
        try:
            got = attention_backward(q, k, v, out, lse, do, causal=causal, **opts)
            torch.cuda.synchronize()
        except Exception as exc:  # recorded as failed; the other variants go on
            found[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        errors = [_error(a, b) if torch.isfinite(a).all() else float("inf")
                  for a, b in zip(got, want)]
        found[name] = max(errors)
    return found


def contenders_for(shape, head_dim, causal, schedules, torch, variants=None):
    """[(name, call of launch number i, note)], the gradients' errors against the first peer.
    `variants`: {name: options} of `--variants` (checked already), timed instead of the plain
    call's two modes, through `wavefront.kernel.backward_call.attention_backward` (the public
    call's options check aside, the same host path)."""
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
    public = wavefront.attention_backward
    calls = {name: public for name in ours}
    if variants is not None:
        from wavefront.kernel.backward_call import attention_backward as by_config
        # the named configs through the kernel's call, and the public call as users make it
        # (its default config) beside them
        calls = {**{name: by_config for name in variants}, "wavefront_det": public}
        ours = {**variants, "wavefront_det": {"deterministic": True}}
    found = []
    for name, options in ours.items():
        def run(i, options=options, call=calls[name]):
            q, k, v, out, lse, do = sets[i % n_sets]
            return call(q, k, v, out, lse, do, causal=causal, **options)
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


class RecordLog(list):
    """The records, each also appended to `path` (--json) as soon as it is made: a run cut
    short (a device call's time limit) keeps every configuration it measured."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def append(self, record):
        super().append(record)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def bench(args, torch) -> list[dict]:
    from wavefront.measure.rounds import Contender, run_rounds
    from wavefront.results.measurement import paired_ratio
    records = RecordLog(args.json)
    if args.variants and args.compile_workers > 0:
        warm_variants(args)
    for shape_name in args.shapes:
        shape = SHAPES[shape_name]
        for head_dim in args.head_dims:
            for causal in args.masks:
                label = f"{shape_name} D{head_dim} {'causal' if causal else 'full'}"
                print(label, flush=True)
                variants = checks = None
                if args.variants:
                    options = variant_options(args.variants, head_dim)
                    checks = check_variants(options, head_dim, causal, torch)
                    print("  errors vs the float64 reference:",
                          {n: e if isinstance(e, str) else f"{e:.2e}" for n, e in checks.items()})
                    variants = {n: o for n, o in options.items()
                                if not isinstance(checks[n], str) and checks[n] < GRAD_TOLERANCE}
                    for n in options.keys() - variants.keys():
                        records.append({"shape": shape_name, "head_dim": head_dim,
                                        "causal": causal, "name": n, "failed": str(checks[n])})
                found, errors = contenders_for(shape, head_dim, causal, args.schedules, torch,
                                               variants)
                print("  gradient errors:", {k: f"{v:.2e}" for k, v in errors.items()})
                flops = backward_flops(shape[0], shape[1], shape[3], head_dim, causal)
                results = run_rounds([Contender(n, run, flops) for n, run, _ in found],
                                     rounds=args.rounds, per_round=args.per_round,
                                     warmup=args.warmup)
                by = {r.name: r for r in results}
                notes = {n: note for n, _, note in found}
                for r in results:
                    record = {"shape": shape_name, "head_dim": head_dim, "causal": causal,
                              "gpu": torch.cuda.get_device_name(0), **r.as_dict(),
                              "note": notes[r.name], "grad_errors": errors}
                    if checks and r.name in checks:
                        record["error_vs_float32"] = checks[r.name]
                    for peer in ("cudnn", "fa2"):
                        if peer in by and peer != r.name:
                            record[f"x_{peer}"] = paired_ratio(by[peer].samples_ms,
                                                               r.samples_ms)
                    records.append(record)
                    ratio, fa2 = record.get("x_cudnn"), record.get("x_fa2")
                    print(f"  {r.name:34s} {r.median_ms:8.3f} ms [{r.ci95_ms[0]:.3f}, "
                          f"{r.ci95_ms[1]:.3f}]  {r.tflops:6.1f} TFLOP/s"
                          + (f"  x cuDNN {ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}]"
                             if ratio else "")
                          + (f"  x FA2 {fa2[0]:.2f}" if fa2 and args.variants else "")
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


def _compiled_facts(job):
    """(kernel, config name, head dim, causal, variant) -> one table row (in a worker)."""
    kernel, config, head_dim, causal, variant = job
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.cubin import kernel_resources
    from wavefront.kernel.sass import disassemble, mma_loop_table, summarise
    row = {"kernel": kernel, "config": config, "head_dim": head_dim, "causal": causal,
           "label": variant.label, "tiles": f"{variant.tile_m}x{variant.tile_n}",
           "worker_warps": variant.worker_warps}
    try:
        cubin = compile_variant(variant, "sm_90")
    except Exception as exc:  # recorded; the other binaries go on
        return {**row, "failed": f"{type(exc).__name__}: {str(exc)[:200]}"}
    (res,) = kernel_resources(cubin)
    sass = disassemble(cubin)
    summary = summarise(sass)
    text = sass.splitlines()
    loops = mma_loop_table(sass)
    # the steady loop: the unmasked one, which does nearly all the work (the fewest integer
    # compares; the shortest of equals), and the worst spills of any MMA loop beside it
    steady = min(loops, key=lambda r: (r["isetp"], r["instructions"])) if loops else {}
    worst = max((r["ldl"] + r["stl"] for r in loops), default=0)
    return {**row, "registers": res.registers, "shared_bytes": res.shared_bytes,
            "ldl": summary.local_loads, "stl": summary.local_stores,
            "red": sum("REDG" in line or "ATOMG" in line for line in text),
            "loops": len(loops), "loop_spills_max": worst,
            **{f"loop_{k}": v for k, v in steady.items() if k != "start"}}


def sass_jobs(names, head_dims, masks):
    """Every distinct binary the named configs run: K/V-major (deterministic; atomic for
    ATOMIC_VARIANTS) and the dQ kernel, bfloat16, per head dim and mask."""
    from wavefront.backward_schedules import backward_config
    from wavefront.kernel.backward import config_variants
    jobs, seen = [], set()
    for name in names:
        for head_dim in head_dims:
            for causal in masks:
                built = config_variants(backward_config(name, head_dim), "bfloat16", head_dim,
                                        causal)
                if name not in ATOMIC_VARIANTS:
                    del built["kv_atomic"]
                for kernel, variant in built.items():
                    if variant not in seen:
                        seen.add(variant)
                        jobs.append((kernel, name, head_dim, causal, variant))
    return jobs


def sass_table(args) -> list[dict]:
    """`--sass`: compile (tileiras, sm_90, no GPU) every binary of the --variants configs
    (default: all) and print what each compiled to: registers per thread, shared memory,
    local-memory loads/stores (spills) in the whole kernel and at most in one MMA loop, float
    reductions (REDG), and the steady (unmasked) MMA loop's mix per trip of one warpgroup
    (warpgroup MMAs and their multiply-accumulates, exponentials, shared/global loads and
    stores, barriers, spills)."""
    from concurrent.futures import ProcessPoolExecutor
    from wavefront.backward_schedules import BACKWARD_CONFIGS
    names = args.variants or list(BACKWARD_CONFIGS)
    jobs = sass_jobs(names, args.head_dims, args.masks)
    print("kernel     config             D   mask   tiles   ww regs smemKiB LDL/STL  maxSp "
          "RED | steady loop: instr HGMMA KiMAC EX2 LDS STS LDG bar LDL/STL", flush=True)
    records = []
    with ProcessPoolExecutor(max_workers=2) as pool:
        for row in pool.map(_compiled_facts, jobs):
            records.append(row)
            head = (f"{row['kernel']:10s} {row['config']:18s} {row['head_dim']:3d} "
                    f"{'causal' if row['causal'] else 'full':6s} {row['tiles']:7s} "
                    f"{row['worker_warps'] or '-':>3}")
            if "failed" in row:
                print(f"{head}  FAILED {row['failed']}", flush=True)
                continue
            print(f"{head} {row['registers']:4d} {row['shared_bytes'] / 1024:7.1f} "
                  f"{row['ldl']:4d}/{row['stl']:<4d} {row['loop_spills_max']:5d} "
                  f"{row['red']:4d} | {row.get('loop_instructions', 0):17d} "
                  f"{row.get('loop_hgmma', 0):5d} {row.get('loop_macs', 0) // 1024:5d} "
                  f"{row.get('loop_ex2', 0):3d} {row.get('loop_lds', 0):3d} "
                  f"{row.get('loop_sts', 0):3d} {row.get('loop_ldg', 0):3d} "
                  f"{row.get('loop_barriers', 0):3d} "
                  f"{row.get('loop_ldl', 0)}/{row.get('loop_stl', 0)}", flush=True)
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


# --red-probe: the accumulator region each layout's adds land in (fits the L2 of an H100 or
# H200, so the adds are timed, not DRAM), CTAs per SM, and adds per CTA and launch
PROBE_REGION_BYTES = 16 << 20
PROBE_CTAS_PER_SM = 2
PROBE_ROUNDS = 64


def red_probe(args, torch) -> list[dict]:
    """`--red-probe`: the atomic dQ accumulate alone (`wavefront.kernel.backward.dq_add_probe`),
    row-major and coalesced, per head dim, in interleaved rounds: float adds per second and per
    SM clock, and the floor they set on the atomic mode of each bench shape (its dQ adds at
    128 K/V rows a CTA, over that rate; causal: the visited tile pairs, about half)."""
    import cuda.tile as ct
    from wavefront.kernel.backward import TILE_M_PROBE, DqAddProbeVariant
    from wavefront.measure.rounds import Contender, run_rounds
    records = RecordLog(args.json)
    props = torch.cuda.get_device_properties(0)
    ctas = PROBE_CTAS_PER_SM * props.multi_processor_count
    stream = torch.cuda.current_stream().cuda_stream
    for head_dim in args.head_dims:
        tile_floats = TILE_M_PROBE * head_dim
        tiles = PROBE_REGION_BYTES // (4 * tile_floats)
        adds = ctas * PROBE_ROUNDS * tile_floats
        contenders = []
        for coalesced in (False, True):
            shape = ((1, 1, tiles, tile_floats) if coalesced
                     else (1, 1, tiles * TILE_M_PROBE, head_dim))
            acc = torch.zeros(shape, dtype=torch.float32, device="cuda")
            kernel = DqAddProbeVariant(head_dim, TILE_M_PROBE, coalesced).kernel()

            def run(i, acc=acc, kernel=kernel, coalesced=coalesced):
                ct.launch(stream, (ctas, 1, 1), kernel,
                          (acc, PROBE_ROUNDS, 1, head_dim, TILE_M_PROBE, coalesced))
            contenders.append(Contender("coalesced" if coalesced else "row-major", run, adds))
        for r in run_rounds(contenders, rounds=max(6, args.rounds), per_round=args.per_round,
                            warmup=args.warmup):
            rate = adds / (r.median_ms * 1e-3)
            clock = (sorted(r.sm_clock_mhz)[len(r.sm_clock_mhz) // 2] * 1e6
                     if r.sm_clock_mhz else None)
            record = {"probe": "dq_add", "head_dim": head_dim, "layout": r.name,
                      "gpu": props.name, "adds_per_launch": adds, **r.as_dict(),
                      "adds_per_s": rate,
                      "adds_per_sm_clock": (rate / (props.multi_processor_count * clock)
                                            if clock else None)}
            floors = {}
            for shape_name, (batch, heads, _, seqlen) in SHAPES.items():
                for causal in (False, True):
                    total = batch * heads * seqlen * head_dim * (seqlen / 128)
                    total *= 0.5 if causal else 1.0
                    floors[f"{shape_name} {'causal' if causal else 'full'}"] = (
                        total / rate * 1e3)
            record["floor_ms"] = floors
            records.append(record)
            print(f"D{head_dim} {r.name:10s} {r.median_ms:7.3f} ms [{r.ci95_ms[0]:.3f}, "
                  f"{r.ci95_ms[1]:.3f}]  {rate / 1e9:7.1f} G adds/s"
                  + (f"  {record['adds_per_sm_clock']:.2f} per SM clock"
                     if record["adds_per_sm_clock"] else "")
                  + "  floor: " + ", ".join(f"{k} {v:.2f} ms" for k, v in floors.items()),
                  flush=True)
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
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", default=None,
                        help="'all' or comma-separated names of BACKWARD_CONFIGS: time each "
                             "config (deterministic; and atomic for "
                             f"{list(ATOMIC_VARIANTS)}) instead of the plain call, each checked "
                             "against the float64 reference first")
    parser.add_argument("--compile-workers", type=int, default=8,
                        help="--variants: processes that compile the variants' binaries "
                             "before the grid (0: compile on first call instead)")
    parser.add_argument("--sass", action="store_true",
                        help="compile every --variants config for sm_90 (no GPU) and print "
                             "registers, spills and the K/V (Q) loop's instruction mix")
    parser.add_argument("--schedules", action="store_true",
                        help="also time every backward schedule (CTA order x Q scan)")
    parser.add_argument("--dram", action="store_true",
                        help="DRAM bytes per schedule under ncu, instead of timing")
    parser.add_argument("--predict", action="store_true",
                        help="the lock-step L2 model's DRAM reads per schedule (no GPU)")
    parser.add_argument("--red-probe", action="store_true",
                        help="time the atomic dQ accumulate alone (row-major and coalesced "
                             "layouts): float adds per second and the floor they set")
    parser.add_argument("--sms", type=int, default=132, help="--predict: SMs (H100: 132)")
    parser.add_argument("--l2-mb", type=float, default=50.0, help="--predict: L2 MiB")
    parser.add_argument("--profile-once", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="append the records to this JSON-lines file")
    raw = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(raw)
    args.passed = [a for a in raw if a not in ("--dram", "--schedules", "--predict",
                                               "--red-probe")]
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; expected names among {list(SHAPES)}")
    args.head_dims = [int(d) for d in args.head_dims.split(",")]
    if args.variants:
        from wavefront.backward_schedules import BACKWARD_CONFIGS
        args.variants = (list(BACKWARD_CONFIGS) if args.variants == "all"
                         else [v.strip() for v in args.variants.split(",") if v.strip()])
        variant_options(args.variants)  # unknown names: a clear error before anything runs
    args.masks = [m for m in (False, True)
                  if not (args.causal_only and not m) and not (args.full_only and m)]
    if args.sass:
        records = sass_table(args)
    elif args.predict:
        records = predict(args)
    else:
        import torch
        if args.profile_once:
            profile_once(args, torch)
            return 0
        if args.red_probe:
            records = red_probe(args, torch)
        else:
            records = dram(args) if args.dram else bench(args, torch)
    if args.json and not isinstance(records, RecordLog):
        with open(args.json, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
