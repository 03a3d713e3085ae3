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


def in_sample() -> list[tuple[str, dict]]:
    """(GPU, shape) of the bench's shapes that are themselves an entry of the tuned table on
    that GPU (searched there, so not held out): read from wavefront/kernel/tuned.json."""
    import json
    from wavefront.kernel.tuning import TUNED_TABLE
    table = json.loads(TUNED_TABLE.read_text())
    out = []
    for gpu, (name, _, _) in GPUS.items():
        keys = set(table.get(name, {}))
        for sh in shapes():
            key = (f"d{sh['head_dim']}_{'causal' if sh['causal'] else 'full'}_b{sh['batch']}"
                   f"_h{sh['heads']}_kv{sh['kv_heads']}_s{sh['seqlen']}")
            if key in keys:
                out.append((gpu, sh))
    return out


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
    per_gpu = []
    for gpu, c in call.groupby("GPU"):
        above = c[c["x cudnn lo"] > 1.0]
        below = c[c["x cudnn hi"] < 1.0]
        level = c[(c["x cudnn lo"] <= 1.0) & (c["x cudnn hi"] >= 1.0)]
        per_gpu.append(f"on the {gpu}, {c['x cudnn'].min():.2f}-{c['x cudnn'].max():.2f}x "
                       f"cuDNN: above it (95% interval above 1) at {len(above)}, level with it "
                       f"(interval including 1) at {len(level)}, below it at {len(below)}")
    s.claim(f"On {call['shape'].nunique()} short-prompt shape-masks the public call runs "
            f"(median of paired rounds) " + "; ".join(per_gpu),
            bool(len(call) and ((call["x cudnn lo"] <= call["x cudnn"])
                                & (call["x cudnn"] <= call["x cudnn hi"])).all()),
            call[["GPU", "shape", "x cudnn", "x cudnn lo", "x cudnn hi"]].to_dict("records"))
    full_d128 = call[call["shape"].str.contains("D128") & ~call["shape"].str.contains("causal")]
    sentences, holds = zip(*(_by_length(gpu, f) for gpu, f in full_d128.groupby("GPU")))
    s.claim(f"The D128 shapes without a mask run {'; '.join(sentences)}", all(holds),
            full_d128[["GPU", "shape", "x cudnn", "x cudnn lo", "x cudnn hi"]]
            .to_dict("records"))
    repeat = untuned_shapes.replaced(study, "short_prompts")  # measured in an earlier run too
    repeat = repeat[repeat["contender then"] == "public call"] if len(repeat) else repeat
    if len(repeat):
        moved = (repeat["x cudnn now"] - repeat["x cudnn then"]).abs()
        same = bool((repeat["configuration then"] == repeat["configuration now"]).all())
        worst = repeat.loc[moved.idxmax()]
        gpus = sorted(set(repeat["GPU"]))
        s.claim(f"On the {' and '.join(gpus)}, every shape-mask was measured in two device "
                f"calls, the second after one more tuned entry; the call resolved to the same "
                f"configuration at all {len(repeat)} in both, and its ratio to cuDNN moved by "
                f"{moved.median():.3f} (median) and up to {moved.max():.3f} ("
                f"{worst['shape']}: {worst['x cudnn then']:.3f} then, "
                f"{worst['x cudnn now']:.3f} now): the run-to-run spread of a ratio the table "
                "prints from one run",
                same and len(repeat) == len(call[call["GPU"].isin(gpus)]),
                repeat[["GPU", "shape", "configuration then", "configuration now",
                        "x cudnn then", "x cudnn now"]].to_dict("records"))
    searches = [_search(study, folder) for folder in SEARCHES]
    listed = "; ".join(f"{shapes} on the {gpu}, kernel at {commit} "
                       f"(`data/short_prompts/{folder}`)"
                       for folder, (shapes, gpu, commit) in zip(SEARCHES, searches))
    inside = [(gpu, sh) for gpu, sh in in_sample() if gpu in set(call["GPU"])]
    searched_here = ("Not held out: " + ", ".join(
        f"{shape_name_of(sh)} on the {gpu}" for gpu, sh in inside)
        + " (each an entry of the tuned table, searched at that very shape in an earlier "
          "session)." if inside else "")
    s.text = f"""## Short prompts

Batched prompts of 512-4k tokens, D64 and D128, MHA and GQA, both masks
(`experiments/short_prompts.py`; the public call as users call it, interleaved rounds):

{md_table(table(study))}

![short prompts](figures/short_prompts.png)

{". ".join(c.text for c in s.claims)}. The call's configurations come from the tuned table,
whose entries nearest these shapes came from lever searches at shapes the bench does not time,
so the bench's shapes are held out from them: {listed}. The last two searches each ran in the
device call of a run of these rounds, before it; no run of these shapes without the S1536
entry is committed, so no before/after is claimed. {searched_here} What the tuned table hands these shapes
(its nearest entry; computed from `wavefront/kernel/tuned.json` as the call resolves it, for
the GPUs measured):

{md_table(picks()[lambda p: p["GPU"].isin(set(call["GPU"]))])}"""
    return s


# Out of the paper until its first data are committed (then listed in APPENDICES).
PAPER_READY = True
until_measured(globals(), PAPER_READY)

if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
