"""`wavefront` command line.

One grammar for every command: `--schedule cta+kv[,cta+kv...]`, `--causal/--no-causal`,
`--out DIR` (always a directory), `--json` on every command that prints results (the JSON
carries the inputs too). GPU libraries are imported only by the commands that need them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import click

from wavefront.device import usable_cpus
from wavefront.kernel.tuning import CARRY_OVER_MODES, CARRY_OVER_VARIABLE
from wavefront.measure.sink import JsonlSink, environment
from wavefront.point import DTYPES, HEAD_DIMS, LEVERS, PARAMS, Point
from wavefront.schedules import schedule_names

# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# info, compile
# --------------------------------------------------------------------------------------------

@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info(as_json):
    """GPU, L2, driver and tool versions (or what is missing on a CPU-only machine)."""
    from wavefront.device import current_device, find_ncu, software_versions
    dev = current_device()
    data = {"gpu": dev.as_dict() if dev else None, **software_versions(),
            "ncu_path": find_ncu()}
    if as_json:
        _echo_json(data)
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


@main.command()
@click.option("--json", "as_json", is_flag=True)
def schedules(as_json):
    """The registered CTA and K/V schedules, from the schedule vocabulary itself."""
    from wavefront.schedules import CTA_SCHEDULES, KV_SCHEDULES

    def doc(s):
        return " ".join((type(s).__doc__ or "").strip().split("\n\n")[0].split())
    data = {"cta": {n: doc(s) for n, s in CTA_SCHEDULES.items()},
            "kv": {n: doc(s) for n, s in KV_SCHEDULES.items()},
            "combinations": schedule_names()}
    if as_json:
        _echo_json(data)
        return
    rows = ([{"kind": "CTA", "name": n, "what": d} for n, d in data["cta"].items()]
            + [{"kind": "K/V", "name": n, "what": d} for n, d in data["kv"].items()])
    print_table(rows, [("kind", "kind", ""), ("name", "name", ""), ("what", "what it does", "")])
    click.echo("schedules are written cta+kv: " + ", ".join(data["combinations"]))


def _compile_one(args):
    variant, arch, out_dir = args
    from wavefront.kernel.arch_support import UnsupportedVariant
    from wavefront.kernel.attention import compile_variant
    from wavefront.kernel.cubin import kernel_resources
    start = time.perf_counter()
    try:
        cubin = compile_variant(variant, arch)
    except UnsupportedVariant as exc:  # refused by name: not a failure of this build
        return (variant, None, time.perf_counter() - start, f"REFUSED: {exc}", None, None)
    except Exception as exc:
        return (variant, None, time.perf_counter() - start, f"{type(exc).__name__}: {exc}",
                None, None)
    from wavefront.kernel.sass import disassemble, find_cuobjdump, summarise
    saved, sass = None, None
    if find_cuobjdump():
        try:
            sass = disassemble(cubin)
        except RuntimeError:
            sass = None
    if out_dir:
        saved = str(Path(out_dir) / f"{variant.label}.{arch}.cubin")
        from wavefront.files import write_file
        write_file(saved, cubin, what="a cubin")  # atomic, a link refused
        if sass:
            write_file(Path(saved).with_suffix(".sass"), sass, what="a SASS listing")
    res = kernel_resources(cubin)
    return (variant, res[0] if res else None, time.perf_counter() - start, None, saved,
            summarise(sass) if sass else None)


@main.command("compile")
@click.option("--arch", default="sm_90", show_default=True,
              help="Target architecture (sm_90 Hopper, sm_100 Blackwell, ...).")
@click.option("--all", "all_variants", is_flag=True,
              help="Every specialisation (both dtypes, all tiles, LSE on and off); default: bf16, "
                   "the default tiles, no LSE.")
@click.option("--filter", "name_filter", default=None,
              help="Only variants whose label contains this text.")
@click.option("--list", "list_only", is_flag=True, help="List the variant labels and stop.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Keep the cubins (and SASS, where cuobjdump is found) in this directory.")
@click.option("--jobs", "-j", type=click.IntRange(1, 128), default=None,
              help="Parallel compiler processes (default: CPU count).")
@click.option("--json", "as_json", is_flag=True)
def compile_cmd(arch, all_variants, name_filter, list_only, out_dir, jobs, as_json):
    """Compile the kernel binaries ahead of time (no GPU needed), with their SASS facts.

    Schedules are data (the work table), so a shape needs four binaries: static CTA
    assignment (every static schedule, both scan directions), dynamic, and the tiled schedules'
    partial-state writers (float32 and bfloat16 partials); packed variable-length batches add a
    static and a dynamic binary of their own (_varlen). A binary's label is
    <dtype>_d<D>_<M>x<N>_<full|causal>_<static|dynamic>[_partials]_occ<O>[_lse][_varlen], e.g.
    bf_d128_128x64_causal_static_occ2; the combine kernel's is combine_<dtype>_d<D>_m<rows>[_lse].
    Where cuobjdump is found, each line says whether the wgmma pipeline survived and how many
    local-memory spills the binary has.
    """
    from concurrent.futures import ProcessPoolExecutor

    from wavefront.device import require_gpu_stack
    from wavefront.point import DEFAULT_TILES
    try:
        require_gpu_stack("wavefront compile")
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    from wavefront.kernel import attention as kernels
    if all_variants:
        variants = list(kernels.all_variants(write_lse=(False, True)))
        variants += list(kernels.all_combine_variants())
    else:
        variants = list(kernels.all_variants(dtypes=("bfloat16",),
                                             tiles=sorted(set(DEFAULT_TILES.values()))))
        variants += list(kernels.all_combine_variants(dtypes=("bfloat16",), write_lse=(False,)))
    if name_filter:
        variants = [v for v in variants if name_filter in v.label]
        if not variants:
            raise click.BadParameter(f"no variant label contains {name_filter!r}",
                                     param_hint="--filter")
    if list_only:
        if as_json:
            _echo_json({"arch": arch, "variants": [v.label for v in variants]})
        else:
            click.echo("\n".join(v.label for v in variants))
        return
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    jobs = min(jobs or usable_cpus(), len(variants))
    failures, refused, rows = 0, 0, []
    start = time.perf_counter()
    click.echo(f"compiling {len(variants)} variants for {arch} with {jobs} processes", err=True)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for variant, res, seconds, error, saved, sass in pool.map(
                _compile_one, [(v, arch, out_dir) for v in variants]):
            row = {"variant": variant.label, "seconds": seconds, "error": error,
                   "registers": res.registers if res else None,
                   "shared_kib": res.shared_bytes / 1024 if res else None, "cubin": saved,
                   "sass": sass.as_dict() if sass else None}
            is_refused = bool(error) and error.startswith("REFUSED: ")
            row["refused"] = is_refused
            rows.append(row)
            failures += error is not None and not is_refused
            refused += is_refused
            if not as_json:
                if is_refused:
                    click.echo(f"{variant.label:<52} REFUSED {error[len('REFUSED: '):]}")
                    continue
                if error:
                    click.echo(f"{variant.label:<52} FAILED {seconds:6.1f} s  {error}")
                    continue
                facts = ""
                if sass:  # the facts that decided speed: pipelined MMAs, no spills
                    state = ("no MMA" if not sass.hgmma else
                             "pipelined" if sass.wgmma_pipelined else "SERIALISED")
                    facts = (f"  HGMMA {sass.hgmma:3d} waits {sass.depbar:3d} ({state})  "
                             f"spills {sass.local_loads + sass.local_stores:3d}")
                click.echo(f"{variant.label:<52} regs {row['registers'] or '?':>4}  smem "
                           f"{row['shared_kib']:6.0f} KiB  {seconds:6.1f} s{facts}")
    summary = (f"{len(variants) - failures - refused} compiled, {failures} failed"
               + (f", {refused} refused by name (not buildable for {arch})" if refused else "")
               + f" in {time.perf_counter() - start:.0f} s" + (f" -> {out_dir}" if out_dir else ""))
    if as_json:
        _echo_json({"arch": arch, "variants": rows, "failed": failures, "refused": refused})
    else:
        click.echo(summary)
    if failures:
        sys.exit(1)


# --------------------------------------------------------------------------------------------
# Measuring: run, bench, profile, sweep
# --------------------------------------------------------------------------------------------

@main.command()
@point_options(default_schedule="persistent+linear", default_seqlen="8192",
               default_head_dim="128", causal_default=False)
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--reps", type=click.IntRange(min=1), default=30, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def run(points, warmup, reps, as_json):
    """Points: check against the reference, time, print TFLOP/s. Fails on a wrong result."""
    from dataclasses import asdict
    dev = _require_gpu()
    from wavefront.measure.bench import IncorrectResult, measure
    rows, failed = [], 0
    for point in points:
        row = {"gpu": dev.name, "point": point.as_dict()}
        try:
            row["timing"] = asdict(measure(point, warmup=warmup, reps=reps))
        except IncorrectResult as exc:
            row["error"] = str(exc)
            failed += 1
        rows.append(row)
    if as_json:
        _echo_json(rows)
    else:
        print_table([{"schedule": r["point"]["schedule"], "S": r["point"]["seqlen"],
                      "D": r["point"]["head_dim"], "causal": r["point"]["causal"],
                      **r.get("timing", {}), "status": r.get("error", "ok")} for r in rows],
                    [*POINT_COLUMNS, ("tflops", "TFLOP/s", ".1f"),
                     ("median_ms", "median ms", ".3f"), ("p10_ms", "p10", ".3f"),
                     ("p90_ms", "p90", ".3f"), ("rel_error", "rel. error", ".1e"),
                     ("status", "status", "")],
                    title=f"{dev.name}: B={points[0].batch} H={points[0].heads} "
                          f"{points[0].dtype}")
    if failed:
        sys.exit(1)


@main.command()
@click.option("--layers", type=click.IntRange(1, 128), default=8, show_default=True)
@click.option("--hidden", type=click.IntRange(64, 16384), default=2048, show_default=True)
@click.option("--heads", type=click.IntRange(1, 256), default=16, show_default=True)
@click.option("--kv-heads", type=click.IntRange(1, 256), default=4, show_default=True)
@click.option("--intermediate", type=click.IntRange(64, 65536), default=5632, show_default=True)
@click.option("--vocab", type=click.IntRange(16, 262144), default=32000, show_default=True)
@click.option("--batch", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--seqlen", "seqlens", default="2048,8192", show_default=True,
              help="Prompt lengths, comma-separated.")
@click.option("--rounds", type=click.IntRange(min=6), default=8, show_default=True)
@click.option("--stand-in", is_flag=True,
              help="Use the plain-torch Llama-style stack even where transformers is present.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the results to <out>/prefill.jsonl.")
def prefill(layers, hidden, heads, kv_heads, intermediate, vocab, batch, seqlens, rounds,
            stand_in, out_dir):
    """End-to-end prefill through a Llama-architecture model with random weights
    (transformers' LlamaForCausalLM, its attention routed to wavefront through transformers'
    attention registry; a plain-torch stand-in where transformers is missing): logits against
    the model's SDPA path, prefill tokens/s of both in interleaved rounds."""
    if hidden % heads or heads % kv_heads or hidden // heads not in HEAD_DIMS:
        raise click.BadParameter(f"hidden / heads must be one of {HEAD_DIMS} and heads a "
                                 f"multiple of kv-heads; got hidden {hidden}, heads {heads}, "
                                 f"kv-heads {kv_heads}", param_hint="--hidden")
    prompt_lengths = _list(int, seqlens, "--seqlen")
    if any(s < 1 for s in prompt_lengths):
        raise click.BadParameter(f"prompt lengths must be positive, got {seqlens!r}",
                                 param_hint="--seqlen")
    dev = _require_gpu()
    import wavefront.torch as ours
    from wavefront.measure.prefill import ModelShape, compare
    shape = ModelShape(layers, hidden, heads, kv_heads, intermediate, vocab)
    rows = []
    with JsonlSink(out_dir, "prefill.jsonl") as sink:
        for seqlen in prompt_lengths:
            row = {"gpu": dev.name, **compare(shape, batch, seqlen, ours, rounds=rounds,
                                              prefer_transformers=not stand_in)}
            rows.append(row)
            sink.write(row)
    print_table([{**r, "speedup": f"{r['speedup_vs_sdpa']:.3f} "
                  f"[{r['speedup_vs_sdpa_ci95'][0]:.3f},{r['speedup_vs_sdpa_ci95'][1]:.3f}]"}
                 for r in rows],
                [("seqlen", "prompt", "d"), ("max_abs_logit_diff", "max |logit diff|", ".4f"),
                 ("max_abs_logit", "max |logit|", ".2f"),
                 ("logits_rel_error", "logits rel. error", ".2e"),
                 ("next_token_agreement", "argmax agrees", ".4f"),
                 ("eager_vs_sdpa_rel_error", "eager vs SDPA rel. error", ".2e"),
                 ("eager_vs_sdpa_agreement", "eager vs SDPA argmax", ".4f"),
                 ("wavefront_tokens_per_s", "wavefront tok/s", ".0f"),
                 ("sdpa_tokens_per_s", "SDPA tok/s", ".0f"), ("speedup", "vs SDPA", "")],
                title=f"\n{dev.name}: {rows[0]['model']}, {layers} layers, hidden {hidden}, "
                      f"{heads} heads / {kv_heads} K/V heads, batch {batch}, bf16 random "
                      f"weights; medians of {rounds} interleaved rounds")


