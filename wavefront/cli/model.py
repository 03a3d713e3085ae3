"""The model, CPU only: `simulate` (DRAM reads and kernel time per schedule on a GPU preset),
`advise` (schedules and tiles ranked by the timed model), `fit` (the L2 and throughput fits of a
results file)."""
from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import click

from wavefront.cli.common import (
    POINT_COLUMNS,
    FiniteFloatRange,
    _echo_json,
    main,
    point_options,
    print_table,
)
from wavefront.model.advise import SCHEDULES as ADVISED_SCHEDULES
from wavefront.model.presets import PRESETS


def _default_fits() -> Path:
    return Path(__file__).resolve().parents[2] / "paper" / "fits.json"


def _fits_option(f):
    return click.option(
        "--fits", "fits_path", type=click.Path(dir_okay=False), default=None,
        help="The fits the timed model's compute times come from (its calibration on "
             "experiments/step_time.py) [default: the checkout's paper/fits.json].")(f)


def _timed_setup(gpu, gpu_name: str, fits_path):
    """(memory timing, a function launch -> compute timing) for a preset: its own calibration
    where fits.json has one, else projected from the H100's (`calibration.calibration_for`)."""
    from wavefront.model.calibration import calibration_for, read_calibrations
    from wavefront.model.timed import memory_timing
    path = Path(fits_path) if fits_path else _default_fits()
    try:
        calibrations = read_calibrations(path)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        memory = memory_timing(gpu)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None
    of_launch = calibration_for(gpu_name, gpu, calibrations)

    def compute(launch):
        try:
            return of_launch(launch)
        except ValueError as exc:
            raise click.UsageError(f"{path}: {exc}") from None
    return memory, compute


def _simulable_launches(points, gpu) -> list:
    """(point, launch) of every point on the preset, each refused before anything is
    allocated if it cannot be simulated here."""
    from wavefront.model.simulation import check_simulable
    launches = []
    for point in points:
        try:
            launch = point.launch(gpu)
            check_simulable(launch)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        launches.append((point, launch))
    return launches


