"""What every command shares: the table printer, the point and lever options, clean errors,
the GPU check, and the `wavefront` group the command modules register on."""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os

import click

from wavefront.point import LEVERS, PARAMS, Point
from wavefront.schedules import schedule_names


# The leading columns of every table of measured or simulated points.
POINT_COLUMNS = [("schedule", "schedule", ""), ("S", "S", "d"), ("D", "D", "d"),
                 ("causal", "causal", "")]


def print_table(rows: list[dict], columns: list[tuple[str, str, str]], *, title: str = "",
                echo=click.echo) -> None:
    """One table printer: `columns` are (key, header, format spec); widths fit the content.
    Columns with a format spec (numbers) are right-aligned, text left-aligned."""
    cells = [[_fmt(r.get(key), spec) for key, _, spec in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h, _) in enumerate(columns)]

    def line(texts):
        return "  ".join(t.rjust(w) if spec else t.ljust(w)
                         for t, w, (_, _, spec) in zip(texts, widths, columns)).rstrip()
    if title:
        echo(title)
    echo(line([h for _, h, _ in columns]))
    for row in cells:
        echo(line(row))


def print_records(rows: list[dict], kind, *, title: str = "", echo=click.echo) -> None:
    """A table of records whose columns their kind declares (`RecordKind.columns`)."""
    print_table([kind.cells(r) for r in rows], [(c.header, c.header, c.spec)
                                                 for c in kind.columns], title=title, echo=echo)


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, refusing nan and infinity (which it lets through: nan compares
    false with every bound, inf passes a lower one)."""

    name = "finite float range"

    def convert(self, value, param, ctx):
        import math
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


class CleanErrors(click.Group):
    """A command group whose commands end in a message, not a traceback, when the machine says
    no: a full disk, a read-only or forbidden path, memory running out, input nested past
    Python's recursion limit. What a sweep stored before the failure stays (rows are appended
    and fsync'd one by one); the message says so. Bugs still raise: they should be seen."""

    def invoke(self, ctx):
        from wavefront.files import FileRefused
        from wavefront.results.store import SchemaError
        try:
            return super().invoke(ctx)
        except (FileRefused, SchemaError) as exc:  # a file refused or not loading, named
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            raise click.ClickException(os_error_text(exc)) from None
        except MemoryError:
            raise click.ClickException(
                "out of memory: make the input smaller (a shorter sequence, fewer points); "
                "rows already stored are kept") from None
        except RecursionError:
            raise click.ClickException("the input is nested too deeply to read") from None


# errno values whose message gets a remedy; anything else is named as the system names it
_OS_REMEDY = {
    28: "the disk is full: rows already stored are kept; free space and run the same command "
        "again to resume",
    30: "the file system is read-only: choose another --out",
    13: "permission denied: choose a directory you may write, or fix its permissions",
    1: "operation not permitted: choose a directory you may write, or fix its permissions",
    122: "the disk quota is exceeded: rows already stored are kept; free space and run again",
}


def os_error_text(exc: OSError) -> str:
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    what = exc.strerror or str(exc) or type(exc).__name__
    remedy = _OS_REMEDY.get(exc.errno)
    return (f"{where}: " if where else "") + what + (f" ({remedy})" if remedy else "")


def _echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _list(kind, value, name):
    try:
        out = [kind(x.strip()) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected a comma-separated list, got {value!r}",
                                 param_hint=name) from None
    if not out:
        raise click.BadParameter(f"expected at least one value, got {value!r}", param_hint=name)
    return out


