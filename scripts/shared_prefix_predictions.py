"""Write the LRU replay's DRAM-byte predictions for experiments/shared_prefix.py's batches,
before they are measured: paper/shared_prefix_predictions.csv (one row per GPU x batch x CTA
order), stamped with the date and the commit the model came from.

    python scripts/shared_prefix_predictions.py [--out paper/shared_prefix_predictions.csv]

(Nothing regenerates this file: it is the record of what was predicted before the GPU ran.)
"""
import argparse
import datetime
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "paper" / "shared_prefix_predictions.csv"))
    args = parser.parse_args()
    from experiments.shared_prefix import predictions
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "wavefront/model",
                            "experiments/shared_prefix.py"],
                           capture_output=True, text=True).stdout.strip()
    table = predictions()
    table.insert(0, "predicted_on", datetime.datetime.now(datetime.timezone.utc)
                 .strftime("%Y-%m-%d %H:%M UTC"))
    table.insert(1, "model_commit", commit + ("+uncommitted model" if dirty else ""))
    table.to_csv(args.out, index=False, float_format="%.6g")
    print(table.drop(columns=["predicted_on", "model_commit"]).to_string())


if __name__ == "__main__":
    main()