@contextlib.contextmanager
def _replacing(path: Path, option: str):
    """The one writer (`wavefront.files.replacing`) for an output another library writes: a
    link at `path` is refused by the option's name, the file replaced only when written."""
    from wavefront.files import FileRefused, replacing
    try:
        with replacing(path, f"{option} output") as tmp:
            yield tmp
    except FileRefused as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def _simulate_timed(points, gpu, gpu_name, partitions, fits_path, timeline_dir, as_json):
    from wavefront.model.counting import launch_counts
    from wavefront.model.timed import simulate_timed
    from wavefront.results.progress import peak_rss_mib
    from wavefront.model.timed import check_timed
    memory, compute_of = _timed_setup(gpu, gpu_name, fits_path)
    partitions = partitions or gpu.l2_partitions
    rows, start = [], time.perf_counter()
    launches = []
    for point in points:
        try:
            launch = point.launch(gpu)
            launches.append((point, launch, check_timed(launch)))
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    for point, launch, expected_s in launches:
        t0 = time.perf_counter()
        click.echo(f"simulating {launch.name} S={point.seqlen} D={point.head_dim} "
                   f"{'causal' if point.causal else 'non-causal'} with the clock (~"
                   f"{max(expected_s, 0.1):.0f} s) ...", err=True, nl=False)
        compute = compute_of(launch)
        pred = simulate_timed(launch, memory, compute, l2_bytes=gpu.l2_bytes,
                              partitions=partitions)
        click.echo(f" {time.perf_counter() - t0:.1f} s", err=True)
        if timeline_dir:
            import numpy as np
            Path(timeline_dir).mkdir(parents=True, exist_ok=True)
            name = (f"{launch.name}_s{point.seqlen}_d{point.head_dim}"
                    f"{'_causal' if point.causal else ''}.timeline.csv")
            with _replacing(Path(timeline_dir) / name, "--timeline-out") as tmp:
                np.savetxt(tmp, np.column_stack(
                    [np.arange(launch.num_items), pred.item_slot, pred.item_start_ns,
                     pred.item_end_ns]), fmt=["%d", "%d", "%.1f", "%.1f"], delimiter=",",
                    header="work_item,cta,start_ns,end_ns", comments="")
            click.echo(f"timeline -> {Path(timeline_dir) / name}", err=True)
        counts = launch_counts(launch.problem, launch.n_chunks, launch.partial_row_bytes)
        rows.append({"inputs": point.as_dict(), "schedule": launch.name, **pred.summary(),
                     "compulsory_read_bytes": counts.compulsory_read_bytes,
                     "tflops": counts.useful_flops / pred.kernel_ns * 1e-3,
                     "step_ns": compute.step_ns, "compute": compute.source,
                     "memory": memory.source, "seconds": time.perf_counter() - t0})
    elapsed = time.perf_counter() - start
    if as_json:
        _echo_json({"gpu": gpu.name, "preset": gpu_name, "sms": gpu.sms,
                    "l2_bytes": gpu.l2_bytes, "partitions": partitions, "model": "timed",
                    "seconds": elapsed, "peak_rss_mib": peak_rss_mib(), "results": rows})
        return
    print_table([{**r, "S": r["inputs"]["seqlen"], "D": r["inputs"]["head_dim"],
                  "causal": r["inputs"]["causal"], "dram_mb": r["dram_read_bytes"] / 1e6,
                  "x_min": r["dram_read_bytes"] / r["compulsory_read_bytes"]} for r in rows],
                [*POINT_COLUMNS, ("dram_mb", "DRAM rd MB", ".1f"),
                 ("x_min", "x compulsory", ".2f"), ("kernel_ms", "time ms", ".3f"),
                 ("tflops", "TFLOP/s", ".0f"), ("step_ns", "step ns", ".0f"),
                 ("seconds", "sim s", ".1f")],
                title=f"{gpu.name} preset ({gpu.sms} SMs, L2 {gpu.l2_bytes / 2**20:.0f} MiB "
                      f"in {partitions} partition(s)), timed model, B={points[0].batch} "
                      f"H={points[0].heads}")
    click.echo(f"compute: {rows[0]['compute']}\nmemory: {rows[0]['memory']}")
    click.echo(f"({len(rows)} launches simulated in {elapsed:.1f} s, peak memory "
               f"{peak_rss_mib():.0f} MiB)")


@main.command()
@click.option("--gpu", "gpu_name", default="h100", show_default=True,
              help=f"GPU preset: {', '.join(PRESETS)}.")
@click.option("--sms", type=click.IntRange(min=1), default=None, help="Override the preset.")
@click.option("--l2-mib", type=FiniteFloatRange(min=0.1), default=None,
              help="Override the preset's L2 size.")
@click.option("--capacity-mib", type=FiniteFloatRange(min=0.01), default=None,
              help="LRU capacity per partition (default: the L2 over its partitions, the "
                   "partition model the draft validates).")
@click.option("--partitions", type=click.IntRange(1, 2), default=None,
              help="L2 partitions modelled (default: the preset's, 2 on Hopper: per-partition "
                   "LRU, far reads leave a copy near the reader; 1: one LRU of --capacity-mib).")
@point_options(default_schedule="persistent+linear,persistent+sawtooth",
               default_seqlen="131072", default_head_dim="64", causal_default=False,
               default_heads=1)
@click.option("--jitter", type=FiniteFloatRange(0, 0.99), default=0.0, show_default=True,
              help="Probability that a CTA stalls for a round.")
@click.option("--trace-out", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="Also write each launch's read trace here in libCacheSim's oracleGeneral "
                   "binary format (lock-step model).")
@click.option("--clock/--no-clock", default=True, show_default=True,
              help="The timed model (CTAs with clocks: DRAM reads and kernel time, the model "
                   "the draft validates) or the lock-step rounds (DRAM reads, reuse distances).")
@_fits_option
@click.option("--timeline-out", "timeline_dir", type=click.Path(file_okay=False), default=None,
              help="With the clock: write each launch's per-CTA timeline (every work item's "
                   "CTA, start and end in ns) here as CSV.")
