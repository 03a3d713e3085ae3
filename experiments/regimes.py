"""Where, if anywhere, does sawtooth's L2 saving become speed on Hopper? The regimes side by side.

No measurement of its own: it reads the regimes' experiments (a: paper_launch, b:
starved_launch, c: dram_bound, d: causal_gqa, e: ctas_in_flight, f: exposure_corunners, g:
exposure_small_l2, h: exposure_latency), puts sawtooth's TFLOP/s
against linear's for every configuration of each (paired by round or repeat, with the range
over them; the median's 95% interval), and counts the configurations whose whole interval
lies above no change.

    python experiments/regimes.py plot --out DIR # anywhere: the figure, from data/
"""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wavefront.report.analysis import paired_repeat_ratios
from wavefront.report.draft import Section, md_table
from wavefront.report.exposure import PRACTICAL_MARGIN, interval_chance
from wavefront.report.front_matter import chance_bound
from wavefront.report.experiments import run_as_script, sibling
from wavefront.report.figures import short_gpu
from wavefront.results.measurement import median_ci95

DATASETS = ("paper_launch", "dram_bound", "causal_gqa", "ctas_in_flight")
RECORDS = ("paper_launch", "starved_launch")
# the experiment whose section each regime's data comes from
SOURCES = {"a": "paper_launch", "b": "starved_launch", "c": "dram_bound", "d": "causal_gqa",
           "e": "ctas_in_flight", "f": "exposure_corunners", "g": "exposure_small_l2",
           "h": "exposure_latency"}
REGIMES = {"a": "the paper's launch (48 CTAs)", "b": "beside a DRAM stream",
           "c": "DRAM-bound head counts", "d": "causal GQA, CTA orders",
           "e": "few CTAs in flight", "f": "co-runners that read and write",
           "g": "a smaller L2 (persisting lines held)", "h": "less latency hiding"}


def _regime_modules():
    """The regimes' experiment modules, from the package this one was loaded with (imported
    when asked: `python experiments/regimes.py` first hands over to the CLI)."""
    return [sibling(__package__, name)
            for name in ("paper_launch", "starved_launch", "exposure_corunners",
                         "exposure_small_l2", "exposure_latency")]


def configurations(study) -> pd.DataFrame:
    """One row per regime, GPU and configuration: sawtooth's TFLOP/s over linear's (median,
    lowest and highest of the paired ratios), and the pairing. Computed once per study (the
    front matter, this section, its table and figure and the model's regime predictions all
    read it); each caller gets its own copy."""
    return study.once("regimes.configurations", lambda: _configurations(study))[0].copy()


def no_interval(study) -> dict:
    """Per regime: its configurations with too few rounds kept for an interval (left out of
    `configurations`, listed in the regime's own section)."""
    return dict(study.once("regimes.configurations", lambda: _configurations(study))[1])


def _configurations(study) -> tuple[pd.DataFrame, dict]:
    no_interval_counts = {}
    paper_launch, starved_launch, corunners, small_l2, latency = _regime_modules()
    frames = []
    t = paper_launch.table(study)
    frames.append(pd.DataFrame({
        "regime": "a", "GPU": t["GPU"], "configuration": t["causal"].map(
            lambda c: "causal" if c else "non-causal"),
        "ratio": t["sawtooth vs linear"], "lo": t["lo"], "hi": t["hi"],
        "paired by": t["rounds"].map(lambda n: f"{n} bench rounds")}))
    t = starved_launch.table(study)
    frames.append(pd.DataFrame({
        "regime": "b", "GPU": t["GPU"],
        "configuration": [f"{'causal' if c else 'non-causal'}, {n} stream CTAs"
                          for c, n in zip(t["causal"], t["stream CTAs"])],
        "ratio": t["sawtooth vs linear"], "lo": t["lo"], "hi": t["hi"],
        "paired by": t["rounds"].map(lambda n: f"{n} rounds")}))
    for regime, dataset, keys, name in (
            ("c", "dram_bound", ["gpu", "heads", "cta_schedule"],
             lambda k: f"H{k[1]}, {k[2]}"),
            ("d", "causal_gqa", ["gpu", "cta_schedule"], lambda k: k[1]),
            ("e", "ctas_in_flight", ["gpu", "resident_ctas"], lambda k: f"{k[1]} CTAs")):
        rows = []
        per_repeat = paired_repeat_ratios(study.load(dataset), keys).dropna()
        for k, group in per_repeat.groupby(level=list(range(len(keys)))):
            ratios = group.to_list()
            lo, hi = median_ci95(ratios)
            rows.append({"regime": regime, "GPU": short_gpu(k[0]), "configuration": name(k),
                         "ratio": float(np.median(ratios)), "lo": lo, "hi": hi,
                         "paired by": f"{len(ratios)} repeats"})
        frames.append(pd.DataFrame(rows))
    # the regimes' own controls (nothing beside, nothing held, the paper's settings alone, K/V
    # in the L2) are regime a's launch or a control, not a configuration of the regime
    lat = latency.table(study)
    lat = lat[~lat["variant"].str.startswith("S16k")
              & ~((lat["variant"] == "64x64 (paper)") & (lat["environment"] == "alone"))]
    co = corunners.table(study)
    small = small_l2.table(study)
    for regime, t, name in (
            ("f", co[co["environment"] != "none"], lambda r: f"{r['mask']}, {r['environment']}"),
            ("g", small[small["held MiB"] > 0],
             lambda r: f"{r['mask']}, {r['held MiB']:.0f} MiB held"),
            ("h", lat, lambda r: f"{r['variant']}, {r['environment']}")):
        without = t[t["lo"].isna()]
        if len(without):  # too few rounds kept: listed in its own section, not counted here
            no_interval_counts[regime] = len(without)
        t = t.dropna(subset=["lo"])
        frames.append(pd.DataFrame({
            "regime": regime, "GPU": t["GPU"],
            "configuration": [name(r) for _, r in t.iterrows()],
            "ratio": t["sawtooth vs linear"], "lo": t["lo"], "hi": t["hi"],
            "paired by": t["rounds"].map(lambda n: f"{n} rounds")}))
    out = pd.concat(frames, ignore_index=True)
    out["regime name"] = out["regime"].map(lambda r: f"{r}: {REGIMES[r]}")
    return out, no_interval_counts


