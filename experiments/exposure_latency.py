"""Does less latency hiding let the paper's misses cost time?

The kernel settings that decide how far ahead the K/V loads run: the `kv_latency` hint (the
compiler's load pipelining), one worker warpgroup instead of two (`worker_warps=4`), the
occupancy hint, and 128x64 tiles against the paper's 64x64. Each at the paper's launch (B8 H1
S128k D64, 48 persistent CTAs, non-causal), sawtooth against linear paired by round, alone,
beside the co-runner that slowed the launch most (a KV-cache append, stores only, on the 84
spare SMs: `exposure_corunners`) and with the most L2 a context may hold taken away (`exposure_small_l2`'s largest hold).

    python experiments/exposure_latency.py run            # on a GPU: data/exposure_latency/
    python experiments/exposure_latency.py plot --out DIR # anywhere: figure, table
"""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wavefront.report.draft import Section, md_table, span
from wavefront.report.experiments import run_as_script
from wavefront.report.exposure import (flat, interval_text, multiplicity, multiplicity_text,
                                       paired, paired_alone, pays, records)

DATASETS = ()
RECORDS = ("exposure_latency",)
ROUNDS = 6
VARIANTS = {
    "64x64 (paper)": dict(tiles="64x64", occupancy=1),
    "64x64 kv_latency=1": dict(tiles="64x64", occupancy=1, kv_latency=1),
    "64x64 kv_latency=10": dict(tiles="64x64", occupancy=1, kv_latency=10),
    "64x64 worker_warps=4": dict(tiles="64x64", occupancy=1, worker_warps=4),
    "64x64 occupancy=2": dict(tiles="64x64", occupancy=2),
    "128x64": dict(tiles="128x64", occupancy=1),
}


def points():
    from wavefront.point import Point
    return {f"{variant}|{kv}": Point(batch=8, heads=1, seqlen=131072, head_dim=64,
                                     causal=False, ctas=48, schedule=f"persistent+{kv}",
                                     **levers)
            for variant, levers in VARIANTS.items() for kv in ("linear", "sawtooth")}


def measure(out_dir) -> int:
    import click
    from wavefront.device import current_device
    from wavefront.measure.corunners import CoRunnerSpec, max_persisting_bytes, paired_rounds
    from wavefront.measure.sink import JsonlSink
    from wavefront.results.records import EXPOSURE_RECORDS
    dev = current_device()
    held = max_persisting_bytes() // (1 << 20) << 20
    envs = {"alone": None, "append st.wb": CoRunnerSpec("append", store="wb"),
            f"held {held / 2**20:.0f} MiB": held}
    # the held environment has no co-runner: paired_rounds treats an int as bytes held
    with JsonlSink(out_dir, "rounds.jsonl") as sink:
        with click.progressbar(length=len(envs) * ROUNDS, label="latency rounds") as bar:
            for row in paired_rounds(points(), envs, rounds=ROUNDS,
                                     spare_ctas=dev.sms - 48,
                                     progress=lambda env, r: bar.update(1)):
                sink.write(EXPOSURE_RECORDS.stamp({"kind": "round", **row}))
    return 0


