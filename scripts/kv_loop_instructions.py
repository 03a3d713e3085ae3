"""The K/V loop's instructions per 128 keys, wider K/V tiles against the 128x128 ones (CPU).

Compiles the non-causal binaries of the tuned configurations before and after the 128x256
entries (tileiras, no GPU), disassembles them (cuobjdump) and counts the steady K/V step of one
consumer thread by what the instructions do (`wavefront.kernel.sass.kv_loop_mix`), per 128 keys.
Written to data/d128_limits/sass/kv_loop.json.gz, which `experiments/d128_limits.py` reads.

    python scripts/kv_loop_instructions.py [--out data/d128_limits/sass/kv_loop.json.gz]
"""
import datetime
import gzip
import json
import sys
from pathlib import Path

import click

# name -> (head dim, tiles, occupancy, dynamic, levers): the H100's entries of each table
BINARIES = {
    "D128 128x128 qk_ahead (entry before)": (128, (128, 128), 1, False,
                                             {"worker_warps": 8, "kv_latency": 8, "qk_ahead": 1}),
    "D128 128x128": (128, (128, 128), 1, False, {"worker_warps": 8, "kv_latency": 8}),
    "D128 128x256 (entry now)": (128, (128, 256), 1, False, {"worker_warps": 8, "kv_latency": 8}),
    "D64 128x128 (entry before)": (64, (128, 128), 2, True, {"cluster": 2, "kv_latency": 8}),
    "D64 128x256 (entry now)": (64, (128, 256), 1, False, {"worker_warps": 8}),
}


@click.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("data/d128_limits/sass/kv_loop.json.gz"), show_default=True)
def main(out):
    from wavefront.device import software_versions
    from wavefront.kernel.attention import KernelVariant, compile_variant
    from wavefront.kernel.sass import disassemble, kv_loop_mix
    from wavefront.results.store import git_commit
    rows = {}
    for name, (head_dim, (m, n), occupancy, dynamic, levers) in BINARIES.items():
        variant = KernelVariant("bfloat16", head_dim, m, n, False, occupancy, dynamic, **levers)
        counts = kv_loop_mix(disassemble(compile_variant(variant)))
        rows[name] = {"binary": variant.label, "keys_per_step": n, "counts": counts}
        per = {k: round(v * 128 / n, 1) for k, v in counts.items()}
        click.echo(f"{name:40s} per 128 keys: {per}")
    versions = software_versions()
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python", "scripts/" + Path(sys.argv[0]).name, *sys.argv[1:]]),
              "git_commit": git_commit(), "cuda_tile": versions["cuda_tile"],
              "tileiras": versions["tileiras"], "arch": "sm_90", "binaries": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
