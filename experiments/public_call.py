"""What does the call users make cost? `wavefront.attention` against its bound launch and the peers.

`wavefront bench --api` times the contender `api` beside each shape's bound launchers and the
peers (cuDNN and FA2 through torch SDPA; TileGym where its bundle is on the host), in the same
interleaved rounds. `api` is `wavefront.attention(q, k, v, causal=...)` on torch tensors, called
per launch as a user calls it, with a new output each call. Its ratio to the bound launcher of
the configuration it resolves to, paired by round, is what the call's host work costs. Issue 20
asks for 0.97 at B1 H32 S8k D128 and 0.9 at B1 H8 S1k D64.

Every commit's runs are kept: a new run lands in `data/public_call/<commit>/`, and
`wavefront fold` folds the committed ones into `data/public_call/bench_runs.jsonl.gz`
(each record's `source` names the file it was); this experiment reads all of them. The call changed between those commits: a launcher cache, a positional hot path,
prepared launches. The kernel's source is 571b462's from that commit on. Runs before e9fadbe
record no calls per round: the bench's default, 5, unless the run's or file's name says 20 or
40.

    wavefront experiment run public_call   # GPU: both shapes and masks, into data/public_call/C/
    python experiments/public_call.py plot --out DIR

`C` is the checkout's commit (`WAVEFRONT_GIT_COMMIT` where the GPU host's copy of `.git` is
stale), its first seven characters; the folder's own manifest says when and where it ran.
"""
import os
import re
import subprocess
import sys

import pandas as pd
from scipy.stats import spearmanr

from wavefront.measure.rounds import SLOW_HOST
from wavefront.report.draft import Section, md_table, paragraphs, span
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu
from wavefront.results.records import BENCH_RECORDS, shape_name

DATASETS = ()
RECORDS = ("public_call",)

_CALL = ["--schedule", "persistent+linear", "--tuned", "--api"]
RUNS = [  # `wavefront bench` argument lists, each into data/public_call/<commit>/
    _CALL + ["--batch", "1", "--heads", "8", "--seqlen", "1024", "--head-dim", "64",
             "--rounds", "30"],
    _CALL + ["--batch", "1", "--heads", "32", "--seqlen", "8192", "--head-dim", "128",
             "--rounds", "20"],
]
SHORT, LONG = "B1 H8 S1k D64", "B1 H32 S8k D128"
TARGETS = {SHORT: 0.9, LONG: 0.97}  # issue 20: the call within 10% and 3% of its bound launch
DEFAULT_PER_ROUND = 5  # `wavefront bench --per-round` since the bench began (2026-11-22)


def _per_round(record: dict, file: str) -> int:
    """Calls per round of a record: its own field (since e9fadbe), else its run's or file's
    name (`s1k_pr40`, `bench_s1k_per20`), else the bench's default."""
    if record.get("per_round"):
        return int(record["per_round"])
    found = (re.search(r"_pr(\d+)", record.get("run") or "")
             or re.search(r"per(\d+)", file))
    return int(found.group(1)) if found else DEFAULT_PER_ROUND


def measure(out_dir) -> int:
    """`RUNS` on this GPU into <out_dir>/<commit>/ (bench.jsonl and its manifest). ->
    failures. The bench runs by process, as a user runs it (experiments never import the
    CLI)."""
    from wavefront.results.store import git_commit
    folder = out_dir / (os.environ.get("WAVEFRONT_GIT_COMMIT") or git_commit())[:7]
    failed = 0
    for args in RUNS:
        cmd = [sys.executable, "-m", "wavefront.cli", "bench", *args, "--out", str(folder)]
        print(" ".join(cmd[2:]), flush=True)
        failed += subprocess.run(cmd).returncode != 0
    return failed


FOLDED = "bench_runs.jsonl"  # the committed runs' records, one file (`wavefront fold`)


def bench_files(study) -> dict:
    """{'<commit>/<file name without .jsonl>': records} of every run: the committed ones
    folded into FOLDED, and any still in their commit's folder (a new run's bench.jsonl)."""
    return study.folded_records(BENCH_RECORDS, "public_call", FOLDED, "*/bench*.jsonl")


