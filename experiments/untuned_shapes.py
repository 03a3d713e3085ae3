"""Does the tuned table carry over to shapes nobody tuned? The public call against cuDNN there.

`wavefront.attention` called with no configuration takes the tuned entry (GPU, head dim,
mask) whose shape is nearest to the call's (`wavefront.kernel.tuning.shape_distance`). The
shapes here are held out: none is a tuned shape, so what they show is what a user who hands
the call a shape of their own gets. Each shape's contenders ran in the same interleaved rounds
(`wavefront bench --tuned --api`): the plain default (persistent+linear, default tiles, no
lever: what an untuned call ran before the table), the bound launcher of the configuration
the call resolved to, the public call itself on torch tensors, cuDNN and FA2 through torch
SDPA. Ratios are paired by round, with 95% intervals.

    wavefront experiment run untuned_shapes     # GPU: the runs below, into data/untuned_shapes
    mv data/untuned_shapes/bench.jsonl data/untuned_shapes/h100.jsonl   # replace that GPU's rounds
    python experiments/untuned_shapes.py plot --out DIR
"""
import matplotlib.pyplot as plt
import pandas as pd

from wavefront.kernel.tuning import (CONFIG_FIELDS, entry_key, entry_shapes, ranked_entries,
                                     tuned_entry)
from wavefront.point import KERNEL_LEVERS
from wavefront.report.draft import Section, md_table, span, wrap
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import plain_log, short_gpu, style
from wavefront.results.measurement import PEER_NAMES, paired_ratio
from wavefront.results.records import BENCH_RECORDS, by_shape, seqlen_label, shape_name

DATASETS = ()
RECORDS = ("untuned_shapes",)

_CALL = ["--schedule", "persistent+linear", "--tuned", "--api"]
BENCH = [
    _CALL + ["--head-dim", "128", "--batch", "4", "--heads", "16", "--seqlen", "4096"],
    _CALL + ["--head-dim", "128", "--batch", "1", "--heads", "16", "--seqlen", "2048,16384"],
    _CALL + ["--head-dim", "128", "--batch", "2", "--heads", "32", "--kv-heads", "4",
             "--seqlen", "8192"],
    _CALL + ["--head-dim", "64", "--batch", "1", "--heads", "32", "--seqlen", "4096,16384"],
    _CALL + ["--head-dim", "64", "--batch", "4", "--heads", "8", "--seqlen", "8192"],
]
DEFAULT = "persistent+linear"  # the bench's plain point: default tiles, no lever
API = "api"


def _tuple(shape: dict) -> tuple[int, int, int, int]:
    return (shape["batch"], shape["heads"], shape["kv_heads"] or shape["heads"], shape["seqlen"])


def _run_dates(study, dataset: str = "untuned_shapes") -> dict[str, str]:
    """Each record file's newest run date, from the data set's manifest (a file gathers
    several bench runs)."""
    dates: dict[str, str] = {}
    for run in study.manifest(dataset).values():
        for name in run.get("files", []):
            name = name.split(".")[0]
            dates[name] = max(dates.get(name, ""), run["date"])
    return dates


def _measured(study, dataset: str = "untuned_shapes"
              ) -> list[tuple[str, str, str, dict, bool]]:
    """(run, GPU, shape, that run's contenders, whether it is the shape's latest run) for
    every shape whose public call was timed. A shape re-measured after the tuned table
    changed (`h100_tiles256`: the D=128 non-causal shapes after the 128x256 entries) is taken
    from the later run; the earlier one stays as the table of then."""
    dates = _run_dates(study, dataset)
    found = []
    for run, records in study.records(BENCH_RECORDS, dataset).items():
        for (gpu, shape), by in by_shape(records, per_gpu=True).items():
            if by.get(API) is not None and "cudnn" in by:
                found.append((dates.get(run, ""), run, gpu, shape, by))
    latest: dict = {}
    for date, run, gpu, shape, _ in found:
        if (gpu, shape) in latest and latest[gpu, shape][0] == date:
            # two runs of one shape at once would be mixed in every ratio
            raise ValueError(f"data/{dataset}: {gpu} {shape} is in both "
                             f"{latest[gpu, shape][1]} and {run}; keep one run per GPU")
        if (gpu, shape) not in latest or date > latest[gpu, shape][0]:
            latest[gpu, shape] = (date, run)
    return [(run, gpu, shape, by, latest[gpu, shape][1] == run)
            for _, run, gpu, shape, by in found]


