"""Why does today's kernel read several times the DRAM bytes of the first kernel on one launch?

B=1 H=1 S=256k D=128, 128x64 tiles, 264 persistent CTAs (two per SM), non-causal: every work
item scans the same 4096 K/V tiles, so the DRAM traffic says how closely the CTAs travel
together through them. Measured on one lent H100 within the hour, ncu, cold L2: the first
kernel (commit 36a0e28, run from `git archive` with its own `profile`) and today's
(`kernel_drift`), today's once more with the work-item tickets of RECORD_ORDER
(`kernel_drift_order`, one-pass counters). The two binaries' SASS is in
data/kernel_drift/sass.json with the commands that read it.

    python experiments/kernel_drift.py run            # on a GPU: today's kernel, both sets
    python experiments/kernel_drift.py plot --out DIR # anywhere: the figure, from data/
    # the first kernel: git archive 36a0e28 wavefront | tar -x -C old_kernel; cd old_kernel;
    # python -m wavefront.cli profile --heads 1 --seqlen 262144 --head-dim 128 --tile 128x64 \
    #     --schedule persistent+linear,persistent+sawtooth --out DIR        (once per repeat)
"""
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from wavefront.report.draft import Section, md_table, wrap
from wavefront.report.experiments import run_as_script
from wavefront.report.figures import short_gpu
from wavefront.results.orders import ORDERS_DIR, load_order

GRID = """
[grid]
batch = [1]
heads = [1]
seqlen = [262144]
head_dim = [128]
tiles = ["128x64"]
"""
SPECS = {
    "kernel_drift": 'name = "kernel_drift"\nmeasure = ["counters"]\nrepeats = 4\n'
                    'timeout_s = 200\n' + GRID
                    + 'schedule = ["persistent+linear", "persistent+sawtooth", "grid+linear"]\n',
    "kernel_drift_order": 'name = "kernel_drift_order"\nmeasure = ["counters"]\n'
                          'record_order = true\nrepeats = 2\nmetric_set = "dram"\n'
                          'timeout_s = 200\n' + GRID + 'schedule = ["persistent+linear"]\n',
}
# The first kernel's data set has no sweep here: its code is not today's (see the docstring).
DATASETS = ("kernel_drift", "kernel_drift_first", "kernel_drift_order")
FIRST = "first kernel (36a0e28)"
TODAY = "today's kernel"


def launches(study) -> pd.DataFrame:
    """Every counter launch of both kernels: DRAM reads against the compulsory bytes and the
    launch's duration under ncu."""
    frames = []
    for dataset, kernel in (("kernel_drift_first", FIRST), ("kernel_drift", TODAY),
                            ("kernel_drift_order", TODAY + ", tickets on")):
        c = study.counters(dataset)
        frames.append(pd.DataFrame({
            "kernel": kernel, "GPU": c["gpu"].map(short_gpu),
            "schedule": c["cta_schedule"] + "+" + c["kv_schedule"],
            "repeat": c["repeat"], "DRAM GB": c["dram_read_bytes"] / 1e9,
            "x compulsory": c["dram_read_bytes"] / c["compulsory_read_bytes"],
            "ncu ms": c["ncu_duration_ns"] / 1e6}))
    return pd.concat(frames, ignore_index=True)


def table(study) -> pd.DataFrame:
    d = launches(study)
    g = d.groupby(["kernel", "schedule"], sort=False)
    return pd.DataFrame({
        "launches": g.size(),
        "DRAM GB (min-max)": g["DRAM GB"].agg(lambda v: f"{v.min():.2f}-{v.max():.2f}"),
        "x compulsory (min-max)": g["x compulsory"].agg(lambda v: f"{v.min():.1f}-{v.max():.1f}"),
        "ms under ncu (min-max)": g["ncu ms"].agg(lambda v: f"{v.min():.1f}-{v.max():.1f}"),
    }).reset_index()


def ticket_rounds(study) -> pd.DataFrame:
    """Per recorded launch: whether every round's items (CTA c's k-th item is item
    k x CTAs + c) end before any item of the next round ends, in ticket order, and the
    launch's DRAM reads."""
    rows = []
    c = study.counters("kernel_drift_order")
    for _, r in c.iterrows():
        directory = study.data_dir / "kernel_drift_order" / ORDERS_DIR
        order = load_order(directory, r["point"], int(r["repeat"]))
        if order is None:
            raise ValueError(f"{directory}: no tickets of repeat {int(r['repeat'])}")
        _, end = order
        ctas = int(r["resident_ctas"])
        rnd = np.arange(len(end)) // ctas
        last = max(rnd)
        separated = all(end[rnd == k].max() < end[rnd == k + 1].min() for k in range(last))
        rows.append({"repeat": int(r["repeat"]), "items": len(end), "rounds": last + 1,
                     "rounds separated": separated, "DRAM GB": r["dram_read_bytes"] / 1e9})
    return pd.DataFrame(rows)


def sass(study) -> dict:
    path = study.data_dir / "kernel_drift" / "sass.json"
    if not path.exists():
        raise ValueError(f"{path}: no SASS record")
    return json.loads(path.read_text())["binaries"]


