"""Where a kernel's warps wait, per instruction: an Nsight Compute source-page export
(`ncu -i R.ncu-rep --page source --csv --print-source sass`) summarised per kernel
(`wavefront stalls`; data/d128_limits/sass/).

The summary groups each kernel's instructions by how many times they ran (a consumer warp's
loop body runs items x K/V tiles x warps times, its per-item code items x warps times), so
the samples of the loop, of the work item's start and end, and of the producer warp's code
fall apart without reading the SASS by hand; then the most-sampled instructions.
"""
from __future__ import annotations

import collections
import csv
import gzip
import re

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


def summary_text(summary) -> str:
    """`summarise`'s kernels as the table `wavefront stalls` prints."""
    lines = []
    for k in summary:
        lines += [f"\n{k['kernel'][:60]}: {k['samples']:.0f} samples, {k['instructions']} "
                  "instructions",
                  "  executed x   instrs  samples %  leading reasons (% of the kernel's samples)"]
        lines += [f"  {g['executed']:10d} {g['instructions']:8d} {g['samples_pct']:9.1f}  "
                  + " ".join(f"{r} {v:.1f}" for r, v in g["reasons_pct"].items())
                  for g in k["groups"]]
        lines.append("  named barriers: " + "; ".join(
            f"#{b['index']} {b['sass']} x{b['executed']} ({b['samples_pct']:.2f}%)"
            for b in k["named_barriers"]))
        lines.append("  most sampled: #index  % samples  executed  SASS  (reasons)")
        lines += [f"  #{t['index']:<5d} {t['samples_pct']:6.2f} {t['executed']:9d}  "
                  f"{t['sass'][:60]:60s} "
                  + " ".join(f"{r} {v:.1f}" for r, v in t["reasons_pct"].items())
                  for t in k["top"]]
    return "\n".join(lines)