@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also append the numbers to <out>/microbench.jsonl (with a manifest).")
@click.option("--json", "as_json", is_flag=True)
def microbench(out_dir, as_json):
    """The memory system's own numbers on this GPU (the timed model's parameters): L2 latency
    near and far (pointer chase, per-hop clocks), DRAM latency, DRAM read bandwidth."""
    dev = _require_gpu()
    from wavefront.measure.microbench import measure, summary_line
    m = {"gpu": dev.name, "l2_bytes": dev.l2_bytes, "sms": dev.sms,
         **measure(dev.l2_bytes, dev.sm_clock_khz * 1e3)}
    with JsonlSink(out_dir, "microbench.jsonl") as sink:
        sink.write(m)
    if as_json:
        _echo_json(m)
    else:
        click.echo(f"{dev.name}: {summary_line(m)}")


@main.command()
@click.option("--label", required=True, help="Names this launch in the records and figures.")
@click.option("--batch", type=click.IntRange(1), default=1, show_default=True)
@click.option("--heads", type=click.IntRange(1), default=1, show_default=True)
@click.option("--kv-heads", type=click.IntRange(1), default=None, help="Default: --heads.")
@click.option("--seqlen", type=click.IntRange(1), default=262144, show_default=True)
@click.option("--head-dim", type=click.Choice([str(d) for d in HEAD_DIMS]), default="128",
              show_default=True)
