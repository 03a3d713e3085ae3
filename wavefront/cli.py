"""`wavefront` command line."""
from __future__ import annotations

import json
import os
import sys
import time

import click

from wavefront.schedules import CTA_SCHEDULES, KV_SCHEDULES


def _schedules_option(default):
    return click.option("--schedule", "schedules", default=default, show_default=True,
                        help="Comma-separated '<cta>+<kv>' with cta in "
                             f"{{{','.join(CTA_SCHEDULES)}}} and kv in {{{','.join(KV_SCHEDULES)}}}.")


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        out = [int(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out or any(x <= 0 for x in out):
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return out


@click.group()
@click.version_option(package_name="wavefront")
def main():
    """wavefront: cache behaviour of attention kernels on NVIDIA GPUs."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info(as_json):
    """GPU, L2, driver and tool versions (or what is missing on a CPU-only machine)."""
    from wavefront.device import current_device, find_ncu, software_versions
    dev = current_device()
    data = {"gpu": dev.as_dict() if dev else None, **software_versions(),
            "ncu_path": find_ncu()}
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if dev is None:
        click.echo("GPU: none visible (CPU-only machine): kernels can still be compiled ahead "
                   "of time with `wavefront compile`; measuring needs a GPU.")
    else:
        click.echo(f"GPU: {dev.name} (sm_{dev.compute_capability.replace('.', '')}), "
                   f"{dev.sms} SMs, L2 {dev.l2_bytes / 2**20:.1f} MiB, "
                   f"memory {dev.memory_bytes / 2**30:.1f} GiB")
        click.echo(f"driver: {dev.driver_version}, CUDA runtime {dev.cuda_runtime}")
    for key in ("cuda_tile", "tileiras", "cupy", "torch"):
        click.echo(f"{key}: {data[key] or 'not found'}")
    click.echo(f"ncu: {data['ncu'] + ' at ' + data['ncu_path'] if data['ncu'] else 'not found'}")


def _compile_one(args):
    variant, arch = args
    from wavefront.cubin import kernel_resources
    from wavefront.kernels import compile_variant
    start = time.perf_counter()
    try:
        cubin = compile_variant(variant, arch)
    except Exception as exc:
        return variant, None, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"
    res = kernel_resources(cubin)
    return variant, res[0] if res else None, time.perf_counter() - start, None


@main.command("compile")
@click.option("--arch", default="sm_90", show_default=True, help="Target GPU architecture.")
@click.option("--all", "all_variants", is_flag=True,
              help="Every specialisation (both dtypes, all tiles, LSE on and off); default: bf16, "
                   "the default tiles, no LSE.")
@click.option("--jobs", "-j", type=click.IntRange(1, 128), default=None,
              help="Parallel compiler processes (default: CPU count).")
@click.option("--filter", "name_filter", default=None,
              help="Only variants whose label contains this text.")
def compile_cmd(arch, all_variants, jobs, name_filter):
    """Compile kernel specialisations ahead of time (no GPU needed)."""
    from concurrent.futures import ProcessPoolExecutor

    from wavefront import kernels
    if all_variants:
        variants = list(kernels.all_variants(write_lse=(False, True)))
        variants += list(kernels.all_combine_variants())
    else:
        variants = list(kernels.all_variants(dtypes=("bfloat16",),
                                             tiles=sorted(set(kernels.DEFAULT_TILES.values()))))
        variants += list(kernels.all_combine_variants(dtypes=("bfloat16",), write_lse=(False,)))
    if name_filter:
        variants = [v for v in variants if name_filter in v.label]
        if not variants:
            raise click.BadParameter(f"no variant label contains {name_filter!r}",
                                     param_hint="--filter")
    jobs = min(jobs or os.cpu_count() or 1, len(variants))
    failures = 0
    start = time.perf_counter()
    click.echo(f"compiling {len(variants)} variants for {arch} with {jobs} processes")
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for variant, res, seconds, error in pool.map(_compile_one,
                                                     [(v, arch) for v in variants]):
            if error:
                failures += 1
                click.echo(f"{variant.label:<48} FAILED {seconds:6.1f} s  {error}")
                continue
            regs = res.registers if res and res.registers is not None else "?"
            smem = f"{res.shared_bytes / 1024:.0f} KiB" if res else "?"
            click.echo(f"{variant.label:<48} regs {regs:>4}  smem {smem:>8}  {seconds:6.1f} s")
    click.echo(f"{len(variants) - failures} compiled, {failures} failed in "
               f"{time.perf_counter() - start:.0f} s")
    if failures:
        sys.exit(1)


def _config_options(f):
    opts = [
        click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True),
        click.option("--heads", type=click.IntRange(min=1), default=32, show_default=True),
        click.option("--kv-heads", type=click.IntRange(min=1), default=None,
                     help="K/V heads (GQA); default: --heads."),
        click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16",
                     show_default=True),
        click.option("--tile", "tiles", default=None, help="MxN (64x64, 128x64, 128x128)."),
        click.option("--occupancy", type=click.IntRange(1, 32), default=None),
        click.option("--ctas", type=click.IntRange(min=1), default=None,
                     help="Persistent grid size (default: SMs x occupancy)."),
        click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True),
        click.option("--reps", type=click.IntRange(min=1), default=30, show_default=True),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _require_gpu():
    from wavefront.device import current_device
    dev = current_device()
    if dev is None:
        raise click.ClickException("no CUDA GPU is visible: `run` and `bench` measure on a GPU "
                                   "(`wavefront compile` and `wavefront simulate` do not need one)")
    return dev


@main.command()
@_config_options
@click.option("--seqlen", type=click.IntRange(min=1), default=8192, show_default=True)
@click.option("--head-dim", type=click.Choice(["64", "128"]), default="128", show_default=True)
@click.option("--causal/--no-causal", default=False, show_default=True)
@click.option("--schedule", default="persistent+linear", show_default=True,
              help="'<cta>+<kv>'.")
@click.option("--json", "as_json", is_flag=True)
def run(batch, heads, kv_heads, dtype, tiles, occupancy, ctas, warmup, reps, seqlen, head_dim,
        causal, schedule, as_json):
    """One configuration: check against the reference, time it, print TFLOP/s."""
    from wavefront.api import parse_schedule, parse_tiles
    from wavefront.bench import Config, measure
    try:
        parse_schedule(schedule)
        if tiles:
            parse_tiles(tiles)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    dev = _require_gpu()
    cfg = Config(batch, heads, kv_heads, seqlen, int(head_dim), dtype, causal, schedule, tiles,
                 occupancy, ctas)
    m = measure(cfg, warmup=warmup, reps=reps)
    if as_json:
        click.echo(json.dumps({"gpu": dev.name, **m.as_dict()}, indent=2))
        return
    status = "ok" if m.rel_error < 1e-2 else "WRONG"
    click.echo(f"{dev.name}: {schedule} B={batch} H={heads} S={seqlen} D={head_dim} {dtype} "
               f"{'causal' if causal else 'non-causal'} ctas={m.num_ctas}")
    click.echo(f"rel. error {m.rel_error:.2e} ({status}); median {m.timing['median_ms']:.3f} ms "
               f"(p10 {m.timing['p10_ms']:.3f}, p90 {m.timing['p90_ms']:.3f}); "
               f"{m.tflops:.1f} TFLOP/s")
    if m.rel_error >= 1e-2:
        sys.exit(1)


@main.command()
@_config_options
@click.option("--seqlen", "seqlens", default="8192", show_default=True, callback=_int_list,
              help="Comma-separated sequence lengths.")
@click.option("--head-dim", "head_dims", default="64,128", show_default=True, callback=_int_list)
@click.option("--causal", "causal_modes", type=click.Choice(["both", "yes", "no"]),
              default="both", show_default=True)
@_schedules_option("grid+linear,persistent+linear,persistent+sawtooth,grouped+linear,"
                   "grouped+sawtooth")
@click.option("--peers/--no-peers", default=True, show_default=True,
              help="Time torch SDPA flash (FA2) and cuDNN in the same process.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write every measurement as JSON lines here.")
def bench(batch, heads, kv_heads, dtype, tiles, occupancy, ctas, warmup, reps, seqlens,
          head_dims, causal_modes, schedules, peers, out_path):
    """A table of schedules x shapes, as TFLOP/s and ratios to FA2 and cuDNN."""
    from wavefront.api import parse_schedule
    from wavefront.bench import Config, measure, measure_peers
    schedule_list = [s.strip() for s in schedules.split(",") if s.strip()]
    try:
        for s in schedule_list:
            parse_schedule(s)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--schedule") from None
    dev = _require_gpu()
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[causal_modes]
    shapes = [(s, d, c) for s in seqlens for d in head_dims for c in causals]
    rows = []
    sink = open(out_path, "a") if out_path else None
    total = len(shapes) * len(schedule_list)
    with click.progressbar(length=total, label="measuring", file=sys.stderr) as bar:
        for seqlen, head_dim, causal in shapes:
            base = Config(batch, heads, kv_heads, seqlen, head_dim, dtype, causal,
                          "persistent+linear", tiles, occupancy, ctas)
            peer = measure_peers(base, warmup=warmup, reps=reps) if peers else {}
            for sched in schedule_list:
                cfg = Config(batch, heads, kv_heads, seqlen, head_dim, dtype, causal, sched,
                             tiles, occupancy, ctas)
                try:
                    m = measure(cfg, warmup=warmup, reps=reps)
                    m.peers = peer
                    row = m.as_dict()
                except Exception as exc:  # one failing point must not lose the table
                    row = {"config": cfg.__dict__, "error": f"{type(exc).__name__}: {exc}"}
                row["gpu"] = dev.name
                rows.append(row)
                if sink:
                    sink.write(json.dumps(row) + "\n")
                    sink.flush()
                bar.update(1)
    if sink:
        sink.close()
    click.echo(f"\n{dev.name}, B={batch} H={heads} {dtype}, TFLOP/s (useful FLOPs), "
               "ratios against peers measured in this run")
    click.echo(f"{'S':>6} {'D':>4} {'causal':>6} {'schedule':<22} {'TFLOP/s':>8} {'ms':>8} "
               f"{'err':>8} {'/cuDNN':>7} {'/FA2':>6} {'cuDNN':>7} {'FA2':>7}")
    for row in rows:
        c = row["config"]
        if "error" in row:
            click.echo(f"{c['seqlen']:>6} {c['head_dim']:>4} {str(c['causal']):>6} "
                       f"{c['schedule']:<22} FAILED: {row['error'][:60]}")
            continue
        pr = row["peers"]
        cudnn = pr.get("cudnn", {}).get("tflops")
        fa2 = pr.get("fa2", {}).get("tflops")
        ratio = lambda x: f"{row['tflops'] / x:7.2f}" if x else "      -"  # noqa: E731
        click.echo(f"{c['seqlen']:>6} {c['head_dim']:>4} {str(c['causal']):>6} "
                   f"{c['schedule']:<22} {row['tflops']:8.1f} {row['timing']['median_ms']:8.3f} "
                   f"{row['rel_error']:8.1e} {ratio(cudnn)} {ratio(fa2)[1:]} "
                   f"{cudnn or 0:7.1f} {fa2 or 0:7.1f}")


@main.command()
@_config_options
@click.option("--seqlen", type=click.IntRange(min=1), default=131072, show_default=True)
@click.option("--head-dim", type=click.Choice(["64", "128"]), default="64", show_default=True)
@click.option("--causal/--no-causal", default=False, show_default=True)
@_schedules_option("persistent+linear,persistent+sawtooth")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Append the rows to <out>/results.csv (with a manifest).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=300,
              show_default=True, help="Per configuration.")
def profile(batch, heads, kv_heads, dtype, tiles, occupancy, ctas, warmup, reps, seqlen,
            head_dim, causal, schedules, out_dir, timeout_s):
    """Run configurations under Nsight Compute and print L2 / DRAM counters.

    Kernel replay, --cache-control all (cold L2 each pass), only the measured launch.
    """
    from wavefront.profiling import ProfilerError
    from wavefront.sweep import SubprocessRunner, SweepSpec, expand, run_sweep
    dev = _require_gpu()
    grid = {"batch": [batch], "heads": [heads], "kv_heads": [kv_heads or heads],
            "seqlen": [seqlen], "head_dim": [int(head_dim)], "dtype": [dtype],
            "causal": [causal], "tiles": [tiles] if tiles else [None],
            "occupancy": [occupancy] if occupancy else [None], "ctas": [ctas or 0],
            "schedule": [s.strip() for s in schedules.split(",") if s.strip()]}
    spec = SweepSpec(name="profile", grid=[grid], measure=["counters"], timeout_s=timeout_s)
    try:
        expand(spec, gpu=dev.name, sms=dev.sms, l2_bytes=dev.l2_bytes)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    import tempfile
    target = out_dir or tempfile.mkdtemp(prefix="wavefront-profile-")
    try:
        run_sweep(spec, target, gpu=dev.name, sms=dev.sms, l2_bytes=dev.l2_bytes,
                  runner=SubprocessRunner(), retry_failed=True)
    except ProfilerError as exc:
        raise click.ClickException(str(exc)) from None
    from wavefront.records import load_results
    df = load_results(f"{target}/results.csv")
    df = df[df["run_id"] == df["run_id"].iloc[-1]]
    click.echo(f"\n{dev.name}: B={batch} H={heads} S={seqlen} D={head_dim} {dtype} "
               f"{'causal' if causal else 'non-causal'} (ncu, cold L2, kernel replay)")
    _print_counters(df)


def _print_counters(df):
    click.echo(f"{'schedule':<22} {'L2 reads':>11} {'/closed':>7} {'miss sect':>11} "
               f"{'SM hit':>7} {'DRAM rd MB':>10} {'fabric rd':>11} {'L1 hit%':>7}")
    for _, r in df.iterrows():
        name = f"{r['cta_schedule']}+{r['kv_schedule']}"
        if r["status"] != "ok":
            click.echo(f"{name:<22} FAILED: {str(r['error'])[:70]}")
            continue
        click.echo(f"{name:<22} {r['l2_tex_read_sectors']:11.4g} {r['read_sectors_ratio']:7.3f} "
                   f"{r['l2_read_miss_sectors']:11.4g} {r['sm_hit_rate']:7.3f} "
                   f"{r['dram_read_bytes'] / 1e6:10.1f} {r['l2_fabric_read_sectors']:11.4g} "
                   f"{r['l1_hit_rate_pct']:7.2f}")


@main.command()
@click.argument("spec_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Results directory (results.csv + manifest.json); re-running resumes.")
@click.option("--retry-failed", is_flag=True, help="Measure failed points again.")
def sweep(spec_path, out_dir, retry_failed):
    """Measure a TOML grid of points (timing and/or counters), resumable."""
    from wavefront.profiling import ProfilerError
    from wavefront.sweep import load_spec, run_sweep
    try:
        spec = load_spec(spec_path)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="SPEC_PATH") from None
    dev = _require_gpu()
    try:
        summary = run_sweep(spec, out_dir, gpu=dev.name, sms=dev.sms, l2_bytes=dev.l2_bytes,
                            retry_failed=retry_failed)
    except ProfilerError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{spec.name}: {summary['points']} points, {summary['skipped']} already done, "
               f"{summary['ok']} measured, {summary['failed']} failed -> {out_dir}/results.csv")


@main.command()
@click.option("--gpu", "gpu_name", default="h100", show_default=True,
              help="GPU preset: h100, h200, b200, gb10.")
@click.option("--sms", type=click.IntRange(min=1), default=None, help="Override the preset.")
@click.option("--l2-mib", type=click.FloatRange(min=0.1), default=None,
              help="Override the preset's L2 size.")
@click.option("--capacity-mib", type=click.FloatRange(min=0.01), default=None,
              help="Effective LRU capacity (default: half the L2, or a fitted value).")
@click.option("--partitions", type=click.IntRange(1, 2), default=1, show_default=True,
              help="2: also run the two-partition model (home + requester copies).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--heads", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--kv-heads", type=click.IntRange(min=1), default=None)
@click.option("--seqlen", type=click.IntRange(min=1), default=131072, show_default=True)
@click.option("--head-dim", type=click.Choice(["64", "128"]), default="64", show_default=True)
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16",
              show_default=True)
@click.option("--causal/--no-causal", default=False, show_default=True)
@click.option("--tile", "tiles", default=None, help="MxN (64x64, 128x64, 128x128).")
@click.option("--occupancy", type=click.IntRange(1, 32), default=None)
@click.option("--ctas", type=click.IntRange(min=1), default=None,
              help="CTAs in flight (default: SMs x occupancy from the preset).")
@click.option("--cta", "cta_names", default="persistent", show_default=True,
              help="Comma-separated CTA schedules to compare.")
@click.option("--kv", "kv_names", default="linear,sawtooth", show_default=True,
              help="Comma-separated K/V schedules to compare.")
@click.option("--jitter", type=click.FloatRange(0, 0.99), default=0.0, show_default=True,
              help="Probability that a CTA stalls for a round.")
@click.option("--json", "as_json", is_flag=True)
def simulate(gpu_name, sms, l2_mib, capacity_mib, partitions, batch, heads, kv_heads, seqlen,
             head_dim, dtype, causal, tiles, occupancy, ctas, cta_names, kv_names, jitter,
             as_json):
    """Predict L2 accesses, misses and DRAM reads per schedule (CPU only)."""
    from wavefront.api import plan
    from wavefront.gpus import gpu_preset
    from wavefront.models import DEFAULT_EFFECTIVE_FRACTION, analytic_misses, predict
    try:
        gpu = gpu_preset(gpu_name).with_overrides(
            sms=sms, l2_bytes=int(l2_mib * 2**20) if l2_mib else None)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None
    capacity = (capacity_mib * 2**20 if capacity_mib
                else DEFAULT_EFFECTIVE_FRACTION * gpu.l2_bytes)
    d = int(head_dim)
    results = []
    start = time.perf_counter()
    for cta in [c.strip() for c in cta_names.split(",") if c.strip()]:
        for kv in [k.strip() for k in kv_names.split(",") if k.strip()]:
            try:
                launch = plan((batch, heads, seqlen, d), (batch, kv_heads or heads, seqlen, d),
                              causal=causal, schedule=f"{cta}+{kv}", tiles=tiles,
                              occupancy=occupancy, sms=gpu.sms, l2_bytes=gpu.l2_bytes,
                              ctas=ctas)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
            pred = predict(launch, gpu, capacity_bytes=capacity,
                           partitions=partitions if partitions > 1 else None, jitter=jitter)
            row = pred.as_dict()
            row["analytic_read_miss_bytes"] = analytic_misses(launch, capacity)
            row["ctas_in_flight"] = min(launch.resident_ctas, launch.problem.num_items)
            results.append(row)
    elapsed = time.perf_counter() - start
    if as_json:
        click.echo(json.dumps({"gpu": gpu.name, "capacity_bytes": capacity, "seconds": elapsed,
                               "results": results}, indent=2))
        return
    click.echo(f"{gpu.name} preset ({gpu.sms} SMs, L2 {gpu.l2_bytes / 2**20:.0f} MiB, "
               f"effective LRU {capacity / 2**20:.1f} MiB): B={batch} H={heads} S={seqlen} "
               f"D={d} {'causal' if causal else 'non-causal'}")
    click.echo(f"{'schedule':<22} {'L2 reads':>11} {'miss sect':>11} {'DRAM rd MB':>10} "
               f"{'x compuls':>9} {'analytic MB':>11} {'reuse p99':>9} {'MiB':>4} "
               f"{'>cap':>7}")
    for r in results:
        reuse = r["reuse"]
        click.echo(f"{r['schedule']:<22} {r['l2_read_sectors']:11.4g} "
                   f"{r['read_miss_sectors']:11.4g} {r['dram_read_bytes'] / 1e6:10.1f} "
                   f"{r['dram_read_bytes'] / r['compulsory_read_bytes']:9.2f} "
                   f"{r['analytic_read_miss_bytes'] / 1e6:11.1f} "
                   f"{reuse.get('p99_mib', float('nan')):14.2f} "
                   f"{1 - reuse.get('within_capacity', float('nan')):7.2%}")
        if r["partitioned"]:
            pt = r["partitioned"]
            click.echo(f"{'  two partitions':<22} fabric reads {pt['fabric_read_sectors']:.4g}, "
                       f"fabric hits {pt['fabric_read_hit_sectors']:.4g}, DRAM reads "
                       f"{pt['dram_read_sectors']:.4g} sectors")
    click.echo(f"({sum(r['accesses'] for r in results) / 1e6:.1f} M tile accesses simulated in "
               f"{elapsed:.1f} s)")


@main.command()
@click.argument("results_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Where to write the fitted parameters (default: fits.json beside the data).")
def fit(results_path, out_path):
    """Fit the effective L2 capacity and the throughput model to a results file."""
    from pathlib import Path

    from wavefront.models import fit_capacity, fit_throughput
    from wavefront.records import SchemaError, load_results, with_timing
    try:
        df = load_results(results_path)
    except SchemaError as exc:
        raise click.BadParameter(str(exc), param_hint="RESULTS_PATH") from None
    ok = df[df["status"] == "ok"]
    fits = {"results": str(results_path), "gpus": {}}
    for gpu, rows in ok.groupby("gpu"):
        entry = {}
        counters = rows[rows["measurement"] == "counters"]
        if len(counters):
            cap = fit_capacity(counters, gpu)
            entry["capacity"] = cap.as_dict()
        joined = with_timing(rows)
        if len(joined) >= 4:
            entry["throughput"] = fit_throughput(joined, gpu).as_dict()
        fits["gpus"][gpu] = entry
    out_path = Path(out_path or Path(results_path).with_name("fits.json"))
    out_path.write_text(json.dumps(fits, indent=1) + "\n")
    click.echo(f"{'GPU':<14} {'model':<11} {'parameters':<46} {'n':>4} {'MAPE':>7} "
               f"{'worst':>7} {'R^2':>6}")
    for gpu, entry in fits["gpus"].items():
        if "capacity" in entry:
            c = entry["capacity"]
            e = c["errors"]
            click.echo(f"{gpu:<14} {'L2 misses':<11} "
                       f"{'effective LRU ' + format(c['capacity_bytes'] / 2**20, '.1f') + ' MiB':<46} "
                       f"{e['n']:>4} {e['mape']:7.1%} {e['worst_ape']:7.1%} {e['r2']:6.2f}")
        if "throughput" in entry:
            t = entry["throughput"]
            e = t["errors"]
            params = (f"{t['flop_rate'] / 1e12:.0f} TFLOP/s, {t['dram_rate'] / 1e12:.2f} TB/s, "
                      f"t0 {t['overhead_s'] * 1e6:.1f} us")
            click.echo(f"{gpu:<14} {'time':<11} {params:<46} {e['n']:>4} {e['mape']:7.1%} "
                       f"{e['worst_ape']:7.1%} {e['r2']:6.2f}")
    click.echo(f"-> {out_path}")


@main.command()
@click.option("--data", "data_dir", type=click.Path(file_okay=False, exists=True),
              default=None, help="Data directory (default: the repository's data/).")
@click.option("--out", "paper_dir", type=click.Path(file_okay=False), default=None,
              help="Paper directory (default: the repository's paper/).")
def paper(data_dir, paper_dir):
    """Regenerate every figure, table and paper/draft.md from data/ (CPU only)."""
    from wavefront import paper as paper_mod
    summary = paper_mod.build(data_dir or paper_mod.DATA, paper_dir or paper_mod.PAPER,
                              log=lambda m: click.echo(m, err=True))
    click.echo(paper_mod.main_summary(summary))


if __name__ == "__main__":
    main()
