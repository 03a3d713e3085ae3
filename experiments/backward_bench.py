"""How fast is the backward pass against cuDNN's and FlashAttention-2's, and what DRAM bytes does each backward schedule read, predicted and measured?

`scripts/backward_bench.py` times `wavefront.attention_backward` (the default schedule,
persistent+linear; `wavefront`: dQ accumulated across CTAs with float32 atomics,
`wavefront_det`: the deterministic mode, a Q-major dQ kernel beside the K/V-major one) against
torch SDPA's backward under its cuDNN and FlashAttention-2 backends, as each is called, in
interleaved rounds (every round times every contender in a new random order; medians with
distribution-free 95% intervals; ratios paired by round), on the forward's bench shapes at D64
and D128, causal and not, bf16. FLOPs are FlashAttention's count (2.5x the forward's, halved by
the causal mask). Gradients are checked against cuDNN's first. Beside the timing: what each
K/V-major binary compiled to (registers, spills; ahead of time, no GPU); the lock-step L2
model's DRAM reads per backward schedule beside the DRAM bytes ncu measured and the call's time
per schedule; and the named configs (`--variants`) that cut the kernels otherwise.

    python experiments/backward_bench.py run      # GPU: the bench into data/backward_bench/
    python experiments/backward_bench.py plot --out DIR
"""
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from wavefront.report.draft import Section, md_table, span
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu
from wavefront.results.measurement import median_ci95, paired_ratio
from wavefront.results.records import BACKWARD_BENCH_RECORDS, BACKWARD_SASS_RECORDS
from wavefront.results.store import read_results_bytes

DATASETS = ()
RECORDS = ("backward_bench",)
# the run the paper reads; `measure` writes a new run beside it, bench_<commit>.jsonl, which the
# paper reads once RUN names it. RUN: today's kernel (fc184ee, H200, 8 rounds), timed as the
# public call runs by default at that commit (RUN_CONFIG, persistent+linear); FIRST_CUT: the
# backward's first cut (8b003aa, one warpgroup per kernel, H200, 10 rounds), kept as history
RUN = "bench_fc184ee.jsonl"
RUN_CONFIG = "atomic_coalesced"
FIRST_CUT = "bench.jsonl"
SASS = "sass.jsonl"
ROUNDS = 10
SHAPES = ("B1 H32 S8k", "B4 H32 KV8 S4k", "B2 H8 S32k")  # scripts/backward_bench.py's
CONTENDERS = ("wavefront", "wavefront_det", "fa2", "cudnn")
LABELS = {"wavefront": "wavefront (atomic dQ)", "wavefront_det": "wavefront (deterministic)",
          "fa2": "FlashAttention-2 (SDPA)", "cudnn": "cuDNN (SDPA)"}
PREDICTED_SCHEDULE_DIM = 128  # the head dim whose schedules the model's table shows


def _script() -> Path:
    return Path(__file__).resolve().parent.parent / "scripts" / "backward_bench.py"


def compile_facts(out_path) -> int:
    """What each K/V-major binary of the first cut's tiles (one warpgroup: what the committed
    bench run timed) compiles to for sm_90 (no GPU needed: tileiras ahead of time), one line
    per binary into `out_path`. -> failures."""
    from wavefront.backward_schedules import FIRST_CUT_BACKWARD_TILES
    from wavefront.device import tileiras_version
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.backward import BackwardKvVariant
    from wavefront.kernel.cubin import kernel_resources
    from wavefront.kernel.sass import sass_summary
    failed = 0
    with open(out_path, "a") as f:
        for head_dim, tiles in sorted(FIRST_CUT_BACKWARD_TILES.items()):
            for causal in (False, True):
                for atomic in (True, False):
                    variant = BackwardKvVariant("bfloat16", head_dim, *tiles, causal, atomic)
                    try:
                        cubin = compile_variant(variant, "sm_90")
                    except Exception as exc:  # recorded; the other binaries go on
                        failed += 1
                        print(f"{variant.label}: {type(exc).__name__}: {exc}", flush=True)
                        continue
                    (kernel,) = kernel_resources(cubin)
                    row = BACKWARD_SASS_RECORDS.stamp({
                        "label": variant.label, "head_dim": head_dim,
                        "tiles": f"{tiles[0]}x{tiles[1]}", "causal": causal,
                        "atomic_dq": atomic, "registers": kernel.registers,
                        "shared_bytes": kernel.shared_bytes, "tileiras": tileiras_version(),
                        **sass_summary(cubin).as_dict()})
                    f.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)
    return failed


def measure(out_dir) -> int:
    """The bench (by process, as a user runs it) into <out_dir>/bench_<commit>.jsonl, and the
    binaries' compile facts into <out_dir>/sass_<commit>.jsonl. -> failures."""
    from wavefront.results.store import git_commit
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    commit = (os.environ.get("WAVEFRONT_GIT_COMMIT") or git_commit() or "unknown")[:7]
    cmd = [sys.executable, str(_script()), "--rounds", str(ROUNDS), "--json",
           str(out_dir / f"bench_{commit}.jsonl")]
    print(" ".join(cmd[1:]), flush=True)
    failed = subprocess.run(cmd).returncode != 0
    return failed + compile_facts(out_dir / f"sass_{commit}.jsonl")


def _records(study, run: str = RUN) -> list[dict]:
    (records,) = study.records(BACKWARD_BENCH_RECORDS, "backward_bench", run).values()
    return records


def _config(r) -> str:
    return f"{r['shape']} D{r['head_dim']} {'causal' if r['causal'] else 'full'}"


