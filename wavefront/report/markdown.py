"""Markdown a report writes: tables from DataFrames, ranges of values. The lowest room of the report, so the
draft and its front matter both use it without importing each other."""
from __future__ import annotations

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
