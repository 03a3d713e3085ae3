"""Which kernel levers reach cuDNN's level? The searches of `wavefront tune`, per GPU and shape.

`wavefront tune` compiles every candidate (tile shape, CTAs per SM, consumer warps, clusters,
the K/V latency hint, static or dynamic assignment), reads its SASS, times the rest and the
peers in interleaved rounds, then searches FlashAttention-4's softmax levers around the
winner. Each search lies in data/tune/<search>/ (tune.jsonl.gz: every candidate; levers.jsonl.gz:
the best per lever value), with the command in its manifest. No figure: the draft prints the
tables.
"""
import pandas as pd

from wavefront.report.draft import Section, md_table, wrap
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu
from wavefront.results.records import LEVER_RECORDS, TUNE_RECORDS, shape_name

DATASETS = ()
RECORDS = ("tune",)


def searches(study) -> dict[str, list[dict]]:
    """Every search's candidates, by search name."""
    return {name.split("/")[0]: rows
            for name, rows in study.records(TUNE_RECORDS, "tune", "*/tune.jsonl.gz").items()}


def lever_record(study) -> pd.DataFrame:
    """Per search, shape and lever value, the best timed candidate with that value relative to
    the shape's best."""
    return pd.DataFrame([
        {"search": name.split("/")[0], "GPU": short_gpu(r["gpu"]),
         "shape": shape_name(r["shape"]), "lever": r["lever"], "value": r["value"],
         "timed": r["timed"], "best TFLOP/s": r["best_tflops"], "of best": r["of_best"],
         "binary": r["best_label"]}
        for name, rows in study.records(LEVER_RECORDS, "tune", "*/levers.jsonl").items()
        for r in rows])


def best(study) -> pd.DataFrame:
    """Each search's fastest candidate per shape, with its interval and cuDNN / FA2 ratios."""
    out = []
    for search, rows in searches(study).items():
        by_shape: dict = {}
        for r in rows:
            # the softmax stage re-times the winner: taking the higher of two timings of
            # one candidate would bias the best upward
            if r.get("peer") or not r.get("tflops") or r.get("stage") == "softmax":
                continue
            key = shape_name(r["shape"])
            if key not in by_shape or r["tflops"] > by_shape[key]["tflops"]:
                by_shape[key] = r
        for shape, r in by_shape.items():
            lv = r["levers"]
            out.append({"search": search, "GPU": short_gpu(r["gpu"]), "shape": shape,
                        "schedule": lv["schedule"], "tiles": lv["tiles"],
                        "occupancy": lv["occupancy"], "worker warps": lv["worker_warps"],
                        "cluster": lv["cluster"], "K/V latency": lv["kv_latency"],
                        "TFLOP/s": r["tflops"], "lo": r["tflops_ci95"][0],
                        "hi": r["tflops_ci95"][1], "x cuDNN": r.get("x_cudnn"),
                        "x FA2": r.get("x_fa2")})
    return pd.DataFrame(out)


def softmax_levers(study) -> pd.DataFrame:
    """The searches' second stage: FlashAttention-4's softmax levers on each shape's winner,
    every candidate against that winner (rescale 0, no polynomial) of the same rounds."""
    out = []
    for search, rows in searches(study).items():
        stage = [r for r in rows
                 if r.get("stage") == "softmax" and not r.get("peer") and r.get("tflops")]
        for shape in dict.fromkeys(shape_name(r["shape"]) for r in stage):
            mine = [r for r in stage if shape_name(r["shape"]) == shape]
            base = [r for r in mine if not r["levers"].get("rescale_threshold")
                    and not r["levers"].get("exp2_poly")]
            if len(base) != 1:
                continue
            for r in mine:
                lv = r["levers"]
                out.append({"search": search, "GPU": short_gpu(r["gpu"]),
                            "shape": shape, "rescale threshold": lv["rescale_threshold"],
                            "exp2 quarters on FMA": lv["exp2_poly"],
                            "TFLOP/s": r["tflops"], "lo": r["tflops_ci95"][0],
                            "hi": r["tflops_ci95"][1],
                            "x winner": r["tflops"] / base[0]["tflops"],
                            "x cuDNN": r.get("x_cudnn")})
    return pd.DataFrame(out)


def table(study) -> pd.DataFrame:
    return best(study)


