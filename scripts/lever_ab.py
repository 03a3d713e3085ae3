"""One kernel lever on the tuned configurations: each shape's tuned kernel as the table has it
("off") and with `--lever NAME=VALUE` ("on"), with the peers, in `wavefront bench`'s rounds
(each contender checked first, inputs cold by rotation).

    python scripts/lever_ab.py --lever qk_ahead=0 [--rounds 15] [--head-dim 128] [--out F.jsonl]

In data/d128_limits/sass/lever_ab.jsonl.gz, `on_over_off` (25%-75%) came from a first form
with rounds of its own. A lever the entry has is timed once. Printed: TFLOP/s and, paired by
round, x cuDNN and on / off, medians [95%].
"""
import json

import click

SHAPES = ((1, 32, 32, 8192, 128), (4, 32, 8, 4096, 128), (2, 8, 8, 32768, 128),
          (8, 16, 16, 2048, 128), (1, 32, 32, 8192, 64), (8, 16, 16, 2048, 64))


def _ab(shape, causal, lever, gpu_name, rounds, per_round) -> dict:
    from wavefront.kernel.tuning import tuned_config
    from wavefront.measure.rounds import (
        contender_name,
        paired_speedup,
        run_rounds,
        shape_contenders,
    )
    from wavefront.point import Point
    b, h, hkv, s, d = shape
    problem = Point(batch=b, heads=h, kv_heads=hkv, seqlen=s, head_dim=d, causal=causal)
    config = tuned_config(gpu_name, (b, h, s, d), (b, hkv, s, d), causal)
    off = problem.replace(**config)
    on = off.replace(**lever)
    points = [off] if on == off else [off, on]
    results = {r.name: r for r in run_rounds(shape_contenders(points), rounds=rounds,
                                             per_round=per_round)}
    mine = {"off": results[contender_name(off, off)],
            "on": results[contender_name(on, off)]}
    row = {"config": config}
    for side, r in mine.items():
        row[f"tflops_{side}"] = r.tflops
        if "cudnn" in results:
            row[f"x_cudnn_{side}_ci95"] = paired_speedup(results["cudnn"], r)
    row["on_over_off_ci95"] = paired_speedup(mine["off"], mine["on"]) if on != off else None
    return row


@click.command()
@click.option("--lever", "lever_text", required=True, help="NAME=VALUE, e.g. qk_ahead=0")
@click.option("--rounds", default=15, show_default=True)
@click.option("--per-round", default=5, show_default=True)
@click.option("--head-dim", type=click.Choice(["64", "128"]), help="Only this head dim.")
@click.option("--out", type=click.Path(), default=None)
def main(lever_text, rounds, per_round, head_dim, out):
    from wavefront.point import check_levers
    name, _, value = lever_text.partition("=")
    try:
        lever = {name: int(value)}
        check_levers(**lever)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(f"expected NAME=VALUE of a lever: {exc}", param_hint="--lever")
    from wavefront.device import current_device
    gpu = current_device().name
    rows = []
    cases = [(shape, causal) for shape in SHAPES for causal in (False, True)
             if shape[-1] == int(head_dim or shape[-1])]
    with click.progressbar(cases, label="shapes") as bar:
        for shape, causal in bar:
            row = {"shape": shape, "causal": causal, "lever": lever_text}
            try:
                row.update(_ab(shape, causal, lever, gpu, rounds, per_round), status="ok")
            except Exception as exc:  # recorded; the rest go on
                row["status"] = f"failed: {type(exc).__name__}: {exc}"
            rows.append(row)
    if out:
        with open(out, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)

    def fmt(t):
        return "-" if t is None else "{:.3f} [{:.3f}, {:.3f}]".format(*t)
    print(f"\n{gpu}, bf16, {lever_text}, {rounds} rounds x {per_round}:"
          " TFLOP/s off, on; x cuDNN off, on; on / off")
    for r in rows:
        print(" ".join(map(str, r["shape"])), "causal" if r["causal"] else "full",
              *((r["config"]["schedule"], f"{r['tflops_off']:.1f}", f"{r['tflops_on']:.1f}",
                 fmt(r.get("x_cudnn_off_ci95")), fmt(r.get("x_cudnn_on_ci95")),
                 fmt(r["on_over_off_ci95"])) if r["status"] == "ok" else (r["status"],)))


if __name__ == "__main__":
    main()
