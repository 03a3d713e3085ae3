"""Experiments are a package: `experiments/<name>.py`, each the whole experiment.

An experiment module defines
- its docstring: the question (first line) and how to run it;
- `SPEC`: the TOML sweep it owns (measured into `data/<name>/`), or `SPECS`: several, by data
  set name; or none;
- `DATASETS`: the results tables it reads (default: its own);
- `BENCH`: optionally, `wavefront bench` argument lists it runs into `data/<name>/`;
- `RECORDS`: the data sets of records (`results.records`: bench, tune, its own) it reads;
- `measure(out_dir)`: optionally, a measurement of its own (neither a sweep nor a bench);
- `figure(study)`: optionally, the figure the paper uses, from a `report.analysis.Study`;
- `table(study)`: optionally, a DataFrame;
- `section(study)`: optionally, its section of the draft (a `report.draft.Section`: markdown
  and the claims it rests on).

The package's `__init__.py` lists `DRAFT`, the names of the experiments whose sections make the
draft, in order: the draft is that list. Experiments import `wavefront` (never its CLI); the
import contract (`lint-imports`) covers them as a package of their own. `wavefront experiment
run|plot NAME` is every experiment's click script; `python experiments/<name>.py run` hands
over to it.

`discover` imports the package; `draw` is the one way a figure is drawn and saved, so `plot`
and `wavefront paper` write the same bytes.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pkgutil
import sys
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
        """The results tables (data/<name>/results.csv[.gz]) it reads; an experiment that reads
        only bench or other records says DATASETS = ()."""
        declared = getattr(self.module, "DATASETS", None)
        if declared is not None:
            return tuple(declared)
        return tuple(self.specs or (self.name,))

    @property
    def bench_runs(self) -> list[list[str]]:
        """`wavefront bench` argument lists whose rounds it owns (data/<name>/bench.jsonl)."""
        return [list(args) for args in getattr(self.module, "BENCH", [])]

    @property
    def records(self) -> tuple[str, ...]:
        """The data sets of records (not results tables) it reads."""
        return tuple(getattr(self.module, "RECORDS", ()))

    @property
    def has_figure(self) -> bool:
        return callable(getattr(self.module, "figure", None))

    def figure(self, study):
        return self.module.figure(study)

    def table(self, study):
        fn = getattr(self.module, "table", None)
        return fn(study) if fn else None

    def section(self, study):
        fn = getattr(self.module, "section", None)
        return fn(study) if fn else None


class Experiments(dict):
    """The experiments of a package by name (name order); `draft`: the names whose sections
    make the paper, in its order; `parts`: the part heading a draft section opens;
    `appendices`: appendix name -> the names whose sections make it."""

    def __init__(self, items, draft: tuple[str, ...], parts: dict | None = None,
                 appendices: dict | None = None):
        super().__init__(items)
        self.draft = draft
        self.parts = dict(parts or {})
        self.appendices = {k: tuple(v) for k, v in (appendices or {}).items()}

    @property
    def in_appendix(self) -> dict[str, str]:
        """Experiment name -> the appendix that prints its section."""
        return {n: a for a, names in self.appendices.items() for n in names}


def _import_package(directory: Path) -> ModuleType:
    init = directory / "__init__.py"
    if not init.is_file():
        raise ValueError(f"{directory}: not an experiments package (no __init__.py listing "
                         "DRAFT)")
    name = directory.name if directory.name.isidentifier() else "experiments"
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == init:
        return loaded
    if loaded is not None:  # a package of that name from elsewhere: this one under its own
        name = f"wavefront_experiments_{hashlib.sha1(str(directory).encode()).hexdigest()[:10]}"
        if name in sys.modules:
            return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, init,
                                                  submodule_search_locations=[str(directory)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ValueError(f"{init}: the experiments package does not load: "
                         f"{type(exc).__name__}: {exc}") from None
    return module


def appendix_letters(appendices) -> dict[str, str]:
    """{appendix name: its letter}, A, B, ... in the order the appendices are listed."""
    return {name: chr(ord("A") + index) for index, name in enumerate(appendices)}


def load_experiment(path) -> Experiment:
    """One experiment module, imported as part of its package (the directory it lies in)."""
    path = Path(path).resolve()
    package = _import_package(path.parent)
    try:
        module = importlib.import_module(f"{package.__name__}.{path.stem}")
    except Exception as exc:
        raise ValueError(f"{path}: the experiment file does not load: "
                         f"{type(exc).__name__}: {exc}") from None
    return Experiment(path.stem, path, module)


def discover(experiments_dir) -> Experiments:
    """Every experiment module of the package in `experiments_dir`, by name, in name order;
    `.draft` is the package's DRAFT, checked against what the modules define."""
    directory = Path(experiments_dir).resolve()
    if not directory.is_dir():
        raise ValueError(f"{directory}: no experiments directory")
    package = _import_package(directory)
    names = sorted(m.name for m in pkgutil.iter_modules([str(directory)])
                   if not m.name.startswith("_"))
    if not names:
        raise ValueError(f"{directory}: no experiment files (*.py) in it")
    found = {name: load_experiment(directory / f"{name}.py") for name in names}
    draft = tuple(getattr(package, "DRAFT", ()))
    parts = dict(getattr(package, "PARTS", {}))
    appendices = {k: tuple(v) for k, v in getattr(package, "APPENDICES", {}).items()}
    listed = list(draft) + [n for names in appendices.values() for n in names]
    unknown = [n for n in listed if n not in found]
    if unknown:
        raise ValueError(f"{directory / '__init__.py'}: DRAFT or APPENDICES name {unknown}, "
                         "which are not experiment files")
    twice = sorted({n for n in listed if listed.count(n) > 1})
    if twice:
        raise ValueError(f"{directory / '__init__.py'}: {twice} listed more than once in DRAFT "
                         "and APPENDICES (a section is printed once)")
    stray = [n for n in parts if n not in draft]
    if stray:
        raise ValueError(f"{directory / '__init__.py'}: PARTS names {stray}, which DRAFT does "
                         "not list")
    silent = [n for n in listed if not callable(getattr(found[n].module, "section", None))]
    if silent:
        raise ValueError(f"{directory / '__init__.py'}: DRAFT or APPENDICES name {silent}, "
                         "which define no section(study)")
    left_out = [n for n, e in found.items() if n not in listed
                and callable(getattr(e.module, "section", None))]
    if left_out:
        raise ValueError(f"{directory / '__init__.py'}: {left_out} define section(study) but "
                         "neither DRAFT nor APPENDICES lists them")
    return Experiments(found, draft, parts, appendices)


