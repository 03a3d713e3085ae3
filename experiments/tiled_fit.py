"""Chunks fitted to Hopper's two L2 partitions: tiled_fit vs tiled vs the scans at D=128.

`tiled` cut K/V into 40%-of-L2 chunks; at D=128 the Q tiles and fp32 partial states that each
round of CTAs streams through the L2 (26 MB on the H100) pushed its chunks out between rounds.
`tiled_fit` sizes the chunk as (0.8 x L2 - stream) / 2: a copy in each partition plus the stream.
DRAM reads and writes under Nsight Compute; the table also gives TFLOP/s against linear from
the bench in data/tiled_fit/bench.jsonl.

    python experiments/tiled_fit.py run            # on a GPU: measure into data/tiled_fit/
    python experiments/tiled_fit.py plot --out DIR # anywhere: the paper's figure, from data/
"""
import pandas as pd

from wavefront.report.draft import Section, md_table, wrap
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu
from wavefront.results.measurement import PEER_NAMES, paired_ratio
from wavefront.results.records import BENCH_RECORDS, by_shape


RECORDS = ("tiled_fit",)  # its bench rounds
SPEC = """
name = "tiled_fit"
measure = ["counters"]
repeats = 3
timeout_s = 300
batch_points = 8

[[grid]]
batch = [1]
heads = [1]
seqlen = [131072, 262144]
head_dim = [128]
causal = [false, true]
tiles = ["128x64"]
schedule = ["persistent+linear", "persistent+sawtooth", "persistent+tiled",
            "persistent+tiled_fit", "persistent+tiled_fit_bf16"]
"""


