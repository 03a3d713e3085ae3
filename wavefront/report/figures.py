"""Paper figures: one function per figure, tidy DataFrame in, seaborn figure out.

Every figure names the GPU(s) and the configuration in its title and has units on its axes.
Draw inside `style()` (the one theme, set per figure, not at import); `save` writes a PNG
into the directory it is given (`pdf=True` adds a vector copy for a manuscript; the repository
keeps PNGs only, because everything it holds travels to the GPU hosts under a 64 MiB limit).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from wavefront.point import SECTOR_BYTES
from wavefront.results.measurement import SPREAD_FLAG, spread


@contextlib.contextmanager
def style():
    """The figures' theme for the figures drawn inside, restored afterwards; nothing is set at
    import."""
    with plt.rc_context():
        sns.set_theme(style="whitegrid", context="paper", font_scale=1.1)
        yield


def seqlen_axis(ax, seqlens) -> None:
    """Log-x axis with one tick per measured length, labelled 16k, 128k, ..."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    ticks = sorted({int(x) for x in seqlens})
    if len(ticks) > 7:
        ticks = [t for t in ticks if t & (t - 1) == 0] or ticks  # powers of two
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1024:g}k"))


def plain_log(axis, ticks=None) -> None:
    """A log-scale axis (`ax.xaxis` or `ax.yaxis`) labelled in plain numbers: ticks at 1, 2, 5
    per decade, or at `ticks`."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator
    axis.set_major_locator(FixedLocator(ticks) if ticks is not None
                           else LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def short_gpu(name: str) -> str:
    return "H100" if "H100" in name else "H200" if "H200" in name else name


def schedule_label(df: pd.DataFrame) -> pd.Series:
    return df["cta_schedule"] + "+" + df["kv_schedule"]


# The smallest text a figure may carry, in points at the figure's own size.
MIN_FONT_PT = 9.0


def small_text(fig) -> list[tuple[str, float]]:
    """(text, size) of every visible text in `fig` smaller than MIN_FONT_PT."""
    from matplotlib.text import Text
    found = []
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_FONT_PT - 1e-6:
            found.append((t.get_text()[:40], float(t.get_fontsize())))
    return found


def save(fig, name: str, directory, pdf: bool = False) -> list[Path]:
    """Write `fig` as `name`.png (and .pdf) into `directory`, every text at MIN_FONT_PT or
    more (a figure must stay readable in print: smaller text is raised to it)."""
    from matplotlib.text import Text
    for t in fig.findobj(Text):
        if t.get_fontsize() < MIN_FONT_PT:
            t.set_fontsize(MIN_FONT_PT)
    if small_text(fig):  # cannot happen: a guard against a matplotlib that ignores sizes
        raise ValueError(f"figure {name}: text under {MIN_FONT_PT:g} pt: {small_text(fig)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "pdf") if pdf else ("png",):
        path = directory / f"{name}.{ext}"
        if ext == "png":
            _save_png(fig, path)
        else:  # no creation date: regenerating from the same data gives the same file
            fig.savefig(path, bbox_inches="tight", metadata={"CreationDate": None})
        paths.append(path)
    plt.close(fig)
    return paths


def _save_png(fig, path: Path) -> None:
    """80 dpi, reduced to a 32-colour palette: plots have few colours (a palette's anti-aliased
    edges are what the rest of it went to), and small files copy fast (they were committed
    until the repository's 4 MB left them out; 5x smaller than full colour,
    deterministic; 80 dpi rather than 90: 14% less, still 1100 pixels across the widest; 32
    colours rather than 64: 11% less; the series stay apart, a little duller)."""
    import io

    from PIL import Image
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    image.quantize(colors=32, method=Image.Quantize.MEDIANCUT).save(path, format="PNG",
                                                                     optimize=True)


def _flagged(d: pd.DataFrame, y: str) -> pd.DataFrame:
    """Points (GPU, point) whose repeats of `y` spread more than SPREAD_FLAG, at their median."""
    g = d.groupby(["GPU", "point"])
    s = g[y].agg(spread)
    med = g.agg(**{y: (y, "median"), "seqlen": ("seqlen", "first"),
                   "head_dim": ("head_dim", "first")})
    return med[s > SPREAD_FLAG].reset_index()


def misses_vs_seqlen(df: pd.DataFrame, predicted: pd.DataFrame | None = None,
                     model_note: str = "model"):
    """DRAM read bytes / compulsory reads against S, per schedule: the median of the repeats,
    the band their range; points whose repeats disagree by more than 10% ringed in red;
    `predicted` dotted, `model_note` saying what it is (fitted in sample or not)."""
    d = df.copy()
    d["schedule"] = schedule_label(d)
    d["x compulsory"] = d["dram_read_sectors"] * SECTOR_BYTES / d["compulsory_read_bytes"]
    d["GPU"] = d["gpu"].map(short_gpu)
    d["mask"] = np.where(d["causal"], "causal", "non-causal")
    g = sns.relplot(data=d, x="seqlen", y="x compulsory", hue="schedule", style="mask",
                    col="head_dim", row="GPU", kind="line", marker="o", height=3.0, aspect=1.3,
                    estimator="median", errorbar=("pi", 100), facet_kws={"sharey": False})
    flagged = _flagged(d, "x compulsory")
    for (gpu, hd), ax in g.axes_dict.items():
        f = flagged[(flagged["GPU"] == gpu) & (flagged["head_dim"] == hd)]
        ax.scatter(f["seqlen"], f["x compulsory"], s=90, facecolors="none", edgecolors="red",
                   lw=1.2, zorder=5)
    if predicted is not None:
        for (gpu, hd), ax in g.axes_dict.items():
            p = predicted[(predicted["GPU"] == gpu) & (predicted["head_dim"] == hd)]
            for sched, sub in p.groupby("schedule"):
                ax.plot(sub["seqlen"], sub["x compulsory"], ls=":", color="k", lw=1)
    g.set(xscale="log", yscale="log")
    for ax in g.axes.flat:
        seqlen_axis(ax, d["seqlen"])
        plain_log(ax.yaxis)
    g.set_axis_labels("sequence length S (tokens)", "DRAM read bytes / compulsory")
    reps = d.groupby(["GPU", "point"]).size()
    n = f"{reps.min()}" if reps.min() == reps.max() else f"{reps.min()}-{reps.max()}"
    g.figure.suptitle(f"DRAM reads vs S, B=1 H=1 bf16, {_tiles(d)} tiles, "
                      f"{' and '.join(sorted(d['GPU'].unique()))}\n{n} repeats per point: median "
                      "and range; red ring: repeats disagree > 10%"
                      + (f"; dotted: {model_note}" if predicted is not None else ""), y=1.07)
    return g.figure


def _tiles(d):
    return ", ".join(sorted({f"{m}x{n}" for m, n in zip(d["tile_m"], d["tile_n"])}))


def sectors_vs_closed_form(df: pd.DataFrame):
    d = df.copy()
    d["GPU"] = d["gpu"].map(short_gpu)
    d["schedule"] = schedule_label(d)
    d["mask"] = np.where(d["causal"], "causal", "non-causal")
    g = sns.relplot(data=d, x="seqlen", y="read_sectors_ratio", hue="mask", style="GPU",
                    col="head_dim", kind="line", marker="o", errorbar=("pi", 100), height=3.0,
                    aspect=1.3)
    g.set(xscale="log")
    for ax in g.axes.flat:
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        seqlen_axis(ax, d["seqlen"])
    g.set_axis_labels("sequence length S (tokens)",
                      "SM-side L2 read sectors / closed form")
    g.figure.suptitle("Measured L2 read sectors against the closed-form count (band: spread "
                      "over the 4 schedules), B=1 H=1 bf16 128x64", y=1.03)
    return g.figure


def tile_size(joined: pd.DataFrame):
    """`joined`: counter rows with their timing (`records.with_timing`)."""
    d = joined.copy()
    d["GPU"] = d["gpu"].map(short_gpu)
    # Each tile shape runs at its own default occupancy: the label says which, so a reader
    # does not take an occupancy effect for a tile effect.
    d["tiles"] = (d["tile_m"].astype(str) + "x" + d["tile_n"].astype(str) + "\n"
                  + d["occupancy"].astype(str) + " CTA/SM")
    d["x compulsory"] = d["dram_read_bytes"] / d["compulsory_read_bytes"]
    d["D"] = "D=" + d["head_dim"].astype(str)
    d["GPU, K/V scan"] = d["GPU"] + ", " + d["kv_schedule"]
    long = pd.concat([d.assign(metric="DRAM reads / compulsory", value=d["x compulsory"]),
                      d.assign(metric="TFLOP/s (useful FLOPs)", value=d["tflops"])],
                     ignore_index=True)
    g = sns.catplot(data=long, x="tiles", y="value", hue="GPU, K/V scan", col="D",
                    row="metric", kind="bar", height=2.8, aspect=1.4,
                    sharey="row", estimator="median", errorbar=("pi", 100), palette="deep",
                    dodge=True)
    for (metric, _), ax in g.axes_dict.items():
        ax.set_ylabel(metric)
        if metric.startswith("DRAM"):
            ax.set_yscale("log")
    g.set_titles("{col_name}")
    g.set_xlabels("tile (Q rows x K/V rows), CTAs per SM")
    g.figure.suptitle("Tile size, persistent grid, S=128k B=1 H=1 bf16, "
                      f"{' and '.join(sorted(d['GPU'].unique()))}; bars median, whiskers range "
                      "over repeats", y=1.04)
    return g.figure


def tiled_vs_scans(joined: pd.DataFrame):
    """`joined`: counter rows with their timing (`records.with_timing`)."""
    d = joined.copy()
    d["GPU"] = d["gpu"].map(short_gpu)
    d["x min"] = d["dram_read_bytes"] / d["compulsory_read_bytes"]
    d["config"] = ("D" + d["head_dim"].astype(str) + np.where(d["causal"], " causal", "")
                   + " S" + (d["seqlen"] // 1024).astype(str) + "k")
    fig, axes = plt.subplots(2, 2, figsize=(12, 6.5), sharey="row")
    for col, gpu in enumerate(sorted(d["GPU"].unique())):
        sub = d[d["GPU"] == gpu]
        sns.barplot(data=sub, x="config", y="x min", hue="kv_schedule", ax=axes[0, col],
                    estimator="median", errorbar=("pi", 100))
        axes[0, col].set(yscale="log", ylabel="DRAM reads / minimum (log)", xlabel="",
                         title=f"{gpu}: DRAM reads / (Q, K, V once + partial states)")
        sns.barplot(data=sub, x="config", y="tflops", hue="kv_schedule", ax=axes[1, col],
                    estimator="median", errorbar=("pi", 100), legend=False)
        axes[1, col].set(ylabel="TFLOP/s", xlabel="configuration (B=1 H=1 bf16, persistent)")
        for ax in axes[:, col]:
            plt.setp(ax.get_xticklabels(), rotation=40, ha="right", rotation_mode="anchor")
    repeats = int(d.groupby("point")["repeat"].nunique().min()) if "repeat" in d else 1
    fig.suptitle("Tiled K/V vs linear and sawtooth at long lengths (64x64 tiles at D=64, "
                 f"128x64 at D=128); bars median, whiskers range over {repeats} repeats")
    fig.tight_layout()
    return fig


def headline_pairs(h: pd.DataFrame):
    """`h`: `report.analysis.headline_pairs`. DRAM reads and TFLOP/s, sawtooth vs linear, with
    the range over repeats; flagged rows marked."""
    d = h.copy()
    d["label"] = d["configuration"] + np.where(d["flag"] != "", "  (!)", "")
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(d) + 1.8), sharey=True)
    for gpu, sub in d.groupby("GPU"):
        y = np.arange(len(d))[d["GPU"].to_numpy() == gpu]
        x = sub["DRAM reads, sawtooth vs linear"].to_numpy() * 100
        err = np.vstack([x - sub["range lo"].to_numpy() * 100, sub["range hi"].to_numpy() * 100 - x])
        axes[0].errorbar(x, y, xerr=err, fmt="o", capsize=3, label=gpu)
        axes[1].plot(sub["TFLOP/s, sawtooth vs linear"].to_numpy() * 100, y, "o", label=gpu)
    for ax in axes:
        ax.axvline(0, color="k", lw=0.8)
    axes[0].set_yticks(np.arange(len(d)), d["label"])
    from matplotlib.ticker import MaxNLocator
    axes[1].xaxis.set_major_locator(MaxNLocator(6))
    axes[0].set_xlabel("DRAM reads, sawtooth vs linear (%; bar: range)")
    axes[1].set_xlabel("TFLOP/s, sawtooth vs linear (%; medians)")
    axes[0].legend(title="GPU")
    fig.suptitle("Headline configurations on H100 SXM and H200, bf16, "
                 f"{h['repeats'].iloc[0].split('+')[0]} repeats each "
                 "((!): repeats disagree by more than 10%)")
    fig.tight_layout()
    return fig


def scaling(p: pd.DataFrame, wall_one: float, wall_two: float):
    """`p`: per point, the median on one GPU and on two (`experiments/scaling.py`)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, (metric, sub) in zip(axes, p.groupby("metric")):
        ax.scatter(sub["one"], sub["two"], s=18)
        lo, hi = min(sub["one"].min(), sub["two"].min()), max(sub["one"].max(), sub["two"].max())
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
        scale = "log" if metric.startswith("DRAM") else "linear"
        ax.set(xscale=scale, yscale=scale, xlabel=f"{metric}, one GPU (median of 3)",
               ylabel=f"{metric}, two GPUs (median of 3)")
    fig.suptitle(f"H200 x2: knee sweep (216 tasks) on one GPU in {wall_one:.0f} s and on two "
                 f"in {wall_two:.0f} s ({wall_two / wall_one:.2f}x); a dot per point ({len(p) // 2})")
    fig.tight_layout()
    return fig