def figure(study):
    d = launches(study)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, y, label in ((axes[0], "x compulsory", "DRAM reads / compulsory bytes (log)"),
                         (axes[1], "ncu ms", "launch duration under ncu (ms)")):
        # no random jitter: `plot` and `wavefront paper` draw the same bytes
        sns.stripplot(data=d, x="schedule", y=y, hue="kernel", dodge=True, ax=ax, size=6,
                      jitter=False, alpha=0.8)
        ax.set_xlabel("schedule")
        ax.set_ylabel(label)
    axes[0].set_yscale("log")
    axes[1].get_legend().remove()
    gpus = ", ".join(sorted(set(d["GPU"])))
    fig.suptitle(f"{gpus}: B1 H1 S256k D128 bf16, 128x64 tiles, 264 CTAs, non-causal; every "
                 "launch (ncu, cold L2), both kernels in one hour on one GPU")
    fig.tight_layout()
    return fig


def section(study) -> Section:
    s = Section()
    d = launches(study)
    first = d[(d["kernel"] == FIRST) & (d["schedule"] == "persistent+linear")]
    today = d[d["kernel"].str.startswith(TODAY) & (d["schedule"] == "persistent+linear")]
    plain = d[(d["kernel"] == TODAY) & (d["schedule"] == "persistent+linear")]
    ratio = (today["DRAM GB"].min() / first["DRAM GB"].max(),
             today["DRAM GB"].max() / first["DRAM GB"].min())
    t = ticket_rounds(study)
    item_ms = float(plain["ncu ms"].median()) / int(t["rounds"].iloc[0])
    shape = study.counters("kernel_drift").iloc[0]
    tiles = int(shape["seqlen"] // shape["tile_n"])
    b = sass(study)
    old, new = b[next(k for k in b if k.startswith("first"))], b[next(k for k in b if k.startswith("today"))]
    alike = [k for k in ("UTMALDG", "HGMMA", "WARPGROUP.DEPBAR", "registers", "shared_bytes",
                         "local_bytes") if old[k] == new[k]]
    s.claim(f"The difference is the kernel, not the tools or the host: on one H100 within the hour, "
            f"the first kernel read {first['DRAM GB'].min():.2f}-{first['DRAM GB'].max():.2f} "
            f"GB at B1 H1 S256k D128 persistent+linear ({len(first)} launches) and today's "
            f"{today['DRAM GB'].min():.1f}-{today['DRAM GB'].max():.1f} GB ({len(today)} "
            f"launches), {ratio[0]:.0f}-{ratio[1]:.0f}x as much, with the same tools.",
            today["DRAM GB"].min() > 4 * first["DRAM GB"].max(),
            f"first {first['DRAM GB'].tolist()}, today {today['DRAM GB'].tolist()}")
    s.claim(f"Today's kernel is the faster one there: {plain['ncu ms'].min():.1f}-"
            f"{plain['ncu ms'].max():.1f} ms per launch under ncu against "
            f"{first['ncu ms'].min():.1f}-{first['ncu ms'].max():.1f} ms; its traffic is "
            f"{(plain['DRAM GB'] / plain['ncu ms']).max():.2f} TB/s at most, far from DRAM's "
            "limit, so the extra reads cost it nothing measurable.",
            plain["ncu ms"].max() < first["ncu ms"].min(),
            f"today {plain['ncu ms'].tolist()}, first {first['ncu ms'].tolist()}")
    s.claim(f"At work-item granularity today's CTAs still travel together: in both recorded "
            f"launches ({', '.join(f'{g:.1f}' for g in t['DRAM GB'])} GB) every one of the "
            f"{int(t['rounds'].iloc[0])} rounds' items ends before any item of the next round "
            f"ends. The extra traffic therefore arises inside the work items (about {item_ms:.0f} "
            f"ms each), which tickets cannot time: the CTAs spread out along the {tiles}-tile "
            "scan.",
            bool(t["rounds separated"].all()), t.to_dict())
    s.claim("The binaries' K/V loops are alike: the same TMA loads, warpgroup MMAs and their "
            f"waits, registers, shared memory (pipeline stages) and no spills ({', '.join(alike)} "
            "equal); today's adds the work table's loads. What differs is how fast they run, "
            "not what they issue: a model with a clock is what can say why a faster kernel lets "
            "its CTAs spread. Still open.",
            len(alike) == 6 and new["LDG"] > old["LDG"], f"first {old}, today {new}")
    text = wrap(
        "The same launch read 1.27 GB with the first kernel (`data/tiled`) and 10-21 GB with "
        "the table-driven one (`data/tiled_fit`). Re-measured side by side "
        "(`experiments/kernel_drift.py`; the first kernel from commit 36a0e28, run with its own "
        "`profile` on the same GPU in the same hour):")
    s.text = f"""## Why today's kernel reads {ratio[0]:.0f}-{ratio[1]:.0f}x the DRAM of the first one at S=256k

{text}

{md_table(table(study))}

![kernel_drift](figures/kernel_drift.png)"""
    return s


if __name__ == "__main__":  # the same as `wavefront experiment ACTION NAME`
    run_as_script(__file__)