@click.option("--causal/--no-causal", default=False, show_default=True)
@click.option("--schedule", default="persistent+linear", show_default=True)
@click.option("--tiles", default="128x64", show_default=True)
@click.option("--ctas", type=click.IntRange(1), default=None, help="Cap the persistent grid.")
@click.option("--occupancy", type=click.IntRange(1, 4), default=None,
              help="CTAs per SM (default: the kernel's own choice).")
@click.option("--inputs", type=click.Choice(["torch", "cupy"]), default="torch",
              show_default=True,
              help="How the random inputs are made: torch.randn in bf16, or as the sweeps' "
                   "workers make them (CuPy float32 N(0, 1) cast to bf16, `out` given).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--package-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="A directory holding another version of the wavefront package (a git "
                   "archive of an older commit) to launch instead of this one.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Appends the record to <out>/timeline.jsonl (with a manifest).")
def timeline(label, batch, heads, kv_heads, seqlen, head_dim, causal, schedule, tiles, ctas,
             occupancy, inputs, seed, package_dir, out_dir):
    """One launch of wavefront.attention under Nsight Compute's PM sampling: DRAM throughput,
    L2 and warp states over the launch's duration (cold L2), with the launch's totals."""
    dev = _require_gpu()
    from wavefront.measure.timeline import TimelineLaunch, sample_launch
    try:
        launch = TimelineLaunch(label=label, batch=batch, heads=heads,
                                kv_heads=kv_heads or heads, seqlen=seqlen,
                                head_dim=int(head_dim), causal=causal, schedule=schedule,
                                tiles=tiles, ctas=ctas, occupancy=occupancy,
                                inputs=inputs, seed=seed)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    from wavefront.results.records import TIMELINE_RECORDS
    with tempfile.TemporaryDirectory() as tmp:
        record = sample_launch(launch, tmp, package_dir, keep_failed_in=out_dir)
    with JsonlSink(out_dir, "timeline.jsonl") as sink:
        sink.write(TIMELINE_RECORDS.stamp({"gpu": dev.name, **record}))
    lengths = [len(s["values"]) for s in record["series"].values()]
    click.echo(f"{label}: {len(lengths)} sampled series, up to {max(lengths, default=0)} "
               f"samples; totals {record['totals']}")


@main.command("bench-varlen")
@click.option("--sequences", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="Sequences in the packed batch (lengths drawn long-tailed).")
@click.option("--tokens", type=click.IntRange(1, 1 << 24), default=65536, show_default=True,
              help="Total tokens of the packed batch.")
@click.option("--longest", type=click.IntRange(1, 1 << 20), default=32768, show_default=True)
@click.option("--lengths", default=None,
              help="Explicit sequence lengths, comma-separated (instead of drawing them).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--heads", type=click.IntRange(1, 1024), default=32, show_default=True)
@click.option("--kv-heads", type=click.IntRange(1, 1024), default=None,
              help="K/V heads (GQA); default: --heads.")
@click.option("--head-dim", type=click.Choice([str(d) for d in HEAD_DIMS]), default="128",
              show_default=True)
@click.option("--causal/--no-causal", default=None,
              help="Causal or not; default: both.")
@click.option("--schedule", "schedules", default="tuned,persistent+linear,longest_first+linear,"
                                                "grouped_dynamic+linear", show_default=True,
              help="wavefront schedules to time ('tuned': the call with no schedule named).")
@click.option("--rounds", type=click.IntRange(min=6), default=10, show_default=True)
@click.option("--per-round", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write every contender's rounds to <out>/bench_varlen.jsonl.")
def bench_varlen(sequences, tokens, longest, lengths, seed, heads, kv_heads, head_dim, causal,
                 schedules, rounds, per_round, out_dir):
    """A packed batch of sequences of different lengths (FlashAttention's varlen layout):
    wavefront's varlen call per schedule against torch's varlen paths (varlen_attn, SDPA on
    nested tensors with cuDNN and FA2, cuDNN padded to the longest), interleaved rounds."""
    kv_heads = kv_heads or heads
    if heads % kv_heads:
        raise click.BadParameter(f"heads ({heads}) must be a multiple of kv-heads ({kv_heads})",
                                 param_hint="--kv-heads")
    from wavefront.measure.varlen_bench import long_tailed_lengths
    if lengths:
        lengths = _list(int, lengths, "--lengths")
    else:
        try:
            lengths = long_tailed_lengths(sequences, tokens, seed, longest)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--tokens") from None
    if min(lengths) < 0 or sum(lengths) < 1:
        raise click.BadParameter("lengths must be >= 0 with at least one token",
                                 param_hint="--lengths")
    names = [None if s == "tuned" else s for s in _list(str, schedules, "--schedule")]
    dev = _require_gpu()
    from wavefront.measure.rounds import run_rounds
    from wavefront.measure.varlen_bench import varlen_contenders
    from wavefront.results.records import VARLEN_BENCH_RECORDS
    rows = []
    with JsonlSink(out_dir, "bench_varlen.jsonl") as sink:
        for is_causal in ([causal] if causal is not None else [False, True]):
            contenders = varlen_contenders(lengths, heads=heads, kv_heads=kv_heads,
                                           head_dim=int(head_dim), causal=is_causal,
                                           schedules=names, seed=seed + 1,
                                           log=lambda m: click.echo(m, err=True))
            results = run_rounds(contenders, rounds=rounds, per_round=per_round)
            peers = [r for r in results if not r.name.startswith("wavefront")]
            for r in results:
                row = {"gpu": dev.name, "lengths": lengths, "heads": heads,
                       "kv_heads": kv_heads, "head_dim": int(head_dim), "causal": is_causal,
                       "contender": r.name, **r.as_dict()}
                for peer in peers:
                    row[f"x_{peer.name}"] = peer.median_ms / r.median_ms
                row = VARLEN_BENCH_RECORDS.stamp(row)
                rows.append(row)
                sink.write(row)
    best_peer = {c: min((r["median_ms"] for r in rows if r["causal"] == c
                         and not r["contender"].startswith("wavefront")), default=None)
                 for c in {r["causal"] for r in rows}}
    table = [{**r, "ci": f"{r['tflops_ci95'][0]:.1f}-{r['tflops_ci95'][1]:.1f}",
              "x_best": (best_peer[r["causal"]] / r["median_ms"]
                         if best_peer[r["causal"]] else None)} for r in rows]
    print_table(table, [("contender", "contender", ""), ("causal", "causal", ""),
                        ("tflops", "TFLOP/s", ".1f"), ("ci", "95% interval", ""),
                        ("x_best", "/best torch path", ".3f"), ("host_us", "host us/call", ".1f"),
                        ("throttled_rounds", "throttled rounds", "d")],
                title=f"\n{dev.name}, packed batch of {len(lengths)} sequences, {sum(lengths)} "
                      f"tokens (longest {max(lengths)}), H={heads} KV={kv_heads} D={head_dim} "
                      f"bf16: medians of {rounds} interleaved rounds x {per_round} calls")


@main.command()
@point_options(default_schedule="grid+linear,persistent+linear,persistent+sawtooth,"
                                "grouped+linear,grouped+sawtooth",
               default_seqlen="8192", default_head_dim="64,128", causal_default=None)
@click.option("--rounds", type=click.IntRange(min=6), default=15, show_default=True,
              help="Interleaved rounds; each times every contender once, in a random order.")
@click.option("--per-round", type=click.IntRange(min=1), default=5, show_default=True,
              help="Back-to-back launches per contender per round (one event pair).")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--peers/--no-peers", default=True, show_default=True,
              help="Time torch SDPA flash (FA2) and cuDNN in the same rounds.")
@lever_options
@click.option("--tuned/--no-tuned", default=False, show_default=True,
              help="Also time each shape's tuned configuration (wavefront/kernel/tuned.json, "
                   "what `wavefront.attention` runs by default here), in the same rounds.")
@click.option("--api/--no-api", default=True, show_default=True,
              help="Also time the public call, `wavefront.attention(q, k, v, causal=...)` on "
                   "torch tensors, called per launch as a user calls it (contender 'api'), "
                   "beside the bound launcher of the configuration it resolves to.")
@click.option("--carry-over", type=click.Choice(CARRY_OVER_MODES), default=None,
              help="How the public call takes a configuration at a shape without a tuned entry "
                   "of its own: the nearest entry's, or the fastest of the entries' "
                   "configurations timed on its first call (sets WAVEFRONT_CARRY_OVER; "
                   "unset: as that says, else nearest). With --api, 'measure' times them before "
                   "the rounds and records what it timed in the api row.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write every contender's rounds to <out>/bench.jsonl.")
@click.option("--json", "as_json", is_flag=True)
def bench(points, levers, rounds, per_round, warmup, peers, tuned, api, carry_over, out_dir,
          as_json):
    """Schedules x shapes, each shape's schedules and peers (cuDNN, FA2) timed in interleaved
    rounds: median TFLOP/s with a 95% interval, ratios to the peers of the same rounds, NVML
    clocks and throttled rounds, the L2 state, and each round's host speed (a probe: a
    host-bound call's ratio moves with it). Exits non-zero if any shape failed."""
    import statistics
    points = [p.replace(**levers) for p in points]
    if carry_over is not None:
        os.environ[CARRY_OVER_VARIABLE] = carry_over
    dev = _require_gpu()
    from wavefront.api import attention as public_attention
    from wavefront.measure.rounds import (API_CONTENDER, SLOW_HOST, bench_records, bench_shapes,
                                          carry_over_record, run_rounds, shape_contenders,
                                          slow_host_rounds)
    shapes, bound_of_api = bench_shapes(points, dev.name, tuned=tuned, api=api,
                                        log=lambda m: click.echo(m, err=True))
    rows, failed = [], 0
    with JsonlSink(out_dir, "bench.jsonl") as sink, \
            click.progressbar(list(shapes.items()), label="shapes", file=sys.stderr) as bar:
        for shape, members in bar:
            try:
                results = run_rounds(
                    shape_contenders(members, peers=peers,
                                     api_call=public_attention if api else None),
                    rounds=rounds, per_round=per_round, warmup=warmup)
            except Exception as exc:  # one failing shape must not lose the table
                rows.append({"gpu": dev.name, "shape": shape.as_dict(),
                             "error": f"{type(exc).__name__}: {exc}"})
                sink.write(rows[-1])
                failed += 1
                continue
            for row in bench_records(dev.name, shape, results, bound_of_api.get(shape),
                                     members):
                if row["contender"] == API_CONTENDER:
                    measured = carry_over_record(dev.name, shape, members)
                    if measured is not None:
                        row["carry_over"] = measured
                rows.append(row)
                sink.write(row)
    if as_json:
        _echo_json(rows)
    else:
        table = [{"contender": r.get("contender", "-"), "S": r["shape"]["seqlen"],
                  "D": r["shape"]["head_dim"], "causal": r["shape"]["causal"],
                  "tflops": r.get("tflops"),
                  "ci": (f"{r['tflops_ci95'][0]:.1f}-{r['tflops_ci95'][1]:.1f}"
                         if "tflops_ci95" in r else ""),
                  "x_cudnn": r.get("x_cudnn"), "x_fa2": r.get("x_fa2"),
                  "x_tilegym": r.get("x_tilegym"),
                  **{f"vs_{k}": (f"{r[f'x_{k}']:.3f} [{r[f'x_{k}_ci95'][0]:.3f},"
                                 f"{r[f'x_{k}_ci95'][1]:.3f}]" if f"x_{k}" in r else "")
                     for k in ("linear", "grid", "bound")},
                  "host_us": r.get("host_us"), "host_first_us": r.get("host_first_us"),
                  "probe": (f"{statistics.median(r['host_probe_us']):.2f} "
                            f"[{min(r['host_probe_us']):.2f}-{max(r['host_probe_us']):.2f}]"
                            if r.get("host_probe_us") else ""),
                  "steal": _steal_share(r.get("host_cpu_jiffies")),
                  "throttled": r.get("throttled_rounds"),
                  "status": r.get("error", "ok")[:40]} for r in rows]
        print_table(table, [("contender", "contender", ""), ("S", "S", "d"), ("D", "D", "d"),
                            ("causal", "causal", ""), ("tflops", "TFLOP/s", ".1f"),
                            ("ci", "95% interval", ""), ("x_cudnn", "/cuDNN", ".3f"),
                            ("x_fa2", "/FA2", ".3f"), ("x_tilegym", "/TileGym", ".3f"),
                            ("vs_linear", "vs own linear", ""),
                            ("vs_grid", "vs grid", ""), ("vs_bound", "api vs bound", ""),
                            ("host_us", "host us/call", ".1f"),
                            ("host_first_us", "host us, 1st call", ".1f"),
                            ("probe", "host probe us [range]", ""),
                            ("steal", "CPU stolen %", ""),
                            ("throttled", "throttled rounds", "d"), ("status", "status", "")],
                    title=f"\n{dev.name}, B={points[0].batch} H={points[0].heads} "
                          f"{points[0].dtype}: medians of {rounds} "
                          f"interleaved rounds x {per_round} launches, useful FLOPs; ratios "
                          "against peers of the same rounds; L2 cold by rotation")
    for found in slow_host_rounds(rows):
        shape, usual = found["shape"], found["api_vs_bound_usual"]
        click.echo(f"S={shape['seqlen']} D={shape['head_dim']} causal={shape['causal']}: the "
                   f"host ran slow in {found['slow']} of {found['rounds']} rounds (its probe "
                   f"{SLOW_HOST:g}x its fastest or more): a host-bound contender (the api at "
                   "short shapes) reads low there"
                   + (f"; api vs bound over the other rounds {usual:.3f}" if usual else ""),
                   err=True)
    if failed:
        sys.exit(1)


def _steal_share(jiffies) -> str:
    """'1.2' (% of the host's CPU time stolen over the rounds), '' where not recorded."""
    if not jiffies:
        return ""
    stolen, total = (sum(j[i] for j in jiffies) for i in (0, 1))
    return f"{100 * stolen / total:.1f}" if total else ""


@main.command()
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--heads", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--kv-heads", type=click.IntRange(min=1), default=None)
@click.option("--seqlen", type=click.IntRange(min=1), default=8192, show_default=True)
@click.option("--head-dim", "head_dims", default="64,128", show_default=True,
              callback=_value_list("head_dim", PARAMS["head_dim"], int),
              help=f"Head dims among {HEAD_DIMS}, comma-separated.")
