"""Experiments are files: `experiments/<name>.py`, each the whole experiment.

An experiment file defines
- its docstring: the question (first line) and how to run it;
- `SPEC`: the TOML sweep it owns (measured into `data/<name>/`), or `SPECS`: several, by data
  set name; or none;
- `DATASETS`: the results tables its figure reads (default: its own);
- `BENCH`: optionally, `wavefront bench` argument lists it runs into `data/<name>/`;
- `figure(study)`: the figure the paper uses, from a `report.analysis.Study`;
- optionally `table(study)`: a DataFrame the paper prints;
- `cli`: its click script (`run` / `plot --out DIR`), built by `wavefront.cli.experiment_cli`.

`discover` finds them; `draw` is the one way a figure is drawn and saved, so `plot` and
`wavefront paper` write the same bytes.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from wavefront.report import figures
from wavefront.results.sweep import SweepSpec, experiment_spec_texts, parse_spec


@dataclass(frozen=True)
class Experiment:
    name: str
    path: Path
    module: ModuleType

    @property
    def question(self) -> str:
        doc = (self.module.__doc__ or "").strip()
        return doc.splitlines()[0].strip() if doc else ""

    @property
    def specs(self) -> dict[str, SweepSpec]:
        """The sweeps it owns, by the data set each measures into."""
        # the same reading as `wavefront sweep FILE` (from the file's text, not the module)
        return {name: parse_spec(text, f"{self.path}[{name}]")
                for name, text in experiment_spec_texts(self.path).items()}

    @property
    def spec(self) -> SweepSpec | None:
        return self.specs.get(self.name)

    @property
    def datasets(self) -> tuple[str, ...]:
        """The results tables (data/<name>/results.csv) its figure reads; an experiment that
        reads only bench files says DATASETS = ()."""
        declared = getattr(self.module, "DATASETS", None)
        if declared is not None:
            return tuple(declared)
        return tuple(self.specs or (self.name,))

    @property
    def bench_runs(self) -> list[list[str]]:
        """`wavefront bench` argument lists whose rounds it owns (data/<name>/bench.jsonl)."""
        return [list(args) for args in getattr(self.module, "BENCH", [])]

    def figure(self, study):
        return self.module.figure(study)

    def table(self, study):
        fn = getattr(self.module, "table", None)
        return fn(study) if fn else None


def load_experiment(path) -> Experiment:
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"wavefront_experiment_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ValueError(f"{path}: the experiment file does not load: "
                         f"{type(exc).__name__}: {exc}") from None
    if not callable(getattr(module, "figure", None)):
        raise ValueError(f"{path}: an experiment defines figure(study)")
    return Experiment(path.stem, path, module)


def discover(experiments_dir) -> dict[str, Experiment]:
    """Every experiment file in `experiments_dir`, by name, in name order."""
    directory = Path(experiments_dir)
    if not directory.is_dir():
        raise ValueError(f"{directory}: no experiments directory")
    out = {}
    for path in sorted(directory.glob("*.py")):
        if not path.name.startswith("_"):
            out[path.stem] = load_experiment(path)
    if not out:
        raise ValueError(f"{directory}: no experiment files (*.py) in it")
    return out


def spec_for(dataset: str, experiments: dict[str, Experiment]) -> SweepSpec:
    """The sweep (of whichever experiment owns it) that measures `dataset`."""
    for exp in experiments.values():
        if dataset in exp.specs:
            return exp.specs[dataset]
    raise ValueError(f"no experiment owns a sweep for data set {dataset!r}")


def draw(experiment: Experiment, study, out_dir) -> list[Path]:
    """Draw an experiment's figure and save it (PNG) into `out_dir`."""
    with figures.style():
        fig = experiment.figure(study)
        return figures.save(fig, experiment.name, out_dir)


def readme_table(experiments: dict[str, Experiment]) -> str:
    """The README's experiment table, generated from the files."""
    lines = ["| experiment | question | data |", "|---|---|---|"]
    for name, exp in experiments.items():
        data = list(exp.datasets) + ([f"{name} (bench rounds)"] if exp.bench_runs else [])
        lines.append(f"| `{name}` | {exp.question} | {', '.join(data)} |")
    return "\n".join(lines)