def _controls_left_out(study, c: pd.DataFrame) -> dict:
    """Per exposure regime: the section's count of intervals, how many of them this table
    leaves out as controls (counted from the section's table, not from this one), and how many
    of those lie below no change."""
    from wavefront.report.exposure import multiplicity
    _, _, corunners, small_l2, latency = _regime_modules()
    out = {}
    for regime, module, what, is_control in (
            ("f", corunners, "the launch with no co-runner",
             lambda t: t["environment"] == "none"),
            ("g", small_l2, "the launch with nothing held", lambda t: t["held MiB"] == 0),
            ("h", latency, "the paper's settings alone and the K/V-in-L2 control",
             lambda t: t["variant"].str.startswith("S16k")
             | ((t["variant"] == "64x64 (paper)") & (t["environment"] == "alone")))):
        t = module.table(study)
        m = multiplicity(t)
        kept = c[c["regime"] == regime]
        controls = t[is_control(t) & t["lo"].notna()]
        out[regime] = {"what": what, "section": m["intervals"],
                       "dropped": m["intervals"] - len(kept), "controls": len(controls),
                       "dropped below": m["below"] - int((kept["hi"] < 1).sum())}
    return out


def table(study) -> pd.DataFrame:
    c = configurations(study)
    rows = []
    for (regime, gpu), sub in c.groupby(["regime name", "GPU"], sort=True):
        best = sub.loc[sub["ratio"].idxmax()]
        faster = sub[sub["lo"] > 1]
        rows.append({"regime": regime, "GPU": gpu, "configurations": len(sub),
                     "best: sawtooth / linear TFLOP/s [95%]":
                         f"{best['ratio']:.3f} [{best['lo']:.3f}, {best['hi']:.3f}]",
                     "best configuration": best["configuration"],
                     "interval above 1": len(faster),
                     "interval below 1": int((sub["hi"] < 1).sum()),
                     "by chance": round(sum(interval_chance(int(p.split()[0]))
                                            for p in sub["paired by"]), 1),
                     "paired by": best["paired by"]})
    return pd.DataFrame(rows)


CAPTION = ("Sawtooth's TFLOP/s against linear's (%) in the eight regimes on the H100 and H200 "
           "(the table-driven kernel, at the commits listed under the section): one marker per "
           "configuration, the median of its paired ratios with the 95% interval the text "
           "counts; the dashed line is no change.")


def figure(study):
    c = configurations(study).sort_values(["regime", "GPU", "configuration"])
    regimes = sorted(c["regime name"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.5), sharey=True)
    for ax, (gpu, sub) in zip(axes, c.groupby("GPU")):
        ys, labels = [], []
        for i, regime in enumerate(regimes):
            r = sub[sub["regime name"] == regime].reset_index(drop=True)
            y = i + np.linspace(-0.3, 0.3, max(len(r), 1))[:len(r)]
            x = (r["ratio"] - 1) * 100
            err = [x - (r["lo"] - 1) * 100, (r["hi"] - 1) * 100 - x]
            excludes = (r["lo"] > 1) | (r["hi"] < 1)
            ax.errorbar(x[~excludes], y[~excludes.to_numpy()],
                        xerr=[e[~excludes] for e in err], fmt="o", ms=3, capsize=2,
                        color="C0", label="interval includes no change" if i == 0 else None)
            ax.errorbar(x[excludes], y[excludes.to_numpy()], xerr=[e[excludes] for e in err],
                        fmt="s", ms=4, capsize=2, color="C3",
                        label="interval excludes no change" if i == 0 else None)
            ys.append(i)
            labels.append(regime)
        ax.axvline(0, color="grey", lw=0.8, ls="--")
        ax.set_yticks(ys, labels)
        ax.set(title=gpu, xlabel="TFLOP/s, sawtooth vs linear (%; median, 95% interval)")
    axes[0].invert_yaxis()
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"Sawtooth against linear in the {len(REGIMES)} regimes, H100 and H200: one "
                 "marker per configuration")
    fig.tight_layout()
    return fig