@click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16", show_default=True)
@click.option("--causal/--no-causal", default=None, help="Unset: both.")
@click.option("--rounds", type=click.IntRange(min=6), default=10, show_default=True)
@click.option("--per-round", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--jobs", "-j", type=click.IntRange(1, 128), default=None,
              help="Parallel compiler processes (default: CPU count).")
@click.option("--softmax-levers/--no-softmax-levers", default=True, show_default=True,
              help="Then search FlashAttention-4's rescale threshold and polynomial exp2 on "
                   "each shape's winner, in rounds of their own.")
@click.option("--write/--no-write", default=False, show_default=True,
              help="Write each shape's fastest configuration into wavefront/kernel/tuned.json "
                   "(keyed by GPU, head dim, mask and this batch/heads/K/V heads/length); "
                   "not a winner under half the speed the table recorded there (a slowed "
                   "GPU), which exits non-zero.")
@click.option("--only", "only", multiple=True, metavar="LEVER=V[,V]",
              help="Hold a lever of the first stage to these of its searched values "
                   "(repeatable; e.g. --only tiles=128x128): a search around known winners.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write every candidate's row to <out>/tune.jsonl and the lever record to "
                   "<out>/levers.jsonl.")
def tune(batch, heads, kv_heads, seqlen, head_dims, dtype, causal, rounds, per_round, jobs,
         softmax_levers, only, write, out_dir):
    """Search the kernel's levers on this GPU, per head dim and mask; keep the fastest.

    Candidates: every combination of tile shape, occupancy, worker warps, cluster, K/V latency
    hint and static/dynamic schedule. Each is compiled and its SASS read first (a candidate
    that spills or serialises its MMAs is recorded, not timed), then the rest are timed with
    cuDNN and FA2 in interleaved rounds after a check against float32. Then FlashAttention-4's
    softmax levers are searched on the winner in rounds of their own. Prints what each lever
    did; with --write, the fastest per shape becomes `wavefront.attention`'s default here for
    this shape and those nearest to it."""
    from wavefront.measure import tune as tuning
    try:
        first_levers = tuning.restricted(only)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from None
    dev = _require_gpu()
    from wavefront.kernel.tuning import entry_key, load_table, write_entry
    causals = (False, True) if causal is None else (causal,)
    try:
        shape_points = [Point(batch, heads, kv_heads, seqlen, d, dtype, c)
                        for d in head_dims for c in causals]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    failed = 0
    sink = JsonlSink(out_dir, "tune.jsonl", manifest_files=["tune.jsonl", "levers.jsonl"])
    levers_sink = JsonlSink(out_dir, "levers.jsonl", manifest_files=())
    columns = [("lever", "lever", ""), ("value", "value", ""), ("candidates", "candidates", "d"),
               ("timed", "timed", "d"), ("best_tflops", "best TFLOP/s", ".1f"),
               ("of_best", "of the best", ".3f"), ("best_label", "binary", "")]
    for shape in shape_points:
        what = f"D={shape.head_dim} {'causal' if shape.causal else 'non-causal'}"
        stages = [("levers", tuning.lever_space(shape, first_levers), first_levers)]
        if softmax_levers:
            stages.append(("softmax", None, tuning.SOFTMAX_LEVERS))
        best = None
        for stage, candidates, levers in stages:
            if candidates is None:  # the second stage searches around the first's winner
                if best is None:
                    break
                candidates = tuning.softmax_space(shape.replace(**best["levers"]))
            rows, ran = tuning.search(
                candidates, dev, dev.name, dtype, rounds=rounds, per_round=per_round, jobs=jobs,
                log=lambda m: click.echo(f"{what}, {stage}: {m}", err=True))
            failed += not ran
            ours = [r for r in rows if not r.get("peer")]
            record = tuning.lever_record(ours, levers)
            for row in tuning.candidate_records(rows, stage):
                sink.write(row)
            for row in tuning.lever_records(dev.name, shape, stage, record):
                levers_sink.write(row)
            print_table(record, columns,
                        title=f"\n{dev.name}, B={batch} H={heads} S={seqlen} {dtype} {what}, "
                              f"{stage}: what each lever did (best timed candidate with that "
                              f"value, against the best of the same rounds)")
            stage_best = tuning.best_row(rows)
            if stage_best is None:
                click.echo(f"{what}, {stage}: no candidate was timed")
                break
            best = stage_best
            click.echo(f"{stage} best: {best['label']} {best['levers']['schedule']} "
                       f"{best['tflops']:.1f} TFLOP/s [{best['tflops_ci95'][0]:.1f}, "
                       f"{best['tflops_ci95'][1]:.1f}]"
                       + "".join(f", {best[f'x_{k}']:.3f}x {k}" for k in ("cudnn", "fa2")
                                 if f"x_{k}" in best))
        if best is None:
            failed += 1
            continue
        if write:
            dims = (batch, heads, kv_heads or heads, seqlen)
            try:  # a table that does not load, or a write refused: named, the table untouched
                previous = load_table().get(dev.name, {}).get(
                    entry_key(shape.head_dim, shape.causal, dims))
                refused = tuning.slowed_gpu(best, previous)
                if not refused:
                    entry = tuning.tuned_entry(best, dims, dtype, first_levers)
                    key = write_entry(dev.name, shape.head_dim, shape.causal, entry)
            except ValueError as exc:
                refused = str(exc)
            except OSError as exc:
                refused = os_error_text(exc) + " (the tuned table is unchanged)"
            if refused:
                click.echo(f"{what}: {refused}", err=True)
                failed += 1
                continue
            click.echo(f"{what}: wrote {dev.name} {key}", err=True)
    sink.close()
    levers_sink.close()
    if failed:
        sys.exit(1)


