"""What every figure shares: the theme (`style`), the axes helpers (S and log axes, GPU and
schedule labels), the one figure two experiments draw (`misses_vs_seqlen`), the readability floor
(MIN_FONT_PT) and `save`. Each experiment draws its own figure in its own file.

Every figure names the GPU(s) and the configuration in its title and has units on its axes.
Draw inside `style()` (the one theme, set per figure, not at import); `save` writes a PNG
into the directory it is given (`pdf=True` adds a vector copy for a manuscript; the repository
keeps the paper's PNGs only, because everything it holds travels to the GPU hosts under a 64 MiB
limit).
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
    colours rather than 64: 11% less; the series stay apart, a little duller). The palette is
    chosen by maximum coverage, not median cut: median cut gave the phase diagram's small red
    region no colour of its own (a pixel off by 293 of 765 in RGB, drawn grey), maximum
    coverage keeps every pixel within 68 there and within 50 on the line plots tried, at
    about the same size."""
    import io

    from PIL import Image
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    image.quantize(colors=32, method=Image.Quantize.MAXCOVERAGE).save(path, format="PNG",
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


