"""Causal GQA at long S: does the CTA order (how many heads' K/V are in flight) or sawtooth pay?

Does the CTA order, which decides how many heads' K/V are in flight, let the L2 saving (of the
order, or of sawtooth's scan) become speed?

B=1, 32 query heads over 8 K/V heads, S=32k, D=128, causal (K/V of all heads together: 128
MiB, 2.6x the H100's 50 MiB L2; the section computes it). Persistent grid-stride runs one head's Q tiles at a time; longest_first runs
every head's longest tiles together (heads fastest); grouped_dynamic runs L2-sized groups of
heads, longest first inside a group; dynamic takes the longest tile first from a queue without
grouping (balanced like grouped_dynamic, every head in flight like longest_first): it tells
load balance from the L2. Each with linear and sawtooth scans, 6 repeats, counters
and timing; sawtooth against linear paired by repeat.

    python experiments/causal_gqa.py run            # on a GPU: measure into data/causal_gqa/
    python experiments/causal_gqa.py plot --out DIR # anywhere: the paper's figure, from data/
"""
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from wavefront.report.analysis import sawtooth_vs_linear_by_repeat, speed_change, timing
from wavefront.model.presets import gpu_preset
from wavefront.report.draft import Section, change_with_range, md_table
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu

SPEC = """
name = "causal_gqa"
measure = ["timing", "counters"]
repeats = 6
reps = 10
timeout_s = 240
batch_points = 12

[grid]
batch = [1]
heads = [32]
kv_heads = [8]
seqlen = [32768]
head_dim = [128]
dtype = ["bfloat16"]
causal = [true]
tiles = ["128x64"]
schedule = ["persistent+linear", "persistent+sawtooth", "longest_first+linear",
            "longest_first+sawtooth", "grouped_dynamic+linear", "grouped_dynamic+sawtooth",
            "dynamic+linear", "dynamic+sawtooth"]
"""


def head_kv_mib(study) -> tuple[float, int]:
    """K and V of one K/V head over the whole sequence (MiB), and the K/V heads, from the data."""
    df = study.load("causal_gqa")
    (seqlen, head_dim, kv_heads, dtype), = df[["seqlen", "head_dim", "kv_heads",
                                               "dtype"]].drop_duplicates().itertuples(index=False)
    from wavefront.point import DTYPE_BYTES
    from wavefront.schedules import AttentionProblem
    one_head = AttentionProblem(1, 1, 1, int(seqlen), int(seqlen), int(head_dim),
                                element_bytes=DTYPE_BYTES[dtype])
    return one_head.kv_bytes_per_unit / 2**20, int(kv_heads)


def table(study) -> pd.DataFrame:
    """Per GPU and CTA schedule: DRAM reads of linear and sawtooth (medians over repeats, with
    their range) against the compulsory bytes, linear's TFLOP/s, and sawtooth's TFLOP/s and
    DRAM reads against linear's, paired by repeat (median, min, max of the ratios)."""
    df = study.load("causal_gqa")
    c = study.counters("causal_gqa")
    keys = ["gpu", "cta_schedule"]
    per = c.pivot_table(index=[*keys, "repeat"], columns="kv_schedule",
                        values="dram_read_bytes")
    bytes_ratio = (per["sawtooth"] / per["linear"]).groupby(keys).agg(["median", "min", "max"])
    speed = sawtooth_vs_linear_by_repeat(df, keys)
    lin_tf = timing(df)[timing(df)["kv_schedule"] == "linear"].groupby(keys)["tflops"].median()
    dram = c.groupby([*keys, "kv_schedule"])["dram_read_bytes"].median()
    compulsory = c.groupby(keys)["compulsory_read_bytes"].first()
    rows = []
    for (gpu, cta), r in speed.iterrows():
        b = bytes_ratio.loc[(gpu, cta)]
        rows.append({"GPU": short_gpu(gpu), "CTA order": cta,
                     "linear DRAM / min": dram[(gpu, cta, "linear")] / compulsory[(gpu, cta)],
                     "sawtooth DRAM / min": dram[(gpu, cta, "sawtooth")]
                     / compulsory[(gpu, cta)],
                     "DRAM, sawtooth vs linear": b["median"] - 1, "DRAM lo": b["min"] - 1,
                     "DRAM hi": b["max"] - 1, "linear TFLOP/s": lin_tf[(gpu, cta)],
                     **speed_change(r)})
    return pd.DataFrame(rows)


