"""The report, CPU only: `paper` (every figure, table and the draft from data) and
`experiment run|plot NAME` (one experiment file: measure what it needs, draw its figure)."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from wavefront.cli.common import _require_gpu, main, os_error_text
from wavefront.cli.measure import _gpus_option, _run_sweep, _run_sweep_on_dask

@main.command()
@click.option("--data", "data_dir", type=click.Path(file_okay=False, exists=True),
              default="data", show_default=True, help="Measured data directory.")
@click.option("--experiments", "experiments_dir", type=click.Path(file_okay=False, exists=True),
              default="experiments", show_default=True, help="Experiment files.")
@click.option("--out", "paper_dir", type=click.Path(file_okay=False), default="paper",
              show_default=True, help="Where the draft and figures/ go.")
def paper(data_dir, experiments_dir, paper_dir):
    """Regenerate every experiment's figure, the tables and the draft from data (CPU only)."""
    from wavefront.report import paper as paper_mod
    from wavefront.report.draft import ClaimFailed
    from wavefront.results.store import SchemaError
    try:
        summary = paper_mod.build(data_dir, paper_dir, experiments_dir,
                                  log=lambda m: click.echo(m, err=True))
    except (ClaimFailed, SchemaError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"--out {paper_dir}: {os_error_text(exc)}") from None
    click.echo(paper_mod.main_summary(summary))


@main.group()
def experiment():
    """Run or plot one experiment of the experiments package (`experiments/<name>.py`):
    `run` measures on this machine's GPU what it needs (resumes), `plot` draws its figure."""


def _experiment_options(f):
    f = click.argument("name")(f)
    f = click.option("--experiments", "experiments_dir", type=click.Path(file_okay=False),
                     default="experiments", show_default=True,
                     help="The experiments package.")(f)
    return click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None,
                        help="Measured data directory [default: beside the experiments "
                             "package, data/].")(f)


def _experiment(experiments_dir, name):
    from wavefront.report.experiments import discover
    try:
        experiments = discover(experiments_dir)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--experiments") from None
    if name not in experiments:
        raise click.BadParameter(f"{name!r} is not one of {sorted(experiments)}",
                                 param_hint="NAME")
    return experiments, experiments[name]


@experiment.command("run")
@_experiment_options
@_gpus_option
def experiment_run(name, experiments_dir, data_dir, gpus, scheduler):
    """Measure on this machine's GPU what experiment NAME needs (resumes); --gpus/--scheduler
    spread its sweeps over several GPUs with Dask."""
    from wavefront.report.experiments import spec_for
    experiments, me = _experiment(experiments_dir, name)
    data_dir = Path(data_dir or Path(experiments_dir).resolve().parent / "data")
    dev = None if gpus or scheduler else _require_gpu()
    failed = 0
    for args in me.bench_runs:  # bench files it owns, appended to
        import subprocess
        cmd = [sys.executable, "-m", "wavefront.cli", "bench", *args, "--out",
               str(data_dir / name)]
        click.echo(" ".join(cmd[2:]), err=True)
        failed += subprocess.run(cmd).returncode != 0
    measure = getattr(me.module, "measure", None)
    if measure is not None:  # a measurement of its own (not a sweep, not a bench)
        failed += bool(measure(data_dir / name))
    for dataset in me.datasets:
        spec, out = spec_for(dataset, experiments), data_dir / dataset
        if spec is None:
            click.echo(f"{dataset}: no sweep measures it here; see experiments/{name}.py",
                       err=True)
            continue
        summary = (_run_sweep_on_dask(spec, out, gpus, scheduler) if dev is None
                   else _run_sweep(spec, out, dev))
        click.echo(f"{dataset}: {summary}")
        failed += summary["failed"]
    if failed:
        sys.exit(1)


@experiment.command("plot")
@_experiment_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where the figure goes [default: a new scratch directory; never a tracked "
                   "file unless named].")
def experiment_plot(name, experiments_dir, data_dir, out_dir):
    """Draw experiment NAME's figure from data into --out."""
    from wavefront.report.analysis import Study
    from wavefront.report.experiments import draw
    _, me = _experiment(experiments_dir, name)
    data_dir = Path(data_dir or Path(experiments_dir).resolve().parent / "data")
    if not data_dir.is_dir():
        raise click.BadParameter(f"{data_dir}: no data directory", param_hint="--data")
    try:
        out_dir = out_dir or tempfile.mkdtemp(prefix=f"wavefront-{name}-")
        Path(out_dir).mkdir(parents=True, exist_ok=True)  # before minutes of drawing
        drawn = draw(me, Study(data_dir), out_dir)
    except (ValueError, OSError) as exc:  # SchemaError is a ValueError
        raise click.ClickException(f"{name}: {exc}") from None
    for p in drawn:
        click.echo(str(p))
    if not drawn:
        click.echo(f"{name} has no figure (its section is text and tables)", err=True)