def rows(study, latest: bool = True, dataset: str = "untuned_shapes") -> pd.DataFrame:
    """Per GPU, shape and contender (the plain default, the resolved configuration's bound
    launcher, the public call): speed against cuDNN and FA2 paired by round, and the call
    against its bound launcher. `latest=False`: the runs a later run of the shape replaced.
    `dataset`: another experiment's bench rounds of the same kind (`short_prompts`)."""
    out = []
    for run, gpu, shape, by, is_latest in _measured(study, dataset):
        if is_latest != latest:
            continue
        api = by[API]
        bound = api.get("bound")
        first = api["shape"]
        for role, name in (("plain default", DEFAULT), ("resolved, bound", bound),
                           ("public call", API)):
            r = by.get(name)
            if r is None:
                continue
            row = {"GPU": short_gpu(gpu), "gpu_name": gpu, "shape": shape, "run": run,
                   "D": first["head_dim"], "causal": first["causal"],
                   "problem": _tuple(first), "contender": role, "configuration": bound,
                   "TFLOP/s": r["tflops"], "ms": r["median_ms"],
                   "throttled": r["throttled_rounds"], "rounds": r["rounds"]}
            for peer in ("cudnn", "fa2"):
                if peer in by:
                    row[f"x {peer}"], row[f"x {peer} lo"], row[f"x {peer} hi"] = \
                        paired_ratio(by[peer]["samples_ms"], r["samples_ms"])
            if role == "public call":
                row["x bound"], row["x bound lo"], row["x bound hi"] = (
                    r["x_bound"], *r["x_bound_ci95"])
            out.append(row)
    return pd.DataFrame(out)


def replaced(study) -> pd.DataFrame:
    """Per GPU and shape measured twice, the public call under the table of then and under
    today's: its configuration and its speed against cuDNN of the same rounds."""
    now, then = (rows(study, latest)[lambda d: d["contender"] == "public call"]
                 .set_index(["GPU", "shape"]) for latest in (True, False))
    both = then.merge(now, left_index=True, right_index=True, suffixes=(" then", " now"))
    return both.reset_index()


def held_out(d: pd.DataFrame) -> pd.Series:
    """Whether each row's shape is absent from today's tuned table: held out only while
    nobody tunes it (an entry of that exact shape would be its own nearest)."""
    def absent(r) -> bool:
        found = tuned_entry(r["gpu_name"], int(r["D"]), bool(r["causal"]), r["problem"])
        return found is None or found[0] != entry_key(int(r["D"]), bool(r["causal"]),
                                                      r["problem"])
    return d.apply(absent, axis=1)


TITLE = ("The public call on shapes absent from the tuned table (held out), bf16: ratios "
         "paired by interleaved round, 95% intervals; dashed: cuDNN")


def _draw(d: pd.DataFrame, title: str = TITLE):
    """Speed against cuDNN (paired by round, 95% interval) per held-out shape, one panel per
    GPU: the plain default, the configuration the public call resolved to (bound) and the
    call itself."""
    shapes = list(dict.fromkeys(d["shape"]))
    gpus = sorted(set(d["GPU"]))
    roles = ("plain default", "resolved, bound", "public call")
    colors = dict(zip(roles, ("tab:gray", "tab:blue", "tab:orange")))
    with style():
        fig, axes = plt.subplots(1, len(gpus), figsize=(4.6 * len(gpus) + 1.8,
                                                        0.42 * len(shapes) + 1.6),
                                 sharey=True, squeeze=False)
        for ax, gpu in zip(axes[0], gpus):
            for i, role in enumerate(roles):
                sub = d[(d["contender"] == role) & (d["GPU"] == gpu)]
                y = sub["shape"].map({s: k for k, s in enumerate(shapes)}) + (i - 1) * 0.22
                ax.errorbar(sub["x cudnn"], y, xerr=[sub["x cudnn"] - sub["x cudnn lo"],
                                                     sub["x cudnn hi"] - sub["x cudnn"]],
                            fmt="o", ms=4, capsize=2, color=colors[role], label=role)
            ax.axvline(1.0, color="k", ls="--", lw=1)
            ax.set_xscale("log")
            plain_log(ax.xaxis, ticks=[0.6, 0.8, 1.0, 1.5, 2.0, 3.0])
            ax.set_yticks(range(len(shapes)))
            ax.set_yticklabels(shapes, fontsize=9)
            ax.set_title(gpu, fontsize=9)
            ax.set_xlabel("speed vs cuDNN (same rounds; > 1: faster; log)")
        axes[0][0].invert_yaxis()
        axes[0][-1].legend(fontsize=9, loc="lower right")
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
    return fig


