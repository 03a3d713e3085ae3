"""Short prompts: does the public call reach cuDNN on batched prompts of 512 to 4k tokens?

`wavefront.attention` as a user calls it (torch tensors, no configuration: the tuned table's
nearest entry, `api`), beside the bound launcher of the configuration it resolved to, the
plain default, and torch SDPA's cuDNN and flash (FA2) backends, every contender of a shape in
the same interleaved rounds (`wavefront bench --tuned --api`), ratios paired by round with
95% intervals. Batched prompts of 512-4k tokens, D64 and D128, MHA and GQA (32 query heads
over 8), both masks: where the issue found the call at 0.90-0.98x cuDNN. `picks()` lists what
the tuned table hands each of these shapes on each GPU (computed on the CPU from
wavefront/kernel/tuned.json), next to what the call resolved to when measured.

    python experiments/short_prompts.py run          # GPU: the bench rounds into data/short_prompts
    python -c "import experiments.short_prompts as e; e.summary('DATA_DIR')"   # the table
"""
from pathlib import Path

import pandas as pd

from wavefront.report.draft import Section, md_table, span
from wavefront.report.experiments import load_experiment, run_as_script, until_measured
from wavefront.report.figures import short_gpu

# (its sibling through the package loader: `python experiments/short_prompts.py plot` runs this
# file as a script, where a relative import has no package)
untuned_shapes = load_experiment(Path(__file__).with_name("untuned_shapes.py")).module

DATASETS = ()
RECORDS = ("short_prompts",)
CAPTION = ("The public call on batched short prompts (512-4k tokens, D64 and D128, MHA and "
           "GQA, both masks, bf16) against cuDNN as called, per shape: ratios paired by "
           "interleaved round with 95% intervals; dashed: cuDNN. The GPU is named in the "
           "figure's title.")
# the lever searches whose entries these shapes resolve near (folders), in the order they ran
SEARCHES = ("tune_s768", "tune_s1536", "tune_s640")

_CALL = ["--schedule", "persistent+linear", "--tuned", "--api", "--rounds", "10",
         "--per-round", "5"]
BENCH = [
    _CALL + ["--batch", "16", "--heads", "32", "--seqlen", "512", "--head-dim", "64,128"],
    _CALL + ["--batch", "8", "--heads", "32", "--kv-heads", "8", "--seqlen", "1024",
             "--head-dim", "64,128"],
    _CALL + ["--batch", "4", "--heads", "32", "--kv-heads", "8", "--seqlen", "2048,4096",
             "--head-dim", "128"],
    _CALL + ["--batch", "4", "--heads", "32", "--seqlen", "4096", "--head-dim", "64"],
]
# the GPUs the tuned table has entries for, as the devices name themselves
GPUS = {"H100": ("NVIDIA H100 80GB HBM3", 132, 50 << 20), "H200": ("NVIDIA H200", 132, 60 << 20)}


def shapes() -> list[dict]:
    """Every (batch, heads, kv_heads, seqlen, head_dim, causal) the BENCH lists time."""
    out = []
    for args in BENCH:
        opt = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
        heads = int(opt["--heads"])
        for seqlen in opt["--seqlen"].split(","):
            for head_dim in opt["--head-dim"].split(","):
                for causal in (False, True):
                    out.append({"batch": int(opt["--batch"]), "heads": heads,
                                "kv_heads": int(opt.get("--kv-heads", heads)),
                                "seqlen": int(seqlen), "head_dim": int(head_dim),
                                "causal": causal})
    return out


def picks() -> pd.DataFrame:
    """What the tuned table gives each shape on each GPU (the nearest entry, one-wave causal
    launches on 64x64 tiles as the call does): computed here, no GPU."""
    from types import SimpleNamespace

    from wavefront.kernel.tuning import nearest_config
    rows = []
    for gpu, (name, sms, l2) in GPUS.items():
        dev = SimpleNamespace(name=name, sms=sms, l2_bytes=l2)
        for s in shapes():
            q = (s["batch"], s["heads"], s["seqlen"], s["head_dim"])
            kv = (s["batch"], s["kv_heads"], s["seqlen"], s["head_dim"])
            config = nearest_config(q, kv, s["causal"], dev=dev) or {}
            rows.append({"GPU": gpu, **s, "schedule": config.get("schedule"),
                         "tiles": config.get("tiles"), "occupancy": config.get("occupancy"),
                         "levers": ", ".join(f"{k}={v}" for k, v in sorted(config.items())
                                             if k not in ("schedule", "tiles", "occupancy")
                                             and v not in (None, 0, 1))})
    return pd.DataFrame(rows)


