#!/usr/bin/env python3
"""Stands in for `ncu` in CPU tests. `--export R ... program` runs the program and writes R as
the CSV `ncu --import R --csv --page raw --print-nvtx-rename kernel` would print, one row per
kernel the program says it launched, named by its NVTX tag; `--import R` prints it back.

Each task's dram__bytes_read is 1000 x its seqlen, so a test can tell whose counters a row got.
FAKE_NCU_MODE plants faults: drop-middle (the middle task's kernels are missing), reorder
(rows reversed), untagged (no NVTX names), silent (exit 0, no output, no report)."""
import csv
import io
import json
import os
import subprocess
import sys

MARK = "@@wavefront "
METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum",
           "lts__t_sectors_srcunit_tex_op_read.sum",
           "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum",
           "lts__t_sectors_srcunit_ltcfabric_op_read_lookup_hit.sum", "gpu__time_duration.sum"]
args = sys.argv[1:]
if "--import" in args:
    sys.stdout.write(open(args[args.index("--import") + 1]).read())
    sys.exit(0)
mode = os.environ.get("FAKE_NCU_MODE", "ok")
if mode == "silent":
    sys.exit(0)
report = args[args.index("--export") + 1]
program = args[args.index("--force-overwrite") + 1:]
tasks = json.load(open(program[program.index("--points") + 1]))
seqlen = {t["tag"]: t["seqlen"] for t in tasks}
out = subprocess.run(program, capture_output=True, text=True)
sys.stdout.write(out.stdout)
rows = []
for line in out.stdout.splitlines():
    if line.startswith(MARK):
        msg = json.loads(line[len(MARK):])
        if msg.get("launched"):
            for k in range(msg["kernels"]):
                s = seqlen[msg["tag"]]
                rows.append([msg["tag"] if mode != "untagged" else "flash_attention_fwd_x",
                             s * 1000.0, 10.0, s * 3.0, s * 2.0, s * 1.0, 5000.0])
if mode == "drop-middle" and len(tasks) >= 3:
    middle = tasks[len(tasks) // 2]["tag"]
    rows = [r for r in rows if r[0] != middle]
if mode == "reorder":
    rows.reverse()
buf = io.StringIO()
w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
w.writerow(["ID", "Kernel Name", *METRICS])
w.writerow(["", "", "byte", "byte", "sector", "sector", "sector", "nsecond"])
for i, r in enumerate(rows):
    w.writerow([str(i), *[f"{x:,.0f}" if isinstance(x, float) else x for x in r]])
with open(report, "w") as f:
    f.write(buf.getvalue())
sys.exit(out.returncode)