def _sweep_runner(out_dir):
    from wavefront.measure.runner import SubprocessRunner
    from wavefront.results.orders import ORDERS_DIR
    return SubprocessRunner(report_dir=str(Path(out_dir) / "ncu-reports"),
                            order_dir=str(Path(out_dir) / ORDERS_DIR))


@main.command()
@point_options(default_schedule="persistent+linear,persistent+sawtooth",
               default_seqlen="131072", default_head_dim="64", causal_default=False,
               default_heads=1)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Separate profiled launches per point, interleaved.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Results directory (results.csv, manifest.json, ncu-reports/); default: a "
                   "new temporary directory, printed.")
@click.option("--timeout", "timeout_s", type=FiniteFloatRange(min=1), default=300,
              show_default=True, help="Per launch, wall clock.")
@click.option("--json", "as_json", is_flag=True)
def profile(points, repeats, out_dir, timeout_s, as_json):
    """Points under Nsight Compute: DRAM reads (the primary miss metric), L2 sectors (SM side
    and fabric), vs the closed-form count. Kernel replay, cold L2 each pass, each launch in its
    own NVTX range."""
    from wavefront.results.sweep import SweepSpec, grid_of
    dev = _require_gpu()
    spec = SweepSpec(name="profile", grid=[grid_of(p) for p in points], measure=["counters"], repeats=repeats,
                     timeout_s=timeout_s)
    target = out_dir or tempfile.mkdtemp(prefix="wavefront-profile-")
    summary = _run_sweep(spec, target, dev, retry_failed=True)
    from wavefront.results.store import load_results, results_path
    from wavefront.results.sweep import expand
    df = load_results(results_path(target))
    # this command's points on this GPU (a resumed --out holds other configurations' rows,
    # and the last run may be another's: everything here may have been measured before)
    keys = {t["point"] for t in expand(spec, gpu=dev.name, sms=dev.sms, l2_bytes=dev.l2_bytes)}
    df = df[df["point"].isin(keys) & (df["gpu"] == dev.name)
            & (df["measurement"] == "counters")]
    if as_json:
        _echo_json({"gpu": dev.name, "inputs": [p.as_dict() for p in points],
                    "results": str(results_path(target)), "summary": summary,
                    "rows": json.loads(df.to_json(orient="records"))})
    else:
        rows = []
        for _, r in df.iterrows():
            rows.append({"schedule": f"{r['cta_schedule']}+{r['kv_schedule']}",
                         "S": r["seqlen"], "D": r["head_dim"], "causal": r["causal"],
                         "repeat": r["repeat"],
                         "dram_mb": r["dram_read_bytes"] / 1e6 if r["status"] == "ok" else None,
                         "x_min": (r["dram_read_bytes"] / r["compulsory_read_bytes"]
                                   if r["status"] == "ok" else None),
                         "l2": r["l2_tex_read_sectors"], "ratio": r["read_sectors_ratio"],
                         "fabric": r["l2_fabric_read_sectors"],
                         "status": "ok" if r["status"] == "ok" else str(r["error"])[:50]})
        print_table(rows, [*POINT_COLUMNS, ("repeat", "rep", "d"),
                           ("dram_mb", "DRAM rd MB", ".1f"), ("x_min", "x compulsory", ".2f"),
                           ("l2", "L2 reads", ".4g"), ("ratio", "/closed", ".3f"),
                           ("fabric", "fabric rd", ".4g"), ("status", "status", "")],
                    title=f"\n{dev.name}: ncu, cold L2, kernel replay")
        click.echo(f"rows appended to {results_path(target)}")
    if summary["failed"]:
        sys.exit(1)


