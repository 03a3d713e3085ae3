"""Does a schedule cost anything by itself? Every schedule against its own linear scan and grid.

Where K/V fits in L2 (S=8k) every schedule reads the same bytes, so any speed difference is
the schedule's own cost. The bench times every schedule and cuDNN / FA2 in interleaved rounds;
ratios are paired by round. Runs: the default levers (128x64 tiles, 2 CTAs per SM) and the
tuned ones (128x128, two consumer warpgroups), on the H100 (twice) and the H200.

    python experiments/schedule_cost.py run            # on a GPU: bench into data/schedule_cost/
    python experiments/schedule_cost.py plot --out DIR # anywhere: the paper's figure
"""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wavefront.report.draft import Section, md_table, wrap
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu, style
from wavefront.results.measurement import PEER_NAMES, paired_ratio, paired_references
from wavefront.results.records import BENCH_RECORDS, PRINTOUT_RECORDS, by_shape

SCHEDULES = ("grid+linear,grid+sawtooth,persistent+linear,persistent+sawtooth,grouped+linear,"
             "grouped+sawtooth,longest_first+linear,longest_first+sawtooth,dynamic+linear,"
             "dynamic+sawtooth,grouped_dynamic+linear,grouped_dynamic+sawtooth")
DATASETS = ()  # it reads bench rounds (data/schedule_cost/*.jsonl), not a results table
RECORDS = ("schedule_cost",)
# `run` appends each of these `wavefront bench` runs to data/schedule_cost/bench.jsonl.
BENCH = [
    ["--seqlen", "8192", "--head-dim", "64,128", "--schedule", SCHEDULES, "--rounds", "15"],
    ["--seqlen", "8192", "--head-dim", "64,128", "--schedule", SCHEDULES, "--tile", "128x128",
     "--occupancy", "1", "--worker-warps", "8", "--tuned", "--rounds", "15"],
]


def rows(runs: dict[str, list[dict]]) -> pd.DataFrame:
    """Every contender of every bench run, with its ratios paired by round (computed here from
    the per-round samples, one way for every run): against the same CTA schedule's linear scan
    and against grid+linear with the same levers, and against cuDNN and FA2 of the same
    rounds."""
    out = []
    for run, records in runs.items():
        for shape, by in by_shape(records).items():
            for name, r in by.items():
                if name in PEER_NAMES:
                    continue
                row = {"run": run, "GPU": short_gpu(r["gpu"]), "shape": shape,
                       "schedule": name, "TFLOP/s": r["tflops"],
                       "lo": r["tflops_ci95"][0], "hi": r["tflops_ci95"][1],
                       "rounds": r["rounds"], "throttled": r["throttled_rounds"]}
                for key, ref in {**paired_references(name), "cudnn": "cudnn",
                                 "fa2": "fa2"}.items():
                    if ref in by:
                        row[f"vs {key}"], row[f"vs {key} lo"], row[f"vs {key} hi"] = \
                            paired_ratio(by[ref]["samples_ms"], r["samples_ms"])
                out.append(row)
    return pd.DataFrame(out)


def study_rows(study) -> pd.DataFrame:
    return rows(study.records(BENCH_RECORDS, "schedule_cost"))


def agreement(first: list[dict], second: list[dict]) -> pd.DataFrame:
    """The same bench command twice on the H100 (tuned levers): run 1's table (transcribed
    from its printout) against run 2's records, per contender: |median difference|."""
    one = pd.DataFrame([{"contender": r["contender"], "D": r["head_dim"],
                         "causal": r["causal"], "TFLOP/s": r["tflops"]} for r in first])
    two = pd.DataFrame([{"contender": r["contender"], "D": r["shape"]["head_dim"],
                         "causal": r["shape"]["causal"], "TFLOP/s": r["tflops"]} for r in second])
    m = one.merge(two, on=["contender", "D", "causal"], suffixes=(" 1", " 2"))
    m["difference"] = (m["TFLOP/s 2"] / m["TFLOP/s 1"] - 1).abs()
    m["peer"] = m["contender"].isin(PEER_NAMES)
    return m


