"""Write the timed model's predictions for issue 49's exposure regimes, before they are
measured: paper/exposure_predictions.csv (one row per GPU x regime, linear and sawtooth at the
paper's launch), stamped with the date and the commit the model came from.

    python scripts/exposure_predictions.py [--jobs 2] [--out paper/exposure_predictions.csv]

(`wavefront paper` rewrites paper/predictions.csv from the lock-step model, so these live in a
file of their own that nothing regenerates.)
"""
import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from wavefront.results.predictions import write_predictions  # noqa: E402  (after the path)


def _one(args):
    from wavefront.report.analysis import Study
    from wavefront.report.timed import exposure_prediction, exposure_regimes
    gpu, index = args
    return exposure_prediction(Study(ROOT / "data"), gpu, exposure_regimes(gpu)[index])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "paper" / "exposure_predictions.csv"))
    args = parser.parse_args()
    import click

    from wavefront.report.timed import exposure_regimes
    work = [(g, i) for g in ("h100", "h200") for i in range(len(exposure_regimes(g)))]
    with ProcessPoolExecutor(args.jobs) as pool:
        with click.progressbar(pool.map(_one, work), length=len(work), label="regimes",
                               file=sys.stderr) as bar:
            rows = list(bar)
    table = pd.DataFrame(rows)
    write_predictions(table, args.out, ROOT, ("wavefront",))
    print(table.drop(columns=["predicted_on", "model_commit"]).to_string())


if __name__ == "__main__":
    main()