def load(study, run: str = RUN) -> pd.DataFrame:
    """One row per configuration, contender and round: its time, TFLOP/s, and cuDNN's time
    over its own in that round (> 1: faster than cuDNN)."""
    records = _records(study, run)
    cudnn = {_config(r): r["samples_ms"] for r in records if r["name"] == "cudnn"}
    rows = []
    for r in records:
        flops_per_ms = r["tflops"] * r["median_ms"]  # TFLOP/s x ms: the launch's FLOPs / 1e9
        for i, ms in enumerate(r["samples_ms"]):
            rows.append({"GPU": short_gpu(r["gpu"]), "shape": r["shape"],
                         "D": r["head_dim"], "mask": "causal" if r["causal"] else "full",
                         "config": _config(r), "contender": r["name"], "round": i, "ms": ms,
                         "tflops": flops_per_ms / ms,
                         "x_cudnn": cudnn[_config(r)][i] / ms})
    return pd.DataFrame(rows)


def ratios(study, run: str = RUN) -> pd.DataFrame:
    """Per configuration and contender: median ms and TFLOP/s with their 95% intervals, speed
    over cuDNN and over FA2 (paired by round: median, 95% interval), the rounds, the throttled
    rounds, cuDNN's slowest round over its median, and the gradients' relative errors against
    cuDNN."""
    records = _records(study, run)
    by = {(_config(r), r["name"]): r for r in records}
    rows = []
    for r in records:
        row = {"GPU": short_gpu(r["gpu"]), "shape": r["shape"], "D": r["head_dim"],
               "mask": "causal" if r["causal"] else "full", "config": _config(r),
               "contender": r["name"], "ms": r["median_ms"], "ms lo": r["ci95_ms"][0],
               "ms hi": r["ci95_ms"][1], "TFLOP/s": r["tflops"],
               "rounds": len(r["samples_ms"]), "throttled": r["throttled_rounds"],
               "slowest / median": max(r["samples_ms"]) / r["median_ms"],
               "grad error": max(r.get("grad_errors", {}).values(), default=float("nan"))}
        for peer in ("cudnn", "fa2", "wavefront"):
            ref = by.get((_config(r), peer))
            if ref is not None and peer != r["name"]:
                row[f"x {peer}"], row[f"x {peer} lo"], row[f"x {peer} hi"] = paired_ratio(
                    ref["samples_ms"], r["samples_ms"])
        rows.append(row)
    return pd.DataFrame(rows)


def table(study) -> pd.DataFrame:
    """One row per configuration: cuDNN's TFLOP/s, and each other contender's speed over
    cuDNN's (paired by round, 95% interval)."""
    t = ratios(study)
    out = []
    for config, g in t.groupby("config", sort=False):
        g = g.set_index("contender")
        row = {"configuration": config,
               "cuDNN TFLOP/s": f"{g.loc['cudnn', 'TFLOP/s']:.0f}"}
        for name in ("fa2", "wavefront_det", "wavefront"):
            r = g.loc[name]
            row[f"{LABELS[name]} / cuDNN"] = (f"{r['x cudnn']:.2f} [{r['x cudnn lo']:.2f}, "
                                              f"{r['x cudnn hi']:.2f}]")
        out.append(row)
    return pd.DataFrame(out)


def sass_facts(study) -> pd.DataFrame:
    (rows,) = study.records(BACKWARD_SASS_RECORDS, "backward_bench", SASS).values()
    return pd.DataFrame(rows)


# The named configs' runs (`scripts/backward_bench.py --variants`), each cut by its device
# call's limit before its JSON was written: their console logs are the record (the manifest says
# so), one line per contender and configuration, parsed here.
VARIANT_RUNS = ("variants_d41682d", "variants_c30b860")
LATEST_VARIANTS = "variants_c30b860"
# the atomic mode's coalesced dQ accumulate (config atomic_coalesced) beside the default's cut,
# and the adds alone (`scripts/backward_bench.py --red-probe`), one device call
COALESCED_VARIANTS = "variants_f9eaca9"
RED_PROBE = "red_probe.jsonl.gz"
_CONFIG_LINE = re.compile(r"^(B\d+ H\d+(?: KV\d+)? S\d+k) D(\d+) (full|causal)$")
_CONTENDER_LINE = re.compile(
    r"^  (\S+)\s+([\d.]+) ms \[([\d.]+), ([\d.]+)\]\s+([\d.]+) TFLOP/s"
    r"(?:  x cuDNN ([\d.]+) \[([\d.]+), ([\d.]+)\])?(?:  x FA2 ([\d.]+))?")


def variant_rows(study, runs=VARIANT_RUNS) -> pd.DataFrame:
    """One row per variant run, configuration and contender: median ms [95%], TFLOP/s, speed
    over cuDNN (paired by round, median [95%]) and over FA2 (median), as the run printed them."""
    rows = []
    for run in runs:
        text = read_results_bytes(study.data_dir / "backward_bench" / f"{run}.log.gz",
                                  "a backward variant run").decode()
        config = None
        for line in text.splitlines():
            if m := _CONFIG_LINE.match(line):
                config = (m[1], int(m[2]), m[3])
            elif (m := _CONTENDER_LINE.match(line)) and config is not None:
                rows.append({"run": run, "shape": config[0], "D": config[1], "mask": config[2],
                             "contender": m[1], "ms": float(m[2]), "ms lo": float(m[3]),
                             "ms hi": float(m[4]), "TFLOP/s": float(m[5]),
                             "x cudnn": float(m[6]) if m[6] else np.nan,
                             "x cudnn lo": float(m[7]) if m[7] else np.nan,
                             "x cudnn hi": float(m[8]) if m[8] else np.nan,
                             "x fa2": float(m[9]) if m[9] else np.nan})
    return pd.DataFrame(rows)