def _measured_on(study) -> dict:
    """Commit folder -> when its first run was measured: the dates of data/public_call's
    manifest entries that name the folder, and of the folder's own manifest where it has
    one."""
    entries = [(entry.get("folder"), entry) for entry in study.manifest("public_call").values()]
    for path in sorted((study.data_dir / "public_call").glob("*/manifest.json*")):
        folder = path.parent.name
        entries += [(folder, entry) for entry in
                    study.manifest(f"public_call/{folder}").values()]
    dates: dict = {}
    for folder, entry in entries:
        if folder and entry.get("date"):
            dates[folder] = min(dates.get(folder, entry["date"]), entry["date"])
    return dates


def rows(study) -> pd.DataFrame:
    """One row per run, shape and mask where the public call was timed: its ratio to its bound
    launcher (paired by round, 95% interval), its speed against the peers, and host and GPU
    microseconds per call of it, its bound launcher and cuDNN. Runs in the order measured."""
    dates = _measured_on(study)
    out = []
    for path, records in bench_files(study).items():
        commit, file = path.split("/", 1)
        if commit not in dates:
            raise ValueError(f"data/public_call/{commit}: no manifest entry names this folder")
        groups: dict = {}
        for r in records:
            if "contender" in r:
                key = (r.get("run"), _per_round(r, file), r["gpu"], shape_name(r["shape"]))
                groups.setdefault(key, {})[r["contender"]] = r
        for (_, per_round, gpu, name), by in groups.items():
            api = by.get("api")
            if api is None or "x_bound" not in api:
                continue
            bound = by.get(api.get("bound"), {})
            cudnn = by.get("cudnn", {})
            shape = name.removesuffix(" causal")
            out.append({
                "date": dates[commit], "commit": commit, "run": f"{commit}, {per_round}/round",
                "per round": per_round, "GPU": gpu, "shape": shape,
                "mask": "causal" if api["shape"]["causal"] else "full",
                "x bound": api["x_bound"], "x bound lo": api["x_bound_ci95"][0],
                "x bound hi": api["x_bound_ci95"][1],
                "x cudnn": api.get("x_cudnn"), "x fa2": api.get("x_fa2"),
                "x tilegym": api.get("x_tilegym"),
                "call us": 1e3 * api["median_ms"],
                "bound us": 1e3 * bound["median_ms"] if bound else None,
                "call host us": api.get("host_us"),
                "call host us, 1st": api.get("host_first_us"),
                "bound host us": bound.get("host_us"), "cuDNN host us": cudnn.get("host_us"),
                "throttled": f"{api['throttled_rounds']}/{api['rounds']}",
                # the tiles of the configuration the call resolved to (128x256: the D=128
                # non-causal entries since 3cb5de0)
                "tiles": (bound.get("config") or {}).get("tiles")})
    if not out:
        raise ValueError(f"{study.data_dir / 'public_call'}: no run timed the public call")
    return pd.DataFrame(out).sort_values(["date", "per round"], kind="stable",
                                         ignore_index=True)


def probe_rounds(study) -> pd.DataFrame:
    """One row per round of the runs that recorded the host's speed (`host_probe_us`, since
    c0ad489): the probe read after the round, and the call's ratio to its bound launch in
    that round (the bound launch's time per call over the call's, both from the round's
    events)."""
    out = []
    for path, records in bench_files(study).items():
        commit, file = path.split("/", 1)
        by = {(r.get("run"), shape_name(r["shape"]), r["contender"]): r
              for r in records if "contender" in r}
        for (run, name, contender), api in by.items():
            bound = by.get((run, name, api.get("bound")))
            if contender != "api" or bound is None or not api.get("host_probe_us"):
                continue
            # the host's stolen and whole CPU time over each round (since c77ab39)
            jiffies = api.get("host_cpu_jiffies") or [[None, None]] * len(api["samples_ms"])
            for i, (call_ms, bound_ms, probe, (stolen, cpu)) in enumerate(zip(
                    api["samples_ms"], bound["samples_ms"], api["host_probe_us"], jiffies)):
                out.append({"commit": commit, "file": file, "GPU": api["gpu"],
                            "shape": name.removesuffix(" causal"),
                            "mask": "causal" if api["shape"]["causal"] else "full",
                            "per round": _per_round(api, file), "round": i,
                            "probe us": probe, "x bound": bound_ms / call_ms,
                            "stolen jiffies": stolen, "jiffies": cpu})
    return pd.DataFrame(out, columns=["commit", "file", "GPU", "shape", "mask", "per round",
                                      "round", "probe us", "x bound", "stolen jiffies",
                                      "jiffies"])