def _run_sweep(spec, out_dir, dev, retry_failed=False, runner=None):
    from wavefront.measure.profiling import ProfilerError
    from wavefront.results.store import SchemaError, StoreLocked
    from wavefront.results.sweep import run_sweep
    try:
        return run_sweep(spec, out_dir, gpu=dev.name, sms=dev.sms, l2_bytes=dev.l2_bytes,
                         runner=runner or _sweep_runner(out_dir), environment=environment(),
                         retry_failed=retry_failed, command=sys.argv)
    except (ProfilerError, StoreLocked, SchemaError, ValueError) as exc:
        # ValueError: a spec error only this GPU's shape reveals (expanding on it)
        raise click.ClickException(str(exc)) from None


def _run_sweep_on_dask(spec, out_dir, gpus, scheduler, retry_failed=False):
    """The same sweep with Dask as the engine: a local cluster of one worker per GPU
    (`gpus`: a count or 'all'), or an existing cluster at `scheduler`."""
    from wavefront.device import software_versions
    from wavefront.results.store import SchemaError, StoreLocked
    from wavefront.results.sweep import run_sweep
    from wavefront.measure.distributed import visible_gpu_count
    if not scheduler:  # the host's GPUs first: the same answer with or without Dask installed
        present = visible_gpu_count()
        n = present if gpus == "all" else int(gpus)
        if n < 1 or present < 1:
            raise click.ClickException("--gpus: no GPU is visible on this host")
        if n > present:
            raise click.ClickException(f"--gpus {n}: this host has {present} GPU"
                                       f"{'s' if present != 1 else ''}")
    try:
        from distributed import Client

        from wavefront.measure.distributed import DaskRunner, cluster_gpu, local_gpu_cluster
    except (ImportError, RuntimeError):
        raise click.ClickException("--gpus and --scheduler need Dask: pip install "
                                   "'wavefront[distributed]'") from None
    cluster = None
    try:
        if scheduler:
            try:
                client = Client(scheduler)
            except (OSError, ValueError, TypeError) as exc:  # unreachable, malformed
                raise click.ClickException(f"--scheduler {scheduler!r}: cannot connect "
                                           f"({exc})") from None
        else:
            cluster = local_gpu_cluster(n)
            client = Client(cluster)
        gpu = cluster_gpu(client)
        env = {"gpu": {k: v for k, v in gpu.items() if k != "workers"},
               "workers": gpu["workers"], **software_versions()}
        from wavefront.results.orders import ORDERS_DIR
        runner = DaskRunner(client, report_dir=str(Path(out_dir).resolve() / "ncu-reports"),
                            order_dir=str(Path(out_dir).resolve() / ORDERS_DIR))
        return run_sweep(spec, out_dir, gpu=gpu["name"], sms=gpu["sms"],
                         l2_bytes=gpu["l2_bytes"], runner=runner, environment=env,
                         retry_failed=retry_failed, command=sys.argv,
                         manifest_extra={"engine": f"dask ({len(gpu['workers'])} workers)"})
    except (StoreLocked, SchemaError, RuntimeError, ValueError) as exc:
        # ValueError: a spec error only the cluster's GPU shape reveals (expanding on it)
        raise click.ClickException(str(exc)) from None
    finally:
        if cluster is not None:
            client.close()
            cluster.close()


