"""What limits D=128: the tuned kernel and cuDNN on the same launch, under Nsight Compute.

    ncu --profile-from-start off --clock-control none --metrics <METRICS> \
        python scripts/d128_limits.py [--causal]

Each contender is warmed up unprofiled, then launched once between profiler start and stop
(B1 H32 S8k D128 bf16, fresh random inputs). `METRICS` below are the tensor-pipe activity,
issue activity and the warp stall reasons per issued instruction; print them with
`python scripts/d128_limits.py --metrics`.

Per instruction (where in the SASS the warps wait), the same launches under the sampler:

    ncu --profile-from-start off --clock-control none --import-source no \
        --section SourceCounters --section WarpStateStats -o src python scripts/d128_limits.py
    ncu -i src.ncu-rep --page source --csv --print-source sass > sass.csv
    python scripts/d128_limits.py --summarise sass.csv [more.csv ...] [--json summary.json]

The summary groups each kernel's instructions by how many times they ran (a consumer warp's
loop body runs items x K/V tiles x warps times, its per-item code items x warps times), so
the samples of the loop, of the work item's start and end, and of the producer warp's code
fall apart without reading the SASS by hand; then the most-sampled instructions.
"""
import collections
import csv
import gzip
import json
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
# BAR.SYNC / BAR.ARV: warps of a CTA ordering each other (FlashAttention-3's ping-pong of two
# consumer warpgroups is two of them per K/V step); not WARPGROUP.DEPBAR, the MMA waits.
NAMED_BARRIER = re.compile(r"\bBAR\.")


def _number(row, column) -> float:
    value = row.get(column)
    return float(value) if value not in (None, "", "-") else 0.0


def summarise(path, groups=8, top=25) -> list[dict]:
    """Per kernel of an ncu `--page source --csv` export: total samples, the samples of each
    execution-count group with its leading stall reasons, the most-sampled instructions."""
    opener = gzip.open if str(path).endswith(".gz") else open
    kernels, rows, header = [], None, None
    with opener(path, "rt") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                rows = []
                kernels.append((row[1], rows))
            elif row and row[0] == "Address":
                header = row
            elif row and rows is not None:
                rows.append(dict(zip(header, row)))
    out = []
    num = _number
    for name, rows in kernels:
        reasons = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
        total = sum(num(r, SAMPLES) for r in rows)
        share = lambda x: round(100 * x / total, 2)  # noqa: E731
        by_count = collections.defaultdict(lambda: [0, 0.0, collections.Counter()])
        for r in rows:
            g = by_count[int(num(r, EXECUTED))]
            g[0] += 1
            g[1] += num(r, SAMPLES)
            for c in reasons:
                g[2][c[6:]] += num(r, c)
        ranked = sorted(by_count.items(), key=lambda kv: -kv[1][1])[:groups]
        hot = sorted(range(len(rows)), key=lambda i: -num(rows[i], SAMPLES))[:top]
        named = [{"index": i, "sass": r["Source"].strip(), "executed": int(num(r, EXECUTED)),
                  "samples_pct": share(num(r, SAMPLES))} for i, r in enumerate(rows)
                 if NAMED_BARRIER.search(r["Source"]) and num(r, EXECUTED) > 0]
        out.append({
            "kernel": name, "samples": total, "instructions": len(rows), "named_barriers": named,
            "groups": [{"executed": count, "instructions": n, "samples_pct": share(s),
                        "reasons_pct": {k: share(v) for k, v in c.most_common(4) if v}}
                       for count, (n, s, c) in ranked],
            "top": [{"index": i, "sass": rows[i]["Source"].strip(),
                     "executed": int(num(rows[i], EXECUTED)),
                     "samples_pct": share(num(rows[i], SAMPLES)),
                     "reasons_pct": {c[6:]: share(num(rows[i], c)) for c in reasons
                                     if num(rows[i], c) >= 0.1 * num(rows[i], SAMPLES) > 0}}
                    for i in hot]})
    return out


def print_summary(summary) -> None:
    for k in summary:
        print(f"\n{k['kernel'][:60]}: {k['samples']:.0f} samples, {k['instructions']} "
              "instructions")
        print("  executed x   instrs  samples %  leading reasons (% of the kernel's samples)")
        for g in k["groups"]:
            print(f"  {g['executed']:10d} {g['instructions']:8d} {g['samples_pct']:9.1f}  "
                  + " ".join(f"{r} {v:.1f}" for r, v in g["reasons_pct"].items()))
        print("  named barriers: " + "; ".join(
            f"#{b['index']} {b['sass']} x{b['executed']} ({b['samples_pct']:.2f}%)"
            for b in k["named_barriers"]))
        print("  most sampled: #index  % samples  executed  SASS  (reasons)")
        for t in k["top"]:
            print(f"  #{t['index']:<5d} {t['samples_pct']:6.2f} {t['executed']:9d}  "
                  f"{t['sass'][:60]:60s} "
                  + " ".join(f"{r} {v:.1f}" for r, v in t["reasons_pct"].items()))

STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "math_pipe_throttle",
          "mio_throttle", "wait", "dispatch_stall", "not_selected", "selected", "lg_throttle",
          "membar", "branch_resolving", "no_instruction", "sleeping", "misc")
METRICS = ",".join([
    "gpu__time_duration.sum",
    "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread", "launch__block_size", "launch__grid_size",
    *(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS)])

if __name__ == "__main__":
    if "--summarise" in sys.argv:
        args = sys.argv[sys.argv.index("--summarise") + 1:]
        paths = args[:args.index("--json")] if "--json" in args else args
        summaries = {}
        for path in paths:  # keyed by the export's name: sass_full.csv -> "full"
            key = path.split("/")[-1].split(".")[0].removeprefix("sass_")
            summaries[key] = summarise(path)
            print(f"== {key}")
            print_summary(summaries[key])
        if "--json" in args:
            with open(args[args.index("--json") + 1], "w") as f:
                json.dump(summaries, f, indent=0)
        sys.exit(0)
    if "--metrics" in sys.argv:
        print(METRICS)
        sys.exit(0)
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    import wavefront
    causal = "--causal" in sys.argv
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 32, 8192, 128, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)
    ours = lambda: wavefront.attention(q, k, v, causal=causal)  # noqa: E731
    for run in (ours, cudnn, ours, cudnn):
        run()
    torch.cuda.synchronize()
    err = float((ours().float() - cudnn().float()).norm() / cudnn().float().norm())
    assert err < 2e-2, err
    torch.cuda.cudart().cudaProfilerStart()
    ours()
    cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled: wavefront tuned and cuDNN, causal={causal}, rel. difference {err:.2e}")
