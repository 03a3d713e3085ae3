"""How far the timed model's held-out scores move when its calibration moves by almost nothing
(CPU only; about 16 minutes a nudge on a 2-core machine).

The draft's predictions carry a spread under item_ns x (1 + k x 1e-15)
(`wavefront.report.timed.CALIBRATION_NUDGES`): event times that tie decide which CTA's request
reaches the L2 first. The held-out validation rows, on which the model's error scores rest,
carry none. This re-simulates every validation point with each GPU's item_ns so nudged and
writes, per point, the nudged predictions beside the committed ones, and per GPU and family
the scores (`timed.validation_table`) under each nudge.

    python scripts/validation_sensitivity.py --nudge -1 --out DIR   # one process per nudge
    python scripts/validation_sensitivity.py --nudge 1 --out DIR
    python scripts/validation_sensitivity.py --summarise DIR
"""
import argparse
import dataclasses
from pathlib import Path

import pandas as pd

from wavefront.report import timed
from wavefront.report.analysis import Study

ROOT = Path(__file__).resolve().parents[1]


def nudged_rows(study, k: int) -> pd.DataFrame:
    cals = {g: dataclasses.replace(c, item_ns=c.item_ns * (1 + k * timed.CALIBRATION_NUDGE))
            for g, c in timed.calibrations(study).items()}
    return timed._validation_rows(study, cals)


def summarise(directory: Path, study) -> None:
    base = timed.validation_rows(study)
    keys = ["gpu", "family", "point"]
    print("per GPU and family: DRAM median / p90 and time median of |relative error|, "
          "committed and under each nudge")
    tables = {0: timed.validation_table(study, base)}
    moved = []
    for path in sorted(directory.glob("nudge_*.csv.gz")):
        k = int(path.name.split("_")[1].split(".")[0])
        rows = pd.read_csv(path)
        tables[k] = timed.validation_table(study, rows)
        both = base.merge(rows, on=keys, suffixes=("", "_nudged"))
        for column in ("predicted_dram_bytes", "predicted_ms", "predicted_far_hit_bytes"):
            change = (both[f"{column}_nudged"] / both[column] - 1).abs()
            moved.append({"nudge": k, "prediction": column, "points": len(both),
                          "moved": int((change > 1e-9).sum()),
                          "moved > 1%": int((change > 0.01).sum()),
                          "largest change": float(change.max())})
    scores = pd.concat({k: t.set_index(["GPU", "family"])[["DRAM median", "DRAM p90",
                                                           "time median"]]
                        for k, t in sorted(tables.items())}, axis=1)
    print(scores.round(4).to_string())
    print(pd.DataFrame(moved).to_string(index=False))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nudge", type=int, help="k: item_ns x (1 + k x 1e-15)")
    parser.add_argument("--out", type=Path, help="write nudge_<k>.csv.gz here")
    parser.add_argument("--summarise", type=Path, help="read the nudge files of this folder")
    args = parser.parse_args()
    study = Study(ROOT / "data")
    if args.summarise:
        summarise(args.summarise, study)
        return
    if args.nudge is None or args.out is None:
        parser.error("--nudge and --out, or --summarise")
    args.out.mkdir(parents=True, exist_ok=True)
    nudged_rows(study, args.nudge).to_csv(args.out / f"nudge_{args.nudge}.csv.gz", index=False)


if __name__ == "__main__":
    main()