@click.option("--json", "as_json", is_flag=True)
def simulate(points, gpu_name, sms, l2_mib, capacity_mib, partitions, jitter, trace_dir, clock,
             fits_path, timeline_dir, as_json):
    """Predict DRAM reads (and, with the clock, kernel time) per schedule on a GPU preset
    (CPU only)."""
    from wavefront.model.fits import analytic_misses, predict
    from wavefront.model.presets import gpu_preset
    from wavefront.point import SECTOR_BYTES
    try:
        gpu = gpu_preset(gpu_name).with_overrides(
            sms=sms, l2_bytes=int(l2_mib * 2**20) if l2_mib else None)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None
    if clock:
        if jitter or trace_dir or capacity_mib:
            raise click.UsageError("--jitter, --trace-out and --capacity-mib belong to the "
                                   "lock-step model: add --no-clock")
        _simulate_timed(points, gpu, gpu_name, partitions, fits_path, timeline_dir, as_json)
        return
    if timeline_dir:
        raise click.UsageError("--timeline-out needs the clock (drop --no-clock)")
    # The default is the partition model, the one the draft validates out of sample: the L2's
    # own size over its partitions. With one partition the whole stream meets one LRU of that
    # capacity; with two, `predict` runs the partitioned cache (per partition `capacity`) and
    # its DRAM reads are the ones reported.
    if partitions is None:
        partitions = gpu.l2_partitions
    capacity = capacity_mib * 2**20 if capacity_mib else gpu.l2_bytes / partitions
    launches = _simulable_launches(points, gpu)
    results = []
    start = time.perf_counter()
    for point, launch in launches:
        t0 = time.perf_counter()
        click.echo(f"simulating {launch.name} S={point.seqlen} D={point.head_dim} "
                   f"{'causal' if point.causal else 'non-causal'} ...", err=True, nl=False)
        pred = predict(launch, gpu, capacity_bytes=capacity,
                       partitions=partitions if partitions > 1 else None, jitter=jitter)
        click.echo(f" {pred.accesses / 1e6:.1f} M accesses in {time.perf_counter() - t0:.1f} s",
                   err=True)
        if trace_dir:
            from wavefront.model.simulation import access_trace, write_oracle_general
            Path(trace_dir).mkdir(parents=True, exist_ok=True)
            name = (f"{launch.name}_s{point.seqlen}_d{point.head_dim}"
                    f"{'_causal' if point.causal else ''}.oracleGeneral.bin")
            with _replacing(Path(trace_dir) / name, "--trace-out") as tmp:
                write_oracle_general(access_trace(launch, jitter=jitter), tmp)
            click.echo(f"trace -> {Path(trace_dir) / name}", err=True)
        row = {"inputs": point.as_dict(), **pred.as_dict(),
               "model": (f"{partitions} partitions x LRU {capacity / 2**20:.1f} MiB"
                         if partitions > 1 else f"one LRU of {capacity / 2**20:.1f} MiB"),
               "analytic_read_miss_bytes": analytic_misses(launch, capacity),
               "ctas_in_flight": min(launch.resident_ctas, launch.problem.num_items)}
        results.append(row)
    elapsed = time.perf_counter() - start
    accesses = sum(r["accesses"] for r in results)
    from wavefront.results.progress import peak_rss_mib
    peak_mib = peak_rss_mib()
    if as_json:
        _echo_json({"gpu": gpu.name, "preset": gpu_name, "sms": gpu.sms,
                    "l2_bytes": gpu.l2_bytes, "capacity_bytes": capacity,
                    "partitions": partitions, "jitter": jitter, "seconds": elapsed,
                    "accesses_per_s": accesses / elapsed if elapsed > 0 else None,
                    "peak_rss_mib": peak_mib, "results": results})
        return
    rows = []
    for r in results:
        reuse = r["reuse"]
        # DRAM reads of the model asked for: the partitioned cache's where it ran
        dram_bytes = (r["partitioned"]["dram_read_sectors"] * SECTOR_BYTES if r["partitioned"]
                      else r["dram_read_bytes"])
        rows.append({"schedule": r["schedule"], "S": r["inputs"]["seqlen"],
                     "D": r["inputs"]["head_dim"], "causal": r["inputs"]["causal"],
                     "l2": r["l2_read_sectors"], "miss": r["read_miss_sectors"],
                     "dram_mb": dram_bytes / 1e6,
                     "x_min": dram_bytes / r["compulsory_read_bytes"],
                     "analytic_mb": r["analytic_read_miss_bytes"] / 1e6,
                     "p99": reuse.get("p99_mib"),
                     "beyond": 1 - reuse["within_capacity"] if "within_capacity" in reuse
                     else None})
    print_table(rows, [*POINT_COLUMNS, ("l2", "L2 reads", ".4g"),
                       ("miss", "miss sect", ".4g"), ("dram_mb", "DRAM rd MB", ".1f"),
                       ("x_min", "x compulsory", ".2f"), ("analytic_mb", "analytic MB", ".1f"),
                       ("p99", "reuse p99 MiB", ".2f"), ("beyond", "> capacity", ".2%")],
                title=f"{gpu.name} preset ({gpu.sms} SMs, L2 {gpu.l2_bytes / 2**20:.0f} MiB), "
                      f"model: {results[0]['model']} (DRAM columns; 'miss sect': one LRU of "
                      f"{capacity / 2**20:.1f} MiB), B={points[0].batch} H={points[0].heads}")
    for r in results:
        if r["partitioned"]:
            pt = r["partitioned"]
            click.echo(f"{r['schedule']} two partitions: fabric reads "
                       f"{pt['fabric_read_sectors']:.4g}, fabric hits "
                       f"{pt['fabric_read_hit_sectors']:.4g}, DRAM reads "
                       f"{pt['dram_read_sectors']:.4g} sectors")
    click.echo(f"({accesses / 1e6:.1f} M tile accesses simulated in {elapsed:.1f} s, "
               f"{accesses / max(elapsed, 1e-9) / 1e6:.1f} M/s, peak memory {peak_mib:.0f} MiB)")