CONTROL_SEQLEN = 16384  # K+V of a head: 4 MiB, in the L2 on both GPUs: no scan can save
# the batch that keeps the launch's FLOPs (B x S^2) those of B8 at S=128k
CONTROL_BATCH = 8 * (131072 // CONTROL_SEQLEN) ** 2


def control_head_mib() -> float:
    """K and V of one head at the control's sequence (bf16, D=64), MiB."""
    from wavefront.point import DTYPE_BYTES
    from wavefront.schedules import AttentionProblem
    return AttentionProblem(1, 1, 1, CONTROL_SEQLEN, CONTROL_SEQLEN, 64,
                            element_bytes=DTYPE_BYTES["bfloat16"]).kv_bytes_per_unit / 2**20


def measure_control(out_dir) -> int:
    """The variants where sawtooth and linear differed, at a sequence whose K/V stays in the
    L2 (every DRAM read compulsory for both scans): a difference left there is not misses."""
    import click
    from wavefront.measure.corunners import paired_rounds
    from wavefront.measure.sink import JsonlSink
    from wavefront.point import Point
    from wavefront.results.records import EXPOSURE_RECORDS
    chosen = ("64x64 (paper)", "64x64 kv_latency=10")
    pts = {f"S16k {variant}|{kv}": Point(batch=CONTROL_BATCH, heads=1, seqlen=CONTROL_SEQLEN,
                                         head_dim=64, causal=False, ctas=48,
                                         schedule=f"persistent+{kv}", **VARIANTS[variant])
           for variant in chosen for kv in ("linear", "sawtooth")}
    with JsonlSink(out_dir, "rounds.jsonl") as sink:
        with click.progressbar(length=ROUNDS, label="control rounds") as bar:
            for row in paired_rounds(pts, {"alone": None}, rounds=ROUNDS, spare_ctas=0,
                                     progress=lambda env, r: bar.update(1)):
                sink.write(EXPOSURE_RECORDS.stamp({"kind": "round", **row}))
    return 0


PIPELINE_FILE = "pipeline.json"


def measure_pipeline(out_dir) -> int:
    """Each variant's K/V pipeline read from its binary's SASS (compiled here, no GPU needed)
    into <out_dir>/pipeline.json."""
    import json
    from datetime import date
    from pathlib import Path
    from wavefront.files import write_file
    from wavefront.kernel.attention import KernelVariant, compile_variant
    from wavefront.kernel.sass import disassemble
    from wavefront.model.pipeline import kv_pipeline
    rows = {}
    for name, levers in VARIANTS.items():
        levers = dict(levers)
        m, n = (int(x) for x in levers.pop("tiles").split("x"))
        variant = KernelVariant("bfloat16", 64, m, n, False, levers.pop("occupancy"), **levers)
        rows[name] = {"label": variant.label,
                      **kv_pipeline(disassemble(compile_variant(variant))).as_dict()}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    write_file(Path(out_dir) / PIPELINE_FILE, what="pipeline record", data=json.dumps({
        "what": "each variant's K/V pipeline (D=64, bf16, non-causal, static schedule), read "
                "from its SASS by wavefront.model.pipeline.kv_pipeline",
        "command": "exposure_latency.measure_pipeline", "date": str(date.today()),
        "variants": rows}, indent=1))
    return 0


def pipeline(study) -> pd.DataFrame:
    """Per variant: K/V steps in flight per consumer (SASS), the time one K/V step takes
    (the faster scan alone over the steps each CTA runs) and the time the loads in flight
    cover."""
    from wavefront.files import read_json
    depth = read_json(study.data_dir / "exposure_latency" / PIPELINE_FILE, "pipeline record")
    t = table(study)
    t = t[(t["environment"] == "alone") & ~t["variant"].str.startswith("S16k")]
    rows = []
    for _, r in t.iterrows():
        tiles = VARIANTS[r["variant"]]["tiles"]
        m = int(tiles.split("x")[0])
        items_per_cta = 8 * 131072 / m / 48
        steps = items_per_cta * 131072 / 64  # every item scans all K/V in 64-key tiles
        # the faster scan's time: a step's own time, with as few miss stalls as measured
        step_us = r["linear ms"] / max(r["sawtooth vs linear"], 1.0) * 1e3 / steps
        ahead = depth["variants"][r["variant"]]["loads_ahead"]
        rows.append({"GPU": r["GPU"], "variant": r["variant"], "K/V steps ahead (SASS)": ahead,
                     "step us": step_us, "covered us": ahead * step_us,
                     "sawtooth vs linear": r["sawtooth vs linear"], "lo": r["lo"],
                     "hi": r["hi"]})
    return pd.DataFrame(rows)


def table(study) -> pd.DataFrame:
    d = records(study, "exposure_latency")
    r = d[d["kind"] == "round"].copy()
    split = r["point"].str.split("|", expand=True)
    r["variant"], r["point"] = split[0], split[1]
    t = paired(r, ["GPU", "environment", "variant"], "linear", "sawtooth")
    alone = t[t["environment"] == "alone"].set_index(["GPU", "variant"])["linear ms"]
    paper = t[(t["environment"] == "alone") & (t["variant"] == "64x64 (paper)")].set_index(
        "GPU")["linear ms"]
    t["linear slowdown vs alone"] = [ms / alone.get((g, v), np.nan) - 1
                                     for g, v, ms in zip(t["GPU"], t["variant"], t["linear ms"])]
    t["linear vs paper's settings alone"] = [ms / paper.get(g, np.nan) - 1
                                            for g, ms in zip(t["GPU"], t["linear ms"])]
    return t


def figure(study):
    t = table(study)
    gpus = sorted(set(t["GPU"]))
    envs = list(dict.fromkeys(t["environment"]))
    variants = list(dict.fromkeys(t["variant"]))
    fig, axes = plt.subplots(1, len(gpus), figsize=(6.5 * len(gpus), 4.6), sharey=True,
                             squeeze=False)
    for ax, gpu in zip(axes[0], gpus):
        for i, env in enumerate(envs):
            sub = t[(t["GPU"] == gpu) & (t["environment"] == env)].set_index("variant")
            sub = sub.reindex(variants)
            y = np.arange(len(variants)) + (i - (len(envs) - 1) / 2) * 0.2
            x = (sub["sawtooth vs linear"] - 1) * 100
            err = np.vstack([x - (sub["lo"] - 1) * 100, (sub["hi"] - 1) * 100 - x])
            ax.errorbar(x, y, xerr=err, fmt="o", ms=4, capsize=2, label=env)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(variants)), variants)
        ax.set(title=gpu, xlabel="sawtooth vs linear TFLOP/s (%), median of paired rounds, "
                                 "95% interval")
    axes[0][0].set_ylabel("kernel settings (S16k: K/V in the L2, the control)")
    axes[0][-1].legend(fontsize=9)
    fig.suptitle(f"Less latency hiding, {', '.join(gpus)}: B8 H1 S128k D64 bf16 non-causal, "
                 f"48 persistent CTAs, {ROUNDS} rounds", fontsize=11)
    fig.tight_layout()
    return fig


