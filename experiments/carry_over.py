"""Does timing the tuned table's configurations on a shape's first call beat taking the nearest entry?

A call that names no configuration takes the tuned entry nearest its shape
(`wavefront.kernel.tuning.shape_distance`), and at B1 H32 S4k D64 non-causal, equally near
two entries, the name order picked the slower one (`untuned_shapes`, tie_s4k). Under
`WAVEFRONT_CARRY_OVER=measure` a shape without an entry of its own times the distinct
configurations of its GPU's entries (same head dim and mask) on its first call, 7
interleaved rounds x 3 launches each on the caller's arrays, and keeps the fastest
(`wavefront.kernel.carry_over`). The shapes are `untuned_shapes`' held-out ones. Each bench
(`--carry-over measure`) makes the choice before its rounds, then times the chosen
configuration's bound launcher, the configuration "nearest" would have taken, the public call,
cuDNN, FA2 and TileGym in the same 15 interleaved rounds x 5 launches; ratios are paired by
round, with 95% intervals. The first-call timing is not the evidence: the rounds are.

    wavefront experiment run carry_over        # GPU: the runs below, into data/carry_over
    mv data/carry_over/bench.jsonl data/carry_over/h100.jsonl   # that GPU's rounds
    python experiments/carry_over.py plot --out DIR
"""
import matplotlib.pyplot as plt
import pandas as pd

from wavefront.point import KERNEL_LEVERS
from wavefront.report.draft import Section, md_table, wrap
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import plain_log, short_gpu, style
from wavefront.results.measurement import paired_ratio
from wavefront.results.records import BENCH_RECORDS, by_shape

DATASETS = ()
RECORDS = ("carry_over",)

_CALL = ["--schedule", "persistent+linear", "--tuned", "--api", "--carry-over", "measure"]
BENCH = [
    _CALL + ["--head-dim", "64", "--batch", "1", "--heads", "32", "--seqlen", "4096,16384"],
    _CALL + ["--head-dim", "64", "--batch", "4", "--heads", "8", "--seqlen", "8192"],
    _CALL + ["--head-dim", "128", "--batch", "4", "--heads", "16", "--seqlen", "4096"],
    _CALL + ["--head-dim", "128", "--batch", "1", "--heads", "16", "--seqlen", "2048,16384"],
    _CALL + ["--head-dim", "128", "--batch", "2", "--heads", "32", "--kv-heads", "4",
             "--seqlen", "8192"],
]
TIE = "B1 H32 S4k D64"  # the held-out shape equally near two entries (untuned_shapes)


def _short(config: dict) -> str:
    """A configuration in a few words: schedule, tiles, occupancy and the levers set to other
    than their defaults."""
    levers = " ".join(f"{k}={v}" for k, v in config.items()
                      if k in KERNEL_LEVERS and v != KERNEL_LEVERS[k])
    return (f"{config['schedule'].replace('+linear', '')} {config['tiles']} "
            f"occ{config['occupancy']}" + (f" {levers}" if levers else ""))


def rows(study) -> pd.DataFrame:
    """Per GPU and shape-mask the call measured a choice at: the chosen configuration against
    the one "nearest" takes (paired by round), each and the call against cuDNN, and what the
    first call timed (how many candidates, how long it took)."""
    out = []
    for run, records in study.records(BENCH_RECORDS, "carry_over").items():
        for (gpu, shape), by in by_shape(records, per_gpu=True).items():
            api = by.get("api")
            measured = (api or {}).get("carry_over")
            if measured is None or "cudnn" not in by:
                continue
            chosen, nearest = by[api["bound"]], by[measured["nearest"]]
            cudnn = by["cudnn"]["samples_ms"]
            row = {"GPU": short_gpu(gpu), "run": run, "shape": shape,
                   "causal": api["shape"]["causal"],
                   "candidates": len(measured["timed"]), "left out": len(measured["left_out"]),
                   "first call s": measured["seconds"],
                   "first call ms": [t["ms"] for t in measured["timed"]],
                   "chosen": _short(measured["config"]),
                   # the candidates are timed nearest first; one that failed is left out
                   "nearest": (_short(measured["timed"][0]["config"])
                               if not measured["left_out"] else measured["nearest"]),
                   "differs": api["bound"] != measured["nearest"],
                   "throttled": api["throttled_rounds"], "rounds": api["rounds"]}
            row["chosen vs nearest"], row["lo"], row["hi"] = paired_ratio(
                nearest["samples_ms"], chosen["samples_ms"])
            for role, r in (("nearest", nearest), ("chosen", chosen), ("call", api)):
                row[f"{role} x cudnn"], row[f"{role} x cudnn lo"], row[f"{role} x cudnn hi"] = \
                    paired_ratio(cudnn, r["samples_ms"])
            out.append(row)
    return pd.DataFrame(out)