def _gpus_option(f):
    f = click.option("--scheduler", default=None,
                     help="Submit to an existing Dask cluster at this address "
                          "(e.g. tcp://host:8786).")(f)
    return click.option("--gpus", default=None,
                        help="Run on a local Dask cluster, one worker per GPU: a count or "
                             "'all'.")(f)


def load_any_spec(path: str):
    """A sweep spec from a TOML file or from an experiment file's SPEC."""
    from wavefront.results.sweep import experiment_spec_texts, load_spec, parse_spec
    if path.endswith(".py"):
        # read as data, not run: a dry run imports nothing the figure needs
        texts = experiment_spec_texts(path)
        if len(texts) != 1:
            raise ValueError(f"{path}: owns {len(texts)} sweeps ({', '.join(texts) or 'none'}); "
                             f"run it with `python {path} run`")
        (dataset, text), = texts.items()
        return parse_spec(text, f"{path}[{dataset}]")
    return load_spec(path)


@main.command()
@click.argument("spec_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Results directory (results.csv + manifest.json); re-running resumes.")
@click.option("--retry-failed", is_flag=True, help="Measure failed points again.")
@click.option("--dry-run", is_flag=True,
              help="List the points the spec expands to on a GPU preset; needs no GPU.")
@click.option("--gpu", "preset", default="h100", show_default=True,
              help="GPU preset for --dry-run (h100, h200, b200, gb10).")
@_gpus_option
@click.option("--json", "as_json", is_flag=True)
def sweep(spec_path, out_dir, retry_failed, dry_run, preset, gpus, scheduler, as_json):
    """Measure a sweep (a TOML spec or an experiment file) point by point, resumable.

    On one GPU by default; `--gpus N|all` on every GPU of this host, `--scheduler ADDRESS` on
    a Dask cluster (Slurm: see the README)."""
    try:
        spec = load_any_spec(spec_path)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="SPEC_PATH") from None
    from wavefront.model.presets import gpu_preset
    from wavefront.results.sweep import describe, expand
    try:  # every value checked on the preset's shape before a GPU is looked for
        gpu = gpu_preset(preset)
        tasks = expand(spec, gpu=gpu.name, sms=gpu.sms, l2_bytes=gpu.l2_bytes,
                       source=spec_path)
    except ValueError as exc:
        if dry_run:
            raise click.BadParameter(str(exc)) from None
        raise click.ClickException(str(exc)) from None
    if dry_run:
        if as_json:
            _echo_json({"spec": spec.as_dict(), "gpu": gpu.name, "tasks": tasks})
        else:
            click.echo(describe(tasks))
            click.echo(f"{spec.name}: {len(tasks)} tasks on the {gpu.name} preset")
        return
    if out_dir is None:
        raise click.UsageError("--out DIR is required (or --dry-run)")
    if gpus or scheduler:
        if gpus and gpus != "all" and not gpus.isdigit():
            raise click.BadParameter(f"expected a count or 'all', got {gpus!r}",
                                     param_hint="--gpus")
        summary = _run_sweep_on_dask(spec, out_dir, gpus, scheduler, retry_failed)
    else:
        dev = _require_gpu()
        summary = _run_sweep(spec, out_dir, dev, retry_failed)
    if as_json:
        _echo_json({"spec": spec.as_dict(), "out": out_dir, **summary})
    else:
        from wavefront.results.store import results_path
        click.echo(f"{spec.name}: {summary['points']} tasks, {summary['skipped']} already done, "
                   f"{summary['ok']} measured, {summary['failed']} failed -> "
                   f"{results_path(out_dir)}")
    if summary["failed"]:
        sys.exit(1)


# --------------------------------------------------------------------------------------------
# The model and the report: simulate, fit, paper
# --------------------------------------------------------------------------------------------

def _default_fits() -> Path:
    return Path(__file__).resolve().parent.parent / "paper" / "fits.json"


def _fits_option(f):
    return click.option(
        "--fits", "fits_path", type=click.Path(dir_okay=False), default=None,
        help="The fits the timed model's compute times come from (its calibration on "
             "experiments/step_time.py) [default: the checkout's paper/fits.json].")(f)


def _timed_setup(gpu, gpu_name: str, fits_path):
    """(memory timing, a function launch -> compute timing) for a preset: its own calibration
    where fits.json has one, else projected from the H100's."""
    from wavefront.model.presets import gpu_preset, preset_for_device
    from wavefront.model.timed import Calibration, memory_timing, projected_compute
    path = Path(fits_path) if fits_path else _default_fits()
    try:
        from wavefront.files import read_json  # a regular file, bounded (a FIFO hung here)
        cals = read_json(path, "fits.json", limit=64 << 20,
                         nan_ok=True)["timed_model"]["calibrations"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise click.UsageError(f"{path}: no timed-model calibration ({exc.__class__.__name__}"
                               f": {exc}); run `wavefront paper` or pass --fits") from None
    cals = {name: Calibration.from_dict(c) for name, c in cals.items()}
    try:
        memory = memory_timing(gpu)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None
    # a calibration belongs to the preset its measured GPU's name maps to
    own = next((c for name, c in cals.items()
                if preset_for_device(name) == gpu_preset(gpu_name)), None)
    h100 = next((c for name, c in cals.items() if preset_for_device(name) == gpu_preset("h100")),
                None)

    def compute(launch):
        timing = own.compute(launch) if own else None
        if timing is None and h100 is not None:
            timing = projected_compute(h100, gpu_preset("h100"), gpu, launch)
        if timing is None:
            raise click.UsageError(f"{path}: no calibration for this kernel variant")
        return timing
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
    memory, compute_of = _timed_setup(gpu, gpu_name, fits_path)
    partitions = partitions or gpu.l2_partitions
    rows, start = [], time.perf_counter()
    for point, launch in _simulable_launches(points, gpu):
        t0 = time.perf_counter()
        click.echo(f"simulating {launch.name} S={point.seqlen} D={point.head_dim} "
                   f"{'causal' if point.causal else 'non-causal'} with the clock ...", err=True,
                   nl=False)
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
              help="GPU preset: h100, h200, b200, gb10.")
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


ADVISE_SCHEDULES = ("grid+linear,persistent+linear,persistent+sawtooth,grouped+linear,"
                    "grouped+sawtooth,longest_first+linear,dynamic+linear,"
                    "grouped_dynamic+linear")


