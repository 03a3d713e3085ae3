"""What the exposure experiments share: their records as DataFrames, and sawtooth against
linear paired by round with the rounds whose two contenders ran under different clock states
left out (and counted).

A round's pair is kept only where both scans ran with the same throttle state (NVML: a
power/thermal reason seen with the SM clock below 97% of its maximum) and within 2% of each
other's median SM clock: a pair that straddles a clock change compares clocks, not scans. A
round whose co-runner ended before the attention did is dropped too.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from wavefront.report.figures import short_gpu
from wavefront.results.measurement import median_ci95, median_ci95_ranks
from wavefront.results.records import EXPOSURE_RECORDS

CLOCK_TOLERANCE = 0.02


def records(study, dataset: str, pattern: str = "*.jsonl", kind=EXPOSURE_RECORDS,
            with_run: bool = False) -> pd.DataFrame:
    """Every `kind` record of data/<dataset>/ as one DataFrame, with the GPU's short name;
    `with_run`: and the file each came from (`run`: its name without suffixes), for pairing
    within a run."""
    rows = study.records(kind, dataset, pattern)
    frame = pd.DataFrame([{**r, "run": run} if with_run else r
                          for run, file_rows in rows.items() for r in file_rows])
    if "gpu" in frame:
        frame["GPU"] = frame["gpu"].map(short_gpu)
    return frame


def measured(study, dataset: str, kind: str) -> pd.DataFrame:
    """The records of data/<dataset>/ whose `kind` field is `kind` and that did not fail
    (no error), each with the run it came from (`records(with_run=True)`)."""
    d = records(study, dataset, with_run=True)
    d = d[d["kind"] == kind]
    return d[d["error"].isna()] if "error" in d else d


def _same_state(a: pd.Series, b: pd.Series) -> bool:
    if bool(a.get("throttled")) != bool(b.get("throttled")):
        return False
    ca, cb = a.get("sm_clock_mhz"), b.get("sm_clock_mhz")
    if ca is None or cb is None or np.isnan(ca) or np.isnan(cb):
        return True
    return abs(ca - cb) <= CLOCK_TOLERANCE * max(ca, cb)


def paired(rounds: pd.DataFrame, keys: list[str], linear: str, sawtooth: str) -> pd.DataFrame:
    """Per `keys` group: linear's median ms, sawtooth's speed over linear's (linear ms over
    sawtooth ms, > 1: sawtooth faster) paired by round, its 95% interval, the rounds kept, the
    rounds dropped for a clock-state mismatch, the rounds throttled, the median SM clock."""
    out = []
    for key, g in rounds.groupby(keys, sort=True):
        lin = g[g["point"] == linear].set_index("round")
        saw = g[g["point"] == sawtooth].set_index("round")
        common = sorted(set(lin.index) & set(saw.index))
        # a round whose co-runner ended before the attention did is no co-run round (seen: a
        # launch queued behind the co-runner for its whole run, 8x its time)
        ran_beside = [r for r in common if not (bool(lin.loc[r].get("overran"))
                                                or bool(saw.loc[r].get("overran")))]
        kept = [r for r in ran_beside if _same_state(lin.loc[r], saw.loc[r])]
        ratios = [lin.loc[r, "ms"] / saw.loc[r, "ms"] for r in kept]
        lo, hi = median_ci95(ratios) if len(ratios) >= 6 else (np.nan, np.nan)
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        throttled = [r for r in common if bool(lin.loc[r].get("throttled"))
                     or bool(saw.loc[r].get("throttled"))]
        row.update({"linear ms": float(lin.loc[kept, "ms"].median()) if kept
                    else float(lin["ms"].median()) if len(lin) else np.nan,
                    "sawtooth vs linear": float(np.median(ratios)) if ratios else np.nan,
                    "lo": lo, "hi": hi, "rounds": len(kept),
                    "dropped (clock state)": len(ran_beside) - len(kept),
                    "dropped (co-runner ended first)": len(common) - len(ran_beside),
                    "throttled rounds": len(throttled),
                    "SM MHz": float(g["sm_clock_mhz"].median())
                    if g["sm_clock_mhz"].notna().any() else np.nan})
        out.append(row)
    return pd.DataFrame(out)


PRACTICAL_MARGIN = 0.01  # a change under 1% is not counted as one (the scans alone: +-0.05%)
PAYS_BY = 0.05  # sawtooth "pays" where its interval over linear lies above 1 + PAYS_BY


def pays(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows whose interval (lo, hi) of sawtooth over linear lies above 1 + PAYS_BY."""
    return frame[frame["lo"] > 1 + PAYS_BY]


def flat(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows whose interval reaches within PRACTICAL_MARGIN of no change."""
    return frame[(frame["lo"] <= 1 + PRACTICAL_MARGIN) & (frame["hi"] >= 1 - PRACTICAL_MARGIN)]


def paired_alone(study, faster: str, slower: str, **labels) -> pd.DataFrame:
    """exposure_latency's rounds with nothing beside the launch: `faster`'s TFLOP/s over
    `slower`'s (points named 'variant|scan'; both ran in every round), paired by round, per GPU
    (`paired`); `labels` become constant columns beside the GPU."""
    r = records(study, "exposure_latency")
    r = r[(r["kind"] == "round") & (r["environment"] == "alone")].assign(**labels)
    return paired(r, ["GPU", *labels], slower, faster)


def interval_chance(rounds: int) -> float:
    """The chance that a distribution-free interval of the median from `rounds` samples misses
    the true median (median_ci95's order statistics): 1/32 at 6 rounds, not 5%."""
    from scipy.stats import binom
    if not rounds:
        return np.nan
    j, k = median_ci95_ranks(rounds)
    j = max(j, 1)
    return float(1 - (binom.cdf(min(k, rounds) - 1, rounds, 0.5)
                      - binom.cdf(j - 1, rounds, 0.5)))


def multiplicity(table: pd.DataFrame) -> dict:
    """How many intervals exclude no change (and by more than PRACTICAL_MARGIN), against how
    many would by chance if nothing changed. The intervals are not independent (the same
    rounds, policies that act alike), so the chance count is a yardstick, not a test."""
    valid = table.dropna(subset=["lo", "hi"])
    above = int((valid["lo"] > 1).sum())
    below = int((valid["hi"] < 1).sum())
    chance = sum(interval_chance(int(n)) for n in valid["rounds"])
    return {"intervals": len(valid), "above": above, "below": below,
            "above by > 1%": int((valid["lo"] > 1 + PRACTICAL_MARGIN).sum()),
            "below by > 1%": int((valid["hi"] < 1 - PRACTICAL_MARGIN).sum()),
            "expected_by_chance": round(chance, 2)}


def multiplicity_text(m: dict) -> str:
    return (f"sawtooth's interval excludes no change in {m['above']} (above) and {m['below']} "
            f"(below) of {m['intervals']} configurations, by more than 1% in "
            f"{m['above by > 1%']} and {m['below by > 1%']}; with no change anywhere, about "
            f"{m['expected_by_chance']:.1f} would by chance (each interval misses with "
            "probability 1/32 at 6 rounds; the intervals share rounds, so this is a yardstick)")


def interval_text(row) -> str:
    return (f"{row['sawtooth vs linear'] - 1:+.2%} [{row['lo'] - 1:+.2%}, {row['hi'] - 1:+.2%}]"
            if pd.notna(row["lo"]) else "n/a")