def figure(study):
    return _draw(rows(study))


def table(study, dataset: str = "untuned_shapes") -> pd.DataFrame:
    d = rows(study, dataset=dataset)
    fmt = lambda m, lo, hi: f"{m:.3f} [{lo:.3f}, {hi:.3f}]"  # noqa: E731
    out = []
    for (gpu, shape), sub in d.groupby(["GPU", "shape"], sort=False):
        by = sub.set_index("contender")
        call = by.loc["public call"]
        row = {"GPU": gpu, "shape": shape, "configuration the call resolved to":
               call["configuration"].replace("persistent+linear ", "persistent ")
               .replace("grouped_dynamic+linear ", "grouped_dynamic ")}
        for role in ("plain default", "public call"):
            if role in by.index:
                r = by.loc[role]
                row[f"{role} x cuDNN [95%]"] = fmt(r["x cudnn"], r["x cudnn lo"],
                                                   r["x cudnn hi"])
        row["call x FA2"] = f"{call['x fa2']:.2f}"
        row["call vs bound [95%]"] = fmt(call["x bound"], call["x bound lo"],
                                         call["x bound hi"])
        row["throttled rounds"] = f"{int(call['throttled'])}/{int(call['rounds'])}"
        out.append(row)
    return pd.DataFrame(out)


def other_gpus_configuration(study) -> pd.DataFrame:
    """The H200 bench of the H100's D=128 configuration against the H200's own tuned entries
    (h200_h100_config): per mask, the H100 configuration's speed against the H200 entry's,
    paired by round, and each against cuDNN."""
    runs = study.records(BENCH_RECORDS, "untuned_shapes")
    out = []
    for shape, by in by_shape(runs.get("h200_h100_config", [])).items():
        own = next(n for n in by if "qk_ahead=0" in n)  # the H200 entry (no qk_ahead)
        causal = by[own]["shape"]["causal"]
        carried = "grouped_dynamic+linear" if causal else "persistent+linear"
        ratio, lo, hi = paired_ratio(by[own]["samples_ms"], by[carried]["samples_ms"])
        out.append({"GPU": short_gpu(by[own]["gpu"]), "shape": shape,
                    "H200 entry": own, "H100 configuration": carried,
                    "H100 configuration vs H200 entry": ratio, "lo": lo, "hi": hi,
                    "H200 entry x cuDNN": by[own]["x_cudnn"],
                    "H100 configuration x cuDNN": by[carried]["x_cudnn"]})
    return pd.DataFrame(out)


HOPPER_REFERENCE = "NVIDIA H100 80GB HBM3"  # whose D=128 configuration the H200 ran


def _same_configuration(gpu: str, reference: str, causal: bool) -> bool:
    """Whether today's tuned table gives `gpu` the configuration it gives `reference` at the
    default tuned shape, D=128 (every field that becomes an `attention` argument)."""
    entries = [tuned_entry(g, 128, causal) for g in (gpu, reference)]
    if None in entries:
        return False
    (_, mine), (_, theirs) = entries
    return all(mine.get(f, KERNEL_LEVERS.get(f)) == theirs.get(f, KERNEL_LEVERS.get(f))
               for f in CONFIG_FIELDS)


def tuned_shapes(gpu: str) -> list[str]:
    """The shapes today's tuned table has entries at for `gpu` (any head dim or mask)."""
    return [f"B{b} H{h}" + (f" KV{kv}" if kv != h else "") + f" {seqlen_label(s)}"
            for b, h, kv, s in entry_shapes(gpu)]


# data/untuned_shapes/tie_s4k/: a held-out shape equally near two of the H100's entries, each
# entry's configuration timed beside the one the call resolved to (one bench, same rounds):
#   wavefront bench --batch 1 --heads 32 --seqlen 4096 --head-dim 64 --no-causal \
#       --schedule persistent+linear,grouped_dynamic+linear --tile 128x128 --occupancy 2 \
#       --worker-warps 8 --tuned --api --rounds 15
TIE = "untuned_shapes/tie_s4k"


