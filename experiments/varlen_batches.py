"""Which CTA order serves a packed batch of ragged sequences, and what does reading the lengths on the GPU cost?

A packed batch (FlashAttention's varlen layout) runs as one launch with one work table across
its sequences, so every CTA order applies across the batch: sequence by sequence
(persistent), longest first (dynamic), or in L2 groups of (sequence, K/V head) units whose
K/V fits half the L2 (grouped_dynamic). With cu_seqlens on the GPU the table is written
there, from them, on every call (`schedules.DeviceVarlenLaunch`); with host cu_seqlens it is
built once per lengths and cached. Every contender ran in the same interleaved rounds
(`wavefront bench-varlen`), each checked against float32 first: wavefront's call per order
and tuned, the tuned call with GPU cu_seqlens, torch's `varlen_attn` (FlashAttention-2), SDPA
on nested tensors (FA2, cuDNN), cuDNN over the batch padded to its longest sequence.

    wavefront bench-varlen --rounds 10 --out data/varlen_batches \\
        --schedule tuned,persistent+linear,dynamic+linear,grouped_dynamic+linear
    python experiments/varlen_batches.py plot --out DIR
"""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wavefront.report.draft import Section, md_table
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu, style
from wavefront.results.measurement import paired_ratio
from wavefront.results.records import VARLEN_BENCH_RECORDS

DATASETS = ()
RECORDS = ("varlen_batches",)
# bench-varlen left torch's varlen_attn out before 2f1590f: its runs of then (data/varlen_bench/,
# in the tree up to 59b0933) have no FA2 row.
RUN = "bench_varlen.jsonl"
TUNED = "wavefront varlen (tuned)"
ON_GPU = "wavefront varlen, cu_seqlens on GPU"
FA2_VARLEN = "torch varlen_attn (FA2)"


def _records(study) -> list[dict]:
    (records,) = study.records(VARLEN_BENCH_RECORDS, "varlen_batches", RUN).values()
    return records


def rows(study) -> pd.DataFrame:
    """Per mask and contender: TFLOP/s with its interval, and speed against FA2's varlen and
    against the tuned call with host cu_seqlens, paired by round."""
    records = _records(study)
    out = []
    for causal in (False, True):
        by = {r["contender"]: r for r in records if r["causal"] == causal}
        for name, r in by.items():
            row = {"GPU": short_gpu(r["gpu"]), "causal": causal, "contender": name,
                   "TFLOP/s": r["tflops"], "lo": r["tflops_ci95"][0],
                   "hi": r["tflops_ci95"][1], "ms": r["median_ms"],
                   "throttled": r.get("throttled_rounds", 0), "rounds": len(r["samples_ms"])}
            for label, reference in (("FA2 varlen", FA2_VARLEN), ("tuned", TUNED)):
                if reference in by:
                    row[f"x {label}"], row[f"x {label} lo"], row[f"x {label} hi"] = \
                        paired_ratio(by[reference]["samples_ms"], r["samples_ms"])
            out.append(row)
    return pd.DataFrame(out)


def _batch(study) -> str:
    r = _records(study)[0]
    lengths = r["lengths"]
    kv = f" KV{r['kv_heads']}" if r["kv_heads"] != r["heads"] else ""
    return (f"{len(lengths)} sequences, {sum(lengths):,} tokens, longest {max(lengths):,}, "
            f"H{r['heads']}{kv} D{r['head_dim']} bf16, {short_gpu(r['gpu'])}")


def _draw(d: pd.DataFrame, title: str):
    """TFLOP/s (median, 95% interval) of each contender on one packed batch, one panel per
    mask; wavefront's calls in blue, torch's paths in grey."""
    contenders = list(dict.fromkeys(d["contender"]))
    with style():
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 0.36 * len(contenders) + 1.7),
                                 sharey=True)
        for ax, causal in zip(axes, (False, True)):
            sub = d[d["causal"] == causal].set_index("contender").reindex(contenders)
            y = np.arange(len(contenders))
            colors = ["tab:blue" if c.startswith("wavefront") else "tab:gray"
                      for c in contenders]
            ax.barh(y, sub["TFLOP/s"], color=colors, height=0.6)
            ax.errorbar(sub["TFLOP/s"], y, xerr=[sub["TFLOP/s"] - sub["lo"],
                                                  sub["hi"] - sub["TFLOP/s"]],
                        fmt="none", ecolor="k", capsize=2, lw=1)
            ax.set_yticks(y)
            ax.set_yticklabels(contenders, fontsize=9)
            ax.set_title("causal" if causal else "non-causal", fontsize=9)
            ax.set_xlabel("TFLOP/s (useful; median, 95% interval)")
        axes[0].invert_yaxis()
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
    return fig