def summary(d: pd.DataFrame) -> pd.DataFrame:
    """Per run and shape: how far the K/V direction moves a schedule (sawtooth vs its own
    linear), persistent vs grid, the slowest static CTA schedule vs grid, the dynamic ones vs
    grid, and the best contender against cuDNN."""
    out = []
    for (run, gpu, shape), sub in d.groupby(["run", "GPU", "shape"], sort=False):
        if "vs grid" not in sub or "vs linear" not in sub:
            continue
        base = sub[~sub["schedule"].str.contains(r"\[")]  # the run's own levers
        saw = base[base["schedule"].str.contains("sawtooth")]
        # a run without grid (the tuned-table check) has no vs-grid ratios
        static = base[~base["schedule"].str.contains("dynamic")
                      & base["schedule"].str.endswith("+linear")].dropna(subset=["vs grid"])
        dyn = base[base["schedule"].str.contains("dynamic")
                   & base["schedule"].str.endswith("+linear")].dropna(subset=["vs grid"])
        pers = base[base["schedule"] == "persistent+linear"].dropna(subset=["vs grid"])
        worst = static.loc[static["vs grid"].idxmin()] if not static.empty else None
        best = sub.loc[sub["vs cudnn"].idxmax()] if "vs cudnn" in sub else None
        out.append({
            "run": run, "GPU": gpu, "shape": shape,
            "sawtooth vs own linear": (f"{saw['vs linear'].min():.3f}-{saw['vs linear'].max():.3f}"
                                       if not saw.empty else ""),
            "persistent vs grid": (f"{float(pers['vs grid'].iloc[0]):.3f}" if not pers.empty
                                   else ""),
            "slowest static vs grid": (f"{worst['vs grid']:.3f} ({worst['schedule']})"
                                       if worst is not None else ""),
            "dynamic vs grid": (f"{dyn['vs grid'].min():.3f}-{dyn['vs grid'].max():.3f}"
                                if not dyn.empty else ""),
            "best vs cuDNN": (f"{best['vs cudnn']:.3f} ({best['schedule']})"
                              if best is not None else "")})
    return pd.DataFrame(out)


def _draw(d: pd.DataFrame):
    """Every schedule's speed against grid+linear of the same rounds (paired by round, 95%
    interval) at B=1 H=32 S=8k, per shape (columns) and bench run (rows); dashed: cuDNN."""
    d = d[d["shape"].str.startswith("B1 H32 S8k") & ~d["schedule"].str.contains(r"\[")]
    runs = list(dict.fromkeys(d["run"]))
    shapes = list(dict.fromkeys(d["shape"]))
    order = list(dict.fromkeys(d["schedule"]))  # the bench's order, the same in every panel
    where = {name: i for i, name in enumerate(order)}
    with style():
        fig, axes = plt.subplots(len(runs), len(shapes), figsize=(3.3 * len(shapes) + 1.5,
                                                                 2.9 * len(runs) + 0.8),
                                 sharey=True, squeeze=False)
        for i, run in enumerate(runs):
            for j, shape in enumerate(shapes):
                ax = axes[i][j]
                sub = d[(d["run"] == run) & (d["shape"] == shape)]
                y = sub["schedule"].map(where).to_numpy()
                colors = np.where(sub["schedule"].str.endswith("sawtooth"), "tab:orange",
                                  "tab:blue")
                ax.errorbar(sub["vs grid"], y, xerr=[sub["vs grid"] - sub["vs grid lo"],
                                                     sub["vs grid hi"] - sub["vs grid"]],
                            fmt="none", ecolor="gray", capsize=2)
                ax.scatter(sub["vs grid"], y, c=colors, zorder=3, s=18)
                grid_vs_cudnn = sub.loc[sub["schedule"] == "grid+linear", "vs cudnn"]
                if len(grid_vs_cudnn):
                    ax.axvline(1 / float(grid_vs_cudnn.iloc[0]), color="k", ls="--", lw=1)
                ax.axvline(1.0, color="gray", lw=0.8)
                ax.set_yticks(range(len(order)))
                ax.set_yticklabels(order, fontsize=9)
                gpu = sub["GPU"].iloc[0] if len(sub) else ""
                ax.set_title(f"{gpu} {shape.replace('B1 H32 S8k ', '')}, {run}", fontsize=9)
                ax.set_xlabel("speed vs grid+linear", fontsize=9)
        fig.suptitle("What a schedule costs by itself (table-driven kernel, B=1 H=32 S=8k bf16, "
                     "K/V in L2): speed vs grid+linear paired by interleaved round, 95% "
                     "intervals; blue linear, orange sawtooth, dashed cuDNN", fontsize=9)
        fig.tight_layout()
    return fig


def figure(study):
    return _draw(study_rows(study))


def table(study):
    return summary(study_rows(study))