def schedule_cost(d: pd.DataFrame):
    """Every schedule's speed against grid+linear of the same rounds (paired by round, 95%
    interval) at B=1 H=32 S=8k, per shape (columns) and bench run (rows); dashed: cuDNN."""
    d = d[d["shape"].str.startswith("B1 H32 S8k") & ~d["schedule"].str.contains(r"\[")]
    runs = list(dict.fromkeys(d["run"]))
    shapes = list(dict.fromkeys(d["shape"]))
    order = list(dict.fromkeys(d["schedule"]))  # the bench's order, the same in every panel
    where = {name: i for i, name in enumerate(order)}
    with style():
        fig, axes = plt.subplots(len(runs), len(shapes), figsize=(3.3 * len(shapes) + 1.5,
                                                                 2.9 * len(runs) + 0.8),
                                 sharey=True, squeeze=False)
        for i, run in enumerate(runs):
            for j, shape in enumerate(shapes):
                ax = axes[i][j]
                sub = d[(d["run"] == run) & (d["shape"] == shape)]
                y = sub["schedule"].map(where).to_numpy()
                colors = np.where(sub["schedule"].str.endswith("sawtooth"), "tab:orange",
                                  "tab:blue")
                ax.errorbar(sub["vs grid"], y, xerr=[sub["vs grid"] - sub["vs grid lo"],
                                                     sub["vs grid hi"] - sub["vs grid"]],
                            fmt="none", ecolor="gray", capsize=2)
                ax.scatter(sub["vs grid"], y, c=colors, zorder=3, s=18)
                grid_vs_cudnn = sub.loc[sub["schedule"] == "grid+linear", "vs cudnn"]
                if len(grid_vs_cudnn):
                    ax.axvline(1 / float(grid_vs_cudnn.iloc[0]), color="k", ls="--", lw=1)
                ax.axvline(1.0, color="gray", lw=0.8)
                ax.set_yticks(range(len(order)))
                ax.set_yticklabels(order, fontsize=9)
                gpu = sub["GPU"].iloc[0] if len(sub) else ""
                ax.set_title(f"{gpu} {shape.replace('B1 H32 S8k ', '')}, {run}", fontsize=9)
                ax.set_xlabel("speed vs grid+linear", fontsize=9)
        fig.suptitle("What a schedule costs by itself (table-driven kernel, B=1 H=32 S=8k bf16, "
                     "K/V in L2): speed vs grid+linear paired by interleaved round, 95% "
                     "intervals; blue linear, orange sawtooth, dashed cuDNN", fontsize=9)
        fig.tight_layout()
    return fig