def rows(study) -> pd.DataFrame:
    """`untuned_shapes.rows` of this experiment's bench rounds."""
    return untuned_shapes.rows(study, dataset="short_prompts")


def table(study) -> pd.DataFrame:
    """Per GPU and shape (`untuned_shapes.table` of this experiment's rounds): the plain
    default and the public call against cuDNN, the call against FA2 and against the bound
    launcher of the configuration it resolved to (paired by round, 95%)."""
    return untuned_shapes.table(study, dataset="short_prompts")


def summary(data_dir) -> None:
    """Print the table of the rounds under data_dir/short_prompts (after `run`)."""
    from wavefront.report.analysis import Study
    print(table(Study(data_dir)).to_string(index=False))
    print(picks().to_string(index=False))


def _search(study, folder: str) -> tuple[str, str, str]:
    """(the searched shapes, the GPU, the kernel's commit) of a lever search committed with
    this experiment's data (data/short_prompts/<folder>), read from its records."""
    from wavefront.results.records import TUNE_RECORDS, shape_name
    records = study.records(TUNE_RECORDS, "short_prompts", f"{folder}/tune.jsonl")
    rows = [r for file_rows in records.values() for r in file_rows]
    shapes = sorted({shape_name({**r["shape"], "kv_heads": r["shape"].get("kv_heads")})
                    .removesuffix(" causal") for r in rows})
    masks = sorted({"causal" if r["shape"]["causal"] else "full" for r in rows})
    gpus = sorted({short_gpu(r["gpu"]) for r in rows})
    commits = sorted({run["git_commit"][:7] for run in
                      study.manifest(f"short_prompts/{folder}").values()})
    return f"{', '.join(shapes)} ({' and '.join(masks)})", ", ".join(gpus), ", ".join(commits)


def _searched_at(tuned: dict, gpu: str, sh: dict) -> dict | None:
    """The entry of the tuned table (`tuning.load_table()`) searched at exactly this bench
    shape on `gpu`, if there is one."""
    from wavefront.kernel.tuning import entry_key
    key = entry_key(sh["head_dim"], sh["causal"],
                    (sh["batch"], sh["heads"], sh["kv_heads"], sh["seqlen"]))
    return tuned.get(GPUS[gpu][0], {}).get(key)


def in_sample() -> list[tuple[str, dict]]:
    """(GPU, shape) of the bench's shapes that are themselves an entry of the tuned table on
    that GPU (searched there, so not held out)."""
    from wavefront.kernel.tuning import load_table
    tuned = load_table()
    return [(gpu, sh) for gpu in GPUS for sh in shapes() if _searched_at(tuned, gpu, sh)]


def _call_runs(study) -> pd.DataFrame:
    """The public call's rows of every run (the latest and those it replaced), with each
    run's date, oldest first."""
    dates = untuned_shapes._run_dates(study, "short_prompts")
    d = pd.concat([rows(study),
                   untuned_shapes.rows(study, latest=False, dataset="short_prompts")])
    d = d[d["contender"] == "public call"].copy()
    d["date"] = d["run"].map(dates)
    return d.sort_values(["GPU", "date", "shape"]).reset_index(drop=True)


def _counts(c: pd.DataFrame) -> str:
    above = int((c["x cudnn lo"] > 1.0).sum())
    below = int((c["x cudnn hi"] < 1.0).sum())
    return f"above it at {above}, level with it at {len(c) - above - below}, below it at {below}"


