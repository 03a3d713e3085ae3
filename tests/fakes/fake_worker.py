"""Stands in for `python -m wavefront.measure.worker` in CPU tests.

Timing: answers at once, except seqlen 666 (hangs silently), 555 (hangs while printing every
0.1 s, so only a wall-clock timeout catches it), 999 (the process exits 3), 777 (a planted
failure), 888 (a wrong result, as the real worker reports it). Stray stdout lines, including one
that starts with '{', are printed before every answer. Counters: reports each task launched,
under its NVTX tag, with 2 kernels for the tiled schedule.
"""
import json
import os
import sys
import time

if os.environ.get("FAKE_WORKER_PIDFILE"):
    with open(os.environ["FAKE_WORKER_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))

MARK = "@@wavefront "
args = sys.argv[1:]
mode = args[args.index("--mode") + 1]
points = json.load(open(args[args.index("--points") + 1]))
for p in points:
    ident = {"key": p["point"], "repeat": p.get("repeat", 0), "tag": p.get("tag")}
    print('{"not": "a result"}', flush=True)
    print("some library chatter", flush=True)
    if mode == "counters":
        kernels = 2 if p["kv_schedule"] == "tiled" else 1
        print(MARK + json.dumps({**ident, "launched": True, "kernels": kernels}), flush=True)
        continue
    if p["seqlen"] == 666:
        time.sleep(3600)
    if p["seqlen"] == 555:
        while True:
            print("still working", flush=True)
            time.sleep(0.1)
    if p["seqlen"] == 999:
        sys.exit(3)
    if p["seqlen"] == 777:
        print(MARK + json.dumps({**ident, "error": "ValueError: planted failure"}), flush=True)
        continue
    if p["seqlen"] == 888:
        print(MARK + json.dumps({**ident, "error": "IncorrectResult: relative error 0.5 "
                                 "against float32 is not below 0.01"}), flush=True)
        continue
    time.sleep(float(args[args.index("--delay") + 1]) if "--delay" in args
               else float(os.environ.get("FAKE_WORKER_DELAY", "0")))
    print(MARK + json.dumps({**ident, "result": {"median_ms": p["seqlen"] / 1000.0,
                                                 "rel_error": 1e-3, "reps": 3}}), flush=True)
