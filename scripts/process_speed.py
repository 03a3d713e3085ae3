"""How much the public call's host time depends on the process, and on the CPU it runs on
(GPU host).

The same code ran 1.4x apart in two processes of one device call (torch call at B1 H8 S1k:
11.8 us in one, 16.6-16.8 us in another; data/public_call/da691d0/), and at S1k, where the
call is host-bound, that decides the bench's api/bound ratio. This starts fresh processes one
after another, unpinned or pinned to one CPU (`os.sched_setaffinity` in the child: the
process's own placement, nothing of the host's is changed), and in each times the public call
on torch tensors: median [20%, 80%] of 15 batches of 200 calls, host us, and the CPUs the
process ran on while timing.

    python scripts/process_speed.py [--processes 5] [--cpus 3,9]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def _cpu_now() -> int:
    """The CPU this process last ran on (/proc/self/stat's 39th field)."""
    with open("/proc/self/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[36])


def one() -> dict:
    import time

    import torch

    import wavefront
    q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    for _ in range(100):
        wavefront.attention(q, k, v)
    torch.cuda.synchronize()
    batches, cpus = [], set()
    for _ in range(15):
        began = time.perf_counter()
        for _ in range(200):
            wavefront.attention(q, k, v)
        batches.append((time.perf_counter() - began) / 200 * 1e6)
        cpus.add(_cpu_now())
        torch.cuda.synchronize()
    batches.sort()
    return {"median": statistics.median(batches), "p20": batches[3], "p80": batches[-4],
            "cpus": sorted(cpus)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--cpus", default="3,9", help="CPUs to pin to, one set of runs each")
    parser.add_argument("--one", action="store_true", help="(child) time in this process")
    parser.add_argument("--pin", type=int, default=None, help="(child) the CPU to pin to")
    args = parser.parse_args()
    if args.one:
        if args.pin is not None:
            os.sched_setaffinity(0, {args.pin})
        print(json.dumps(one()))
        return
    print(f"host: {os.cpu_count()} CPUs; allowed {sorted(os.sched_getaffinity(0))}")
    placements = [None] + [int(c) for c in args.cpus.split(",")]
    rows = []
    for n in range(args.processes):
        for pin in placements:  # interleaved, so a drift of the host hits every placement
            cmd = [sys.executable, __file__, "--one"] + ([] if pin is None else
                                                         ["--pin", str(pin)])
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode:
                print(f"process {n} pin {pin}: failed\n{done.stderr[-800:]}")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append((pin, result))
            print(f"process {n}  pinned to {'-' if pin is None else pin:>3}  "
                  f"{result['median']:6.2f} [{result['p20']:6.2f}, {result['p80']:6.2f}] us  "
                  f"ran on CPUs {result['cpus']}", flush=True)
    for pin in placements:
        medians = sorted(r["median"] for p, r in rows if p == pin)
        if medians:
            print(f"pinned to {'-' if pin is None else pin:>3}: medians of {len(medians)} "
                  f"processes {medians[0]:.2f}-{medians[-1]:.2f} us "
                  f"(median {statistics.median(medians):.2f})")


if __name__ == "__main__":
    main()
