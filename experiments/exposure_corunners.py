"""Does a co-runner that reads and writes through the L2 make the paper's misses cost time?

The paper's launch (B8 H1 S128k D64 bf16, 64x64 tiles, 48 persistent CTAs, one per SM) beside
a co-runner on every SM it leaves free, for each kind a deployment overlaps with attention (a
streaming read, a streaming copy, a KV-cache append, a GEMM-shaped load-from-L2/store-out) and
each cache policy PTX offers its loads and stores (`wavefront.measure.corunners`). A read-only
stream (the earlier starvation experiment) is the one co-runner a launch needing ~60 GB/s can
ignore; stores allocate dirty lines in the L2 and turn the bus around. Per co-runner: its own
achieved read and write bandwidth while the attention ran (its byte count over its elapsed
time), the bandwidth left per attention SM (the fastest co-runner alone on every SM, less what
this one took, over 48), linear's slowdown against no co-runner, and sawtooth against linear
paired by round (6 rounds, rounds whose two scans ran under different clock states dropped).

    python experiments/exposure_corunners.py run            # on a GPU: data/exposure_corunners/
    python experiments/exposure_corunners.py plot --out DIR # anywhere: figure, table
"""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from wavefront.report.draft import Section, md_table
from wavefront.report.experiments import run_as_script, sibling
from wavefront.report.exposure import (interval_text, multiplicity, multiplicity_text,
                                       paired, records)

DATASETS = ()
RECORDS = ("exposure_corunners", "production_bytes")
ATTENTION_CTAS = 48
ROUNDS = 6
GB10_GBPS_PER_SM = 273 / 48  # 273 GB/s LPDDR5X over 48 SMs (published)
# Datasheet DRAM bandwidth (leads, not measurements): a co-runner rate above it cannot all
# be DRAM traffic, and is not used as such.
DATASHEET_GBPS = {"H100": 3350.0, "H200": 4800.0}


def environments():
    from wavefront.measure.corunners import CoRunnerSpec as C
    specs = [C("read", "ca"), C("read", "cs"), C("read", "evict_last"),
             *(C("copy", "ca", s) for s in ("wb", "cs", "wt", "cg", "no_allocate",
                                             "evict_first", "evict_last")),
             C("copy", "cs", "cs"), C("append", store="wb"), C("append", store="evict_last"),
             C("gemm_like", "ca", "wb"), C("gemm_like", "ca", "cs")]
    return {"none": None, **{s.label: s for s in specs}}


def points():
    from wavefront.point import Point
    return {f"{kv}{' causal' if causal else ''}": Point(
        batch=8, heads=1, seqlen=131072, head_dim=64, causal=causal, tiles="64x64",
        occupancy=1, ctas=ATTENTION_CTAS, schedule=f"persistent+{kv}")
        for causal in (False, True) for kv in ("linear", "sawtooth")}


APPEND_LEVELS = (21, 42, 63)  # CTAs of the append co-runner below the 84 spare SMs


def measure(out_dir) -> int:
    """Each co-runner alone (spare SMs and every SM), its count checked against DRAM bytes,
    the paired rounds, then the append co-runner at fewer CTAs; appended to
    <out_dir>/rounds.jsonl. -> failures."""
    from wavefront.measure.corunners import solo_traffic
    from wavefront.measure.sink import JsonlSink
    from wavefront.results.records import EXPOSURE_RECORDS
    from wavefront.device import current_device
    dev = current_device()
    specs = {name: spec for name, spec in environments().items() if spec is not None}
    with JsonlSink(out_dir, "rounds.jsonl") as sink:
        for row in solo_traffic(specs, [dev.sms - ATTENTION_CTAS, dev.sms]):
            sink.write(EXPOSURE_RECORDS.stamp({"kind": "solo", **row}))
    failures = measure_check(out_dir)
    _rounds(out_dir, environments())
    _rounds(out_dir, append_levels())
    return failures


def append_levels():
    from wavefront.measure.corunners import CoRunnerSpec
    return {f"append st.wb @{n} CTAs": (CoRunnerSpec("append", store="wb"), n)
            for n in APPEND_LEVELS}


