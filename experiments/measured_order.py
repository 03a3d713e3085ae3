"""Do the CTAs run in lock-step? The work items' real interleaving, recorded by the kernel, and
what it does to the cache model's predictions of DRAM reads.

The RECORD_ORDER kernel takes a ticket from a global atomic counter as each work item starts
and ends; a counter run saves the tickets of the very launch whose DRAM reads ncu reports.
Each launch is then predicted three ways against its own DRAM reads: lock-step rounds (the
model's default), the measured order, and a drift model (per-SM rate spread, start skew) fitted
to the *other* repeats' orders. The same points measured without the flag give its overhead.
Configurations: 132 vs 264 CTAs (occupancy 1 and 2), grouped with 256 vs 264 CTAs, causal,
all at B=8 H=16 S=16k D=128; and causal S=128k D=128, where sawtooth read more than linear.

    python experiments/measured_order.py run            # on a GPU: both data sets
    python experiments/measured_order.py plot --out DIR # anywhere: figure and table from data/
"""
import pandas as pd

from wavefront.report import figures
from wavefront.report.analysis import ORDER_PERTURBED
from wavefront.report.draft import Section, md_table, wrap
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu

GRID = """
repeats = 3
timeout_s = 300
reps = 10
batch_points = 16
metric_set = "dram"

[[grid]]
batch = [8]
heads = [16]
seqlen = [16384]
head_dim = [128]
causal = [false, true]
tiles = ["128x64"]
occupancy = [1, 2]
schedule = ["persistent+linear", "persistent+sawtooth"]

[[grid]]
batch = [8]
heads = [16]
seqlen = [16384]
head_dim = [128]
causal = [false]
tiles = ["128x64"]
ctas = [256, 0]
schedule = ["grouped+linear", "grouped+sawtooth"]

[[grid]]
batch = [1]
heads = [1]
seqlen = [131072]
head_dim = [128]
causal = [true]
tiles = ["128x64"]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""
SPECS = {
    "measured_order": 'name = "measured_order"\nmeasure = ["timing", "counters"]\n'
                      'record_order = true\n' + GRID,
    "measured_order_plain": 'name = "measured_order_plain"\n'
                            'measure = ["timing", "counters"]\n' + GRID,
}


def measured_order_table(study) -> pd.DataFrame:
    """Per configuration: measured DRAM reads (median and range over repeats, with and without
    the flag), each predictor's median and its error against the measured median, and the
    flag's overhead (TFLOP/s with / without, medians)."""
    rows = study.measured_order_rows
    plain = study.load("measured_order_plain")
    flagged = study.load("measured_order")
    out = []
    for (gpu, point), sub in rows.groupby(["gpu", "point"], sort=False):
        m = float(sub["measured"].median())
        p_c = plain[(plain["point"] == point) & (plain["measurement"] == "counters")]
        tf = {name: df[(df["point"] == point) & (df["measurement"] == "timing")]["tflops"]
              for name, df in (("flag", flagged), ("plain", plain))}
        overhead = float(tf["flag"].median() / tf["plain"].median() - 1)
        row = {"GPU": short_gpu(gpu), "configuration": sub["configuration"].iloc[0],
               "DRAM MB": m / 1e6, "range MB": f"{sub['measured'].min() / 1e6:.0f}-"
                                              f"{sub['measured'].max() / 1e6:.0f}",
               "without flag MB": float(p_c["dram_read_bytes"].median()) / 1e6,
               "flag TFLOP/s": overhead,
               "note": ORDER_PERTURBED if overhead < -0.5 else ""}
        for col in [c for c in sub.columns if ", " in c]:
            row[f"{col} MB"] = float(sub[col].median()) / 1e6
            row[f"{col} err"] = float(sub[col].median()) / m - 1
        out.append(row)
    return pd.DataFrame(out)


