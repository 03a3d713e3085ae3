"""The kernel and the machine: `info`, `schedules`, `compile` (no GPU needed for the last two)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from wavefront.cli.common import _echo_json, main, print_table
from wavefront.device import usable_cpus
from wavefront.schedules import schedule_names


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
    --all adds the KV-cache call's binaries (decode_*, combine_splits_*, append_kv_*).
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
        from wavefront.kernel.decode import all_decode_variants
        variants += list(all_decode_variants())  # the cache call's (decode_*, append_kv_*)
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
