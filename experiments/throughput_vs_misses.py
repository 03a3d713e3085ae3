"""The fitted throughput model over every timed point: where misses matter at all.

    python experiments/throughput_vs_misses.py run            # on a GPU: measure what the figure needs
    python experiments/throughput_vs_misses.py plot --out DIR # anywhere: the paper's figure, from data/
"""
import pandas as pd

from wavefront.model.fits import BOOTSTRAP
from wavefront.model.presets import gpu_preset
from wavefront.report.analysis import TIMED_EXPERIMENTS
from wavefront.report.draft import Section, errors_row, interval, md_table, wrap
from wavefront.report.experiments import run_as_script

DATASETS = TIMED_EXPERIMENTS


CAPTION = ("Throughput against DRAM traffic per executed FLOP, every timed point on each GPU "
           "(the table-driven kernel). The line is the fitted throughput model's max(compute, DRAM) "
           "time turned into TFLOP/s: a fit through the points (in sample), not an upper "
           "bound, so points lie on both sides of it.")


def figure(study):
    import numpy as np
    import seaborn as sns
    from wavefront.report.figures import short_gpu
    fits, joined = study.throughput
    d = joined.copy()
    d["GPU"] = d["gpu"].map(short_gpu)
    d["DRAM bytes / FLOP"] = (d["dram_read_bytes"] + d["dram_write_bytes"]) / d["executed_flops"]
    g = sns.relplot(data=d, x="DRAM bytes / FLOP", y="tflops", hue="head_dim", style="causal",
                    col="GPU", height=3.6, aspect=1.2, palette="deep")
    for gpu, ax in g.axes_dict.items():
        fit = fits.get(gpu)
        if fit:
            x = np.logspace(np.log10(d["DRAM bytes / FLOP"].min()),
                            np.log10(d["DRAM bytes / FLOP"].max()), 100)
            ax.plot(x, fit.roof_tflops(x), color="k", lw=1)
            above = (d.loc[d["GPU"] == gpu, "tflops"] > fit.roof_tflops(
                d.loc[d["GPU"] == gpu, "DRAM bytes / FLOP"].to_numpy())).mean()
            ax.set_title(f"{gpu}: {above:.0%} of the points above the fitted line")
    g.set(xscale="log")
    g.set_axis_labels("DRAM bytes per executed FLOP (log)", "TFLOP/s (useful FLOPs)")
    g.figure.suptitle("Throughput vs DRAM traffic, every timed point (line: the fitted "
                      "max(compute, DRAM) model, in sample)", y=1.03)
    return g.figure


def section(study) -> Section:
    tfits, _ = study.throughput
    # a fitted point is one repeat of one launch; the DRAM-bound ones are the DRAM-bound
    # regime's launches (Appendix F), each repeated alike
    repeats = int(study.load("dram_bound").groupby(["gpu", "point", "measurement"])[
        "repeat"].nunique().min())
    measured = {g: gpu_preset(g.lower()).dram_read_bytes_per_s for g in tfits}
    fits = md_table(pd.DataFrame([
        {"GPU": g, "R_flop (TFLOP/s)": f"{f.flop_rate / 1e12:.0f} "
                                       f"{interval(f.intervals['flop_rate'], 1e12, '.0f')}",
         "R_dram (TB/s)": f"{f.dram_rate / 1e12:.2f} "
                          f"{interval(f.intervals['dram_rate'], 1e12)}",
         "gamma": f"{f.occupancy_exponent:.2f} {interval(f.intervals['occupancy_exponent'])}",
         "DRAM-bound points (launches x repeats)":
             f"{f.dram_bound_points} ({f.dram_bound_points // repeats} x {repeats})",
         "points (one per repeat)": f.errors["n"],
         "in-sample MAPE": f"{f.errors['mape']:.0%}"} for g, f in tfits.items()]))
    s = Section()
    rate_note = ("R_dram is an effective rate of this max(compute, DRAM) form, fitted in "
                 "sample, not the GPU's bandwidth: its interval lies below the read rate the "
                 "microbenchmark measured (" + ", ".join(
                     f"{measured[g] / 1e12:.2f} TB/s on the {g}" for g in sorted(tfits)) + ").")
    s.claim(rate_note, all(f.dram_bound_points > 0 and f.dram_bound_points % repeats == 0
                           and f.intervals["dram_rate"][1] < measured[g]
                           for g, f in tfits.items()),
            f"{ {g: f.intervals['dram_rate'] for g, f in tfits.items()} }, measured {measured}, "
            f"DRAM-bound points { {g: f.dram_bound_points for g, f in tfits.items()} }, "
            f"repeats {repeats}", listed=False)
    held_out = md_table(pd.DataFrame(
        [{"GPU": r["GPU"], "held out": r["held out"], **errors_row(r),
          "R_dram of that fit (TB/s)": (
              f"{r['R_dram of the fit (TB/s)']:.3g}" if r["DRAM-bound points in the fit"]
              else "unidentified (no DRAM-bound point)")}
         for _, r in study.throughput_validation.iterrows()]))
    s.text = f"""## Throughput: compute, DRAM and occupancy terms

time = max(executed FLOPs / (R_flop x e_schedule x u^gamma), DRAM bytes / R_dram) + t0, with
u the work items per CTA slot (capped at 1) and e_schedule each specialisation's compute rate
relative to persistent+linear; fitted per GPU over every timed point with counters, 95%
intervals from {BOOTSTRAP} bootstrap resamples of the points:

{fits}

{wrap(rate_note)}

Held out one data set at a time (fitted on the GPU's others):

{held_out}

![throughput](figures/throughput_vs_misses.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