def figure(study):
    d = rows(study)
    return _draw(d, f"A packed batch of {_batch(study)}: useful TFLOP/s, "
                                     f"{int(d['rounds'].max())} interleaved rounds")


def table(study) -> pd.DataFrame:
    d = rows(study)
    out = []
    for name, sub in d.groupby("contender", sort=False):
        row = {"contender": name}
        for causal, r in sub.set_index("causal").iterrows():
            mask = "causal" if causal else "non-causal"
            row[f"{mask} TFLOP/s [95%]"] = f"{r['TFLOP/s']:.0f} [{r['lo']:.0f}, {r['hi']:.0f}]"
            row[f"{mask} x FA2 varlen"] = f"{r['x FA2 varlen']:.2f}"
        out.append(row)
    return pd.DataFrame(out)


def section(study) -> Section:
    d = rows(study).set_index(["causal", "contender"])
    s = Section()
    tuned = d.xs(TUNED, level="contender")
    s.claim(f"With cu_seqlens on the host the tuned call ran {tuned.loc[False, 'x FA2 varlen']:.2f}x "
            f"(non-causal) and {tuned.loc[True, 'x FA2 varlen']:.2f}x (causal) torch's "
            "varlen_attn (FA2), paired by round, both intervals above 1.",
            bool((tuned["x FA2 varlen lo"] > 1.0).all()),
            tuned[["x FA2 varlen", "x FA2 varlen lo"]].round(3).to_dict())
    on_gpu = d.xs(ON_GPU, level="contender")
    s.claim(f"With cu_seqlens on the GPU, the table written there on every call, the call ran "
            f"{on_gpu.loc[False, 'x tuned']:.3f}x and {on_gpu.loc[True, 'x tuned']:.3f}x the "
            "host path (whose table was built once), within 5%.",
            bool((on_gpu["x tuned"] >= 0.95).all()), on_gpu["x tuned"].round(3).to_dict())
    orders = {name: d.xs(f"wavefront varlen {name}", level="contender")["TFLOP/s"]
              for name in ("persistent+linear", "dynamic+linear", "grouped_dynamic+linear")}
    best = pd.DataFrame(orders).idxmax(axis=1)
    grouped = orders["grouped_dynamic+linear"]
    s.claim(f"Of the three orders named, L2 groups of ragged sequences (grouped_dynamic) ran "
            f"fastest in both masks: {grouped[True] / orders['persistent+linear'][True]:.2f}x "
            f"sequence by sequence and {grouped[True] / orders['dynamic+linear'][True]:.2f}x "
            "longest first, causal; the tuned call (its dense entry's tiles and levers too) ran "
            "faster than all three.",
            bool((best == "grouped_dynamic+linear").all())
            and bool((tuned["TFLOP/s"] > pd.DataFrame(orders).max(axis=1)).all()),
            {"best order": best.to_dict(), "tuned": tuned["TFLOP/s"].round(1).to_dict()})
    throttled = int(d["throttled"].max())
    s.text = (
        f"## Ragged batches: orders across packed sequences, lengths on the GPU ({_batch(study)})"
        "\n\n" + "One work table spans a packed batch, so the question of which CTAs share "
        "the L2 applies across sequences too. With cu_seqlens on the GPU, as FlashAttention's "
        "callers hold them, the table is written on the GPU from them on every call: the call "
        "then neither waits for the GPU nor rebuilds anything on the host, and a CUDA graph "
        "replays it for new lengths; what a call with new lengths costs the host and the GPU "
        "either way is in `data/varlen_call/b65469d/` (its notes: `data/varlen_call/RUNS.md.gz`, "
        "section b65469d). Below, the host path's launcher is "
        "cached (its lengths do not change between rounds), while the GPU path writes its "
        "table on every call." + "\n\n" + md_table(table(study)) + "\n\n"
        + f"Up to {throttled} of a contender's rounds were throttled (NVML)."
        "\n\n![ragged batch](figures/varlen_batches.png)")
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