def section(study) -> Section:
    s = Section()
    t = table(study)
    c = configurations(study)
    faster = c[c["lo"] > 1]
    best = c.loc[c["ratio"].idxmax()]
    pairs = c["paired by"].str.split().str[0].astype(int)
    chance = sum(interval_chance(int(n)) for n in pairs)
    beyond = c[(c["lo"] > 1 + PRACTICAL_MARGIN) | (c["hi"] < 1 - PRACTICAL_MARGIN)]
    s.claim(f"Over {len(c)} configurations of the {len(REGIMES)} regimes on the two GPUs, sawtooth's "
            f"interval lies above no change in {len(faster)}"
            + (f" ({', '.join(f'{r}: {n}' for r, n in faster.groupby('regime').size().items())};"
               f" by {(faster['ratio'] - 1).min():+.1%} to {(faster['ratio'] - 1).max():+.1%})"
               if len(faster) else "")
            + f" and below it in {int((c['hi'] < 1).sum())}; its best median "
            f"change is {best['ratio'] - 1:+.1%} ({best['regime']}, {best['GPU']}, "
            f"{best['configuration']}). With no change anywhere, about {chance:.1f} would "
            f"exclude it by chance (up to {chance_bound(len(c), chance / len(c))} in 95% of such "
            f"sets); {len(beyond)} exclude it by more than 1% ("
            + ", ".join(f"{r}: {n}" for r, n in beyond.groupby("regime").size().items()) + ")",
            c["regime"].nunique() == len(REGIMES) and c["GPU"].nunique() == 2
            and bool((pairs >= 6).all()),
            c.to_dict("records"))
    above_beyond = c[c["lo"] > 1 + PRACTICAL_MARGIN]
    below_beyond = c[c["hi"] < 1 - PRACTICAL_MARGIN]
    beside = below_beyond["regime"].isin(["f", "h"]) & below_beyond["configuration"].str.contains(
        "append|copy|gemm|read")
    s.claim(f"Beyond {PRACTICAL_MARGIN:.0%} of no change, sawtooth is faster only in the "
            f"kv_latency=10 binary ({len(above_beyond)} configurations: "
            + "; ".join(above_beyond["GPU"] + " " + above_beyond["configuration"])
            + f"); of the {len(below_beyond)} beyond {PRACTICAL_MARGIN:.0%} below it, "
            f"{int(beside.sum())} run beside a co-runner",
            len(above_beyond) > 0
            and bool(above_beyond["configuration"].str.contains("kv_latency=10").all()),
            {"above": above_beyond.to_dict("records"), "below": below_beyond.to_dict("records")})
    dropped = _controls_left_out(study, c)
    s.claim("The exposure regimes leave out their sections' controls, so their counts here are "
            "smaller than the sections': "
            + "; ".join(f"{r} leaves out {d['what']} ({d['dropped']} of the section's "
                        f"{d['section']} intervals, {d['dropped below']} of them below no change)"
                        for r, d in dropped.items()),
            all(d["dropped"] == d["controls"] for d in dropped.values()), dropped)
    package = sibling(__package__)
    where = {}
    for regime, name in SOURCES.items():
        where.setdefault("the results above" if name in package.DRAFT
                         else package.appendix_of(name), []).append(regime)
    where_text = "; ".join(f"{', '.join(r)}: {place}" for place, r in where.items())
    s.text = f"""## The regimes side by side: where sawtooth's saving becomes speed

Per regime and GPU, sawtooth's TFLOP/s over linear's in the configuration where it does best
(the median of the paired ratios and, in brackets, its distribution-free 95% interval), and how
many configurations have their whole interval above or below no change, beside how many
would by chance if nothing changed (each distribution-free interval misses with its own
probability: 1/32 at 6 pairs) (`experiments/regimes.py`, from the regimes' own
data; each regime's own section: {where_text}). The pairs are bench rounds in a, b and f-h and
sweep repeats in c-e (a repeat times every point once, so its two scans ran side by side).

{md_table(t.drop(columns="paired by"))}

{s.claims[0].text}. Configurations with too few rounds kept for an interval are left out of
the count ({', '.join(f'{k}: {v}' for k, v in no_interval(study).items()) or 'none'}; each regime's
own section lists them). An interval that excludes no change by less than 1% is counted here
too. {s.claims[1].text}. {s.claims[2].text}. The schedule ablation ({package.appendix_of("ablation")})
is not a regime here: its ranges rest on a few repeats, not on intervals.

![regimes](figures/regimes.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