def net_against_default(study) -> pd.DataFrame:
    """Per GPU, alone: sawtooth with the kv_latency=10 hint against linear with the default
    settings, paired by round (both ran in every round), as `paired` reports it."""
    return paired_alone(study, "64x64 kv_latency=10|sawtooth", "64x64 (paper)|linear",
                        net="hint's sawtooth vs default linear")


def _latency_ns(gpu: str) -> float:
    from wavefront.model.presets import gpu_preset
    return gpu_preset(gpu.lower()).dram_latency_ns


CAPTION = ("Sawtooth's TFLOP/s against linear's (%; median of 6 paired rounds, 95% interval) per "
           "kernel setting at the paper's launch (B8 H1 S128k D64 bf16 non-causal, 48 persistent "
           "CTAs) on the H100 and H200: alone, beside a store-only append co-runner, with L2 "
           "held; S16k: the K/V-in-L2 control (H200).")


def section(study) -> Section:
    s = Section()
    t = table(study)
    m = multiplicity(t)
    # one row per setting; per GPU and environment: sawtooth against linear [95%]
    # (linear's times, clocks and dropped rounds: `python experiments/exposure_latency.py plot`)
    env = t["environment"].where(~t["environment"].str.startswith("held"), "L2 held")
    shown = t.assign(cell=[interval_text(r) for _, r in t.iterrows()],
                     col=t["GPU"] + " " + env).pivot_table(
        index="variant", columns="col", values="cell", aggfunc="first").fillna("").reset_index()
    held = (t[t["environment"].str.startswith("held")].drop_duplicates("GPU")
            .set_index("GPU")["environment"].str.removeprefix("held "))
    hint = t[(t["variant"] == "64x64 kv_latency=10") & (t["environment"] == "alone")]
    control = t[t["variant"] == "S16k 64x64 kv_latency=10"]
    control_paper = t[t["variant"] == "S16k 64x64 (paper)"].set_index("GPU")["linear ms"]
    s.claim("With the kv_latency=10 hint, alone, at the paper's non-causal launch, sawtooth runs "
            + ", ".join(f"{r['GPU']} {interval_text(r)}" for _, r in hint.iterrows())
            + f" against linear; with K/V in the L2 (S={CONTROL_SEQLEN // 1024}k at "
              f"{CONTROL_BATCH // 8}x the batch, same FLOPs; measured on "
            + ", ".join(control["GPU"]) + " only) the same settings differ by "
            + ", ".join(f"{r['GPU']} {interval_text(r)}" for _, r in control.iterrows())
            + ". The control agrees with a gain that needs the misses (one interval, on one "
              "GPU; the S=16k launch has other work items too, so it controls the misses, not "
              "every other difference)",
            len(hint) >= 2 and len(pays(hint)) == len(hint) and len(control) >= 1
            and bool((control["sawtooth vs linear"] - 1).abs().max() < 0.01),
            {"hint": hint.to_dict("records"), "control": control.to_dict("records")})
    net = net_against_default(study)
    slowed = hint.set_index("GPU")["linear vs paper's settings alone"]
    at_16k = {g: r["linear ms"] / control_paper.get(g, np.nan) - 1
              for g, r in control.set_index("GPU").iterrows()}
    s.claim("The non-causal gain is against a linear the hint slowed: linear runs "
            + ", ".join(f"{g} {x:+.1%}" for g, x in slowed.items())
            + " longer with the hint than with the default settings (medians of rounds). "
              "Against the default settings' linear, paired by round, sawtooth with the hint "
              "runs " + ", ".join(f"{r['GPU']} {interval_text(r)}" for _, r in net.iterrows())
            + " (hypothesis: the hint exposes the misses and sawtooth takes back what they "
              "cost; with K/V in the L2, where there are no misses to expose, the hint changes "
              "linear's time by "
            + ", ".join(f"{g} {x:+.1%}" for g, x in at_16k.items())
            + ": the hint's binary is not slower where K/V stays in the L2)",
            len(net) == len(hint) and bool((slowed > 0.05).all())
            and bool((net["sawtooth vs linear"] < hint.set_index("GPU").loc[
                net["GPU"], "sawtooth vs linear"].to_numpy() - 0.1).all())
            and len(at_16k) >= 1 and all(x < 0 for x in at_16k.values()),
            {"net": net.to_dict("records"), "slowed": slowed.to_dict(), "at_16k": at_16k})
    top = t.loc[t["sawtooth vs linear"].idxmax()]
    s.claim(f"With less latency hiding, {multiplicity_text(m)}; the best: "
            f"{interval_text(top)} ({top['GPU']}, {top['variant']}, {top['environment']}, "
            "non-causal)",
            m["intervals"] == len(t), m)
    p = pipeline(study)
    paid, level = pays(p), flat(p)
    covered_text = ""
    if len(paid) and len(level):
        ahead = p.groupby("variant")["K/V steps ahead (SASS)"].first()
        wide = level[level["variant"] == "128x64"]
        s.claim(f"The variable that separates the binaries is the time their loads in flight "
                f"cover, not the count of K/V steps: the kv_latency=10 hint leaves "
                f"{ahead['64x64 kv_latency=10']} K/V step(s) in flight where the paper's "
                f"settings have {ahead['64x64 (paper)']}, and 128x64 tiles also "
                f"{ahead['128x64']}; sawtooth pays only where the loads in flight cover the "
                f"least time (one binary pays, the kv_latency=10 one, on "
                f"{paid['GPU'].nunique()} GPUs): {paid['covered us'].max():.2f} us at most "
                f"where it pays, "
                f"{level['covered us'].min():.2f} us at least where it does not (128x64 covers "
                f"{span(wide['covered us'], '.2f')} us with its one step)",
                paid["covered us"].max() < level["covered us"].min()
                and ahead["64x64 kv_latency=10"] < ahead["64x64 (paper)"]
                and ahead["128x64"] == ahead["64x64 kv_latency=10"] and len(wide) >= 2
                and set(paid["variant"]) == {"64x64 kv_latency=10"},
                p.to_dict("records"))
        bracket = {}
        for gpu, g in p.groupby("GPU"):
            paying, still = pays(g), flat(g)
            if len(paying) and len(still):
                bracket[gpu] = (paying["covered us"].max() * 1e3 / _latency_ns(gpu),
                                still["covered us"].min() * 1e3 / _latency_ns(gpu))
        lows, highs = [b[0] for b in bracket.values()], [b[1] for b in bracket.values()]
        s.claim("Hypothesis (the model's map below takes it as its rule of covered DRAM "
                "latencies): a miss under this load stalls a step for longer than the time "
                f"covered where sawtooth pays and shorter than where it does not, "
                f"{min(lows):.1f}x to {max(highs):.1f}x the unloaded pointer-chase latency ("
                + ", ".join(f"{g} {_latency_ns(g):.0f} ns" for g in bracket)
                + ", data/microbench); two binaries per GPU bracket it, no latency was "
                  "measured under load",
                len(bracket) >= 2 and all(1 < lo < hi for lo, hi in bracket.values()),
                {"bracket (covered / latency)": bracket})
        covered_text = " ".join(c.text + "." for c in s.claims[3:])
    depth_table = p.assign(cell=[f"{a:.2f} / {b:.2f}" for a, b in zip(p["step us"],
                                                                     p["covered us"])]).pivot_table(
        index=["variant", "K/V steps ahead (SASS)"], columns="GPU", values="cell",
        aggfunc="first").add_suffix(" step / covered us").reset_index()
    s.text = f"""## Less latency hiding

The settings that decide how far the K/V loads run ahead of their use, at the paper's launch
(B8 H1 S128k D64, non-causal; `experiments/exposure_latency.py`): the `kv_latency` hint, one
worker warpgroup instead of two, the occupancy hint, 128x64 tiles; each alone, beside an append
co-runner on the spare SMs and with the most L2 a context may hold taken away ("L2 held":
{", ".join(f"{mib} on the {g}" for g, mib in held.items())}). Each cell: sawtooth against
linear paired by round [95%]. The "S16k" rows are the control: the same settings with a head's
K/V ({control_head_mib():.0f} MiB) in the L2.

{md_table(shown)}

What each binary keeps in flight (its producer's K and V rings read from its SASS,
`data/exposure_latency/pipeline.json`), the time one K/V step takes alone (the faster scan's
time over the 64-key steps each CTA runs), and the time the loads in flight cover:

{md_table(depth_table)}

{covered_text}

{s.claims[2].text}. {s.claims[0].text}. The hint is a compile-time load-latency estimate that
cuTile passes to the compiler; with 10 this binary keeps fewer K/V loads in flight (read from
its SASS above). {s.claims[1].text}. That sawtooth's fewer misses are what buys the time back
is a hypothesis the control and the warp states (`warp_states`: on the H200 the long-scoreboard
stalls fall with the misses under this hint) support, not a measured cause.

![exposure_latency](figures/exposure_latency.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
