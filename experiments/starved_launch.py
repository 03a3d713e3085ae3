"""Does sawtooth buy speed once DRAM bandwidth is starved towards GB10's level?

The paper's launch (B=8 H=1 S=128k D=64, 64x64 tiles, 48 persistent CTAs, one per SM) with a
streaming kernel on the other SMs taking DRAM bandwidth for the whole measurement
(`wavefront.measure.starvation`: one stream CTA per SM, evict-first loads of a 4 GB buffer,
0 to all of the spare SMs). Sawtooth against linear, timed back to back in each round in a
random order, paired by round. The stream's own bandwidth is measured in each round; what it
leaves is the all-SM stream bandwidth less that. GB10 has 273 GB/s for all its 48 SMs.

Not checked: the L2 counters of the attention while the stream runs (Nsight Compute replays
one kernel at a time, so it cannot profile the two together); the loads are evict-first by
construction, not by measurement.

    python experiments/starved_launch.py run            # on a GPU: data/starved_launch/
    python experiments/starved_launch.py plot --out DIR # anywhere: figure and table
"""
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wavefront.cli import JsonlSink, experiment_cli
from wavefront.report.figures import short_gpu
from wavefront.results.measurement import paired_ratio

DATASETS = ()  # its own rounds (data/starved_launch/rounds.jsonl), not a results table
ATTENTION_CTAS = 48
ROUNDS = 6


def measure(out_dir) -> int:
    """The rounds on this GPU, appended to <out_dir>/rounds.jsonl. -> failures (0)."""
    from wavefront.device import current_device
    from wavefront.measure.starvation import starved_rounds, stream_alone_gbps
    from wavefront.point import Point
    dev = current_device()
    spare = dev.sms - ATTENTION_CTAS
    points = {f"{kv}{' causal' if causal else ''}": Point(
        batch=8, heads=1, seqlen=131072, head_dim=64, causal=causal, tiles="64x64",
        occupancy=1, ctas=ATTENTION_CTAS, schedule=f"persistent+{kv}")
        for causal in (False, True) for kv in ("linear", "sawtooth")}
    levels = sorted({0, spare // 3, 2 * spare // 3, spare})
    with JsonlSink(out_dir, "rounds.jsonl") as sink:
        for ctas in (*levels, dev.sms):  # what the stream takes with nothing else running
            sink.write({"gpu": dev.name, "kind": "stream alone", "stream_ctas": ctas,
                        "stream_gbps": stream_alone_gbps(ctas)})
        for record in starved_rounds(points, levels, rounds=ROUNDS,
                                     progress=lambda c, r: print(f"stream CTAs {c} round {r}",
                                                                 flush=True)):
            sink.write({"kind": "round", **record})
    return 0


def rounds(study) -> pd.DataFrame:
    path = study.data_dir / "starved_launch" / "rounds.jsonl"
    if not path.exists():
        raise ValueError(f"{path}: no rounds")
    return pd.DataFrame([json.loads(line) for line in path.read_text().splitlines()])


def table(study) -> pd.DataFrame:
    """Per GPU, mask and stream: the bandwidth the stream took and left, linear's time, and
    sawtooth against linear paired by round (> 1: sawtooth faster) with its 95% interval."""
    d = rounds(study)
    alone = d[d["kind"] == "stream alone"]
    r = d[d["kind"] == "round"]
    out = []
    for gpu, g in r.groupby("gpu"):
        sms = int(g["sms"].iloc[0])
        peak = float(alone[(alone["gpu"] == gpu) & (alone["stream_ctas"] == sms)]["stream_gbps"]
                     .max())
        for ctas, sub in g.groupby("stream_ctas"):
            for mask in ("", " causal"):
                lin = sub[sub["point"] == "linear" + mask].sort_values("round")
                saw = sub[sub["point"] == "sawtooth" + mask].sort_values("round")
                ratio, lo, hi = paired_ratio(lin["ms"].to_list(), saw["ms"].to_list())
                taken = float(lin["stream_gbps"].median())
                out.append({"GPU": short_gpu(gpu), "causal": bool(mask), "stream CTAs": ctas,
                            "stream GB/s": taken, "left GB/s": peak - taken,
                            "linear ms": float(lin["ms"].median()),
                            "sawtooth vs linear": ratio, "lo": lo, "hi": hi,
                            "rounds": len(lin), "overran": int(sub["overran"].sum()),
                            "SM MHz": float(sub["sm_clock_mhz"].median())})
    return pd.DataFrame(out)


def figure(study):
    t = table(study)
    gpus = ", ".join(sorted(set(t["GPU"])))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for (gpu, causal), sub in t.groupby(["GPU", "causal"]):
        label = f"{gpu} {'causal' if causal else 'non-causal'}"
        axes[0].plot(sub["left GB/s"], sub["linear ms"], "o-", label=label)
        y = (sub["sawtooth vs linear"] - 1) * 100
        err = np.vstack([y - (sub["lo"] - 1) * 100, (sub["hi"] - 1) * 100 - y])
        axes[1].errorbar(sub["left GB/s"], y, yerr=err, fmt="o-", capsize=3, label=label)
    for ax in axes:
        ax.set_xlabel("DRAM bandwidth the stream leaves (GB/s; all-SM stream less its take)")
        ax.axvline(273, color="grey", ls=":", lw=1)
    axes[0].set_ylabel("linear, ms per launch")
    axes[1].set_ylabel("sawtooth vs linear, TFLOP/s (%)")
    axes[1].axhline(0, color="k", lw=0.8)
    axes[0].legend(fontsize=8)
    axes[1].set_title("paired by round, 95% CI; dotted: GB10's 273 GB/s", fontsize=9)
    fig.suptitle(f"The paper's launch starved of DRAM bandwidth on {gpus}: B8 H1 S128k D64 bf16, "
                 "64x64, 48 persistent CTAs, a stream kernel on the other SMs")
    fig.tight_layout()
    return fig


cli = experiment_cli(__file__)

if __name__ == "__main__":
    cli()
