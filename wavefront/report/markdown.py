"""Markdown a report writes: tables from DataFrames, ranges of values, printed bounds. The lowest room of the report, so the
draft and its front matter both use it without importing each other."""
from __future__ import annotations

import math

import pandas as pd


def md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def span(values, fmt=".1f") -> str:
    """'lo-hi' of a series of values (one value where both ends print alike)."""
    lo, hi = f"{values.min():{fmt}}", f"{values.max():{fmt}}"
    return lo if lo == hi else f"{lo}-{hi}"


def bound(x: float, decimals: int, percent: bool = True, up: bool = True) -> tuple[str, float]:
    """`x` printed as a bound at `decimals` (rounded up for "at most", down for "at least"), and
    the bound the printed text states, read back from it: a claim checks the data against
    what the sentence says, not against the unrounded value (give or take a part in 10^9, the
    float error of 0.99 - 1 against 0.01)."""
    scale = 10 ** (decimals + (2 if percent else 0))
    step = math.ceil if up else math.floor
    value = step(round(x * scale, 6)) / scale
    text = f"{value:.{decimals}%}" if percent else f"{value:.{decimals}f}"
    return text, float(text.rstrip("%")) / (100 if percent else 1) * (1 + (1e-9 if up else -1e-9))


def change_with_range(median: float, lo: float, hi: float) -> str:
    """'+7.8% [+1.7%, +9.1%]': a relative change and its range."""
    return f"{median:+.1%} [{lo:+.1%}, {hi:+.1%}]"
