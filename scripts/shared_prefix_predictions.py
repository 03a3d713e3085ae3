"""Write the LRU replay's DRAM-byte predictions for experiments/shared_prefix.py's batches,
before they are measured: paper/shared_prefix_predictions.csv (one row per GPU x batch x CTA
order), stamped with the date and the commit the model came from.

    python scripts/shared_prefix_predictions.py [--out paper/shared_prefix_predictions.csv]

(Nothing regenerates this file: it is the record of what was predicted before the GPU ran.)
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from wavefront.results.predictions import write_predictions  # noqa: E402  (after the path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "paper" / "shared_prefix_predictions.csv"))
    args = parser.parse_args()
    from experiments.shared_prefix import predictions
    table = predictions()
    write_predictions(table, args.out, ROOT, ("wavefront/model", "experiments/shared_prefix.py"))
    print(table.drop(columns=["predicted_on", "model_commit"]).to_string())


if __name__ == "__main__":
    main()