def varlen_batches(d: pd.DataFrame, title: str):
    """TFLOP/s (median, 95% interval) of each contender on one packed batch, one panel per
    mask; wavefront's calls in blue, torch's paths in grey."""
    contenders = list(dict.fromkeys(d["contender"]))
    with style():
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 0.36 * len(contenders) + 1.7),
                                 sharey=True)
        for ax, causal in zip(axes, (False, True)):
            sub = d[d["causal"] == causal].set_index("contender").reindex(contenders)
            y = np.arange(len(contenders))
            colors = ["tab:blue" if c.startswith("wavefront") else "tab:gray"
                      for c in contenders]
            ax.barh(y, sub["TFLOP/s"], color=colors, height=0.6)
            ax.errorbar(sub["TFLOP/s"], y, xerr=[sub["TFLOP/s"] - sub["lo"],
                                                  sub["hi"] - sub["TFLOP/s"]],
                        fmt="none", ecolor="k", capsize=2, lw=1)
            ax.set_yticks(y)
            ax.set_yticklabels(contenders, fontsize=9)
            ax.set_title("causal" if causal else "non-causal", fontsize=9)
            ax.set_xlabel("TFLOP/s (useful; median, 95% interval)")
        axes[0].invert_yaxis()
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
    return fig


def untuned_shapes(d: pd.DataFrame):
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
        fig.suptitle("The public call on shapes absent from the tuned table (held out), bf16: "
                     "ratios paired by interleaved round, 95% intervals; dashed: cuDNN",
                     fontsize=9)
        fig.tight_layout()
    return fig