def tie_rows(study) -> pd.DataFrame:
    """Per contender of the tie's bench (ours and the public call): its configuration, speed
    against cuDNN paired by round, and the tuned entries whose configuration it is, with their
    distance to the shape (`wavefront.kernel.tuning.ranked_entries`)."""
    out = []
    for records in study.records(BENCH_RECORDS, TIE).values():
        for (gpu, _), by in by_shape(records, per_gpu=True).items():
            api, first = by["api"], by["api"]["shape"]
            ranked = ranked_entries(gpu, first["head_dim"], first["causal"], _tuple(first))
            for name, r in by.items():
                if name in PEER_NAMES:
                    continue
                config = by[api["bound"]]["config"] if name == API else r["config"]
                entries = [f"{key} ({distance:g})" for distance, key, _, entry in ranked
                           if all(entry.get(f, KERNEL_LEVERS.get(f)) == config.get(f)
                                  for f in CONFIG_FIELDS)]
                if not entries and name in (api["bound"], API):
                    # the nearest entry has been searched again since: the call took its
                    # configuration of then
                    distance, key, *_ = ranked[0]
                    entries = [f"{key} ({distance:g}; its configuration of then)"]
                x, lo, hi = paired_ratio(by["cudnn"]["samples_ms"], r["samples_ms"])
                out.append({"GPU": short_gpu(gpu), "shape": shape_name(first),
                            "contender": name, "resolved to": name == api["bound"],
                            "entries (distance)": ", ".join(entries) or "-",
                            "x cudnn": x, "lo": lo, "hi": hi,
                            "distances": [d for d, *_ in ranked]})
    return pd.DataFrame(out)