def section(study) -> Section:
    s = Section()
    top = best(study)
    shown = top.copy()
    shown["TFLOP/s [95%]"] = [f"{t:.0f} [{lo:.0f}, {hi:.0f}]"
                              for t, lo, hi in zip(top["TFLOP/s"], top["lo"], top["hi"])]
    shown["worker warps"] = shown["worker warps"].map(lambda x: "auto" if pd.isna(x) else int(x))
    shown["x cuDNN"] = shown["x cuDNN"].map(lambda x: f"{x:.3f}")
    shown["x FA2"] = shown["x FA2"].map(lambda x: f"{x:.2f}")
    rec = lever_record(study)
    rec = rec[rec["search"] == "h100_run1"].copy()
    rec["of best"] = rec["of best"].map(lambda x: "" if pd.isna(x) else f"{x:.3f}")
    piv = rec.pivot_table(index=["lever", "value"], columns="shape", values="of best",
                          aggfunc="first").reset_index()
    base = top[top["shape"].str.startswith("B1 H32 S8k")]
    d128 = base[base["shape"].str.contains("D128")]
    d64 = base[base["shape"].str.contains("D64")]
    auto = int(base["worker warps"].isna().sum())
    tune_text = wrap(
        "`wavefront tune` searches cuTile's levers per GPU, head dim, mask and shape: tile "
        "shape, CTAs per SM, `num_worker_warps` (8: two consumer warpgroups, FlashAttention-3's "
        "layout), `num_ctas` (2-CTA clusters), the K/V loads' latency hint, and static or "
        "dynamic assignment. Each candidate is compiled and its SASS read first (spilling or "
        "serialised candidates are recorded, not timed), then the rest and cuDNN / FA2 are "
        "timed in interleaved rounds after a float32 check. The fastest per shape goes to "
        "`wavefront/kernel/tuned.json`, which `wavefront.attention` uses by default, taking "
        "the entry of the nearest tuned shape. Fastest per search and shape (bf16):")
    s.claim(f"At cuDNN's level: at B=1 H=32 S=8k the tuned kernel runs "
            f"{float(d128['x cuDNN'].min()):.2f}-{float(d128['x cuDNN'].max()):.2f}x cuDNN at "
            f"D=128 and {float(d64['x cuDNN'].min()):.2f}-{float(d64['x cuDNN'].max()):.2f}x at "
            f"D=64 (same rounds, H100 and H200); every winner there uses 128x128 tiles, and "
            f"{len(base) - auto} of {len(base)} two consumer warpgroups.",
            float(d128["x cuDNN"].min()) >= 0.9 and float(d64["x cuDNN"].min()) >= 0.95
            and (base["tiles"] == "128x128").all(), base["x cuDNN"].tolist())
    other = top[~top["shape"].str.startswith("B1 H32 S8k")]
    s.claim(f"On the other tuned shapes (B>1, GQA; H100) the best candidate ran "
            f"{float(other['x cuDNN'].min()):.2f}-{float(other['x cuDNN'].max()):.2f}x "
            f"cuDNN, and {int((other['tiles'] != '128x128').sum())} of {len(other)} winners "
            f"there do not use the B=1 winners' 128x128 tiles: hence a table keyed by shape.",
            len(other) > 0 and float(other["x cuDNN"].min()) >= 0.9, other["x cuDNN"].tolist())

    t = softmax_levers(study)
    soft = t.copy()
    soft["TFLOP/s [95%]"] = [f"{x:.0f} [{lo:.0f}, {hi:.0f}]"
                             for x, lo, hi in zip(t["TFLOP/s"], t["lo"], t["hi"])]
    soft["x winner"] = soft["x winner"].map(lambda x: f"{x:.3f}")
    soft["x cuDNN"] = soft["x cuDNN"].map(lambda x: f"{x:.3f}")
    tried = t[(t["rescale threshold"] > 0) | (t["exp2 quarters on FMA"] > 0)]
    resc = tried[(tried["rescale threshold"] > 0) & (tried["exp2 quarters on FMA"] == 0)]
    poly = tried[(tried["rescale threshold"] == 0) & (tried["exp2 quarters on FMA"] == 1)]
    softmax_text = wrap(
        "FlashAttention-4's two softmax tricks are kernel levers too (`rescale_threshold`, "
        "`exp2_poly`), searched on each shape's winner in rounds of their own: rescale the "
        "accumulator only when some row maximum grew by more than 2^8 (exact after the final "
        "normalisation; in cuTile the test is a tile condition, a reduction across the CTA's "
        "warps every K/V tile), and exponentiate a quarter or half of the score columns with a "
        "degree-3 polynomial and exponent-bit arithmetic on the FMA units instead of MUFU.EX2. "
        "Against the winner in the same rounds:")
    s.claim(f"FlashAttention-4's softmax tricks lose on the H100 in cuTile: the conditional "
            f"rescale ran {float(resc['x winner'].min()):.2f}-{float(resc['x winner'].max()):.2f}x "
            f"the winner and a quarter of the exp2 on the FMA units "
            f"{float(poly['x winner'].min()):.2f}-{float(poly['x winner'].max()):.2f}x; no "
            f"shape's best used either.",
            len(tried) > 0 and bool((tried["x winner"] < 1.0).all()), tried["x winner"].tolist())
    s.text = f"""## A kernel at cuDNN's level: the lever search

{tune_text}

{md_table(shown.drop(columns=["TFLOP/s", "lo", "hi"]))}

What each lever did in the first H100 search (the best candidate with that value, relative to
the best of the shape; the first search also had 64x64 tiles and the heads-fastest `dynamic`
order):

{md_table(piv)}

{softmax_text}

{md_table(soft.drop(columns=["TFLOP/s", "lo", "hi", "search"]))}

Why they lose here (SASS, `wavefront compile`): on Hopper the FMA pipe issues 128 lanes per
SM per clock against MUFU's 16, but the polynomial costs about eight instructions per element
(clamp, floor, convert, three FMAs, shift, add) where MUFU.EX2 costs one, so the FMA pipe,
already carrying the scaling, row maxima and sums, saturates first; and the rescale test needs
the whole CTA's maxima each K/V tile, a barrier the unconditional multiply never had. The
tricks were designed for Blackwell, where the accumulator lives in tensor memory and
exponentials are scarcer relative to MMA throughput."""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
