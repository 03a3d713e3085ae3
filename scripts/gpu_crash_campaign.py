"""The crash campaign on a real GPU: a small timed + profiled sweep is SIGKILLed (with its
process group: the driver, its worker and any ncu child) at random moments and resumed until
it finishes; after every kill the results file must load, and at the end every task must be
stored exactly once and every row seen stored before a kill must still be there.

The CPU suite runs the same campaign against a fake runner (tests/test_store_and_sweep.py);
this one kills real kernel launches, real ncu runs and the worker process between them.

    python scripts/gpu_crash_campaign.py OUT_DIR [--budget-s 240] [--seed 2026]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

SPEC = """
name = "gpu_crash"
measure = ["timing", "counters"]
repeats = 2
[grid]
seqlen = [1024, 2048, 4096]
head_dim = [64, 128]
causal = [false, true]
schedule = ["persistent+linear", "persistent+sawtooth"]
"""
TASKS = 3 * 2 * 2 * 2 * 2 * 2  # points x measurements x repeats


def stored_tasks(results: Path) -> list[tuple]:
    from wavefront.results.store import load_results
    if not results.exists():
        return []
    df = load_results(results)
    return list(zip(df["point"], df["measurement"], df["repeat"].astype(int)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    spec = args.out / "spec.toml"
    spec.write_text(SPEC)
    data = args.out / "sweep"
    results = data / "results.csv"
    rng = random.Random(args.seed)
    start = time.monotonic()
    runs = kills = 0
    seen: set = set()
    log = []
    finished = False
    while time.monotonic() - start < args.budget_s:
        runs += 1
        proc = subprocess.Popen([sys.executable, "-m", "wavefront.cli", "sweep", str(spec),
                                 "--out", str(data)], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The first run compiles; later ones are killed after 2-20 s, mostly mid-measurement.
        wait = rng.uniform(2.0, 20.0) if runs > 1 else rng.uniform(15.0, 40.0)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
        now = stored_tasks(results)  # must load after every kill
        lost = seen - set(now)
        log.append({"run": runs, "killed": proc.returncode == -signal.SIGKILL,
                    "returncode": proc.returncode, "rows": len(now),
                    "lost_since_last": len(lost), "duplicates": len(now) - len(set(now))})
        print(json.dumps(log[-1]), flush=True)
        seen |= set(now)
        if proc.returncode == 0:
            finished = True
            break
    final = stored_tasks(results)
    summary = {"runs": runs, "sigkills": kills, "finished": finished, "tasks": TASKS,
               "stored": len(final), "unique": len(set(final)),
               "lost": len(seen - set(final)),
               "duplicated": len(final) - len(set(final)),
               "lost_after_any_kill": sum(r["lost_since_last"] for r in log)}
    (args.out / "campaign.json").write_text(json.dumps({"summary": summary, "runs": log},
                                                       indent=1))
    print(json.dumps(summary))
    ok = summary["lost"] == 0 and summary["duplicated"] == 0 and summary["lost_after_any_kill"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
