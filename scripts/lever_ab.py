"""One kernel lever on the tuned configurations: each shape's tuned kernel as the table has it
("off") and with `--lever NAME=VALUE` ("on"), against cuDNN, in interleaved rounds.

    python scripts/lever_ab.py --lever qk_ahead=0 [--rounds 15] [--out results.jsonl]

Any lever of `wavefront.point.LEVERS`; the two of data/d128_limits/sass/ (`direct_store`,
`q_prefetch`) ran with their patch applied. A lever that a shape's tuned schedule does not take
is timed anyway and means nothing there: read the schedule column. Each output is first checked
against cuDNN's on fresh random inputs, the output poisoned with NaN; then rounds of
`--per-round` launches per contender in random order, timed with CUDA events. Printed: TFLOP/s
(median), x cuDNN and on/off as the median of per-round ratios with the 25%-75% spread of
those ratios.
"""
import json
import os
import random
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import click

SHAPES = ((1, 32, 32, 8192, 128), (4, 32, 8, 4096, 128), (2, 8, 8, 32768, 128),
          (8, 16, 16, 2048, 128), (1, 32, 32, 8192, 64), (8, 16, 16, 2048, 64))


def _inputs(shape):
    import torch
    b, h, hkv, s, d = shape
    gen = torch.Generator(device="cuda").manual_seed(hash(shape) % 2**31)
    return tuple(torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                 for heads in (h, hkv, hkv))


def _launcher(shape, causal, lever):
    from wavefront.device import current_device
    from wavefront.kernel.launcher import launcher_for
    from wavefront.kernel.tuning import tuned_config
    q, k, v = _inputs(shape)
    config = tuned_config(current_device().name, q.shape, k.shape, causal)
    config = {**config, **lever}
    launcher, _ = launcher_for(q, k, v, causal=causal, **config)
    return launcher, config, (q, k, v)


def _spread(values):
    s = sorted(values)
    return statistics.median(s), s[len(s) // 4], s[(3 * len(s)) // 4]


@click.command()
@click.option("--rounds", default=15, show_default=True)
@click.option("--per-round", default=5, show_default=True)
@click.option("--out", type=click.Path(), default=None)
@click.option("--lever", "lever_text", required=True, help="NAME=VALUE, e.g. qk_ahead=0")
@click.option("--warm", nargs=3, type=int, hidden=True)  # shape index, causal, lever on
def main(rounds, per_round, out, lever_text, warm):
    from wavefront.point import check_levers
    name, _, value = lever_text.partition("=")
    try:
        levers = ({}, {name: int(value)})
        check_levers(**levers[1])
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(f"expected NAME=VALUE of a kernel lever: {exc}",
                                 param_hint="--lever")
    if warm:
        import torch
        i, causal, on = warm
        launcher, _, (q, k, v) = _launcher(SHAPES[i], bool(causal), levers[on])
        launcher(q, k, v, torch.empty_like(q), torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        return
    # Compile every binary in parallel processes first (they share cuTile's disk cache).
    jobs = [(i, c, d) for i in range(len(SHAPES)) for c in (0, 1) for d in (0, 1)]
    with ThreadPoolExecutor(max_workers=min(12, os.cpu_count() or 2)) as pool:
        codes = list(pool.map(lambda j: subprocess.run(
            [sys.executable, __file__, "--lever", lever_text, "--warm", *map(str, j)],
            capture_output=True, text=True), jobs))
    for j, r in zip(jobs, codes):
        if r.returncode:
            print("warm failed", j, r.stderr[-400:])

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    with click.progressbar(list(enumerate(SHAPES)), label="shapes") as bar:
        for i, shape in bar:
            for causal in (False, True):
                b, h, hkv, s, d = shape
                runs, configs = {}, {}
                try:
                    for on in (0, 1):
                        launcher, config, (q, k, v) = _launcher(shape, causal, levers[on])
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            ref = sdpa(q, k, v, is_causal=causal, enable_gqa=hkv != h)
                        o = torch.full_like(q, float("nan"))
                        launcher(q, k, v, o, stream)
                        err = float((o.float() - ref.float()).norm() / ref.float().norm())
                        assert err < 1e-2, (shape, causal, levers[on], err)
                        runs[("off", "on")[on]] = (lambda launcher=launcher, q=q, k=k, v=v, o=o:
                                                   launcher(q, k, v, o, stream))
                        configs[("off", "on")[on]] = config

                    def cudnn(q=q, k=k, v=v):
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            sdpa(q, k, v, is_causal=causal, enable_gqa=hkv != h)
                    runs["cudnn"] = cudnn
                except Exception as exc:  # recorded, and the other shapes go on
                    rows.append({"shape": shape, "causal": causal, "status": f"failed: {exc}"})
                    continue
                for fn in runs.values():  # warm-up
                    for _ in range(3):
                        fn()
                ms = {name: [] for name in runs}
                for _ in range(rounds):
                    order = list(runs)
                    random.shuffle(order)
                    for name in order:
                        a = torch.cuda.Event(enable_timing=True)
                        z = torch.cuda.Event(enable_timing=True)
                        a.record()
                        for _ in range(per_round):
                            runs[name]()
                        z.record()
                        z.synchronize()
                        ms[name].append(a.elapsed_time(z) / per_round)
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                row = {"shape": shape, "causal": causal, "lever": lever_text,
                       "config": configs["off"],
                       "samples_ms": ms, "status": "ok"}
                for side in ("off", "on"):
                    row[f"tflops_{side}"] = flops / statistics.median(ms[side]) / 1e9
                    row[f"x_cudnn_{side}"] = _spread([c / x for c, x in zip(ms["cudnn"],
                                                                             ms[side])])
                row["on_over_off"] = _spread([a / b for a, b in zip(ms["off"], ms["on"])])
                rows.append(row)
    if out:
        with open(out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    print(f"\n{torch.cuda.get_device_name()}, bf16, {lever_text} against the tuned table, "
          f"{rounds} rounds x {per_round} launches; ratios: median [25%, 75%] of per-round ratios")
    print(f"{'B H KV S D':22s} {'mask':7s} {'schedule':24s} {'off TF/s':>9s} {'x cuDNN':>22s} "
          f"{'on TF/s':>9s} {'x cuDNN':>22s} {'on / off':>22s}")
    fmt = lambda t: f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"  # noqa: E731
    for r in rows:
        label = " ".join(map(str, r["shape"]))
        mask = "causal" if r["causal"] else "full"
        if r["status"] != "ok":
            print(f"{label:22s} {mask:7s} {r['status']}")
            continue
        print(f"{label:22s} {mask:7s} {r['config']['schedule']:24s} {r['tflops_off']:9.1f} "
              f"{fmt(r['x_cudnn_off']):>22s} {r['tflops_on']:9.1f} "
              f"{fmt(r['x_cudnn_on']):>22s} {fmt(r['on_over_off']):>22s}")


if __name__ == "__main__":
    main()
