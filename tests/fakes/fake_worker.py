"""Stands in for `python -m wavefront.worker` in CPU tests: answers timing points at once,
hangs on points whose seqlen is 666, crashes the process on seqlen 999."""
import json
import sys
import time

args = sys.argv[1:]
points = json.load(open(args[args.index("--points") + 1]))
for p in points:
    if p["seqlen"] == 666:
        time.sleep(3600)
    if p["seqlen"] == 999:
        sys.exit(3)
    if p["seqlen"] == 777:
        print(json.dumps({"key": p["key"], "error": "ValueError: planted failure"}), flush=True)
        continue
    print(json.dumps({"key": p["key"], "result": {"median_ms": p["seqlen"] / 1000.0,
                                                   "rel_error": 1e-3, "reps": 3}}), flush=True)