def measure_check(out_dir) -> int:
    """What each co-runner's own count is worth: DRAM bytes (ncu, cold L2) of a fixed amount
    of its work alone on the spare SMs, against what it counted."""
    from wavefront.device import current_device
    from wavefront.measure.exposure_profile import profile_contenders
    from wavefront.measure.sink import JsonlSink
    from wavefront.results.records import EXPOSURE_RECORDS
    dev = current_device()
    specs = [s for s in environments().values() if s is not None]
    only = ",".join(f"corunner:{s.kind}:{s.load}:{s.store}" for s in specs)
    with JsonlSink(out_dir, "rounds.jsonl") as sink:
        try:
            for row in profile_contenders((8, 1, 131072, 64), causal=False, peers=False,
                                          repeats=2, only=only, timeout_s=300):
                sink.write(EXPOSURE_RECORDS.stamp({"kind": "ncu", "gpu": dev.name, **row}))
        except Exception as exc:  # recorded; the rounds still run
            sink.write(EXPOSURE_RECORDS.stamp({"kind": "ncu", "gpu": dev.name,
                                               "error": str(exc)[:300]}))
            return 1
    return 0


def _rounds(out_dir, envs) -> None:
    import click
    from wavefront.device import current_device
    from wavefront.measure.corunners import paired_rounds
    from wavefront.measure.sink import JsonlSink
    from wavefront.results.records import EXPOSURE_RECORDS
    spare = current_device().sms - ATTENTION_CTAS
    with JsonlSink(out_dir, "rounds.jsonl") as sink:
        with click.progressbar(length=len(envs) * ROUNDS, label="co-runner rounds") as bar:
            for row in paired_rounds(points(), envs, rounds=ROUNDS, spare_ctas=spare,
                                     progress=lambda env, r: bar.update(1)):
                sink.write(EXPOSURE_RECORDS.stamp({"kind": "round", **row}))