def section(study) -> Section:
    s = Section()
    d = rows(study)
    call = d[d["contender"] == "public call"].set_index(["GPU", "shape"])
    plain = d[d["contender"] == "plain default"].set_index(["GPU", "shape"])["x cudnn"]
    gain = (call["x cudnn"] / plain).dropna()
    held = held_out(call.reset_index())
    s.claim(f"All {len(call)} shape-masks of this section are held out: none is a shape of the "
            "tuned table the call read.", len(call) > 0 and bool(held.all()),
            dict(zip(call.index.map(" ".join), held)), listed=False)
    per_gpu = []
    for gpu, sub in call.groupby(level="GPU"):
        long = sub[~sub.index.get_level_values("shape").str.contains("S2k")]
        per_gpu.append(f"{gpu} {sub['x cudnn'].min():.2f}-{sub['x cudnn'].max():.2f}x "
                       f"({int((sub['x cudnn'] >= 1.0).sum())} of {len(sub)} at or above "
                       f"1.0x; {long['x cudnn'].min():.2f}-{long['x cudnn'].max():.2f}x without "
                       "the S=2k shape, where cuDNN is slow)")
    s.claim("On shapes nobody tuned the public call ran at " + "; ".join(per_gpu)
            + " cuDNN, medians of paired rounds.", len(call) >= 10 and bool(held.all()),
            dict(zip(call.index.map(" ".join), call["x cudnn"].round(3))))
    s.claim(f"The configuration the table carries over beats the plain default on "
            f"{int((gain > 1).sum())} of {len(gain)} held-out shape-masks "
            f"({gain.min():.2f}-{gain.max():.2f}x; the losses are at S=2k, where the call "
            "costs more host time than the launch).",
            len(gain) == len(call) and bool((gain[gain <= 1].index.get_level_values("shape")
                                              .str.contains("S2k")).all()),
            dict(zip(gain.index.map(" ".join), gain.round(3))))
    long = call[~call.index.get_level_values("shape").str.contains("S2k")]
    misses = long[long["x cudnn"] < 1.0]
    for gpu, sub in misses.groupby(level="GPU"):
        listed = ", ".join(f"{shape} {x:.3f}x" for shape, x in
                           zip(sub.index.get_level_values("shape"), sub["x cudnn"]))
        d128_full = sub["D"].eq(128) & ~sub["causal"].astype(bool)
        s.claim(f"Below cuDNN on the {gpu} (S >= 4k): {listed}; "
                f"{int(d128_full.sum())} of the {len(sub)} are D=128 non-causal.",
                bool((sub["x cudnn"] < 1.0).all()), sub["x cudnn"].round(3).tolist())
    before = replaced(study)
    replaced_text = ""
    if len(before):
        moved = before["configuration then"] != before["configuration now"]
        wide = before[moved & ~before["shape"].str.contains("S2k")]
        dims = " and ".join(f"D={d}" for d in sorted(set(wide["D now"].astype(int))))
        per_gpu = "; ".join(
            f"{gpu} {span(sub['x cudnn now'], '.3f')}x, where the table of then ran "
            f"{span(sub['x cudnn then'], '.3f')}x"
            for gpu, sub in wide.groupby("GPU"))
        level = (wide["x cudnn now"] >= 1.0) | ((wide["x cudnn lo now"] <= 1.0)
                                                & (wide["x cudnn hi now"] >= 1.0))
        s.claim(f"With the committed table's 128x256 entries every held-out shape-mask of S >= 4k whose call "
                f"now resolves to them ({dims} non-causal) runs at cuDNN's level or above: "
                f"{int((wide['x cudnn now'] >= 1.0).sum())} of {len(wide)} at or above 1.0x, "
                f"the rest with 1.0 inside their 95% interval ({per_gpu}; each a ratio to cuDNN "
                "in its own run's rounds).",
                len(wide) > 0 and bool(level.all())
                and bool(wide["configuration now"].str.contains("tiles=128x256").all())
                and not wide["causal now"].astype(bool).any(),
                wide[["GPU", "shape", "x cudnn then", "x cudnn now", "x cudnn lo now",
                      "x cudnn hi now"]].round(3).to_dict("records"))
        same = before[~moved]
        if len(same):
            change = same["x cudnn now"] / same["x cudnn then"] - 1
            s.claim(f"Where the configuration did not change ({len(same)} shape-masks re-measured "
                    f"with the rest), the call's ratio to cuDNN moved by "
                    f"{change.abs().min():.1%}-{change.abs().max():.1%} between the two runs: "
                    "the runs' own spread.",
                    bool((change.abs() < 0.05).all()), change.round(3).tolist())
        shown = before.assign(**{
            f"call x cuDNN {when} [95%]": [
                f"{x:.3f} [{lo:.3f}, {hi:.3f}]" for x, lo, hi in
                zip(before[f"x cudnn {when}"], before[f"x cudnn lo {when}"],
                    before[f"x cudnn hi {when}"])] for when in ("then", "now")})
        shown = shown[["GPU", "shape", "configuration then", "call x cuDNN then [95%]",
                       "configuration now", "call x cuDNN now [95%]"]]
        replaced_text = (
            "Re-measured after the 128x256 entries (`h100_tiles256`, `h200_tiles256`: the "
            "D=128 non-causal shapes; `h100_d64_tiles256`, `h200_d64_tiles256`: the D=64 shapes, "
            "both masks; the "
            "same bench; the table above shows these runs), beside the runs they "
            "replaced:\n\n" + md_table(shown) + "\n")
    s2k = call[call.index.get_level_values("shape").str.contains("S2k")]
    s2k_bound = d[(d["contender"] == "resolved, bound") & d["shape"].str.contains("S2k")]
    s.claim(f"At S=2k (B1 H16) the call runs at {s2k['x bound'].min():.2f}-"
            f"{s2k['x bound'].max():.2f}x its own bound launcher, below the longer shapes' "
            f"median ({long['x bound'].median():.2f}x): the launch "
            f"({1e3 * s2k_bound['ms'].min():.0f}-{1e3 * s2k_bound['ms'].max():.0f} us) is "
            "not much longer than the call's host work; cuDNN through SDPA is slower still "
            "there.",
            len(s2k) > 0 and bool((s2k["x bound"] < 1.0).all())
            and float(s2k["x bound"].median()) < float(long["x bound"].median()),
            s2k["x bound"].tolist())
    cross = other_gpus_configuration(study)
    cross_text = ""
    if len(cross):
        carried, carried_x = (cross["H100 configuration vs H200 entry"],
                              cross["H100 configuration x cuDNN"])
        adopted = {causal: _same_configuration("NVIDIA H200", HOPPER_REFERENCE, causal)
                   for causal in (False, True)}
        s.claim(f"The H200's searched entries predated `qk_ahead`: on the H200 the H100's D=128 "
                f"configuration ran {carried.min():.3f}-{carried.max():.3f}x the H200's own "
                f"entries at B1 H32 S8k (same rounds), {carried_x.min():.2f}-"
                f"{carried_x.max():.2f}x cuDNN; the H200's causal D=128 entry is still that "
                "configuration, chosen from these rounds, not by a search, and its non-causal "
                "one is the H100's again, found by each GPU's own search with 128x256 tiles.",
                bool((cross["lo"] > 1.0).all()) and all(adopted.values()),
                {"rows": cross.to_dict("records"), "adopted": adopted})
        shown = cross.copy()
        shown["H100 configuration vs H200 entry [95%]"] = [
            f"{r:.3f} [{lo:.3f}, {hi:.3f}]" for r, lo, hi in zip(carried, cross["lo"],
                                                             cross["hi"])]
        for c in ("H200 entry x cuDNN", "H100 configuration x cuDNN"):
            shown[c] = shown[c].map(lambda x: f"{x:.3f}")
        cross_text = ("Before the rows above, the H200's held-out shapes ran its entries "
                      "of then, searched before `qk_ahead` existed. The H100's D=128 "
                      "configuration on the H200, same rounds (B1 H32 S8k, a tuned shape):\n\n"
                      + md_table(shown.drop(columns=["H100 configuration vs H200 entry", "lo",
                                                     "hi"]))
                      + "\n\n" + wrap(
                          "The H200's D=128 entries in `wavefront/kernel/tuned.json` then "
                          "became the H100's configuration, chosen from these rounds (their "
                          "'chosen by' says so); a held search on the H200 with `qk_ahead` "
                          "found them again (`data/public_call/8bb1460/`). Since then its "
                          "non-causal entries come from a search with 128x256 tiles "
                          "(`data/tune/h200_tiles256`)."))
    gpus = ", ".join(sorted(set(d["GPU"])))
    tables = "; ".join(f"the {short_gpu(g)}'s entries at {', '.join(tuned_shapes(g))}"
                       for g in sorted(set(d["gpu_name"])))
    intro = wrap(
        "A tuned table is only as good as what it does for shapes nobody tuned. "
        "`experiments/untuned_shapes.py` hands the public call shapes absent from "
        "`wavefront/kernel/tuned.json` (checked against the committed table when the draft is "
        "built) and times it as a user calls it, beside the configuration it resolved to "
        "(bound), the plain default and the peers, in the same interleaved rounds "
        f"({gpus}, bf16, 15 rounds x 5 launches; ratios paired by round, 95% intervals; "
        f"the committed table: {tables}):")
    tie = tie_rows(study)
    tie_text = ""
    if len(tie):
        resolved = tie[tie["resolved to"]].iloc[0]
        others = tie[(tie["contender"] != API) & ~tie["resolved to"]
                     & (tie["entries (distance)"] != "-")]
        best = others.loc[others["x cudnn"].idxmax()]
        distances = tie["distances"].iloc[0]
        s.claim(f"At {resolved['shape']} ({resolved['GPU']}), held out, the two tuned entries "
                f"of its head dim and mask are equally near ({distances[0]:g} and "
                f"{distances[1]:g} octaves); the name order breaks the tie, and the call "
                f"resolved to {resolved['entries (distance)']}, {resolved['x cudnn']:.3f}x cuDNN "
                f"in the same rounds, where the other entry's configuration "
                f"({best['entries (distance)']}) ran {best['x cudnn']:.3f}x "
                f"[{best['lo']:.3f}, {best['hi']:.3f}]: 'nearest' lost "
                f"{best['x cudnn'] / resolved['x cudnn'] - 1:.1%} there.",
                len(distances) >= 2 and distances[0] == distances[1]
                and best["x cudnn"] > resolved["x cudnn"],
                dict(zip(tie["contender"], tie["x cudnn"].round(3))))
        shown = tie.drop(columns=["distances", "lo", "hi"]).assign(**{
            "x cudnn [95%]": [f"{x:.3f} [{lo:.3f}, {hi:.3f}]"
                              for x, lo, hi in zip(tie["x cudnn"], tie["lo"], tie["hi"])]})
        tie_text = ("A held-out shape equally near two entries (`data/untuned_shapes/tie_s4k/`, "
                    "one bench, 15 rounds x 5 launches):\n\n"
                    + md_table(shown.drop(columns=["x cudnn"])) + "\n")
    s.text = f"""## Shapes nobody tuned

{intro}

{md_table(table(study))}

![untuned shapes](figures/untuned_shapes.png)

{replaced_text}
{cross_text}

{tie_text}"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
