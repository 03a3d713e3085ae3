"""`wavefront` command line.

One grammar for every command: `--schedule cta+kv[,cta+kv...]`, `--causal/--no-causal`,
`--out DIR` (always a directory), `--json` on every command that prints results (the JSON
carries the inputs too). GPU libraries are imported only by the commands that need them.

Each command parses, calls one library function and prints. `common` holds what they share;
the commands live by layer: `kernel` (info, schedules, compile), `measure` (run, bench, tune,
sweep, ...), `model` (simulate, advise, fit), `data` (fold, compress), `report` (paper,
experiment).
"""
from wavefront.cli import data, kernel, measure, model, report  # noqa: F401  (they register)
from wavefront.cli.common import main

__all__ = ["main"]
