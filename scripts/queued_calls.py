"""Do queued calls come out as the same calls made alone? (GPU host; torch.)

Two ways a call's launch can run while something else has changed what it reads:
- **two streams at once**: calls of one shape queued on two side streams, each stream its own
  inputs; a launcher's dynamic schedules keep an item counter and its tiled schedules partial
  states on the GPU, which the streams would share;
- **a dropped launcher**: calls queued behind half a second of GPU work whose launchers are
  dropped before they run (made for one call that cannot be cached, tiles given as a list; or
  evicted from a cache of two by four configurations of one shape), while the next launchers
  build their work tables.

Each case makes its calls alone first (the reference), then queued, and counts the queued
calls whose output differs from the reference by any bit. Each case runs in a process of its
own, so a case that crashes the context is recorded as failed and the rest go on.

    python scripts/queued_calls.py --out DIR [--label TREE] [--rounds 12]
"""
import argparse
import json
import subprocess
import sys

from wavefront.measure.sink import JsonlSink

# name -> (how the calls are queued, causal, schedule, cu_seqlens: None (dense), "gpu", "host")
CASES = {
    "causal, tuned (grouped_dynamic)": ("two streams", True, None, None),
    "non-causal, tuned (persistent)": ("two streams", False, None, None),
    "non-causal, dynamic+linear": ("two streams", False, "dynamic+linear", None),
    "non-causal, persistent+tiled": ("two streams", False, "persistent+tiled", None),
    "varlen causal, cu_seqlens on the GPU": ("two streams", True, None, "gpu"),
    "varlen causal, host cu_seqlens": ("two streams", True, None, "host"),
    "dropped: no cache key (tiles as a list)": ("dropped", None, None, None),
    "dropped: evicted (a cache of 2)": ("dropped", None, None, None),
}
SHAPE = (4, 32, 4096, 128)  # two-streams dense cases: B4 H32 S4k D128
PACKED = (16384, 32, 128)  # varlen cases: 4 sequences, 32 heads, D128
DROPPED_SHAPE = (2, 16, 4096, 128)  # dropped cases: B2 H16 S4k D128, 128x128 tiles


def _randn(shape):
    import torch
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def two_streams(causal, schedule, packed, rounds: int):
    """-> (the outputs of each input set's call alone, of the calls queued on two streams)."""
    import torch

    from wavefront.api import attention, attention_varlen
    if packed is None:
        input_sets = [[_randn(SHAPE) for _ in range(3)] for _ in range(2)]

        def call(q, k, v):
            return attention(q, k, v, causal=causal, schedule=schedule)
    else:
        bounds = [0, 3000, 3100, 9000, PACKED[0]]
        cu = (torch.tensor(bounds, dtype=torch.int32, device="cuda") if packed == "gpu"
              else bounds)
        input_sets = [[_randn(PACKED) for _ in range(3)] for _ in range(2)]

        def call(q, k, v):
            return attention_varlen(q, k, v, cu, cu, causal=causal, schedule=schedule)
    alone = [call(*inputs).clone() for inputs in input_sets]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in input_sets]
    together = []
    for _ in range(rounds):
        for stream, inputs in zip(streams, input_sets):
            with torch.cuda.stream(stream):
                together.append(call(*inputs))
    torch.cuda.synchronize()
    return alone, together


def dropped(name: str, rounds: int):
    """-> (each configuration's output alone, the calls queued behind a sleep, configurations
    in turn)."""
    import torch

    from wavefront.api import attention
    from wavefront.kernel import launcher
    q, k, v = (_randn(DROPPED_SHAPE) for _ in range(3))
    configs = [(causal, schedule) for schedule in ("persistent+linear", "persistent+sawtooth")
               for causal in (False, True)]
    tiles = [128, 128] if "no cache key" in name else "128x128"
    if "evicted" in name:
        launcher.LAUNCHER_CACHE_SIZE = 2
        launcher.clear_launcher_cache()

    def call(causal, schedule):
        return attention(q, k, v, causal=causal, schedule=schedule, tiles=tiles)
    alone = [call(*config).clone() for config in configs]
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # about half a second of GPU cycles
    queued = [call(*config) for _ in range(max(1, rounds // 4)) for config in configs]
    torch.cuda.synchronize()
    return alone, queued


def run_case(name: str, rounds: int) -> dict:
    import torch
    torch.manual_seed(0)
    how, causal, schedule, packed = CASES[name]
    alone, queued = (two_streams(causal, schedule, packed, rounds) if how == "two streams"
                     else dropped(name, rounds))
    differing, worst = 0, 0.0
    for n, out in enumerate(queued):
        want = alone[n % len(alone)]
        diff = torch.nan_to_num((out.float() - want.float()).abs(), nan=float("inf"))
        worst = max(worst, float(diff.max()))
        differing += not torch.equal(out, want)
    return {"calls": len(queued), "differing": differing, "worst_abs_diff": worst}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="directory for queued_calls.jsonl and its manifest")
    parser.add_argument("--label", default="this tree", help="what tree ran (for the records)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # the child process's one case
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.rounds)))
        return
    with JsonlSink(args.out, "queued_calls.jsonl") as sink:
        for name, (how, *_) in CASES.items():
            row = {"tree": args.label, "queued": how, "case": name, "rounds": args.rounds}
            try:
                child = subprocess.run([sys.executable, __file__, "--case", name,
                                        "--rounds", str(args.rounds)],
                                       capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                row["error"] = "hung: no result in 300 s"
            else:
                if child.returncode == 0:
                    row.update(json.loads(child.stdout.strip().splitlines()[-1]))
                else:
                    row["error"] = (child.stderr.strip().splitlines() or ["?"])[-1][:300]
            sink.write(row)
            shown = (f"{row['differing']:3d} of {row['calls']} differ, worst |diff| "
                     f"{row['worst_abs_diff']:.3g}" if "error" not in row
                     else f"failed: {row['error']}")
            print(f"{args.label:10s} {name:42s} {shown}", flush=True)


if __name__ == "__main__":
    main()