def spec_for(dataset: str, experiments: dict[str, Experiment]) -> SweepSpec | None:
    """The sweep (of whichever experiment owns it) that measures `dataset`; None where no sweep
    of today's code measures it (a first kernel's data, kept for comparison)."""
    for exp in experiments.values():
        if dataset in exp.specs:
            return exp.specs[dataset]
    return None


def draw(experiment: Experiment, study, out_dir) -> list[Path]:
    """Draw an experiment's figure and save it (PNG) into `out_dir`; none if it has none."""
    if not experiment.has_figure:
        return []
    with figures.style():
        fig = experiment.figure(study)
        return figures.save(fig, experiment.name, out_dir)


def readme_table(experiments: dict[str, Experiment]) -> str:
    """The experiments table of docs/experiments.md, generated from the files."""
    lines = ["| experiment | question | data |", "|---|---|---|"]
    for name, exp in experiments.items():
        data = (list(exp.datasets) + [f"{d} (records)" for d in exp.records
                                      if not (exp.bench_runs and d == name)]
                + ([f"{name} (bench rounds)"] if exp.bench_runs else []))
        lines.append(f"| `{name}` | {exp.question} | {', '.join(data) or '-'} |")
    return "\n".join(lines)


def until_measured(namespace: dict, ready: bool) -> None:
    """Keep an experiment that has no committed data yet out of the paper: unless `ready`,
    its `figure` and `section` (which `wavefront paper` would call, and which need data) are
    renamed `figure_when_measured` and `section_when_measured`. Once data are committed, the
    experiment sets ready and is listed in experiments/__init__.py."""
    if not ready:
        for name in ("figure", "section"):
            if name in namespace:
                namespace[f"{name}_when_measured"] = namespace.pop(name)


def sibling(package: str | None, name: str = "") -> ModuleType:
    """An experiment's neighbour in its package (`name`), or the package itself (no name),
    from an experiment module's `__package__`: None where the file runs as a script, whose
    package is then `experiments`."""
    base = package or "experiments"
    return importlib.import_module(f"{base}.{name}" if name else base)


def run_as_script(path: str) -> None:
    """`python experiments/<name>.py ACTION ...` is `wavefront experiment ACTION <name> ...`:
    the experiment file hands over to the CLI by process, never by import (the CLI sits above
    the experiments in the import contract)."""
    path = Path(path).resolve()
    args = sys.argv[1:]
    if args and not args[0].startswith("-"):
        argv = ["experiment", args[0], path.stem, "--experiments", str(path.parent), *args[1:]]
    else:  # --help, or nothing: the experiment commands' help
        argv = ["experiment", *args]
    os.execv(sys.executable, [sys.executable, "-m", "wavefront.cli", *argv])