def measured_schedules(study) -> pd.DataFrame:
    """Per bench shape, mask and backward schedule at D=128 (the first cut's K/V-major kernel):
    DRAM reads under ncu (one cold launch), the model's prediction and each-byte-once count on
    the measured GPU, and the whole call's time in interleaved rounds with its speed over
    persistent+linear's (paired by round)."""
    # (ncu's per-launch rows: schedule, DRAM bytes, duration; not timing records)
    dram = [json.loads(line) for line in read_results_bytes(
        study.data_dir / "backward_bench" / "dram.jsonl.gz", "the backward's DRAM bytes")
        .decode().splitlines() if line.strip()]
    (timed,) = study.records(BACKWARD_BENCH_RECORDS, "backward_bench",
                             "schedules.jsonl").values()
    (entry,) = [e for e in study.manifest("backward_bench").values()
                if "dram.jsonl" in e.get("files", ())]
    sms, l2 = int(entry["gpu"]["sms"]), int(entry["gpu"]["l2_bytes"])
    times = {(r["shape"], r["causal"], r["name"].removeprefix("wavefront ")): r for r in timed
             if r["name"].startswith("wavefront ")}
    rows = []
    for r in dram:
        predicted, once = _predicted(r["shape"], r["head_dim"], r["causal"], r["schedule"],
                                     sms, l2)
        t = times[(r["shape"], r["causal"], r["schedule"])]
        base = times[(r["shape"], r["causal"], "persistent+linear")]
        ratio = paired_ratio(base["samples_ms"], t["samples_ms"])
        rows.append({"shape": r["shape"], "mask": "causal" if r["causal"] else "full",
                     "schedule": r["schedule"], "GPU": short_gpu(entry["gpu"]["name"]),
                     "measured DRAM GB": r["dram_read_bytes"] / 1e9,
                     "predicted DRAM GB": predicted / 1e9, "each byte once GB": once / 1e9,
                     "call ms": t["median_ms"], "x persistent+linear": ratio[0],
                     "x persistent+linear lo": ratio[1], "x persistent+linear hi": ratio[2]})
    return pd.DataFrame(rows)


@functools.lru_cache(maxsize=None)
def _predicted(shape: str, head_dim: int, causal: bool, schedule: str, sms: int,
               l2_bytes: int) -> tuple[float, float]:
    """The lock-step L2 model's DRAM reads of the atomic K/V-major kernel, and its each-byte-
    once count (an L2 that holds everything)."""
    from wavefront.backward_schedules import FIRST_CUT_BACKWARD_TILES, BackwardLaunch
    from wavefront.model.backward_simulation import predict_backward_l2
    from wavefront.schedules import AttentionProblem
    shapes = {"B1 H32 S8k": (1, 32, 32, 8192), "B4 H32 KV8 S4k": (4, 32, 8, 4096),
              "B2 H8 S32k": (2, 8, 8, 32768)}
    batch, heads, kv_heads, seqlen = shapes[shape]
    problem = AttentionProblem(batch, heads, kv_heads, seqlen, seqlen, head_dim, causal,
                               *FIRST_CUT_BACKWARD_TILES[head_dim])
    launch = BackwardLaunch.of(problem, schedule, sms, 1, l2_bytes)
    got = predict_backward_l2(launch)
    every_byte_once = predict_backward_l2(launch, capacity_bytes=1e15)
    return got.dram_read_sectors * 32.0, every_byte_once.dram_read_sectors * 32.0


def predictions(study) -> pd.DataFrame:
    """The model's DRAM reads per backward schedule (CTA order x Q scan) at D=128, on the
    measured GPU's SMs and L2 (its manifest), for each bench shape and mask: predictions, with
    no measured DRAM bytes to hold them against yet."""
    from wavefront.backward_schedules import BACKWARD_CTA_SCHEDULES, BACKWARD_SCANS
    (entry,) = [e for e in study.manifest("backward_bench").values()
                if FIRST_CUT in e.get("files", ())]
    sms, l2 = int(entry["gpu"]["sms"]), int(entry["gpu"]["l2_bytes"])
    rows = []
    for shape in SHAPES:
        for causal in (False, True):
            for cta in BACKWARD_CTA_SCHEDULES:
                for scan in BACKWARD_SCANS:
                    dram, once = _predicted(shape, PREDICTED_SCHEDULE_DIM, causal,
                                            f"{cta}+{scan}", sms, l2)
                    rows.append({"shape": shape, "mask": "causal" if causal else "full",
                                 "schedule": f"{cta}+{scan}", "sms": sms, "l2_bytes": l2,
                                 "predicted DRAM GB": dram / 1e9,
                                 "predicted / each byte once": dram / once})
    return pd.DataFrame(rows)


RUN_COMMIT = RUN.removeprefix("bench_").split(".")[0]  # the kernel's commit, as `measure` names it
CAPTION = (f"The backward pass on an H200 (one GPU of a host whose other GPUs ran other work "
           f"at the same time, as the run's manifest says), kernel at commit {RUN_COMMIT}, "
           f"both dQ modes at the public call's default config ({RUN_CONFIG}) and schedule "
           "(persistent+linear); bf16, the forward's bench shapes, D64 and D128, full and causal: "
           "each contender's speed over "
           "cuDNN's backward (cuDNN's time over its own, paired by round; 1 = cuDNN, dashed); "
           "bars are medians over rounds, whiskers their distribution-free 95% intervals.")


def _run_entry(study, run: str) -> dict:
    (entry,) = [e for e in study.manifest("backward_bench").values()
                if run in e.get("files", ())]
    return entry