# A round's host is at its usual speed where the probe reads within 15% of the fastest probe
# of these runs, slow where the bench calls it slow (`SLOW_HOST`, 1.4x or more: the spells of
# data/public_call/RUNS.md.gz#aec4edd and #f597be2 ran every contender's host work about 1.4x slower).
USUAL_PROBE, SLOW_PROBE = 1.15, SLOW_HOST


CAPTION = ("The public call against the bound launcher it resolves to, per GPU, shape and mask "
           "(`wavefront bench` rounds, bf16; the latest run of each, the ratio paired by round "
           "with its 95% interval; dashed: the call's target, dotted: no host cost).")


def figure(study):
    import matplotlib.pyplot as plt
    d = rows(study)
    d = d[d["shape"].isin(TARGETS)]
    latest = d.groupby(["shape", "GPU", "mask"], sort=False).tail(1)
    shapes = list(TARGETS)
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 3.8), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        sub = latest[latest["shape"] == shape].reset_index(drop=True)
        labels = [f"{short_gpu(r['GPU'])} {r['mask']}\n({r['run']})" for _, r in sub.iterrows()]
        ax.errorbar(range(len(sub)), sub["x bound"],
                    yerr=[sub["x bound"] - sub["x bound lo"], sub["x bound hi"] - sub["x bound"]],
                    fmt="o", capsize=3)
        ax.axhline(TARGETS[shape], color="k", ls="--", lw=1)
        ax.axhline(1.0, color="gray", ls=":", lw=1)
        ax.set_xticks(range(len(sub)), labels)
        ax.set_xlim(-0.5, len(sub) - 0.5)
        ax.set(title=shape, ylabel="public call / bound launch (TFLOP/s)")
    fig.suptitle("`wavefront.attention` as users call it against its bound launcher")
    fig.tight_layout()
    return fig


def table(study) -> pd.DataFrame:
    """Each shape's runs at its latest two commits (every run is in the figure and the
    claims' evidence)."""
    d = rows(study)
    latest = d.groupby("shape")["commit"].transform(
        lambda commits: commits.isin(list(dict.fromkeys(commits))[-2:]))
    d = d[latest.astype(bool)]
    def fmt(x, f=".2f") -> str:
        return "" if x is None or x != x else format(x, f)

    def host(r) -> str:
        first = r["call host us, 1st"]
        return (fmt(r["call host us"], ".1f") + ("" if first is None or first != first
                                                 else f" ({first:.0f})")
                + f" / {fmt(r['bound host us'], '.1f')} / {fmt(r['cuDNN host us'], '.1f')}")
    return pd.DataFrame([{
        "run": r["run"], "GPU": short_gpu(r["GPU"]), "shape": r["shape"], "mask": r["mask"],
        "call vs bound [95%]": f"{r['x bound']:.3f} [{r['x bound lo']:.3f}, "
                               f"{r['x bound hi']:.3f}]",
        "call x cuDNN": fmt(r["x cudnn"]), "call x FA2": fmt(r["x fa2"]),
        "call x TileGym": fmt(r["x tilegym"]),
        "us per call: call / bound": f"{fmt(r['call us'], '.1f')} / {fmt(r['bound us'], '.1f')}",
        "host us per call: call (1st) / bound / cuDNN": host(r),
        "throttled rounds": r["throttled"]} for _, r in d.iterrows()])