def tiled_fit_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per shape and K/V schedule (data/tiled_fit, counters): DRAM reads in GB and against two
    minimums (with the partial states once, as `tiled_table`; and Q+K+V alone), DRAM writes,
    medians over repeats; and TFLOP/s against linear where the bench timed it."""
    c = df[(df["measurement"] == "counters") & (df["status"] == "ok")].copy()
    if c.empty:
        return pd.DataFrame()
    qkv = 3 * c["seqlen"] * c["head_dim"] * 2 * c["batch"] * c["heads"]
    c["read GB"] = c["dram_read_bytes"] / 1e9
    c["write GB"] = c["dram_write_bytes"] / 1e9
    c["x minimum"] = c["dram_read_bytes"] / c["compulsory_read_bytes"]
    c["x Q+K+V"] = c["dram_read_bytes"] / qkv
    g = (c.groupby(["gpu", "seqlen", "causal", "kv_schedule"], sort=False)
         [["read GB", "write GB", "x minimum", "x Q+K+V"]].median().reset_index())
    g["GPU"] = g["gpu"].map(short_gpu)
    g["S"] = g["seqlen"]
    g["schedule"] = g["kv_schedule"]
    out = g[["GPU", "S", "causal", "schedule", "read GB", "write GB", "x minimum", "x Q+K+V"]]
    return out.round({"read GB": 2, "write GB": 2, "x minimum": 2, "x Q+K+V": 1})


def bench_timing(study) -> pd.DataFrame:
    """The benches of data/tiled_fit (bench*.jsonl, one run each): each K/V schedule against
    linear of the same run and shape, paired by round."""
    rows = []
    for run, records in study.records(BENCH_RECORDS, "tiled_fit", "bench*.jsonl").items():
        for shape, by in by_shape(records).items():
            ref = by.get("persistent+linear")
            for name, r in by.items():
                if name in PEER_NAMES or ref is None:
                    continue
                med, lo, hi = paired_ratio(ref["samples_ms"], r["samples_ms"])
                rows.append({"run": run, "GPU": short_gpu(r["gpu"]), "shape": shape,
                             "schedule": name, "TFLOP/s": round(r["tflops"], 1),
                             "vs linear": med,
                             "vs linear [95%]": f"{med:.3f} [{lo:.3f}, {hi:.3f}]"})
    return pd.DataFrame(rows)


def figure(study):
    """DRAM reads per K/V schedule (GB, log scale), per length and mask, one panel per GPU."""
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns
    df = study.load("tiled_fit")
    repeats = int(df[df["measurement"] == "counters"].groupby(["gpu", "point"])["repeat"]
                  .nunique().min())
    t = tiled_fit_table(df)
    t["shape"] = t["S"].map(lambda s: f"S={s // 1024}k") + np.where(t["causal"], " causal", "")
    gpus = sorted(set(t["GPU"]))
    fig, axes = plt.subplots(1, len(gpus), figsize=(5.5 * len(gpus), 4), sharey=True,
                             squeeze=False)
    order = sorted(t["schedule"].unique())
    for ax, gpu in zip(axes[0], gpus):
        sns.barplot(data=t[t["GPU"] == gpu], x="shape", y="read GB", hue="schedule",
                    hue_order=order, ax=ax)
        ax.set_yscale("log")
        ax.set(title=gpu, xlabel="", ylabel=f"DRAM reads (GB, log scale; median of {repeats})")
        ax.tick_params(axis="x", rotation=20)
        if ax is not axes[0][-1]:
            ax.get_legend().remove()
    fig.suptitle("tiled vs tiled_fit vs the scans, B=1 H=1 D=128 bf16, 128x64 tiles (ncu, "
                 "cold L2)")
    fig.tight_layout()
    return fig


CAPTION = ("DRAM reads of the K/V schedules at D=128 on each GPU (B=1 H=1, 128x64 tiles, "
           "Nsight Compute, cold L2, medians over repeats; log scale).")


def table(study):
    return tiled_fit_table(study.load("tiled_fit"))


def section(study) -> Section:
    s = Section()
    t = table(study)
    timing = bench_timing(study)
    shown = md_table(t) + (
        "\n\nTimed in interleaved rounds (8 rounds x 2 launches; each run against its own "
        "linear, paired by round):\n\n" + md_table(timing.drop(columns=["vs linear"])))
    fit = t[t["schedule"] == "tiled_fit"]
    old = t[t["schedule"] == "tiled"]

    def reads(schedule, seqlen, causal):
        row = t[(t["schedule"] == schedule) & (t["S"] == seqlen) & (t["causal"] == causal)]
        return float(row["read GB"].iloc[0])
    more_than_linear = reads("tiled_fit", 131072, False) > reads("linear", 131072, False)
    more_than_tiled = all(reads("tiled_fit", s, True) > reads("tiled", s, True)
                          for s in (131072, 262144))
    first = timing[(timing["run"] == "bench") & (timing["schedule"] == "persistent+tiled_fit")]
    slower = bool(len(first)) and float(first["vs linear"].iloc[0]) < 1.0
    repeats = int(study.counters("tiled_fit").groupby(["gpu", "point"])["repeat"].nunique().min())
    text = wrap(
        "`tiled_fit` sizes the chunk for Hopper's partitions: read by SMs of both partitions, "
        "a chunk keeps a copy in each, and each round of the CTAs in flight streams its Q "
        "tiles and fp32 partial states through once, so the chunk is (0.8 x L2 - stream) / 2. "
        "`tiled` took 40% of the L2 and, at D=128, ignored a stream larger than the chunk "
        "(264 CTAs x 128 rows x 776 B = 26 MB). H100 and H200, B=1 H=1 D=128, 128x64 tiles, "
        f"ncu, cold L2, medians of {repeats} repeats (`experiments/tiled_fit.py`). 'x minimum' counts the partial "
        "states once in the minimum, as the tiled rows above do; 'x Q+K+V' does not:")
    worst_fit = float(fit["x minimum"].max())
    s.claim(f"tiled_fit reads {float(fit['x minimum'].min()):.2f}-{worst_fit:.2f}x its minimum "
            f"(tiled: {float(old['x minimum'].min()):.2f}-{float(old['x minimum'].max()):.2f}x), "
            "but its partial states grow with the chunks: in absolute bytes it reads more than "
            "linear at 128k non-causal and more than tiled on causal shapes, and at 128k it runs "
            "slower than linear. The partial-state traffic, not the chunk size, is what limits "
            "the tiled family at D=128.",
            worst_fit < float(old["x minimum"].min()) and more_than_linear and more_than_tiled
            and slower, f"{fit.to_dict()}")
    narrow = t[t["schedule"] == "tiled_fit_bf16"]
    bf16 = timing[timing["schedule"] == "persistent+tiled_fit_bf16"]
    s.claim(f"bfloat16 partial outputs (tiled_fit_bf16, error bounded by one more bfloat16 "
            f"rounding of the weighted |V|) halve the partial traffic and allow larger chunks: "
            f"non-causal it reads {reads('tiled_fit_bf16', 131072, False):.2f} GB at 128k "
            f"(linear {reads('linear', 131072, False):.2f}) and "
            f"{reads('tiled_fit_bf16', 262144, False):.2f} GB at 256k (tiled_fit "
            f"{reads('tiled_fit', 262144, False):.2f}, sawtooth "
            f"{reads('sawtooth', 262144, False):.2f}, linear "
            f"{reads('linear', 262144, False):.2f}), and runs "
            f"{float(bf16['vs linear'].min()):.3f}-{float(bf16['vs linear'].max()):.3f}x linear "
            f"in the same rounds; on the stricter measure (minimum with the partials once) that "
            f"is {float(narrow['x minimum'].min()):.2f}-{float(narrow['x minimum'].max()):.2f}x, "
            f"worse than tiled_fit's ratio with fewer bytes: the measure rewards partial traffic.",
            len(narrow) > 0 and reads("tiled_fit_bf16", 262144, False) < reads("tiled_fit", 262144, False)
            and reads("tiled_fit_bf16", 262144, False) < reads("sawtooth", 262144, False)
            and len(bf16) > 0 and float(bf16["vs linear"].min()) > 0.95, f"{narrow.to_dict()}")
    s.text = f"""### Chunks fitted to the partitions: tiled_fit

{text}

{shown}

![tiled_fit](figures/tiled_fit.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