def table(study) -> pd.DataFrame:
    d = records(study, "exposure_corunners")
    solo = d[d["kind"] == "solo"]
    r = d[d["kind"] == "round"].copy()
    r["causal"] = r["point"].str.endswith("causal")
    r["mask"] = r["causal"].map({True: "causal", False: "non-causal"})
    rows = []
    for mask, m in r.groupby("mask"):
        m = m.assign(point=m["point"].str.replace(" causal", "", regex=False))
        t = paired(m, ["GPU", "environment"], "linear", "sawtooth")
        t.insert(2, "mask", mask)
        rows.append(t)
    t = pd.concat(rows, ignore_index=True)
    # what a counted byte is worth in DRAM bytes, per co-runner (its ncu check alone)
    n = d[d["kind"] == "ncu"]
    n = n[n["error"].isna()] if "error" in n else n
    worth = pd.DataFrame({"DRAM/counted read": [], "DRAM/counted write": []},
                         index=pd.MultiIndex.from_tuples([], names=["GPU", "environment"]))
    if len(n):
        g = n.groupby(["GPU", "corunner"])
        worth = pd.DataFrame({
            "DRAM/counted read": g["dram__bytes_read.sum"].sum()
            / g["corunner_read_bytes"].sum().replace(0, np.nan),
            "DRAM/counted write": g["dram__bytes_write.sum"].sum()
            / g["corunner_write_bytes"].sum().replace(0, np.nan)})
        worth.index.names = ["GPU", "environment"]
    traffic = r.groupby(["GPU", "environment"])[["corunner_read_gbps",
                                                 "corunner_write_gbps"]].median()
    traffic = traffic.reset_index()
    traffic["label"] = traffic["environment"].str.split(" @").str[0]
    traffic = traffic.join(worth.rename_axis(["GPU", "label"]), on=["GPU", "label"]).drop(
        columns="label").set_index(["GPU", "environment"])
    t = t.join(traffic, on=["GPU", "environment"])
    for side in ("read", "write"):
        counted = t[f"corunner_{side}_gbps"].fillna(0.0)
        ratio = t.get(f"DRAM/counted {side}", pd.Series(np.nan, index=t.index))
        t[f"co-runner counted {side} GB/s"] = counted
        # no byte counted: no DRAM bytes either; a check missing: the count stands, flagged
        t[f"co-runner DRAM {side} GB/s"] = np.where(counted == 0, 0.0,
                                                    counted * ratio.fillna(1.0))
    t["checked"] = t.get("DRAM/counted read", pd.Series(np.nan, index=t.index)).notna() | \
        t.get("DRAM/counted write", pd.Series(np.nan, index=t.index)).notna()
    t["co-runner GB/s"] = t["co-runner DRAM read GB/s"] + t["co-runner DRAM write GB/s"]
    # a rate above the datasheet is not all DRAM (seen: the read co-runner's own count over
    # long runs, 6-7.6 TB/s, while its ncu check alone read at DRAM's rate): not known
    t["trusted"] = [used <= DATASHEET_GBPS.get(g, np.inf)
                    for g, used in zip(t["GPU"], t["co-runner GB/s"])]
    t.loc[~t["trusted"], "co-runner GB/s"] = np.nan
    # this GPU's DRAM ceiling here: the most any co-runner moved to and from DRAM alone on
    # every SM (its count, at its checked worth)
    full = solo[solo["corunner_ctas"] == solo.groupby("GPU")["corunner_ctas"].transform("max")].join(
        worth, on=["GPU", "environment"])
    full_dram = (full["corunner_read_gbps"] * full["DRAM/counted read"].fillna(1.0)
                 + full["corunner_write_gbps"] * full["DRAM/counted write"].fillna(1.0))
    full_dram = full_dram.where(full_dram <= full["GPU"].map(DATASHEET_GBPS).fillna(np.inf))
    ceiling = full_dram.groupby(full["GPU"]).max()  # per GPU: its own largest CTA count
    t["GB/s left per attention SM"] = [
        max(ceiling.get(g, np.nan) - used, 0.0) / ATTENTION_CTAS
        for g, used in zip(t["GPU"], t["co-runner GB/s"])]
    # the attention's own DRAM bandwidth beside the co-runner: its DRAM bytes from one cold
    # launch alone (ncu, `production_bytes`: ncu cannot profile it beside another kernel)
    # over its time beside the co-runner
    try:
        own = sibling(__package__, "production_bytes").table(study)
        own = own[own["shape"].str.contains("paper") & (own["contender"] == "persistent+linear")]
        own_bytes = own.set_index(["GPU", "mask"])["median"]
        t["attention GB/s"] = [own_bytes.get((g, m), np.nan) / (ms * 1e6)
                               for g, m, ms in zip(t["GPU"], t["mask"], t["linear ms"])]
    except Exception:  # no production_bytes data: the column stays unknown
        t["attention GB/s"] = np.nan
    none = t[t["environment"] == "none"].set_index(["GPU", "mask"])["linear ms"]
    t["linear slowdown"] = [ms / none.get((g, mk), np.nan) - 1
                            for g, mk, ms in zip(t["GPU"], t["mask"], t["linear ms"])]
    return t


CAPTION = ("Linear's slowdown beside each co-runner on the 84 spare SMs (%) and sawtooth's "
           "TFLOP/s against linear's (%; median of 6 paired rounds, 95% interval) at the paper's "
           "launch (B8 H1 S128k D64 bf16, 48 persistent CTAs), H100 and H200.")