def section(study) -> Section:
    s = Section()
    d = rows(study)
    short, long = d[d["shape"] == SHORT], d[d["shape"] == LONG]
    others = d[~d["shape"].isin(TARGETS)]
    gpus = ", ".join(sorted(set(d["GPU"])))
    s.claim(f"At {LONG} the call ran within 3% of its bound launch in every run: "
            f"{long['x bound'].min():.3f}-{long['x bound'].max():.3f}x over {len(long)} "
            "runs and masks.", len(long) > 0 and bool((long["x bound"] >= TARGETS[LONG]).all()),
            _evidence(long, "x bound"))
    s.claim(f"On the {len(others)} other shape-masks benched with the call "
            f"({', '.join(dict.fromkeys(others['shape']))}) it ran at "
            f"{others['x bound'].min():.3f}-{others['x bound'].max():.3f}x its bound launch.",
            len(others) > 0 and bool((others["x bound"] >= 0.93).all()),
            _evidence(others, "x bound", shape=True))
    met = short[short["x bound"] >= TARGETS[SHORT]]
    recent = short[short["commit"].isin(list(dict.fromkeys(short["commit"]))[-2:])]
    recent_met = recent[recent["x bound"] >= TARGETS[SHORT]]
    s.claim(f"At {SHORT} the call ran at {short['x bound'].min():.3f}-"
            f"{short['x bound'].max():.3f}x its bound launch over {len(short)} runs and masks, "
            f"reaching {TARGETS[SHORT]:g} in {len(met)} "
            f"({', '.join(met['run'] + ' ' + met['mask']) or 'none'}). The runs of the latest "
            f"two commits ({', '.join(dict.fromkeys(recent['commit']))}) reached it in "
            f"{len(recent_met)} of {len(recent)}: {recent['x bound'].min():.3f}-"
            f"{recent['x bound'].max():.3f}x.",
            len(short) > 0 and len(recent) > 0,
            _evidence(short, "x bound"))
    timed = short.dropna(subset=["bound us", "call host us"])
    long_rounds = timed[timed["per round"] >= 20]
    slack = long_rounds[long_rounds["call host us"] < long_rounds["bound us"]]
    bound_by_host = long_rounds[long_rounds["call host us"] >= long_rounds["bound us"]]
    five = short[short["per round"] == DEFAULT_PER_ROUND]
    five_firsts = five.dropna(subset=["call host us, 1st"])
    five_met = five[five["x bound"] >= TARGETS[SHORT]]
    margin = long_rounds["bound us"] - long_rounds["call host us"]
    rho = float(spearmanr(margin, long_rounds["x bound"]).statistic) if len(margin) > 2 else 0.0
    short_of = bound_by_host[bound_by_host["x bound"] >= TARGETS[SHORT]]
    # a run's median host time can sit below the kernel's while some of its rounds ran on a
    # slow host (the per-round claim below reads each round against the host's speed)
    slack_short = slack[slack["x bound"] < TARGETS[SHORT]]
    s.claim(f"With 20 or more calls a round, the ratio follows the margin between the bound "
            f"launch's time per call on the GPU (between events, same rounds) and the call's "
            f"host time per call: Spearman's rank correlation {rho:.2f} over the "
            f"{len(long_rounds)} such runs that recorded both. The {len(slack)} runs with a "
            f"margin ({span(slack['call host us'], '.1f')} us against "
            f"{span(slack['bound us'], '.1f')} us) ran at {span(slack['x bound'], '.3f')}x, "
            + (f"all at or above {TARGETS[SHORT]:g}" if len(slack_short) == 0 else
               f"{len(slack) - len(slack_short)} at or above {TARGETS[SHORT]:g} (not: "
               + ", ".join(f"{r['run']} {r['mask']}: {r['x bound']:.3f} at "
                           f"{r['bound us'] - r['call host us']:.2f} us of margin"
                           for _, r in slack_short.iterrows()) + ")")
            + f"; of the {len(bound_by_host)} without "
            f"({span(bound_by_host['call host us'], '.0f')} us against "
            f"{span(bound_by_host['bound us'], '.0f')} us, "
            f"{span(bound_by_host['x bound'], '.3f')}x), "
            + (f"{len(short_of)} reached it ("
               + ", ".join(f"{r['run']} {r['mask']}: {r['x bound']:.3f} at "
                           f"{r['call host us'] - r['bound us']:.1f} us over"
                           for _, r in short_of.iterrows()) + ")"
               if len(short_of) else "none reached it")
            + ". The same code's host time moves from process to process, and within one, on "
            "the H100 hosts (`data/public_call/RUNS.md.gz#aec4edd`, "
            "`#f597be2`), so where a run falls is the host's as much as the call's. With 5 "
            f"calls a round, the bench's default, {len(five_met)} of {len(five)} runs and "
            f"masks reached {TARGETS[SHORT]:g} ({span(five['x bound'], '.3f')}x"
            + (f"; {', '.join(five_met['run'] + ' ' + five_met['mask'])}" if len(five_met)
               else "") + "): the round's "
            f"first call, {span(five_firsts['call host us, 1st'], '.0f')} us of host time "
            "where recorded, weighs on a fifth of it.",
            len(slack) > 0 and len(bound_by_host) > 0 and len(five) > 0 and rho >= 0.8
            and len(slack_short) <= 0.1 * len(slack) and len(five_met) < len(five),
            _evidence(timed, "per round", "call host us", "bound us", "x bound"))
    probed = probe_rounds(study)
    probed = probed[probed["shape"] == SHORT]
    fastest = probed["probe us"].min()
    usual = probed[probed["probe us"] <= USUAL_PROBE * fastest]
    slow = probed[probed["probe us"] >= SLOW_PROBE * fastest]

    counted = slow.dropna(subset=["jiffies"])

    def share(r: pd.DataFrame) -> str:
        met = int((r["x bound"] >= TARGETS[SHORT]).sum())
        return (f"median {r['x bound'].median():.3f}x, {met} of {len(r)} at or above "
                f"{TARGETS[SHORT]:g}")
    many = {k: r[r["per round"] >= 20] for k, r in (("usual", usual), ("slow", slow))}
    few = {k: r[r["per round"] == DEFAULT_PER_ROUND] for k, r in (("usual", usual),
                                                                   ("slow", slow))}
    dates = _measured_on(study)
    first_probed = min(set(probed["commit"]), key=lambda c: dates.get(c, ""), default="-")
    s.claim(f"Since {first_probed} the bench reads the "
            "host's speed after each round (`host_probe_us`: a fixed Python task, the fastest "
            f"of five batches), so each round's ratio can be read against its host. Over "
            f"{len(probed)} rounds of {len(probed[['commit', 'file']].drop_duplicates())} runs at "
            f"{SHORT} (both masks), "
            f"the fastest probe read {fastest:.2f} us. With 20 calls a round, the rounds whose "
            f"probe read within {USUAL_PROBE - 1:.0%} of it ran the call at "
            f"{share(many['usual'])}; the rounds at {SLOW_PROBE:g}x or more "
            f"({span(many['slow']['probe us'], '.1f')} us), {share(many['slow'])}. With 5 "
            f"calls a round: {share(few['usual'])} at the usual speed"
            + (f", {share(few['slow'])} slow." if len(few["slow"]) else ".")
            + " Round by round, the host's speed decides the S1k ratio."
            + (f" The slow rounds that recorded the host's CPU time ({len(counted)}, since "
               f"{min(set(counted['commit']), key=lambda c: dates.get(c, ''))}) lost "
               f"{int(counted['stolen jiffies'].sum())} of {int(counted['jiffies'].sum())} "
               "jiffies of it, over every CPU, to the hypervisor: the slow spells are slower "
               "CPUs (the host is a KVM guest), not stolen time." if len(counted) else ""),
            len(many["usual"]) > 0 and len(many["slow"]) > 0
            and many["usual"]["x bound"].median() >= TARGETS[SHORT]
            and many["slow"]["x bound"].median() < TARGETS[SHORT]
            and (len(counted) == 0
                 or counted["stolen jiffies"].sum() < 0.01 * counted["jiffies"].sum()),
            {f"{k}, {n} a round": (len(r), round(float(r["x bound"].median()), 3))
             for n, groups in ((20, many), (5, few)) for k, r in groups.items() if len(r)})
    firsts = d.dropna(subset=["call host us, 1st"])
    s.claim(f"The first call of a round, made right after another contender's burst, cost "
            f"{firsts['call host us, 1st'].min():.0f}-{firsts['call host us, 1st'].max():.0f} "
            f"us of host time against {firsts['call host us'].min():.0f}-"
            f"{firsts['call host us'].max():.0f} us per call over the round "
            f"({', '.join(dict.fromkeys(firsts['commit']))}), more in every run.",
            len(firsts) > 0
            and bool((firsts["call host us, 1st"] > firsts["call host us"]).all()),
            _evidence(firsts, "call host us, 1st", "call host us", "x bound", shape=True))
    long_full = long[long["mask"] == "full"]
    # runs recorded before the bound launcher's configuration was (no "tiles") all predate
    # 128x256: the only D=128 tiles until then were 128x128
    wide = long_full[long_full["tiles"] == "128x256"]
    narrow = long_full[long_full["tiles"] != "128x256"]
    s.claim(f"Against cuDNN through torch's SDPA the call ran {short['x cudnn'].min():.1f}-"
            f"{short['x cudnn'].max():.1f}x at {SHORT} (SDPA's own host work: "
            f"{short['cuDNN host us'].min():.0f}-{short['cuDNN host us'].max():.0f} us a call "
            f"where recorded) and {long['x cudnn'].min():.2f}-{long['x cudnn'].max():.2f}x at "
            f"{LONG}; below 1.0x only without the causal mask at {LONG} while its entry had "
            f"128x128 tiles ({narrow['x cudnn'].min():.2f}-{narrow['x cudnn'].max():.2f}x, "
            f"{len(narrow)} runs), the D=128 gap (`experiments/d128_limits.py`); with the "
            f"128x256 entry {span(wide['x cudnn'], '.3f')}x "
            f"({', '.join(dict.fromkeys(wide['commit']))}).",
            bool((short["x cudnn"] > 1.0).all())
            and bool((long[long["mask"] == "causal"]["x cudnn"] >= 0.99).all())
            and bool((narrow["x cudnn"] < 1.0).all()) and len(wide) > 0
            and narrow["date"].max() < wide["date"].min()
            and bool((wide["x cudnn"] >= 1.0).all()),
            _evidence(d, "x cudnn", shape=True))
    intro = paragraphs(
        "The call a model makes, `wavefront.attention`, was once slower than the kernel "
        "`wavefront bench` times, because every call built a launcher and its work table. `experiments/public_call.py` reads "
        "every bench run that timed the call (contender `api`) beside the bound launcher it "
        f"resolves to and the peers, in the same interleaved rounds ({gpus}, bf16; "
        "ratios paired by round, 95% intervals; each run's commit and calls per round "
        "named). Where the launch is long the call costs what the launcher costs. Where it "
        "is as short as the host work around it, it does not. The table holds each shape's "
        "runs at its latest two commits, the figure every run of the two shapes the call was "
        f"tuned for ({SHORT} and {LONG}). Three more runs at a20efe1 printed their tables, but their records did not "
        "come back from the host: `data/public_call/RUNS.md.gz`, section a20efe1, lists them (one "
        "below 0.9 on both masks).")
    s.text = f"""## The call users make

{intro}

{md_table(table(study))}

![public call](figures/public_call.png)
"""
    return s


def _evidence(d: pd.DataFrame, *columns: str, shape: bool = False) -> dict:
    """A claim's evidence: per run (and shape) and mask, the columns' values, rounded."""
    def key(r) -> str:
        return f"{r['run']}{' ' + r['shape'] if shape else ''} {r['mask']}"
    return {key(r): (round(float(r[columns[0]]), 3) if len(columns) == 1 else
                     tuple(round(float(r[c]), 3) for c in columns)) for _, r in d.iterrows()}


if __name__ == "__main__":
    run_as_script(__file__)