def _by_length(gpu: str, full_d128: pd.DataFrame) -> tuple[str, bool]:
    """Where one GPU's D128 shapes without a mask stand against cuDNN, by prompt length, and
    whether that sentence holds: where some reach cuDNN's level (interval reaching 1) and some
    do not, only if length alone separates them (every one that reaches it is longer)."""
    lengths = full_d128["shape"].str.extract(r" S(\d+k?) ")[0]
    tokens = lengths.str.replace("k", "000").astype(int)
    reach = full_d128["x cudnn hi"] >= 1.0
    head = f"on the {gpu} {span(full_d128['x cudnn'], '.2f')}x cuDNN"
    if reach.all():
        return f"{head}, level with it or above at every length", True
    if not reach.any():
        return f"{head}, below it at every length ({_lengths(lengths)} tokens)", True
    return (f"{head}: at {_lengths(lengths[reach])} tokens level with it or above, at "
            f"{_lengths(lengths[~reach])} below it", bool(tokens[reach].min()
                                                         > tokens[~reach].max()))


def shape_name_of(sh: dict) -> str:
    """"B4 H32 KV8 S4k D128 causal", as the bench's tables name a shape."""
    from wavefront.results.records import shape_name
    return shape_name({**sh, "kv_heads": None if sh["kv_heads"] == sh["heads"]
                       else sh["kv_heads"]})


def _names(index) -> str:
    return ", ".join(index) if len(index) else "no shape"


def _entry_config(gpu: str, key: str) -> str:
    """The start of the configuration column's text for a tuned entry
    ("grouped_dynamic+linear [tiles=128x256"), as the bench names what the call resolved to."""
    from wavefront.kernel.tuning import load_table
    entry = load_table()[GPUS[gpu][0]][key]
    return f"{entry['schedule']} [tiles={entry['tiles']}"


def _lengths(labels) -> str:
    """"S512", "S1k" labels -> "512 and 1k" (in order, each once)."""
    names = sorted(set(labels), key=lambda x: int(x.replace("k", "000")))
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def figure(study):
    return untuned_shapes._draw(
        rows(study), "The public call on batched short prompts (512-4k tokens), bf16: ratios "
                     "paired by interleaved round, 95% intervals; dashed: cuDNN")