@main.command()
@click.option("--gpu", "gpu_name", default="h100", show_default=True,
              help="GPU preset: h100, h200, b200, gb10.")
@point_options(default_schedule=ADVISE_SCHEDULES, default_seqlen="131072",
               default_head_dim="64", causal_default=False, default_heads=1)
@click.option("--tiles-to-try", "tile_list", default="64x64,128x64", show_default=True,
              help="Tile shapes to rank (each with every schedule).")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True)
@_fits_option
@click.option("--json", "as_json", is_flag=True)
def advise(gpu_name, points, tile_list, top, fits_path, as_json):
    """Rank schedules and tile shapes for one shape on a GPU preset by the timed model's
    predicted kernel time (CPU only; nothing is measured)."""
    from dataclasses import replace
    from wavefront.model.presets import gpu_preset
    from wavefront.model.timed import simulate_timed
    try:
        gpu = gpu_preset(gpu_name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None
    shapes = {(p.batch, p.heads, p.kv_heads, p.seqlen, p.head_dim, p.causal) for p in points}
    if len(shapes) > 1:
        raise click.UsageError("advise ranks configurations of one shape: give one --seqlen, "
                               "--head-dim and mask")
    tiles = _list(str, tile_list, "--tiles-to-try")
    memory, compute_of = _timed_setup(gpu, gpu_name, fits_path)
    rows = []
    candidates = [replace(p, tiles=t, occupancy=None) for p in points for t in tiles]
    with click.progressbar(candidates, label="simulating", file=sys.stderr) as bar:
        for point in bar:
            try:
                launch = point.launch(gpu)
            except ValueError:
                continue  # a tile shape this schedule or head dim does not take
            pred = simulate_timed(launch, memory, compute_of(launch), l2_bytes=gpu.l2_bytes,
                                  partitions=gpu.l2_partitions)
            rows.append({"schedule": launch.name, "tiles": point.tiles,
                         "time_ms": pred.kernel_ns * 1e-6,
                         "dram_mb": pred.dram_read_bytes / 1e6})
    rows.sort(key=lambda r: r["time_ms"])
    for r in rows:
        r["vs_best"] = r["time_ms"] / rows[0]["time_ms"]
    p = points[0]
    if as_json:
        _echo_json({"gpu": gpu.name, "shape": {"batch": p.batch, "heads": p.heads,
                                               "kv_heads": p.kv_heads, "seqlen": p.seqlen,
                                               "head_dim": p.head_dim, "causal": p.causal},
                    "ranking": rows})
        return
    print_table(rows[:top], [("schedule", "schedule", ""), ("tiles", "tiles", ""),
                             ("time_ms", "predicted ms", ".3f"),
                             ("vs_best", "x best", ".3f"), ("dram_mb", "DRAM rd MB", ".1f")],
                title=f"{gpu.name}: B{p.batch} H{p.heads}/{p.kv_heads} S{p.seqlen} "
                      f"D{p.head_dim} {'causal' if p.causal else 'non-causal'}, ranked by the "
                      "timed model's predicted time")


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


@main.command()
@click.argument("directories", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False))
@click.option("--significant-digits", "digits", type=click.IntRange(4, 17), default=None,
              help="Then pack every packed table and record file (results.csv.gz, *.jsonl.gz) "
                   "again with each float that is not a whole number at this many significant "
                   "digits (7: what float32 CUDA events and ncu rates hold); whole numbers "
                   "stay exact, and each line is checked to be within the rounding.")
def compress(directories, digits):
    """Pack each data directory's plain results.csv as results.csv.gz, its manifest.json as
    manifest.json.gz and its record files (*.jsonl, in subdirectories too) as *.jsonl.gz, the
    form committed data takes (about 8x smaller); the store and the report read either. Each
    packed file is checked to hold what it was made from before the plain file goes; a plain
    file beside a packed one that holds something else is refused, nothing replaced."""
    from wavefront.results.store import (
        COMPRESSED_RESULTS_FILE, MANIFEST_FILE, RESULTS_FILE, SchemaError, compress_manifest,
        compress_results, gzip_file, load_results, read_manifest, read_results_bytes,
        repack_significant)
    for directory in directories:
        plain = Path(directory) / RESULTS_FILE
        records = sorted(Path(directory).rglob("*.jsonl"))
        manifests = sorted(Path(directory).rglob(MANIFEST_FILE))
        packed_files = [*Path(directory).rglob("*.jsonl.gz"),
                        *Path(directory).rglob(COMPRESSED_RESULTS_FILE)]
        if not plain.is_file() and not records and not manifests and not (
                digits and packed_files):
            raise click.BadParameter(f"{directory}: no {RESULTS_FILE}, {MANIFEST_FILE} or "
                                     "*.jsonl record file to compress"
                                     + (", nor a packed one" if digits else ""),
                                     param_hint="DIRECTORIES")
        for manifest in manifests:
            try:
                runs = read_manifest(manifest.parent)
            except SchemaError as exc:
                raise click.ClickException(str(exc)) from None
            size = manifest.stat().st_size
            try:
                packed = compress_manifest(manifest.parent)
            except SchemaError as exc:
                raise click.ClickException(str(exc)) from None
            if read_manifest(manifest.parent) != runs:
                raise click.ClickException(f"{packed}: does not hold the runs it was made from")
            click.echo(f"{packed}: {len(runs)} runs, {size} -> {packed.stat().st_size} bytes")
        for record in records:
            try:
                text = read_results_bytes(record, "a record file")
                packed = gzip_file(record)
            except SchemaError as exc:
                raise click.ClickException(str(exc)) from None
            if read_results_bytes(packed) != text:
                raise click.ClickException(f"{packed}: does not hold the lines it was made from")
            click.echo(f"{packed}: {len(text)} -> {packed.stat().st_size} bytes")
        if not plain.is_file():
            continue
        try:
            rows = len(load_results(plain, require_manifest=False))
        except SchemaError as exc:
            raise click.ClickException(str(exc)) from None
        try:
            text = read_results_bytes(plain, "a results file")
            packed = compress_results(directory)
        except SchemaError as exc:
            raise click.ClickException(str(exc)) from None
        if read_results_bytes(packed) != text:  # the plain file is gone: say so loudly
            raise click.ClickException(f"{packed}: does not hold the rows it was made from")
        click.echo(f"{packed}: {rows} rows, {len(text)} -> {packed.stat().st_size} bytes")
    if digits is None:
        return
    for directory in directories:
        for path in sorted([*Path(directory).rglob("*.jsonl.gz"),
                            *Path(directory).rglob(COMPRESSED_RESULTS_FILE)]):
            try:
                before, after = repack_significant(path, digits)
            except (SchemaError, ValueError) as exc:
                raise click.ClickException(str(exc)) from None
            click.echo(f"{path}: at {digits} significant digits, {before} -> {after} bytes")


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


# --------------------------------------------------------------------------------------------
# Experiment scripts
# --------------------------------------------------------------------------------------------

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


if __name__ == "__main__":
    main()