def figure(study):
    d = load(study)
    d = d[d["contender"] != "cudnn"].copy()
    d["contender"] = d["contender"].map(LABELS)
    d["shape, mask"] = d["shape"].str.replace(" S", "\nS") + "\n" + d["mask"]
    order = [f"{s.replace(' S', chr(10) + 'S')}\n{m}" for s in SHAPES for m in ("full", "causal")]
    hue = [LABELS[n] for n in ("fa2", "wavefront_det", "wavefront")]
    dims = sorted(d["D"].unique())
    fig, axes = plt.subplots(1, len(dims), figsize=(6.2 * len(dims), 4.4), sharey=True,
                             squeeze=False)
    for ax, dim in zip(axes[0], dims):
        sns.barplot(data=d[d["D"] == dim], x="shape, mask", y="x_cudnn", hue="contender",
                    order=order, hue_order=hue, estimator="median",
                    errorbar=lambda x: median_ci95(list(x)), palette="deep", ax=ax)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set(xlabel=f"D={dim}: shape and mask",
               ylabel="speed over cuDNN's backward (x, paired by round)")
        ax.tick_params(axis="x", labelsize=9)
        ax.set_ylim(0, 1.2)
        handles, labels = ax.get_legend_handles_labels()
        ax.get_legend().remove()
    rounds = int(d.groupby(["config", "contender"])["round"].nunique().min())
    commit = _run_entry(study, RUN)["git_commit"][:7]
    fig.suptitle(f"Backward pass on the {', '.join(sorted(d['GPU'].unique()))}, kernel "
                 f"{commit} at its default config ({RUN_CONFIG}, persistent+linear), bf16:\n"
                 f"speed over cuDNN (torch SDPA), medians and 95% intervals over {rounds} "
                 "interleaved rounds", fontsize=11)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def section(study) -> Section:
    from wavefront.backward_schedules import (BACKWARD_CONFIGS, DEFAULT_BACKWARD_CONFIG,
                                              DEFAULT_BACKWARD_SCHEDULE)
    s = Section()
    t = ratios(study)
    gpu = ", ".join(sorted(t["GPU"].unique()))
    configs = t["config"].nunique()
    commit = _run_entry(study, RUN)["git_commit"][:7]
    rounds = int(t["rounds"].min())
    # the named config each head dim's default is (measured_pick is a pick of others)
    default = BACKWARD_CONFIGS[DEFAULT_BACKWARD_CONFIG]
    # (the atomic mode's accumulate aside: the named cuts add row-major)
    same_as = {d: next(n for n in ("two_warpgroups", "sass_pick", "first_cut")
                       if BACKWARD_CONFIGS[n][d]
                       == dataclasses.replace(default[d], dq_coalesced=False))
               for d in default}
    cut = ", ".join(f"D{d} as {n}" for d, n in sorted(same_as.items()))

    def of(name, frame=t):
        return frame[frame["contender"] == name]

    atomic, det, fa2, cudnn = of("wavefront"), of("wavefront_det"), of("fa2"), of("cudnn")
    ours = pd.concat([atomic, det])
    # where an interval reaches 1, say why: cuDNN's own rounds spread (an outlier round of the
    # reference widens the paired interval, not a faster wavefront round)
    reaching = det[det["x cudnn hi"] >= 1]
    noisy = cudnn.set_index("config").loc[reaching["config"]]
    cudnn_rounds = {_config(r): r["samples_ms"] for r in _records(study)
                    if r["name"] == "cudnn"}
    exceptions = []
    for config, hi in zip(reaching["config"], reaching["x cudnn hi"]):
        samples = np.asarray(cudnn_rounds[config])
        slow = samples[samples > 1.3 * np.median(samples)] / np.median(samples)
        exceptions.append(f"{config}'s reaches {hi:.2f}, where {len(slow)} of cuDNN's "
                          f"{len(samples)} rounds ran "
                          + (f"{span(slow, '.1f')}x its median, none throttled" if len(slow)
                             else "over 1.3x its median"))
    by_dim = det.groupby("D")["x cudnn"]
    s.claim(f"On the {gpu} at commit {commit}, the public call's default, the deterministic "
            f"mode (`wavefront_det`, config {RUN_CONFIG}, {DEFAULT_BACKWARD_SCHEDULE}), runs "
            f"at {_spread(det, 'cudnn')} cuDNN's speed across all {configs} configurations "
            f"({', '.join(f'D{d}: {g.min():.2f}-{g.max():.2f}x' for d, g in by_dim)}); every "
            f"median and every 95% interval below 1"
            + (f" but {'one interval' if len(reaching) == 1 else f'{len(reaching)} intervals'}"
               f" ({'; '.join(exceptions)})" if exceptions else "")
            + f"; the atomic mode (`deterministic=False`) runs at {_spread(atomic, 'cudnn')}",
            configs == 12 and len(ours) == 2 * configs
            and DEFAULT_BACKWARD_CONFIG == RUN_CONFIG and commit == RUN_COMMIT
            and bool((ours["x cudnn"] < 1).all()) and bool((atomic["x cudnn hi"] < 1).all())
            and bool((noisy["slowest / median"] > 1.3).all())
            and bool((noisy["throttled"] == 0).all()) and rounds >= 8
            and int(t["rounds"].max()) == rounds,
            ours[["config", "contender", "x cudnn", "x cudnn lo", "x cudnn hi"]].round(4)
            .to_dict("records"))
    s.claim(f"FlashAttention-2's backward (SDPA) runs at {_spread(fa2, 'cudnn')} cuDNN's "
            f"speed; the deterministic mode at {_spread(det, 'fa2')} FA2's, "
            f"{_against(det, 'x fa2', 'faster than FA2', 'slower')}, and the atomic mode at "
            f"{_spread(atomic, 'fa2')}, {_against(atomic, 'x fa2', 'faster', 'slower')}",
            len(fa2) == configs and bool((det["x fa2 lo"] > 1).all())
            and bool((atomic["x fa2 lo"] > 1).all()),
            t[t["contender"] != "cudnn"][["config", "contender", "x cudnn", "x fa2",
                                          "x fa2 lo", "x fa2 hi"]].round(4)
            .to_dict("records"))
    det_over_atomic = det[["config", "x wavefront", "x wavefront lo", "x wavefront hi"]]
    atomic_faster = int((det_over_atomic["x wavefront hi"] < 1).sum())
    det_faster = int((det_over_atomic["x wavefront lo"] > 1).sum())
    s.claim(f"The atomic mode, which adds each visit's dQ into a float32 accumulator (its "
            f"coalesced layout, below) in place of running a second (Q-major) kernel, is the "
            f"faster mode at {atomic_faster} of {configs} configurations (paired 95% interval "
            f"below 1), the deterministic one at {det_faster}, level at "
            f"{configs - atomic_faster - det_faster}; the deterministic mode runs "
            f"{det_over_atomic['x wavefront'].min():.2f}-"
            f"{det_over_atomic['x wavefront'].max():.2f}x the atomic mode's speed (medians)",
            len(det_over_atomic) == configs and atomic_faster > configs // 2,
            det_over_atomic.round(4).to_dict("records"))
    errors = ours.groupby("contender")["grad error"].max()
    s.claim(f"Gradients agree with cuDNN's to bf16 precision: the largest relative norm error "
            f"of dQ, dK or dV is {errors['wavefront']:.1e} (atomic) and "
            f"{errors['wavefront_det']:.1e} (deterministic) over the {configs} configurations",
            bool((errors < 1e-2).all()), errors.round(6).to_dict())
    throttled = t[t["throttled"] > 0]
    alike = t.groupby("config")["throttled"].nunique().max() == 1
    s.claim(f"{throttled['config'].nunique()} of the {configs} configurations had throttled "
            f"rounds ({', '.join(throttled['config'].unique())}; at most "
            f"{int(t['throttled'].max())} of {rounds} per contender, the same count for every "
            "contender of a configuration: kept, the ratios are paired by round)",
            bool(alike), throttled[["config", "contender", "throttled"]]
            .to_dict("records"))
    first = ratios(study, FIRST_CUT)
    first_det, first_atomic = of("wavefront_det", first), of("wavefront", first)
    gain = (det.set_index("config")["x cudnn"] / first_det.set_index("config")["x cudnn"])
    first_entry = _run_entry(study, FIRST_CUT)
    hours = (pd.Timestamp(_run_entry(study, RUN)["date"])
             - pd.Timestamp(first_entry["date"])).total_seconds() / 3600
    s.claim(f"The backward's first cut (commit {first_entry['git_commit'][:7]}, one warpgroup "
            f"per kernel; {int(first['rounds'].min())} rounds on an "
            f"{short_gpu(first_entry['gpu']['name'])} {hours:.0f} hours earlier) ran the "
            f"deterministic mode at {span(first_det['x cudnn'], '.2f')}x cuDNN's speed and the "
            f"atomic mode at {span(first_atomic['x cudnn'], '.2f')}x, slower than FA2 in every "
            f"configuration; today's deterministic mode's speed over cuDNN is "
            f"{gain.min():.2f}-{gain.max():.2f}x the first cut's in each configuration (each "
            "run's ratio paired by round within the run; across the runs, medians only)",
            len(gain.dropna()) == configs and bool((gain > 1).all()) and hours > 0
            and bool((first_det["x cudnn hi"] < 1).all())
            and bool((pd.concat([first_det, first_atomic])["x fa2 hi"] < 1).all()),
            gain.round(4).to_dict())
    sass = sass_facts(study)
    at, dt = sass[sass["atomic_dq"]], sass[~sass["atomic_dq"]]
    spilled = at[at["local_loads"] + at["local_stores"] > 0]
    s.claim(f"The binaries differ: every atomic K/V-major binary (dQ's product in the same loop) "
            f"allocates {span_int(at['registers'])} registers per thread and issues "
            f"{span_int(at['hgmma'])} warpgroup MMA instructions, {len(spilled)} of {len(at)} "
            f"with spills ({span_int(at['local_loads'])} local loads); every deterministic one "
            f"{span_int(dt['registers'])} registers, {span_int(dt['hgmma'])} warpgroup MMAs, "
            f"{int((dt['local_loads'] + dt['local_stores']).sum())} spills (SASS for sm_90)",
            len(at) == len(dt) == 4 and bool((dt["local_loads"] == 0).all())
            and int(at["registers"].max()) < int(dt["registers"].min()),
            sass[["label", "registers", "hgmma", "local_loads", "local_stores"]]
            .to_dict("records"))
    pred = predictions(study)
    per = pred.pivot_table(index="schedule", columns=["shape", "mask"],
                           values="predicted / each byte once", sort=False)
    default = pred[pred["schedule"] == "persistent+linear"]
    fewest = pred.loc[pred.groupby(["shape", "mask"])["predicted DRAM GB"].idxmin()]
    ratio = "predicted / each byte once"
    grid_best = pred[pred["schedule"].str.startswith("grid+")].groupby(["shape", "mask"])[
        ratio].min()
    longest = pred[pred["schedule"].str.startswith("longest_first")][ratio]
    most = pred.loc[pred.groupby(["shape", "mask"])["predicted DRAM GB"].idxmax(), "schedule"]
    s.claim("The lock-step model predicts that the persistent+linear schedule reads "
            f"{default[ratio].min():.1f}-"
            f"{default[ratio].max():.1f}x the bytes an L2 holding everything would read at "
            f"D={PREDICTED_SCHEDULE_DIM}, that the grid order reads the fewest in all "
            f"{len(fewest)} configurations ({grid_best.min():.1f}-{grid_best.max():.1f}x) and "
            f"longest_first the most ({longest.min():.0f}-{longest.max():.0f}x)",
            len(pred) == len(SHAPES) * 2 * 8 and bool((pred[ratio] > 0.999).all())
            and bool(fewest["schedule"].str.startswith("grid+").all())
            and bool(most.str.startswith("longest_first").all()),
            per.round(3).to_dict())
    m = measured_schedules(study)
    orders = m.assign(order=m["schedule"].str.split("+").str[0])
    fewest_measured = m.loc[m.groupby(["shape", "mask"])["measured DRAM GB"].idxmin()]
    drifting = orders[orders["order"].isin(["persistent", "grouped"])]
    under = drifting["measured DRAM GB"] / drifting["predicted DRAM GB"]
    grid = orders[orders["order"] == "grid"]
    s.claim(f"Measured (ncu, one cold launch of the first cut's K/V-major kernel per schedule, "
            f"D={PREDICTED_SCHEDULE_DIM}), the grid order reads the fewest DRAM bytes in all "
            f"{len(fewest_measured)} shape-masks, "
            f"{(grid['measured DRAM GB'] / grid['each byte once GB']).max():.1f}x each byte "
            "once at most; the lock-step model, right for the grid order to "
            f"{(grid['predicted DRAM GB'] / grid['measured DRAM GB']).min():.2f}-"
            f"{(grid['predicted DRAM GB'] / grid['measured DRAM GB']).max():.2f}x of the "
            "measured bytes, under-predicts the persistent and grouped orders by up to "
            f"{under.max():.0f}x (the model moves its CTAs in lock step; that the kernel's CTAs "
            "drift apart is a hypothesis, as it was for the forward before its timed clock)",
            len(fewest_measured) == 4 and bool(fewest_measured["schedule"]
                                               .str.startswith("grid+").all())
            and bool(under.max() > 5),
            m[["shape", "mask", "schedule", "measured DRAM GB", "predicted DRAM GB"]]
            .round(3).to_dict("records"))
    saw = m.set_index(["shape", "mask", "schedule"]).sort_index()
    s32k = ("B2 H8 S32k", "full")
    lin, sw = saw.loc[(*s32k, "persistent+linear")], saw.loc[(*s32k, "persistent+sawtooth")]
    s.claim(f"Sawtooth over Q halves the persistent order's reads at {s32k[0]} {s32k[1]} "
            f"({lin['measured DRAM GB']:.1f} -> {sw['measured DRAM GB']:.1f} GB) and the call "
            f"runs {sw['x persistent+linear']:.3f}x [{sw['x persistent+linear lo']:.3f}, "
            f"{sw['x persistent+linear hi']:.3f}] persistent+linear's speed (paired by round): "
            "no measured change",
            bool(sw["measured DRAM GB"] < 0.6 * lin["measured DRAM GB"]
                 and sw["x persistent+linear lo"] <= 1 <= sw["x persistent+linear hi"]),
            saw.loc[s32k].round(4).reset_index().to_dict("records"))
    longest = orders[orders["order"] == "longest_first"]
    times_once = longest["measured DRAM GB"] / longest["each byte once GB"]
    s.claim(f"The longest_first order reads {times_once.min():.0f}-{times_once.max():.0f}x each "
            f"byte once and its call runs {longest['x persistent+linear'].min():.2f}-"
            f"{longest['x persistent+linear'].max():.2f}x persistent+linear's speed, every "
            "interval below 1: misses that come with lost time (a hypothesis that they cause "
            "it: the order also changes which CTA runs which K/V tile, and no control separates "
            "the two; the grid order, the fewest bytes, also runs faster than persistent+linear "
            "where it reads far fewer, at B1 H32 S8k causal, under the same caveat)",
            len(longest) == 8 and bool((longest["x persistent+linear hi"] < 1).all())
            and bool((longest["measured DRAM GB"] > 10 * longest["each byte once GB"]).all()),
            longest[["shape", "mask", "schedule", "measured DRAM GB", "x persistent+linear",
                     "x persistent+linear lo", "x persistent+linear hi"]].round(4)
            .to_dict("records"))
    shown_measured = m.assign(**{
        "measured / predicted DRAM GB": [f"{a:.2f} / {b:.2f}" for a, b in
                                         zip(m["measured DRAM GB"], m["predicted DRAM GB"])],
        "call x persistent+linear [95%]": [f"{a:.3f} [{b:.3f}, {c:.3f}]" for a, b, c in zip(
            m["x persistent+linear"], m["x persistent+linear lo"],
            m["x persistent+linear hi"])]})[["shape", "mask", "schedule",
                                             "measured / predicted DRAM GB",
                                             "call x persistent+linear [95%]"]]

    v = variant_rows(study)
    latest = v[v["run"] == LATEST_VARIANTS]
    latest = latest.assign(config=latest["shape"] + " D" + latest["D"].astype(str) + " "
                           + latest["mask"])
    picked = latest[latest["contender"] == latest["D"].map(lambda d: f"det[{same_as[d]}]")]
    measured_configs = latest["config"].nunique()
    dets = latest[latest["contender"].str.startswith("det[")]
    fastest = dets.groupby(["D", "contender"])["x cudnn"].mean().groupby("D").idxmax()
    in_sample = picked.groupby("D")["x cudnn"].agg(["min", "max"])
    today = det.set_index("config")
    shared = picked.set_index("config")["x cudnn"]
    reproduced = (today.loc[shared.index, "x cudnn"] - shared).abs()
    held = today.drop(index=shared.index)
    outside = pd.Series([max(0.0, in_sample.loc[d, "min"] - x, x - in_sample.loc[d, "max"])
                         for d, x in zip(held["D"], held["x cudnn"])], index=held.index)
    held_dims = held.groupby("D")["x cudnn"]
    s.claim(f"Today's default config ({RUN_CONFIG}: {cut}; both split the K/V-major kernel's "
            f"rows between two consumer warpgroups, FlashAttention-3's cut) is, per head dim, "
            f"the deterministic config fastest over cuDNN on the latest variant run's "
            f"{measured_configs} configurations, where it was picked (in sample: "
            + ", ".join(f"D{d} {r['min']:.2f}-{r['max']:.2f}x" for d, r in in_sample.iterrows())
            + f", every 95% interval below 1); the bench run above, a later device call, "
            f"reproduces those {len(shared)} within {reproduced.max():.3f} (median over cuDNN) "
            f"and measures the {len(held)} configurations the variant run never reached "
            f"(held out) at "
            + ", ".join(f"D{d} {g.min():.2f}-{g.max():.2f}x" for d, g in held_dims)
            + (", inside the in-sample range of their head dim" if outside.max() == 0 else
               f", at most {outside.max():.3f} outside the in-sample range of their head dim"),
            len(picked) == measured_configs and bool((picked["x cudnn hi"] < 1).all())
            and all(fastest[d] == (d, f"det[{n}]") for d, n in same_as.items())
            and all(c.kv_worker_warps == 8 for c in BACKWARD_CONFIGS[RUN_CONFIG].values())
            and len(held) == configs - measured_configs and reproduced.max() < 0.03
            and outside.max() < 0.03 and _run_entry(study, RUN)["date"]
            > _run_entry(study, f"{LATEST_VARIANTS}.log")["date"],
            {"picked": picked[["config", "contender", "x cudnn", "x cudnn lo", "x cudnn hi"]]
             .to_dict("records"), "reproduced": reproduced.round(4).to_dict(),
             "held out": held["x cudnn"].round(4).to_dict()})
    earlier = v[(v["run"] == VARIANT_RUNS[0]) & (v["contender"] == "det[two_warpgroups]")]
    earlier_configs = len(earlier)
    missing = sorted({f"{sh} D{d} {mask}" for sh in SHAPES for d in (64, 128)
                      for mask in ("full", "causal")}
                     - set(latest["shape"] + " D" + latest["D"].astype(str) + " "
                           + latest["mask"]))
    (schedule_rounds,) = {len(r["samples_ms"]) for r in study.records(
        BACKWARD_BENCH_RECORDS, "backward_bench", "schedules.jsonl")["schedules"]}
    shown_variants = latest.assign(
        configuration=latest["shape"] + " D" + latest["D"].astype(str) + " " + latest["mask"],
        speed=[f"{a:.2f} [{b:.2f}, {c:.2f}]" if a == a else "-" for a, b, c in zip(
            latest["x cudnn"], latest["x cudnn lo"], latest["x cudnn hi"])]).pivot_table(
        index="configuration", columns="contender", values="speed", aggfunc="first",
        sort=False).drop(columns=["cudnn"], errors="ignore").reset_index()

    shown_pred = per.map(lambda x: f"{x:.1f}")
    shown_pred.columns = [f"{a} {b}" for a, b in shown_pred.columns]
    shown_pred = shown_pred.reset_index()
    shown_sass = sass.assign(**{"dQ": sass["atomic_dq"].map({True: "atomic",
                                                            False: "deterministic"}),
                                "mask": sass["causal"].map({True: "causal", False: "full"}),
                                "spills (LDL/STL)": sass["local_loads"].astype(str) + "/"
                                + sass["local_stores"].astype(str)})[
        ["head_dim", "tiles", "mask", "dQ", "registers", "hgmma", "spills (LDL/STL)"]].rename(
        columns={"head_dim": "D", "hgmma": "warpgroup MMAs"})
    _coalesced_claim(s, study)
    c = [claim.text for claim in s.claims]
    s.text = f"""## The backward pass: dQ, dK, dV against cuDNN and FlashAttention-2

`wavefront.attention_backward` (FlashAttention-2's algorithm in cuTile: a K/V-major kernel per
(batch, K/V head, K/V tile) that re-reads Q, dO and the row statistics for every Q tile; dQ
either added across CTAs with float32 atomics or, in the deterministic mode, computed by a
second, Q-major kernel) against torch SDPA's backward under its cuDNN and FlashAttention-2
backends, each as called, on the {gpu} (`experiments/backward_bench.py`,
`scripts/backward_bench.py`; kernel at {commit}; one GPU of a host whose other GPUs ran other
work at the same time, as the run's manifest says; bf16; {rounds} interleaved rounds; speed
over cuDNN paired by round, median [95% interval]; wavefront as the public call runs by
default: deterministic, config {RUN_CONFIG} ({cut}: **Faster binaries** below),
{DEFAULT_BACKWARD_SCHEDULE}; the atomic mode with `deterministic=False`):

{md_table(table(study))}

{c[0]}. {c[1]}. {c[2]}. {c[3]}. {c[4]}. {c[5]}.

![backward_bench](figures/backward_bench.png)

What the first cut's K/V-major binaries compiled to, at its tiles (its run's, `{FIRST_CUT}`;
not today's configs; ahead of time for sm_90; `experiments/backward_bench.py` `compile_facts`):

{md_table(shown_sass)}

{c[6]}.

Why the first cut's atomic mode was the slower one is not measured here (the row-major adds'
cost is, below: **The atomic mode's adds, coalesced**). Hypotheses for the first cut's
binaries, none tested by a control yet: register pressure
({span_int(at['registers'])} registers per thread against the deterministic binaries'
{span_int(dt['registers'])}, with the product dQ = dS K computed in the same loop as dK and dV)
and the spills that come with it; the float32 atomic adds of every (Q tile, K/V tile) visit
queuing at the L2; the dQ conversion pass after the kernel. The profile that would tell them
apart (ncu's local-memory traffic, atomic throughput and stall reasons of both binaries) has not
been run, and the deterministic mode's own gap to cuDNN is not explained either.

**The schedules: predicted, then measured (the first cut's kernel).** The lock-step L2 model
(`wavefront.model.backward_simulation`, fitted to nothing) replays each backward schedule's work
table (the atomic K/V-major kernel at the first cut's tiles) on the measured GPU's SMs and L2.
Its predicted DRAM reads at D={PREDICTED_SCHEDULE_DIM} over the bytes an L2 holding everything
would read:

{md_table(shown_pred)}

{c[7]}. Measured on the {m['GPU'].iloc[0]} (`scripts/backward_bench.py --dram` and
`--schedules`: the K/V-major kernel's DRAM reads under ncu, one cold launch per schedule, and the
whole call's time over {schedule_rounds} interleaved rounds, both of the first cut's binaries):

{md_table(shown_measured)}

{' '.join(text + '.' for text in c[8:11])}

**Faster binaries.** The first cut's binaries spill or sit at 255 registers; FlashAttention-3
splits the K/V-major kernel's 128 K/V rows between two consumer warpgroups. Named configs
(`wavefront.backward_schedules.BACKWARD_CONFIGS`) cut each kernel otherwise with the same
arithmetic; `scripts/backward_bench.py --variants` checked each against float32 autograd (the
script now checks against the float64 reference of `measure.backward_reference`), then
times it beside cuDNN and FA2 in interleaved rounds (the run was cut by its device call's limit
after {measured_configs} of {len(SHAPES) * 4} configurations, {', '.join(missing) or 'none'}
missing; its console log is its record, the manifest its command and rounds). Speed over cuDNN,
paired by round, median [95%]; `wavefront_det` is the public call as users make it, with the
default config of the run's commit:

{md_table(shown_variants)}

{c[11]}. The run before it (`variants_d41682d`: two_warpgroups without the dQ
kernel's masked tiles first, {earlier_configs} configurations) measured two_warpgroups at
{span(earlier['x cudnn'], '.2f')}x cuDNN and {span(earlier['x fa2'], '.2f')}x FA2.

**The atomic mode's adds, coalesced.** In the row-major atomic binary each warp's float32 dQ
add (a scalar `RED.E.ADD.F32` per element; cuTile 1.7 has neither a vector nor a bulk reduce)
covers 32 floats 16 bytes apart at D=128, each in a 32-byte sector half used (read from the
SASS ahead of time, `tests/test_backward.py` checks the lanes' addresses). Config
`atomic_coalesced` keeps the default's cut and lays the float32 accumulator out tile by tile,
each tile column-major, so that a warp's adds fall on consecutive floats; a second pass turns it
back into dQ (packed batches keep the row-major accumulator).
{c[12]}."""
    return s