def section(study) -> Section:
    s = Section()
    d = rows(study)
    call = d[d["contender"] == "public call"]
    runs = _call_runs(study)
    per_gpu, complete = [], True
    for gpu, c in call.groupby("GPU"):
        earlier = runs[(runs["GPU"] == gpu) & (runs["run"] != c["run"].iloc[0])]
        last_before = earlier[earlier["date"] == earlier["date"].max()] if len(earlier) else earlier
        per_gpu.append(f"on the {gpu}, {c['x cudnn'].min():.2f}-{c['x cudnn'].max():.2f}x "
                       f"cuDNN, {_counts(c)}"
                       + (f" (the run before it: {_counts(last_before)})"
                          if len(last_before) else ""))
        complete &= len(c) == len(shapes()) and c["run"].nunique() == 1
    s.claim(f"On {len(shapes())} short-prompt shape-masks the public call runs (median of "
            f"paired rounds; above or below: the 95% interval of the run excludes 1) "
            + "; ".join(per_gpu),
            bool(complete),
            call[["GPU", "shape", "x cudnn", "x cudnn lo", "x cudnn hi"]].to_dict("records"))
    full_d128 = call[call["shape"].str.contains("D128") & ~call["shape"].str.contains("causal")]
    sentences, holds = zip(*(_by_length(gpu, f) for gpu, f in full_d128.groupby("GPU")))
    s.claim(f"The D128 shapes without a mask run {'; '.join(sentences)}", all(holds),
            full_d128[["GPU", "shape", "x cudnn", "x cudnn lo", "x cudnn hi"]]
            .to_dict("records"))
    # Run to run: the latest two runs of a GPU at the same configurations (the spread), then
    # the shapes whose configuration a new tuned entry changed (before and after).
    for gpu, g in runs.groupby("GPU"):
        dates = sorted(g["date"].unique())
        if len(dates) < 2:
            continue
        now = g[g["date"] == dates[-1]].set_index("shape")
        then = g[g["date"] == dates[-2]].set_index("shape").reindex(now.index)
        moved = (now["x cudnn"] - then["x cudnn"]).abs()
        same = bool((now["configuration"] == then["configuration"]).all())
        worst = moved.idxmax()
        outside = int(((now["x cudnn"] < then["x cudnn lo"])
                       | (now["x cudnn"] > then["x cudnn hi"])).sum())
        s.claim(f"On the {gpu} the latest two runs resolved to the same configuration at all "
                f"{len(now)} shape-masks; the call's ratio to cuDNN moved by "
                f"{moved.median():.3f} (median) and up to {moved.max():.3f} ({worst}: "
                f"{then.loc[worst, 'x cudnn']:.3f}, then {now.loc[worst, 'x cudnn']:.3f}), "
                f"and "
                f"{outside} of the later medians lie outside the earlier run's interval: an "
                "interval here is one run's, and runs differ by more",
                same and len(now) == len(shapes()),
                pd.DataFrame({"then": then["x cudnn"], "now": now["x cudnn"]}).round(4)
                .to_dict())
        if len(dates) >= 3:
            first = g[g["date"] == dates[0]].set_index("shape").reindex(now.index)
            changed = then[then["configuration"] != first["configuration"]]
            bigger = [i for i in changed.index
                      if then.loc[i, "x cudnn"] - first.loc[i, "x cudnn"] > moved.max()]
            s.claim(f"On the {gpu}, between its first two runs the tuned table gained the "
                    f"S1536 entry, which changed the configuration at {_names(changed.index)}: "
                    + ", ".join(f"{i} {first.loc[i, 'x cudnn']:.3f} -> "
                                f"{then.loc[i, 'x cudnn']:.3f}" for i in changed.index)
                    + f"; larger than the spread between runs of one configuration "
                      f"({moved.max():.3f}) at {_names(bigger)}",
                    len(changed) > 0 and bool(changed["configuration"].str.contains(
                        _entry_config(gpu, "d128_full_b6_h32_kv8_s1536"), regex=False).all()),
                    pd.DataFrame({"first": first.loc[changed.index, "x cudnn"],
                                  "second": then.loc[changed.index, "x cudnn"]}).round(4)
                    .to_dict())
    searches = [_search(study, folder) for folder in SEARCHES]
    listed = "; ".join(f"{shapes} on the {gpu}, kernel at {commit} "
                       f"(`data/short_prompts/{folder}`)"
                       for folder, (shapes, gpu, commit) in zip(SEARCHES, searches))
    from wavefront.kernel.tuning import entry_shapes, load_table
    tuned = load_table()
    other = {gpu: [shape_name_of(dict(batch=b, heads=h, kv_heads=kv, seqlen=sq, head_dim=128,
                                      causal=False)).removesuffix(" D128")
                   for b, h, kv, sq in entry_shapes(GPUS[gpu][0])]
             for gpu in sorted(set(call["GPU"]))}
    inside = [(gpu, sh) for gpu, sh in in_sample() if gpu in set(call["GPU"])]
    measured = call.set_index(["GPU", "shape"])["x cudnn"]
    searched_here = "".join(
        f" On the {gpu} the bench's {shape_name_of(sh)} is itself a tuned entry (searched at "
        f"that shape, not held out): its search recorded "
        f"{_searched_at(tuned, gpu, sh)['x_cudnn']:.3f}x cuDNN, this bench "
        f"{measured[gpu, shape_name_of(sh)]:.3f}x." for gpu, sh in inside)
    s.text = f"""## Short prompts

Batched prompts of 512-4k tokens, D64 and D128, MHA and GQA, both masks
(`experiments/short_prompts.py`; the public call as users call it, interleaved rounds; the
table shows each GPU's latest run):

{md_table(table(study))}

![short prompts](figures/short_prompts.png)

{". ".join(c.text for c in s.claims)}.

The call's configurations come from the tuned table. Its entries per GPU are lever
searches at {"; ".join(f"{', '.join(v)} on the {gpu}" for gpu, v in other.items())}.
The searches made for these shapes, all on the H200, were placed after runs of them had shown
the D128 shapes without a mask below cuDNN (their shapes are not the bench's, but their
placement is not blind to it): {listed}; the last two each ran in the device call of a run of
these rounds, before it.{searched_here} What the tuned table hands these shapes (its nearest
entry; computed from `wavefront/kernel/tuned.json` as the call resolves it, for the GPUs
measured):

{md_table(picks()[lambda p: p["GPU"].isin(set(call["GPU"]))])}"""
    return s


# Out of the paper until its first data are committed (then listed in APPENDICES).
PAPER_READY = True
until_measured(globals(), PAPER_READY)

if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