def section(study) -> Section:
    """The table-driven kernel: SASS facts of the first kernel's binaries against the new
    one's (from the test that guards them), and what each schedule costs by itself, per run."""
    s = Section()
    d = study_rows(study)
    s8k = d[d["shape"].str.startswith("B1 H32 S8k") & ~d["schedule"].str.contains(r"\[")]
    saw = s8k[s8k["schedule"].str.endswith("sawtooth")]["vs linear"]
    dev_saw = float((saw - 1).abs().max())
    med_saw = float((saw - 1).abs().median())
    pers = s8k[s8k["schedule"] == "persistent+linear"]["vs grid"]
    balanced_static = s8k[~s8k["schedule"].str.contains("dynamic")
                          & ~(s8k["schedule"].str.startswith("grouped")
                              & s8k["shape"].str.contains("causal"))]
    worst_static = float(balanced_static["vs grid"].min())
    dyn_causal = s8k[s8k["schedule"].str.contains("dynamic")
                     & s8k["shape"].str.contains("causal")]["vs grid"]
    grouped_causal = s8k[s8k["schedule"].str.startswith("grouped+")
                         & s8k["shape"].str.contains("causal")]["vs grid"]
    first = study.records(PRINTOUT_RECORDS, "schedule_cost", "printouts/tuned_levers_run1.jsonl")
    second = study.records(BENCH_RECORDS, "schedule_cost", "tuned_levers_run2.jsonl")
    agree = agreement(*first.values(), *second.values())
    ours = agree[~agree["peer"]]
    text = wrap(
        "Where the cost came from. The first kernel compiled each schedule into its own binary. "
        "Read from the SASS (`wavefront compile` prints it; `tests/test_compile.py` guards it): "
        "every persistent sawtooth binary, and the run-time-schedule binary, had a "
        "`WARPGROUP.DEPBAR` wait after each of its 96 HGMMAs and 35-49 local-memory spills; the "
        "single-direction binaries 8 waits for 48 HGMMAs. With both scan directions compiled "
        "into a persistent loop, the compiler serialised the warpgroup MMA pipeline. The fix: "
        "the schedule is data. The host writes each work item's coordinates and K/V scan "
        "(start, step, count, then the masked tiles) into a small table, from the same "
        "`Launch` the simulator replays; the kernel reads its items' rows, scans with one loop "
        "affine in its counter, and has no schedule code. Every static schedule and direction "
        "is one binary (8 waits, 0 spills); the dynamic schedules (an atomic counter, "
        "FlashAttention-3's scheduler) a second. Below, every schedule at S=8k (K/V in L2, "
        "equal misses), ratios paired by interleaved round (`experiments/schedule_cost.py`):")
    s.claim(f"A K/V direction costs nothing by itself: at S=8k every sawtooth is within "
            f"{dev_saw:.1%} of its own linear scan (median {med_saw:.1%}) on the H100 and H200, "
            f"at both lever settings, where the first kernel's persistent sawtooth ran up to "
            "19% slower.", dev_saw <= 0.03, f"max {dev_saw}, median {med_saw}")
    s.claim(f"Persistent runs at {float(pers.min()):.3f}-{float(pers.max()):.3f}x grid at "
            "S=8k.", float(pers.min()) >= 0.98, f"{pers.tolist()}")
    s.claim(f"Balance: the dynamic schedules run {float(dyn_causal.min()):.2f}-"
            f"{float(dyn_causal.max()):.2f}x grid on causal shapes; every balanced static "
            f"schedule is at least {worst_static:.3f}x grid; static grouped stays unbalanced on "
            f"causal ({float(grouped_causal.min()):.2f}-{float(grouped_causal.max()):.2f}x grid), "
            "which its dynamic form, grouped_dynamic, fixes without leaving its L2 head groups.",
            float(dyn_causal.min()) > 1.0 and worst_static >= 0.95
            and float(grouped_causal.max()) < 1.0, f"{dyn_causal.tolist()}")
    s.claim(f"The bench repeats: the same command in two device calls on the H100 agrees "
            f"within 3% for {int((ours['difference'] <= 0.03).sum())} of {len(ours)} of our "
            f"contenders (median {float(ours['difference'].median()):.1%}, worst "
            f"{float(ours['difference'].max()):.1%} in the shape whose every round was "
            "power-throttled).", float(ours["difference"].median()) <= 0.01,
            f"{ours['difference'].describe()}")
    s.text = f"""## Schedules that cost nothing by themselves: the table-driven kernel

{text}

{md_table(summary(d))}

![schedule_cost](figures/schedule_cost.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