def figure(study):
    t = table(study)
    gpus = ", ".join(sorted(set(t["GPU"])))
    t = t.assign(**{"sawtooth vs linear (%)": (t["sawtooth vs linear"] - 1) * 100,
                    "linear's slowdown (%)": t["linear slowdown"] * 100,
                    "series": t["GPU"] + " " + t["mask"]})
    order = list(dict.fromkeys(t["environment"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 6.5), sharey=True)
    sns.barplot(data=t, y="environment", x="linear's slowdown (%)", hue="series", order=order,
                ax=axes[0], orient="h")
    for i, (series, sub) in enumerate(t.groupby("series")):
        sub = sub.set_index("environment").reindex(order)
        y = np.arange(len(order)) + (i - 1.5) * 0.18
        x = sub["sawtooth vs linear (%)"]
        err = np.vstack([x - (sub["lo"] - 1) * 100, (sub["hi"] - 1) * 100 - x])
        axes[1].errorbar(x, y, xerr=err, fmt="o", ms=4, capsize=2, label=series)
    axes[1].axvline(0, color="k", lw=0.8)
    axes[0].set(xlabel="linear's time beside the co-runner vs alone (%)", ylabel="co-runner")
    axes[1].set(xlabel="sawtooth vs linear TFLOP/s (%), median of rounds, 95% interval")
    axes[1].legend(fontsize=9)
    fig.suptitle(f"Co-runners on the 84 spare SMs, {gpus}: B8 H1 S128k D64 bf16, 64x64 tiles, "
                 f"48 persistent CTAs, {ROUNDS} rounds", fontsize=11)
    fig.tight_layout()
    return fig


# A co-runner that slowed linear by at most this, with no sawtooth interval off no change,
# is shown in the draft's table as part of one row of ranges
QUIET_SLOWDOWN = 0.05


def section(study) -> Section:
    s = Section()
    t = table(study)
    m = multiplicity(t)
    # one row per co-runner: its traffic and, per GPU and mask, linear's slowdown and
    # sawtooth against linear (the full table: `python experiments/exposure_corunners.py plot`)
    cell = t.assign(cell=[f"{sl:+.0%} / {interval_text(r)}" for sl, (_, r) in
                          zip(t["linear slowdown"], t.iterrows())],
                    col=t["GPU"] + " " + t["mask"])
    shown = cell.pivot_table(index="environment", columns="col", values="cell",
                             aggfunc="first").reset_index()
    per_gpu = t.groupby(["environment", "GPU"])[["co-runner GB/s",
                                                 "GB/s left per attention SM"]].first()
    fmt = (lambda x: "/".join(f"{v:.0f}" if v == v else "?" for v in x))
    traffic = pd.DataFrame({
        "co-runner GB/s (" + "/".join(sorted(set(t["GPU"]))) + ")":
            per_gpu["co-runner GB/s"].groupby(level=0).agg(fmt),
        "GB/s left per SM": per_gpu["GB/s left per attention SM"].groupby(level=0).agg(fmt)})
    shown = shown.join(traffic, on="environment")
    # rows with no interval in any column (their linear slowdowns: the plot's table)
    shown = shown[shown["environment"].isin(set(t[t["lo"].notna()]["environment"]))]
    # Co-runners that changed nothing (linear within QUIET_SLOWDOWN of alone, every sawtooth
    # interval across no change) share one row of ranges: the figure and `plot` show each.
    moved = t.groupby("environment").apply(
        lambda g: bool((g["linear slowdown"].abs() <= QUIET_SLOWDOWN).all()
                       and ((g["lo"] <= 1) & (g["hi"] >= 1)).all()), include_groups=False)
    # (not the append's CTA levels: the text reads the cliff off those rows)
    quiet = sorted(e for e in moved[moved].index
                   if e != "none" and "@" not in e and e in set(shown["environment"]))
    if len(quiet) > 1:
        rest = cell[cell["environment"].isin(quiet)]
        summary = {"environment": f"{len(quiet)} others: " + ", ".join(quiet)}
        for col, g in rest.groupby("col"):
            summary[col] = (f"{g['linear slowdown'].min():+.0%}..{g['linear slowdown'].max():+.0%}"
                            f" / {g['sawtooth vs linear'].min() - 1:+.2%}.."
                            f"{g['sawtooth vs linear'].max() - 1:+.2%}")
        for col in traffic.columns:
            summary[col] = "see figure"
        shown = pd.concat([shown[~shown["environment"].isin(quiet)], pd.DataFrame([summary])],
                          ignore_index=True)
    worst = t.loc[t["linear slowdown"].idxmax()]
    best = t.loc[t["sawtooth vs linear"].idxmax()]
    lost = t[t["lo"].isna()]
    reasons = {row["environment"]: (int(row["dropped (clock state)"]),
                                    int(row["dropped (co-runner ended first)"]))
               for _, row in lost.iterrows()}
    power = sorted(e for e, (clock, ended) in reasons.items() if clock >= 3)
    ended = sorted(e for e, (clock, ended) in reasons.items() if ended and clock < 3)
    s.claim(f"Beside a co-runner, {multiplicity_text(m)}. {len(lost)} configurations kept too "
            f"few rounds for an interval: {', '.join(power)} lost 3 or more of {ROUNDS} rounds "
            "to pairs that ran under different clock states (these co-runners drive the GPU "
            f"to its power limit: {int(lost['throttled rounds'].sum())} of their rounds "
            f"throttled); {', '.join(ended) or 'none'} lost one to its co-runner ending before "
            "the attention did",
            set(power) | set(ended) == set(reasons), {**m, "lost": reasons})
    writes = t[t["environment"].str.startswith("append") & ~t["environment"].str.contains("@")]
    full = writes[writes["mask"] == "non-causal"]
    slower = full[full["hi"] < 1]
    s.claim("Beside a store-only co-runner (a KV-cache append on all 84 spare SMs), linear "
            f"slows by {writes['linear slowdown'].min():+.0%} to "
            f"{writes['linear slowdown'].max():+.0%}; non-causal, sawtooth is slower than "
            f"linear in {len(slower)} of {len(full)} configurations ("
            + ", ".join(f"{r['GPU']} {r['environment']} {interval_text(r)}"
                        for _, r in full.iterrows())
            + "), causal in none. Why is not measured: the attention's DRAM bytes beside the "
              "co-runner are not (Nsight Compute profiles one kernel at a time); hypotheses: "
              "sawtooth's backward scans meet write-drain latency differently, or its saving "
              "is smaller under the co-runner's evictions",
            len(slower) >= 2 and bool((writes[writes["mask"] == "causal"]["hi"] >= 1).all()),
            writes.to_dict("records"))
    s.claim(f"The co-runner that slowed linear most ({worst['environment']}, {worst['GPU']} "
            f"{worst['mask']}) slowed it by {worst['linear slowdown']:+.1%}, leaving "
            f"{worst['GB/s left per attention SM']:.1f} GB/s per attention SM (GB10: "
            f"{GB10_GBPS_PER_SM:.1f})", bool(np.isfinite(worst["linear slowdown"])),
            worst.to_dict())
    s.text = f"""## Co-runners that write through the L2

The paper's launch beside a co-runner on the 84 SMs it leaves idle (`experiments/
exposure_corunners.py`, `wavefront.measure.corunners`): streaming reads, a streaming copy, a
KV-cache append and a GEMM-shaped load-from-L2/store-out, each with the PTX cache policies of
its loads and stores. The co-runner's bandwidth is its own byte count over its elapsed time
while the attention ran; the bandwidth left per attention SM is the fastest co-runner alone
on every SM less that, over 48 (GB10 has {GB10_GBPS_PER_SM:.1f} GB/s per SM); the attention's
own bandwidth is linear's DRAM bytes from one cold launch alone over its time beside the
co-runner (Nsight Compute profiles one kernel at a time). Sawtooth against
linear is paired by round ({ROUNDS} rounds); a round whose two scans ran under different clock
states is dropped and counted. Each cell: linear's slowdown against no co-runner / sawtooth
against linear [95%]; co-runners that changed nothing (linear within
{QUIET_SLOWDOWN:.0%} of alone, every interval across no change; not the append's CTA levels)
share one row of ranges. The
largest sawtooth gain measured here:
{interval_text(best)} ({best['environment']}, {best['GPU']} {best['mask']}{'; its interval includes no change' if best['lo'] <= 1 <= best['hi'] else ''}).

{md_table(shown)}

{' '.join(c.text + '.' for c in s.claims)} The append at fewer CTAs shows where the
cliff is: linear's slowdown per level of stores in the table's `@ CTAs` rows. Why stores
hurt where a copy at the same bytes does not is not measured here (hypothesis: a copy's own
loads throttle it, stores do not wait and fill the DRAM queues ahead of the attention's reads).
Policies that PTX defines alike at the L2 (`.wt` and `.L1::no_allocate` stores to device
memory, `.cg` against the default write-back) act as repeats of one condition: their spread
(causal copies on the H100: -1.2% to +2.7%, all intervals across no change) is this table's
noise. The co-runner rates count its own bytes over its run; only a fixed amount of its work
alone was checked against DRAM counters (`DRAM/counted`), and the read co-runners' counts over
long runs exceed the datasheet bandwidth (not understood; shown as not known). "attention
GB/s" is a lower bound: bytes of a launch alone over its time beside the co-runner.

![exposure_corunners](figures/exposure_corunners.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