def load_balance_split(study) -> pd.DataFrame:
    """Per GPU, with the linear scan: dynamic over persistent (load balance alone) and
    grouped_dynamic over dynamic (what grouping for the L2 adds), paired by repeat; and the
    DRAM bytes dynamic reads over grouped_dynamic's."""
    from wavefront.results.measurement import median_ci95
    tm = timing(study.load("causal_gqa"))
    tm = tm[tm["kv_schedule"] == "linear"].pivot_table(index=["gpu", "repeat"],
                                                       columns="cta_schedule", values="tflops")
    c = study.counters("causal_gqa")
    c = c[c["kv_schedule"] == "linear"].groupby(["gpu", "cta_schedule"])[
        "dram_read_bytes"].median()
    rows = []
    for gpu, g in tm.groupby(level="gpu"):
        if "dynamic" not in g or g["dynamic"].isna().all():
            continue
        g = g.dropna(subset=["dynamic", "grouped_dynamic", "persistent"])
        grouping = (g["grouped_dynamic"] / g["dynamic"]).to_list()
        balance = (g["dynamic"] / g["persistent"]).to_list()
        lo, hi = median_ci95(grouping)
        balance_lo, balance_hi = median_ci95(balance)
        rows.append({"GPU": short_gpu(gpu),
                     "balance": float(pd.Series(balance).median()),
                     "balance_lo": balance_lo, "balance_hi": balance_hi,
                     "dram_vs_persistent": c[(gpu, "persistent")] / c[(gpu, "dynamic")],
                     "grouping": float(pd.Series(grouping).median()), "lo": lo, "hi": hi,
                     "dram": c[(gpu, "dynamic")] / c[(gpu, "grouped_dynamic")],
                     "repeats": len(grouping)})
    return pd.DataFrame(rows)


CAPTION = ("Causal GQA on each GPU (B=1, 32 query heads over 8 K/V heads, S=32k, D=128, "
           "128x64 tiles, the table-driven kernel): DRAM reads over the compulsory bytes (log scale) and "
           "TFLOP/s (bf16) per CTA order and K/V scan; bars are medians, whiskers the range over "
           "repeats.")


def figure(study):
    c = study.counters("causal_gqa").copy()
    t = timing(study.load("causal_gqa"))
    c["GPU"], t["GPU"] = c["gpu"].map(short_gpu), t["gpu"].map(short_gpu)
    c["DRAM reads / compulsory"] = c["dram_read_bytes"] / c["compulsory_read_bytes"]
    gpus = sorted(c["GPU"].unique())
    orders = sorted(c["cta_schedule"].unique())
    fig, axes = plt.subplots(len(gpus), 2, figsize=(10, 3.4 * len(gpus)), squeeze=False)
    for row, gpu in zip(axes, gpus):
        for ax, d, y, label in ((row[0], c, "DRAM reads / compulsory",
                                 "DRAM reads / compulsory"),
                                (row[1], t, "tflops", "TFLOP/s (useful FLOPs)")):
            sns.barplot(data=d[d["GPU"] == gpu], x="cta_schedule", y=y, hue="kv_schedule",
                        order=orders, hue_order=["linear", "sawtooth"], ax=ax,
                        estimator="median", errorbar=("pi", 100), palette="deep")
            ax.set(xlabel="CTA order", ylabel=f"{gpu}: {label}")
        row[0].set_yscale("log")
        row[1].get_legend().remove()
    reps = int(t.groupby(["gpu", "point"])["repeat"].nunique().min())
    fig.suptitle(f"Causal GQA on the H100 and H200, B=1 H=32 KV=8 S=32k D=128, 128x64 tiles: bars "
                 f"median, whiskers range over {reps} repeats")
    fig.tight_layout()
    return fig