def order_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Mean absolute error and worst error of each predictor over the configurations whose
    order the flag did not perturb."""
    ok = table[table["note"] == ""]
    cols = [c for c in table.columns if c.endswith(" err")]
    return pd.DataFrame([{"predictor": c[:-4], "configurations": len(ok),
                          "MAPE": float(ok[c].abs().mean()),
                          "worst": float(ok[c].abs().max()),
                          "within 10%": int((ok[c].abs() < 0.10).sum())} for c in cols])


def figure(study):
    return figures.measured_order(measured_order_table(study))


def table(study):
    return measured_order_table(study)


def section(study) -> Section:
    s = Section()
    t = measured_order_table(study)
    cols = {"configuration": "configuration", "DRAM MB": "DRAM MB (median)",
            "range MB": "range MB", "flag TFLOP/s": "flag's TFLOP/s change",
            "lock-step, partitions err": "lock-step", "measured order, partitions err":
            "measured order", "drift model, partitions err": "drift model (held out)",
            "note": "note"}
    shown = t[list(cols)].rename(columns=cols)
    for c in ("flag's TFLOP/s change", "lock-step", "measured order", "drift model (held out)"):
        shown[c] = shown[c].map(lambda x: f"{x:+.0%}")
    shown["DRAM MB (median)"] = shown["DRAM MB (median)"].map(lambda x: f"{x:.0f}")
    ok = t[t["note"] == ""]
    many = ok[~ok["configuration"].str.contains(" 132 CTAs")]
    within = {c: int((many[c].abs() < 0.2).sum()) for c in
              ("lock-step, partitions err", "measured order, partitions err")}
    one_per_sm = ok[ok["configuration"].str.contains(" 132 CTAs")]
    worst_one = float(one_per_sm["measured order, partitions err"].min()) if len(one_per_sm) else 0
    overhead = t[t["note"] == ""]["flag TFLOP/s"]
    perturbed = t[t["note"] != ""]["flag TFLOP/s"]
    perturbed_slowdown = float(1 / (1 + perturbed.min())) if len(perturbed) else float("nan")
    errs = order_errors(t)
    text = wrap(
        "The RECORD_ORDER kernel (a compile-time flag, off by default) takes a ticket from a "
        "global atomic counter as each work item starts and ends; a counter run saves the "
        "tickets of the very launch whose DRAM reads ncu reports (`experiments/"
        "measured_order.py`, three repeats, H100). Each launch is predicted from lock-step "
        "rounds, from its own recorded order, and from a drift model (per-SM rate spread and "
        "start skew, fitted to the other repeats' orders), with the partition capacity model; "
        "errors are predicted / measured - 1 of the medians. The flag changed TFLOP/s by "
        f"{overhead.min():+.0%} to {overhead.max():+.0%} where it did not change code "
        "generation; in the causal one-CTA-per-SM specialisation it did (that launch ran "
        f"{perturbed_slowdown:.1f}x slower with the flag), so those orders are not the plain "
        f"kernel's and are left out of the scores. Over the other {errs['configurations'].iloc[0]} "
        "configurations, mean absolute error: "
        + ", ".join(f"{r['predictor']} {r['MAPE']:.0%}" for _, r in errs.iterrows()) + ".")
    s.claim(f"With two CTAs per SM the recorded order explains the DRAM reads better than "
            f"lock-step rounds: within 20% in {within['measured order, partitions err']} of "
            f"{len(many)} configurations against {within['lock-step, partitions err']} for "
            "lock-step, including both causal B8 H16 launches. With one CTA per SM (132 CTAs, "
            f"non-causal) the order-driven "
            f"prediction is off by {worst_one + 1:.0f}x while the launch read about the "
            "compulsory bytes: there the tickets do not time the loads, or the L2 keeps what LRU "
            "would evict. Still open.",
            within["measured order, partitions err"] > within["lock-step, partitions err"]
            and worst_one > 5, f"within 20%: {within}; one-per-SM error {worst_one}")
    s.text = f"""## Do the CTAs run in lock-step? The measured order

{text}

{md_table(shown)}

![measured order](figures/measured_order.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