def carry_over(d: pd.DataFrame):
    """Per held-out shape-mask, one row of panels per GPU: the configuration the measured
    carry-over chose against the one "nearest" takes (paired by round, 95% interval), and the
    public call against cuDNN."""
    shapes = list(dict.fromkeys(d["shape"]))
    gpus = sorted(set(d["GPU"]))
    with style():
        fig, axes = plt.subplots(len(gpus), 2, figsize=(11.5, len(gpus) * (0.36 * len(shapes)
                                                                              + 1.2) + 0.6),
                                 sharey=True, sharex="col", squeeze=False)
        for row, gpu in zip(axes, gpus):
            sub = d[d["GPU"] == gpu]
            y = sub["shape"].map({s: i for i, s in enumerate(shapes)})
            ax = row[0]
            for differs, color, label in ((True, "tab:blue", "chose another configuration"),
                                          (False, "tab:gray", "chose the nearest's")):
                part = sub["differs"] == differs
                ax.errorbar(sub["chosen vs nearest"][part], y[part],
                            xerr=[(sub["chosen vs nearest"] - sub["lo"])[part],
                                  (sub["hi"] - sub["chosen vs nearest"])[part]],
                            fmt="o", ms=4, capsize=2, color=color, label=label)
            ax.axvline(1.0, color="k", ls="--", lw=1)
            ax.set_title(f"{gpu}: measured choice vs 'nearest'", fontsize=9)
            ax.legend(fontsize=9, loc="lower right")
            ax = row[1]
            ax.errorbar(sub["call x cudnn"], y, xerr=[sub["call x cudnn"] - sub["call x cudnn lo"],
                                                      sub["call x cudnn hi"] - sub["call x cudnn"]],
                        fmt="o", ms=4, capsize=2, color="tab:orange", label="public call")
            ax.axvline(1.0, color="k", ls="--", lw=1)
            ax.set_xscale("log")
            plain_log(ax.xaxis, ticks=[0.9, 1.0, 1.2, 1.5, 2.0, 3.0])
            ax.set_title(f"{gpu}: the call, measured carry-over", fontsize=9)
            row[0].set_yticks(range(len(shapes)))
            row[0].set_yticklabels(shapes, fontsize=9)
        axes[0][0].invert_yaxis()
        axes[-1][0].set_xlabel("chosen / nearest's configuration, time ratio (> 1: faster)")
        axes[-1][1].set_xlabel("public call / cuDNN, time ratio (> 1: faster; log)")
        fig.suptitle("Measured carry-over on held-out shapes, bf16: 15 interleaved rounds x 5 "
                     "launches, ratios paired by round, 95% intervals", fontsize=9)
        fig.tight_layout()
    return fig