def _draw(d: pd.DataFrame):
    """Per held-out shape-mask, one row of panels per GPU: the configuration the measured
    carry-over chose against the one "nearest" takes (paired by round, 95% interval), and the
    public call against cuDNN."""
    shapes = list(dict.fromkeys(d["shape"]))
    gpus = sorted(set(d["GPU"]))
    with style():
        fig, axes = plt.subplots(len(gpus), 2, figsize=(11.5, len(gpus) * (0.36 * len(shapes)
                                                                              + 1.2) + 0.6),
                                 sharey=True, sharex="col", squeeze=False)
        for row, gpu in zip(axes, gpus):
            sub = d[d["GPU"] == gpu]
            y = sub["shape"].map({s: i for i, s in enumerate(shapes)})
            ax = row[0]
            for differs, color, label in ((True, "tab:blue", "chose another configuration"),
                                          (False, "tab:gray", "chose the nearest's")):
                part = sub["differs"] == differs
                ax.errorbar(sub["chosen vs nearest"][part], y[part],
                            xerr=[(sub["chosen vs nearest"] - sub["lo"])[part],
                                  (sub["hi"] - sub["chosen vs nearest"])[part]],
                            fmt="o", ms=4, capsize=2, color=color, label=label)
            ax.axvline(1.0, color="k", ls="--", lw=1)
            ax.set_title(f"{gpu}: measured choice vs 'nearest'", fontsize=9)
            ax.legend(fontsize=9, loc="lower right")
            ax = row[1]
            ax.errorbar(sub["call x cudnn"], y, xerr=[sub["call x cudnn"] - sub["call x cudnn lo"],
                                                      sub["call x cudnn hi"] - sub["call x cudnn"]],
                        fmt="o", ms=4, capsize=2, color="tab:orange", label="public call")
            ax.axvline(1.0, color="k", ls="--", lw=1)
            ax.set_xscale("log")
            plain_log(ax.xaxis, ticks=[0.9, 1.0, 1.2, 1.5, 2.0, 3.0])
            ax.set_title(f"{gpu}: the call, measured carry-over", fontsize=9)
            row[0].set_yticks(range(len(shapes)))
            row[0].set_yticklabels(shapes, fontsize=9)
        axes[0][0].invert_yaxis()
        axes[-1][0].set_xlabel("chosen / nearest's configuration, time ratio (> 1: faster)")
        axes[-1][1].set_xlabel("public call / cuDNN, time ratio (> 1: faster; log)")
        fig.suptitle("Measured carry-over on held-out shapes, bf16: 15 interleaved rounds x 5 "
                     "launches, ratios paired by round, 95% intervals", fontsize=9)
        fig.tight_layout()
    return fig


def figure(study):
    return _draw(rows(study))


def table(study) -> pd.DataFrame:
    d = rows(study)
    fmt = lambda m, lo, hi: f"{m:.3f} [{lo:.3f}, {hi:.3f}]"  # noqa: E731
    return pd.DataFrame([{
        "GPU": r["GPU"], "shape": r["shape"], "nearest takes": r["nearest"],
        "measured choice": r["chosen"] if r["differs"] else "(the same)",
        "choice vs nearest [95%]": fmt(r["chosen vs nearest"], r["lo"], r["hi"]),
        "nearest x cuDNN": f"{r['nearest x cudnn']:.3f}",
        "call x cuDNN [95%]": fmt(r["call x cudnn"], r["call x cudnn lo"], r["call x cudnn hi"]),
        "candidates": int(r["candidates"]), "first call s": f"{r['first call s']:.1f}",
        "throttled rounds": f"{int(r['throttled'])}/{int(r['rounds'])}"}
        for _, r in d.iterrows()])


def _per_gpu(d: pd.DataFrame, text) -> str:
    return "; ".join(f"{gpu}: {text(sub)}" for gpu, sub in d.groupby("GPU"))