class DeclaredValue(click.ParamType):
    """A value of a Point parameter or a kernel lever, checked by its declaration: the same
    check, and the same message, as the Point's."""

    def __init__(self, name: str, expected: str, check, kind, none_word: str | None = None):
        self.name, self._expected, self._check = name, expected, check
        self._kind, self._none = kind, none_word

    def convert(self, value, param, ctx):
        if value is None or (self._none and str(value).strip().lower() == self._none):
            return None
        if not isinstance(value, self._kind):
            try:
                value = self._kind(str(value).strip())
            except ValueError:
                self.fail(f"{self.name} must be {self._expected}, got {value!r}", param, ctx)
        try:
            self._check(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return value


def _value_list(name: str, p, kind, normalise=None):
    """A comma-separated list of one parameter's values, each checked by its declaration."""
    def callback(ctx, param, value):
        if value is None:
            return None
        out = _list(kind, value, param.opts[0])
        out = [normalise(x) for x in out] if normalise else out
        for x in out:
            try:
                p.check(name, x)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
        return out
    return callback


# The command line's own spelling of some parameters: an option name, how a bare value reads.
_OPTION_NAMES = {"tiles": "--tile"}
def _registered_schedule(s: str) -> str:
    s = s if "+" in s else s + "+linear"
    if "+" in s and s.split("+")[1] and s not in schedule_names():
        raise click.BadParameter(f"{s!r} is not a schedule; choose among "
                                 f"{', '.join(schedule_names())}")
    return s


_NORMALISE = {"schedule": _registered_schedule}
# What each parameter's value is on the command line: the field's own type.
_KINDS = {f.name: {"int": int, "str": str, "bool": bool}[str(f.type).split("|")[0].strip()]
          for f in dataclasses.fields(Point) if f.name in PARAMS}


def point_options(*, default_schedule: str, default_seqlen: str, default_head_dim: str,
                  causal_default, default_heads: int = 32):
    """The options that describe points, the same for every command, one per parameter field
    of Point (its `Param`: help, check, whether it takes a comma-separated list); the command
    receives `points`, every combination as a checked Point. `--causal/--no-causal` left unset
    means `causal_default` (None: both)."""
    defaults = {"seqlen": default_seqlen, "head_dim": default_head_dim,
                "schedule": default_schedule, "heads": default_heads}
    opts = []
    for name, p in PARAMS.items():
        option = _OPTION_NAMES.get(name, "--" + name.replace("_", "-"))
        if p.column_type == "bool":
            opts.append(click.option(f"{option}/--no-{option[2:]}", name, default=causal_default,
                                     help=p.help + " Unset: " + (
                                         "both" if causal_default is None else
                                         name if causal_default else f"not {name}") + "."))
        elif p.many:
            extra = (" Any of " + ", ".join(schedule_names()) + "."
                     if name == "schedule" else "")
            opts.append(click.option(option, name, default=defaults[name], show_default=True,
                                     callback=_value_list(name, p, _KINDS[name],
                                                          _NORMALISE.get(name)),
                                     help=f"{p.help} Comma-separated.{extra}"))
        else:
            default = defaults.get(name, getattr(Point(), name))
            opts.append(click.option(option, name, default=default,
                                     show_default=default is not None,
                                     type=DeclaredValue(name, p.expected,
                                                        lambda v, n=name, q=p: q.check(n, v),
                                                        _KINDS[name]),
                                     help=p.help))

    def wrap(f):
        @functools.wraps(f)
        def command(**kwargs):
            values = {name: kwargs.pop(name) for name in PARAMS}
            return f(points=points_from(values), **kwargs)
        for opt in reversed(opts):
            command = opt(command)
        return command
    return wrap


def points_from(values: dict) -> list[Point]:
    """Every combination of the options' values (lists for the list options; causal unset:
    both) as a checked Point; a bad combination is a usage error."""
    axes = {name: (value if PARAMS[name].many else
                   [False, True] if PARAMS[name].column_type == "bool" and value is None
                   else [value]) for name, value in values.items()}
    try:
        return [Point(**dict(zip(axes, combo))) for combo in itertools.product(*axes.values())]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def lever_options(f):
    """One option per kernel lever (`point.LEVERS`: help, values); the command receives
    `levers`, every lever's value by name."""
    @functools.wraps(f)
    def command(**kwargs):
        return f(levers={lever.name: kwargs.pop(lever.name) for lever in LEVERS}, **kwargs)
    for lever in reversed(LEVERS):
        command = click.option(
            "--" + lever.name.replace("_", "-"), lever.name, default=lever.default,
            show_default=lever.default is not None, help=f"{lever.help} ({lever.expected})",
            type=DeclaredValue(lever.name, lever.expected, lever.check, int,
                               none_word="none"))(command)
    return command


def _require_gpu():
    from wavefront.device import current_device, require_gpu_stack
    try:
        require_gpu_stack("this command")
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    dev = current_device()
    if dev is None:
        raise click.ClickException("no CUDA GPU is visible: this command measures on a GPU "
                                   "(`wavefront compile`, `simulate`, `fit` and `paper` do not "
                                   "need one)")
    return dev


@click.group(cls=CleanErrors)
@click.version_option(package_name="wavefront")
def main():
    """wavefront: cache behaviour of attention kernels on NVIDIA GPUs."""
    # a setting read deep inside a command (the work tables' threads) is checked before any
    # command runs: 'abc' was a traceback from deep inside the first table built
    threads = os.environ.get("WAVEFRONT_TABLE_THREADS")
    if threads is not None and not (threads.strip().isdigit()
                                    and 1 <= int(threads) <= 1024):
        raise click.ClickException(f"WAVEFRONT_TABLE_THREADS must be a whole number of "
                                   f"threads from 1 to 1024, got {threads!r}")