def section(study) -> Section:
    s = Section()
    t = table(study)
    shown = pd.DataFrame({
        "GPU": t["GPU"], "CTA order": t["CTA order"],
        "DRAM / min, linear": t["linear DRAM / min"].map(lambda x: f"{x:.2f}"),
        "DRAM / min, sawtooth": t["sawtooth DRAM / min"].map(lambda x: f"{x:.2f}"),
        "DRAM, sawtooth vs linear [range]": list(map(
            change_with_range, t["DRAM, sawtooth vs linear"], t["DRAM lo"], t["DRAM hi"])),
        "linear TFLOP/s": t["linear TFLOP/s"].map(lambda x: f"{x:.0f}"),
        "TFLOP/s, sawtooth vs linear [range]": list(map(
            change_with_range, t["TFLOP/s, sawtooth vs linear"], t["lo"], t["hi"]))})
    faster = t[t["lo"] > 0]
    spread = t["linear DRAM / min"]
    s.claim(f"The CTA order sets the DRAM traffic of a causal GQA launch: linear reads "
            f"{spread.min():.2f}-{spread.max():.2f}x the compulsory bytes across the "
            f"{t['CTA order'].nunique()} orders. Sawtooth's paired speed change is {t['TFLOP/s, sawtooth vs linear'].min():+.1%} "
            f"to {t['TFLOP/s, sawtooth vs linear'].max():+.1%}; "
            + (f"its range excludes no change in {len(faster)} of {len(t)} orders "
               f"({', '.join(faster['GPU'] + ' ' + faster['CTA order'])})."
               if len(faster) else
               f"in no order is every repeat faster (range over {int(t['repeats'].min())} "
               "repeats)."),
            len(t) >= 3 and bool((t["repeats"] >= 3).all()), t.to_dict())
    tm = timing(study.load("causal_gqa"))
    tm = tm[tm["kv_schedule"] == "linear"].pivot_table(index=["gpu", "repeat"],
                                                       columns="cta_schedule", values="tflops")
    gain = (tm["grouped_dynamic"] / tm["persistent"]).groupby(level="gpu").agg(["min", "max"])
    lin = t.set_index(["GPU", "CTA order"])["linear DRAM / min"]
    fewer = [lin[(g, "persistent")] / lin[(g, "grouped_dynamic")] for g in t["GPU"].unique()]
    s.claim(f"The CTA order moves both bytes and time here: grouped_dynamic with the linear "
            f"scan reads {min(fewer):.0f}-{max(fewer):.0f}x fewer DRAM bytes than persistent and "
            f"runs {gain['min'].min() - 1:+.1%} to {gain['max'].max() - 1:+.1%} faster, every "
            "repeat on both GPUs (repeats paired by index).",
            bool((gain["min"] > 1).all()) and min(fewer) > 5, gain.to_dict())
    split = load_balance_split(study)
    s.claim("Load balance and the L2 partly told apart: against persistent, dynamic (longest "
            "first, not grouped) runs "
            + ", ".join(f"{r.GPU} {r.balance - 1:+.1%} [{r.balance_lo - 1:+.1%}, "
                        f"{r.balance_hi - 1:+.1%}] with {r.dram_vs_persistent:.1f}x fewer DRAM "
                        "bytes" for r in split.itertuples())
            + " (it changes balance and bytes at once); grouping on top of it "
              "(grouped_dynamic against dynamic, paired by repeat) adds "
            + ", ".join(f"{r.GPU} {r.grouping - 1:+.1%} [{r.lo - 1:+.1%}, {r.hi - 1:+.1%}] "
                        f"with {r.dram:.1f}x fewer DRAM bytes" for r in split.itertuples())
            + ": a lower bound on what the L2 buys here, since part of dynamic's own gain may "
              "be its fewer bytes",
            len(split) == t["GPU"].nunique() and bool((split["repeats"] >= 6).all())
            and bool((split["dram_vs_persistent"] > 1).all()), split.to_dict("records"))
    kv_mib, kv_heads = head_kv_mib(study)
    l2 = {short_gpu(g.name): g.l2_bytes / 2**20 for g in (gpu_preset("h100"), gpu_preset("h200"))}
    s.claim("The K/V of all heads together exceeds each GPU's L2 and one K/V head's fits in it",
            all(kv_mib * kv_heads > mib > kv_mib for mib in l2.values()),
            {"head MiB": kv_mib, "K/V heads": kv_heads, "L2 MiB": l2}, listed=False)
    s.text = f"""## Causal GQA at long S: the CTA order decides the heads in flight

B=1, 32 query heads over 8 K/V heads, S=32k, D=128, causal, 128x64 tiles: the K/V of all heads
together is {kv_mib * kv_heads:.0f} MiB, {", ".join(f"{kv_mib * kv_heads / mib:.1f}x the {g}'s {mib:.0f} MiB L2" for g, mib in l2.items())}
(one K/V head's: {kv_mib:.0f} MiB) (`experiments/causal_gqa.py`; the table-driven kernel,
commits below, {int(t["repeats"].min())} repeats, counters and timing;
sawtooth against linear paired by repeat, in brackets the range over repeats). Persistent
grid-stride works through one head's Q tiles at a time, longest_first puts every head's longest
tiles in flight together, grouped_dynamic runs L2-sized groups of heads. Persistent and
longest_first are static orders of one binary; dynamic and grouped_dynamic take their work from
an atomic counter, a second binary, so a comparison across the two pairs crosses binaries:

{md_table(shown)}

{s.claims[0].text} {s.claims[1].text} {s.claims[2].text}.

![causal_gqa](figures/causal_gqa.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