def _coalesced_claim(s: Section, study) -> None:
    """The coalesced accumulate's run against the row-major one and the deterministic default,
    and the adds alone, as one claim."""
    from wavefront.backward_schedules import BACKWARD_CONFIGS, DEFAULT_BACKWARD_CONFIG
    v = variant_rows(study, (COALESCED_VARIANTS,))
    by = {name: v[v["contender"] == name].set_index(["shape", "D", "mask"])
          for name in ("atomic[atomic_coalesced]", "atomic[two_warpgroups]", "wavefront_det")}
    coalesced, row_major, default = by.values()
    faster = (coalesced["ms"] < default["ms"].reindex(coalesced.index)).sum()
    probe = pd.DataFrame([json.loads(line) for line in read_results_bytes(
        study.data_dir / "backward_bench" / RED_PROBE, "the dQ add probe").decode().splitlines()
        if line.strip()])
    probe["G adds/s"] = probe["adds_per_s"] / 1e9  # (at the median launch time)
    rate = probe.set_index(["head_dim", "layout"])["G adds/s"]
    gpu = ", ".join(sorted({short_gpu(name) for name in probe["gpu"]}))
    default_coalesced = any(c.dq_coalesced for c in BACKWARD_CONFIGS[DEFAULT_BACKWARD_CONFIG]
                            .values())

    def kv_cut(c):  # what the atomic mode runs of a config: its K/V-major kernel
        return c.kv_tiles, c.kv_worker_warps, c.q_latency
    # "the row-major atomic mode of the same cut": two_warpgroups' K/V-major kernel is
    # atomic_coalesced's at both head dims
    same_cut = all(kv_cut(BACKWARD_CONFIGS["two_warpgroups"][d]) == kv_cut(c)
                   for d, c in BACKWARD_CONFIGS["atomic_coalesced"].items())

    s.claim(f"On the {gpu} (`{COALESCED_VARIANTS}`, {len(coalesced)} configurations, "
            f"interleaved rounds), the coalesced atomic mode runs at "
            f"{_spread(coalesced, 'cudnn', ' cuDNN')}, the row-major atomic mode of the same cut "
            f"at {_spread(row_major, 'cudnn', ' cuDNN')} and the deterministic default at "
            f"{_spread(default, 'cudnn', ' cuDNN')} in the same rounds; the coalesced "
            f"atomic mode is the faster of the two modes at {faster} of {len(coalesced)} "
            f"configurations (medians) and below cuDNN in every one. The adds alone "
            f"(`dq_add_probe`: one launch adding a bench-sized dQ, medians of its repeats) run "
            + ", ".join(f"D{d} {rate[d, 'coalesced']:.0f} G adds/s coalesced against "
                        f"{rate[d, 'row-major']:.0f} row-major"
                        for d in sorted(probe["head_dim"].unique()))
            + ": the same adds over fewer whole sectors ran "
            + ", ".join(f"{rate[d, 'coalesced'] / rate[d, 'row-major']:.1f}x"
                        for d in sorted(probe["head_dim"].unique()))
            + " as fast. "
            + ("The public call's atomic mode is the coalesced one" if default_coalesced else
               "The public call's atomic mode (`deterministic=False`) still adds row-major: "
               "making the coalesced one its default needs the whole backward GPU suite and a "
               "bench of the public call"),
            len(coalesced) == len(row_major) == len(default) == 12 and same_cut
            and bool((coalesced["x cudnn hi"] < 1).all())
            and bool((coalesced["ms"] < row_major["ms"].reindex(coalesced.index)).all())
            and bool((rate.xs("coalesced", level="layout")
                      > 2 * rate.xs("row-major", level="layout")).all()),
            {"coalesced": coalesced[["x cudnn", "x cudnn lo", "x cudnn hi"]].round(3)
             .reset_index().to_dict("records"),
             "default ms": default["ms"].round(3).tolist(),
             "G adds/s": {f"D{d} {layout}": round(x, 1) for (d, layout), x in rate.items()}})


def _spread(rows, peer: str, unit: str = "") -> str:
    """'0.62-0.77x<unit> (95% intervals within [lo, hi])': the medians' range of a speed over
    `peer` and the widest reach of their intervals."""
    return (f"{rows[f'x {peer}'].min():.2f}-{rows[f'x {peer}'].max():.2f}x{unit} (95% intervals "
            f"within [{rows[f'x {peer} lo'].min():.2f}, {rows[f'x {peer} hi'].max():.2f}])")


def _against(rows, column: str, above: str, below: str) -> str:
    """Where a paired ratio's intervals lie, said as the data say it: '<above> in every
    configuration (every interval above 1)', the same below, or the counts of each."""
    up, down = int((rows[f"{column} lo"] > 1).sum()), int((rows[f"{column} hi"] < 1).sum())
    if up == len(rows):
        return f"{above} in every configuration (every interval above 1)"
    if down == len(rows):
        return f"{below} in every configuration (every interval below 1)"
    return (f"{above} at {up}, {below} at {down} and level at {len(rows) - up - down} "
            "configurations")


def span_int(values) -> str:
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
