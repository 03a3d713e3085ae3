"""The shape every experiment script shares: `run` measures on a GPU, `plot` draws from data/."""
from __future__ import annotations

from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent


def experiment(name: str, spec: str, doc: str) -> click.Group:
    """A click group with `run` (sweep `experiments/specs/<spec>.toml` into `data/<spec>/`, GPU)
    and `plot` (figure `name` from data/ into paper/figures/, any machine)."""

    @click.group(name=name, help=doc)
    def cli():
        pass

    @cli.command(help=f"Measure on this machine's GPU into data/{spec}/ (resumes).")
    @click.option("--out", "out_dir", type=click.Path(file_okay=False),
                  default=str(ROOT / "data" / spec), show_default=True)
    def run(out_dir):
        from wavefront.cli import sweep
        click.get_current_context().invoke(
            sweep, spec_path=str(ROOT / "experiments" / "specs" / f"{spec}.toml"),
            out_dir=out_dir, retry_failed=False)

    @cli.command(help=f"Draw paper/figures/{name}.png/.pdf from data/.")
    @click.option("--data", "data_dir", type=click.Path(file_okay=False, exists=True),
                  default=str(ROOT / "data"), show_default=True)
    def plot(data_dir):
        from wavefront import figures, paper
        paths = figures.save(paper.FIGURES[name](Path(data_dir)), name)
        click.echo("\n".join(str(p) for p in paths))

    return cli
