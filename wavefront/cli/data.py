"""Data sets on disk: `fold` a data set's per-run record files into one, `compress` it as
committed data is packed."""
from __future__ import annotations

from pathlib import Path

import click

from wavefront.cli.common import main

@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--files", default="bench*", show_default=True,
              help="The run files' name in each run folder, without .jsonl.")
@click.option("--into", default="bench_runs.jsonl", show_default=True,
              help="The folded records file, in DIRECTORY.")
@click.option("--manifests", is_flag=True, help="Merge the run folders' manifests too.")
@click.option("--notes", is_flag=True,
              help="Gather the run folders' READMEs into DIRECTORY/RUNS.md.gz too.")
def fold(directory, files, into, manifests, notes):
    """Fold a data set's per-run record files (DIRECTORY/<run>/<files>.jsonl[.gz]) into one
    records file, each record marked with its `source`; the experiments read either. Then
    `wavefront compress DIRECTORY --significant-digits 7`."""
    from wavefront.results.fold import NOTES, fold_notes, merge_manifests
    from wavefront.results.fold import fold as fold_runs
    try:
        n = fold_runs(Path(directory), files, into)
        click.echo(f"{n} files folded into {Path(directory) / into}")
        if manifests:
            click.echo(f"{merge_manifests(Path(directory))} folder manifests merged")
        if notes:
            click.echo(f"{fold_notes(Path(directory))} READMEs gathered into "
                       f"{Path(directory) / NOTES}")
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"now `wavefront compress {directory} --significant-digits 7`")


@main.command()
@click.argument("directories", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False))
@click.option("--significant-digits", "digits", type=click.IntRange(4, 17), default=None,
              help="Then pack every packed table and record file (results.csv.gz, *.jsonl.gz) "
                   "again with each float that is not a whole number at this many significant "
                   "digits (7: what float32 CUDA events and ncu rates hold); whole numbers "
                   "stay exact, and each line is checked to be within the rounding.")
@click.option("--smallest", is_flag=True,
              help="Then pack every *.gz (subdirectories too) again with zopfli where that "
                   "is smaller (about 10%; any gzip reader reads it; needs the zopfli "
                   "package); each text checked unchanged.")
def compress(directories, digits, smallest):
    """Pack each data directory's plain results.csv as results.csv.gz, its manifest.json as
    manifest.json.gz and its record files (*.jsonl, in subdirectories too) as *.jsonl.gz, the
    form committed data takes (about 8x smaller); the store and the report read either. Each
    packed file is checked to hold what it was made from before the plain file goes."""
    from wavefront.files import repack_smallest
    from wavefront.results.store import NothingToCompress, compress_dir
    for directory in directories:
        try:
            for packed in compress_dir(directory, digits):
                click.echo(str(packed))
        except NothingToCompress as exc:
            if not smallest:  # with --smallest, the packed files are what is asked for
                raise click.BadParameter(str(exc), param_hint="DIRECTORIES") from None
        except ValueError as exc:  # SchemaError too; a packed file that does not hold its own
            raise click.ClickException(str(exc)) from None
        for path in sorted(Path(directory).rglob("*.gz")) if smallest else ():
            try:
                before, after = repack_smallest(path)
            except ValueError as exc:  # FileRefused: no zopfli, a damaged or torn file
                raise click.ClickException(str(exc)) from None
            click.echo(f"{path}: {before} -> {after} bytes")