def section(study) -> Section:
    s = Section()
    d = rows(study)
    gpus = ", ".join(sorted(set(d["GPU"])))
    key = d["GPU"] + " " + d["shape"]
    differs = d[d["differs"]]
    s.claim("The measured carry-over chose another configuration than 'nearest' on "
            + _per_gpu(d, lambda g: f"{int(g['differs'].sum())} of {len(g)}")
            + " held-out shape-masks.",
            len(d) >= 10 and bool((d["candidates"] >= 2).all()), dict(zip(key, d["differs"])))
    losses = d[d["hi"] < 1.0]
    s.claim(f"In the bench's rounds the choice was never slower than 'nearest' beyond the noise: "
            f"the chosen configuration's paired ratio to it ran {d['chosen vs nearest'].min():.3f}"
            f"-{d['chosen vs nearest'].max():.3f} on {gpus}, and no 95% interval lies below 1.",
            len(losses) == 0, dict(zip(key, d["chosen vs nearest"].round(3))))
    gains = differs[differs["lo"] > 1.0]
    gain_text = "; ".join(f"{r['GPU']} {r['shape']} {r['chosen vs nearest']:.3f}x "
                          f"[{r['lo']:.3f}, {r['hi']:.3f}] ({r['nearest']} -> {r['chosen']})"
                          for _, r in gains.iterrows())
    tie = d[d["shape"] == TIE].set_index("GPU")
    tie_text = "; ".join(f"{gpu} {r['chosen vs nearest']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"
                         + ("" if r["differs"] else " (kept the nearest's)") + ", first call "
                         + " vs ".join(f"{ms:.4f}" for ms in r["first call ms"]) + " ms"
                         for gpu, r in tie.iterrows())
    s.claim(f"Where the choice gained beyond its interval: {gain_text or 'nowhere'}. At "
            f"`untuned_shapes`' tie ({TIE}, where 'nearest' takes the entry first in name "
            f"order): {tie_text}. It gains where one of the two configurations is faster and "
            "keeps the nearest's where they time alike.",
            len(tie) >= 1 and bool((tie["hi"] >= 1.0).all())
            and bool(((tie["lo"] > 1.0) | ~tie["differs"] | (tie["hi"] - tie["lo"] < 0.05)).all())
            and bool((tie["lo"] > 1.0).any()),
            dict(zip(tie.index, tie["chosen vs nearest"].round(3))))
    even = differs[(differs["lo"] <= 1.0) & (differs["hi"] >= 1.0)]
    wash = even[(even["chosen vs nearest"] - 1).abs() < 0.01]
    listed = "; ".join(f"{r['GPU']} {r['shape']} {r['chosen vs nearest']:.3f} [{r['lo']:.3f}, "
                       f"{r['hi']:.3f}]" for _, r in even.iterrows())
    s.claim(f"Where it chose another configuration without a gain beyond the interval ({listed}), "
            f"{len(wash)} of the {len(even)} ran within 1% of 'nearest': which candidate the "
            "first call keeps matters little there.",
            len(even) == 0 or bool(((even["lo"] <= 1.0) & (even["hi"] >= 1.0)).all()),
            dict(zip(even["GPU"] + " " + even["shape"], even["chosen vs nearest"].round(3))))
    first = d["first call s"]
    s.claim(f"The first call's timing took {first.min():.1f}-{first.max():.1f} s of host time "
            f"({d['candidates'].min()}-{d['candidates'].max()} candidates), almost all of it "
            f"the candidates' compiles: {first.min():.1f} s where the bench process had compiled "
            "the same configurations for its previous sequence length. That is why it is "
            "opt-in.",
            bool((first > 0).all()) and float(first.min()) < 1.0, dict(zip(key, first.round(2))))
    below = d[d["call x cudnn"] < 1.0]
    d128_full = below["shape"].str.contains("D128") & ~below["causal"].astype(bool)
    s.claim("With it the public call ran "
            + _per_gpu(d, lambda g: f"{g['call x cudnn'].min():.3f}-{g['call x cudnn'].max():.3f}"
                       f"x cuDNN, {int((g['call x cudnn'] >= 1.0).sum())} of {len(g)} at or "
                       "above 1.0x")
            + f". {int(d128_full.sum())} of the {len(below)} below are D=128 non-causal, where "
            "every entry's configuration then sat below cuDNN (`d128_limits`): choosing among "
            "them could not lift it. These runs predate the 128x256 entries, which lifted "
            "those shapes above cuDNN for the plain call (`untuned_shapes`).",
            len(below) > 0 and int(d128_full.sum()) >= len(below) - 2,
            dict(zip(key, d["call x cudnn"].round(3))))
    intro = wrap(
        "`wavefront.attention` under `WAVEFRONT_CARRY_OVER=measure` (or `wavefront bench "
        "--carry-over measure`): a shape without an entry of its own times the distinct "
        "configurations of its GPU's entries for its head dim and mask on its first call (7 "
        "interleaved rounds x 3 launches each on the caller's arrays, CUDA events, each output "
        "checked against the nearest entry's first) and keeps the fastest for the process. "
        "`experiments/carry_over.py` ran it on `untuned_shapes`' held-out shapes and then timed "
        "the chosen configuration against the one 'nearest' takes, the call, cuDNN, FA2 and "
        f"TileGym in the same 15 interleaved rounds x 5 launches ({gpus}, bf16; ratios paired "
        "by round, 95% intervals):")
    s.text = f"""## Shapes nobody tuned: measured, not nearest

{intro}

{md_table(table(study))}

![measured carry-over](figures/carry_over.png)
"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