ADVISE_SCHEDULES = ",".join(ADVISED_SCHEDULES)


@main.command()
@click.option("--gpu", "gpu_name", default="h100", show_default=True,
              help=f"GPU preset: {', '.join(PRESETS)}.")
@point_options(default_schedule=ADVISE_SCHEDULES, default_seqlen="131072",
               default_head_dim="64", causal_default=False, default_heads=1)
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--budgets/--no-budgets", default=True, show_default=True,
              help="Also predict the best L2 budget (head-group size) for grouped+linear "
                   "against the fixed 8/32/50 MB of production kernels.")
@_fits_option
@click.option("--json", "as_json", is_flag=True)
def advise(gpu_name, points, top, budgets, fits_path, as_json):
    """Rank every schedule and tile shape the kernel offers for one shape on a GPU preset by
    the timed model's predicted kernel time (CPU only; nothing is measured). Uncalibrated
    tiles are projected and marked so; kernel levers are not modelled."""
    from wavefront.model import advise as advisor
    from wavefront.model.presets import gpu_preset
    try:
        gpu = gpu_preset(gpu_name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None
    shapes = {(p.batch, p.heads, p.kv_heads, p.seqlen, p.head_dim, p.causal) for p in points}
    if len(shapes) > 1:
        raise click.UsageError("advise ranks configurations of one shape: give one --seqlen, "
                               "--head-dim and mask")
    memory, compute_of = _timed_setup(gpu, gpu_name, fits_path)
    p = points[0]
    schedules = sorted({q.schedule for q in points}, key=[q.schedule for q in points].index)

    def progress(items):
        with click.progressbar(items, label="simulating", file=sys.stderr) as bar:
            yield from bar
    try:
        ranked = advisor.rank(p, gpu, memory, compute_of, schedules, progress=progress)
        groups = (advisor.group_budgets(p, gpu, memory, compute_of, tiles=ranked[0].tiles)
                  if budgets and ranked else [])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    rows = [{**r.__dict__, "vs_best": r.time_ms / ranked[0].time_ms,
             "step": "PROJECTED" if r.projected else "calibrated"} for r in ranked]
    label = (f"{gpu.name}: B{p.batch} {advisor.head_label(p.heads, p.kv_heads)} S{p.seqlen} "
             f"D{p.head_dim} {'causal' if p.causal else 'non-causal'}")
    if as_json:
        _echo_json({"gpu": gpu.name, "shape": {"batch": p.batch, "heads": p.heads,
                                               "kv_heads": p.kv_heads or p.heads,
                                               "seqlen": p.seqlen, "head_dim": p.head_dim,
                                               "causal": p.causal},
                    "ranking": rows, "group_budgets": groups,
                    "not_modelled_levers": advisor.not_modelled_levers()})
        return
    print_table(rows[:top], [("schedule", "schedule", ""), ("tiles", "tiles", ""),
                             ("occupancy", "CTA/SM", "d"), ("time_ms", "predicted ms", ".3f"),
                             ("vs_best", "x best", ".3f"), ("dram_mb", "DRAM rd MB", ".1f"),
                             ("step", "step time", "")],
                title=f"{label}, ranked by the timed model's predicted time")
    if groups:
        print_table(groups, [("budget", "L2 budget", ""), ("group_units", "heads/group", "d"),
                             ("time_ms", "predicted ms", ".3f"), ("vs_best", "x best", ".3f"),
                             ("dram_mb", "DRAM rd MB", ".1f")],
                    title=f"grouped+linear {ranked[0].tiles}: head-group size by L2 budget")
    click.echo("not modelled (code generation; measure with `wavefront tune`): "
               + ", ".join(advisor.not_modelled_levers()))


@main.command()
@click.argument("results_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write fits.json into this directory (default: print only; a committed "
                   "file is overwritten only when named here).")
@click.option("--json", "as_json", is_flag=True)
def fit(results_path, out_dir, as_json):
    """Fit the effective L2 capacity and the throughput model to a results file; the capacity
    is also scored out of sample (fitted on the shorter lengths, tested on the longer)."""
    from wavefront.report.analysis import fit_results
    from wavefront.results.store import SchemaError, load_results
    try:
        df = load_results(results_path, strict=True)
        fits = fit_results(df, str(results_path))
    except (SchemaError, ValueError) as exc:  # SchemaError is a ValueError
        raise click.BadParameter(str(exc), param_hint="RESULTS_PATH") from None
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        from wavefront.files import FileRefused, write_file
        try:
            write_file(Path(out_dir) / "fits.json", json.dumps(fits, indent=1) + "\n",
                       what="fits.json")
        except FileRefused as exc:
            raise click.BadParameter(str(exc), param_hint="--out") from None
    if as_json:
        _echo_json(fits)
        return
    rows = []
    for gpu, entry in fits["gpus"].items():
        if "capacity" in entry:
            c = entry["capacity"]
            rows.append({"gpu": gpu, "model": "L2 misses",
                         "params": f"effective LRU {c['capacity_bytes'] / 2**20:.1f} MiB",
                         **c["errors"]})
        if "throughput" in entry:
            t = entry["throughput"]
            rows.append({"gpu": gpu, "model": "time",
                         "params": f"{t['flop_rate'] / 1e12:.0f} TFLOP/s, "
                                   f"{t['dram_rate'] / 1e12:.2f} TB/s, "
                                   f"t0 {t['overhead_s'] * 1e6:.1f} us", **t["errors"]})
    print_table(rows, [("gpu", "GPU", ""), ("model", "model", ""), ("params", "parameters", ""),
                       ("n", "n", "d"), ("mape", "MAPE", ".1%"), ("worst_ape", "worst", ".1%"),
                       ("r2", "R^2", ".2f")], title="in sample (scored on the rows fitted)")
    held = [{"gpu": gpu, **entry["capacity_out_of_sample"]}
            for gpu, entry in fits["gpus"].items() if "capacity_out_of_sample" in entry]
    if held:
        print_table(held, [("gpu", "GPU", ""), ("split", "fitted / held out", ""),
                           ("n", "n", "d"), ("mape", "MAPE", ".1%"), ("r2", "R^2", ".2f"),
                           ("error_p50", "median error", "+.1%")],
                    title="out of sample (capacity fitted on the shorter half, scored above the "
                          "knee on the longer half)")
    if out_dir:
        click.echo(f"-> {Path(out_dir) / 'fits.json'}")
