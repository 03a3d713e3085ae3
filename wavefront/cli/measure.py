"""Measuring on a GPU: `run`, `bench`, `bench-varlen`, `bench-decode`, `tune`, `prefill`, `microbench`,
`timeline`, `profile`, `sweep` (one GPU, every GPU of a host, or a Dask cluster), and `stalls`
(Nsight Compute's warp-state samples per instruction, summarised)."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click

from wavefront.cli.common import (
    POINT_COLUMNS,
    FiniteFloatRange,
    _echo_json,
    _list,
    _require_gpu,
    _value_list,
    lever_options,
    main,
    point_options,
    print_records,
    print_table,
)
from wavefront.kernel.tuning import CARRY_OVER_MODES, CARRY_OVER_VARIABLE
from wavefront.measure.sink import JsonlSink, environment
from wavefront.model.presets import PRESETS
from wavefront.point import DTYPES, HEAD_DIMS, PARAMS, Point


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


def _decode_variants(splits: str, ctas_per_sm: str) -> dict:
    """{label: cache-call options} of a split x occupancy sweep; {} where neither is given."""
    if not splits.strip() and not ctas_per_sm.strip():
        return {}
    from wavefront.decode_schedules import MAX_SPLITS
    from wavefront.kernel.kvcache import MAX_CTAS_PER_SM

    def values(text, option, upper):  # None: the planned value ('auto', or not swept)
        if not text.strip():
            return [None]
        out = []
        for part in _list(str, text, option):
            if part == "auto":
                out.append(None)
            elif part.isdecimal() and part.isascii() and 1 <= int(part) <= upper:
                out.append(int(part))
            else:
                raise click.BadParameter(f"expected integers in [1, {upper}] or 'auto', comma-"
                                         f"separated; got {part!r}", param_hint=option)
        return out
    return {f"s{s or 'auto'} c{c or 'auto'}": {"num_splits": s, "ctas_per_sm": c}
            for s in values(splits, "--sweep-splits", MAX_SPLITS)
            for c in values(ctas_per_sm, "--sweep-ctas-per-sm", MAX_CTAS_PER_SM)}


@main.command("bench-decode")
@click.option("--batch", "batches", default="1,8,64", show_default=True,
              help="Sequences per step, comma-separated.")
@click.option("--context", "contexts", default="4096,32768,131072", show_default=True,
              help="Keys in each sequence's cache, comma-separated.")
@click.option("--heads", type=click.IntRange(1, 1024), default=32, show_default=True)
@click.option("--kv-heads", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("--head-dim", type=click.Choice([str(d) for d in HEAD_DIMS]), default="128",
              show_default=True)
@click.option("--page-size", type=click.Choice(["16", "32", "64", "128", "256"]), default="64",
              show_default=True, help="Keys per page of the paged contender.")
@click.option("--rounds", type=click.IntRange(min=6), default=15, show_default=True)
@click.option("--per-round", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--graphs/--no-graphs", default=True, show_default=True,
              help="Also time every contender replayed from CUDA graphs (one per input set), "
                   "as a serving engine that graphs its decode step launches it.")
@click.option("--sweep-splits", default="", metavar="LIST",
              help="Also time the contiguous call at these K/V split counts (comma-separated, "
                   "'auto' for the planned count): contenders 'wavefront contiguous s<N> "
                   "c<CTAs per SM>', beside the planned launch.")
@click.option("--sweep-ctas-per-sm", default="", metavar="LIST",
              help="... and at these persistent CTAs per SM (comma-separated, the kernel's "
                   "occupancy; default the planned one).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write every contender's rounds to <out>/bench_decode.jsonl.")
def bench_decode(batches, contexts, heads, kv_heads, head_dim, page_size, rounds, per_round,
                 warmup, graphs, sweep_splits, sweep_ctas_per_sm, out_dir):
    """One decode step (a query per sequence, bf16) against a full KV cache: wavefront's cache
    call on a contiguous and a paged cache against torch SDPA's backends on the same cache,
    interleaved rounds; GB/s of K/V read against the DRAM read bandwidth measured first
    (the microbenchmark's reduction). A shape that fails is recorded and the rest goes on."""
    if heads % kv_heads:
        raise click.BadParameter(f"heads ({heads}) must be a multiple of kv-heads ({kv_heads})",
                                 param_hint="--kv-heads")
    batches = _list(int, batches, "--batch")
    contexts = _list(int, contexts, "--context")
    for name, values in (("--batch", batches), ("--context", contexts)):
        if min(values) < 1:
            raise click.BadParameter("must be positive", param_hint=name)
    variants = _decode_variants(sweep_splits, sweep_ctas_per_sm)
    dev = _require_gpu()
    from wavefront.measure.decode_bench import decode_contenders, gbps, launched_alike
    from wavefront.measure.microbench import read_bandwidth
    from wavefront.measure.rounds import run_rounds
    from wavefront.results.records import DECODE_BENCH_RECORDS
    peak, peak_runs = read_bandwidth()
    click.echo(f"DRAM read bandwidth (cupy.sum over 4 GiB, best of {len(peak_runs)}): "
               f"{peak:.0f} GB/s", err=True)
    rows = []
    shapes = [(b, c) for b in batches for c in contexts]
    shape = {"heads": heads, "kv_heads": kv_heads, "head_dim": int(head_dim),
             "page_size": int(page_size)}
    with JsonlSink(out_dir, "bench_decode.jsonl") as sink, \
            click.progressbar(shapes, label="shapes", file=sys.stderr) as bar:
        for batch, context in bar:
            where = {"gpu": dev.name, "batch": batch, "context": context, **shape}
            try:
                contenders, step_bytes, sets, notes = decode_contenders(
                    batch=batch, context=context, heads=heads, kv_heads=kv_heads,
                    head_dim=int(head_dim), page_size=int(page_size), l2_bytes=dev.l2_bytes,
                    graphs=graphs, variants=variants, log=lambda m: click.echo(m, err=True))
                results = run_rounds(contenders, rounds=rounds, per_round=per_round,
                                     warmup=warmup)
            except Exception as exc:  # one failing shape must not lose the others
                row = {**where, "error": f"{type(exc).__name__}: {exc}"}
                click.echo(f"B{batch} context {context}: FAILED {row['error']}", err=True)
                sink.write(row)
                continue
            for r in results:
                # against the fastest SDPA launched the same way (eager or graphed)
                best_sdpa = min((o.median_ms for o in results if o.name.startswith("SDPA")
                                 and launched_alike(o.name, r.name)), default=None)
                lo, hi = r.ci95_ms
                row = DECODE_BENCH_RECORDS.stamp({
                    **where, "contender": r.name, "kv_bytes": step_bytes, "input_sets": sets,
                    "notes": notes, **r.as_dict(),
                    "gbps": gbps(step_bytes, r.median_ms),
                    "gbps_ci95": [gbps(step_bytes, hi), gbps(step_bytes, lo)],
                    "dram_peak_gbps": peak, "dram_peak_runs_gbps": peak_runs,
                    "x_dram_peak": gbps(step_bytes, r.median_ms) / peak,
                    "x_best_sdpa": best_sdpa / r.median_ms if best_sdpa else None})
                rows.append(row)
                sink.write(row)
    table = [{**r, "shape": f"B{r['batch']} ctx {r['context']}",
              "ci": f"{r['gbps_ci95'][0]:.0f}-{r['gbps_ci95'][1]:.0f}"} for r in rows]
    print_table(table, [("shape", "shape", ""), ("contender", "contender", ""),
                        ("median_ms", "ms", ".4f"), ("gbps", "GB/s", ".0f"),
                        ("ci", "95% interval", ""), ("x_dram_peak", "/DRAM peak", ".3f"),
                        ("x_best_sdpa", "/best SDPA", ".3f"),
                        ("throttled_rounds", "throttled rounds", "d")],
                title=f"\n{dev.name}, one decode step, H={heads} KV={kv_heads} D={head_dim} "
                      f"bf16, DRAM read peak {peak:.0f} GB/s: medians of {rounds} interleaved "
                      f"rounds x {per_round} calls")


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
    points = [p.replace(**levers) for p in points]
    if carry_over is not None:
        os.environ[CARRY_OVER_VARIABLE] = carry_over
    dev = _require_gpu()
    from wavefront.api import attention as public_attention
    from wavefront.results.records import BENCH_RECORDS
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
        print_records(rows, BENCH_RECORDS,
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
    causals = (False, True) if causal is None else (causal,)
    try:
        shape_points = [Point(batch, heads, kv_heads, seqlen, d, dtype, c)
                        for d in head_dims for c in causals]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sink = JsonlSink(out_dir, "tune.jsonl", manifest_files=["tune.jsonl", "levers.jsonl"])
    levers_sink = JsonlSink(out_dir, "levers.jsonl", manifest_files=())
    columns = [("lever", "lever", ""), ("value", "value", ""), ("candidates", "candidates", "d"),
               ("timed", "timed", "d"), ("best_tflops", "best TFLOP/s", ".1f"),
               ("of_best", "of the best", ".3f"), ("best_label", "binary", "")]

    def show(stage):
        what = (f"D={stage.shape.head_dim} "
                f"{'causal' if stage.shape.causal else 'non-causal'}")
        print_table(stage.record, columns,
                    title=f"\n{dev.name}, B={batch} H={heads} S={seqlen} {dtype} {what}, "
                          f"{stage.stage}: what each lever did (best timed candidate with that "
                          f"value, against the best of the same rounds)")
        best = stage.best
        if best is None:
            click.echo(f"{what}, {stage.stage}: no candidate was timed")
            return
        click.echo(f"{stage.stage} best: {best['label']} {best['levers']['schedule']} "
                   f"{best['tflops']:.1f} TFLOP/s [{best['tflops_ci95'][0]:.1f}, "
                   f"{best['tflops_ci95'][1]:.1f}]"
                   + "".join(f", {best[f'x_{k}']:.3f}x {k}" for k in ("cudnn", "fa2")
                             if f"x_{k}" in best))
    try:
        result = tuning.run(shape_points, dev, dtype, rounds=rounds, per_round=per_round,
                            jobs=jobs, levers=first_levers, softmax_levers=softmax_levers,
                            write_dims=(batch, heads, kv_heads or heads, seqlen) if write
                            else None, sink=sink, levers_sink=levers_sink,
                            log=lambda m: click.echo(m, err=True), on_stage=show)
    finally:
        sink.close()
        levers_sink.close()
    if result.failed:
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
@click.option("--record-order", type=click.Choice(["shared", "per_cta"]), default=None,
              is_flag=False, flag_value="shared",
              help="Profile the binary that takes a ticket as each work item starts and ends "
                   "(the order and clock recorder), from one shared counter (tickets under "
                   "<out>/orders) or one per CTA.")
@click.option("--free-shapes", is_flag=True,
              help="Profile the binary compiled without the shapes the JIT bakes in of q, k, "
                   "v and out (a batch or head count of 1), not the JIT's own.")
@click.option("--json", "as_json", is_flag=True)
def profile(points, repeats, out_dir, timeout_s, record_order, free_shapes, as_json):
    """Points under Nsight Compute: DRAM reads (the primary miss metric), L2 sectors (SM side
    and fabric), vs the closed-form count. Kernel replay, cold L2 each pass, each launch in its
    own NVTX range."""
    from wavefront.results.sweep import SweepSpec, grid_of
    dev = _require_gpu()
    spec = SweepSpec(name="profile", grid=[grid_of(p) for p in points], measure=["counters"],
                     repeats=repeats, timeout_s=timeout_s,
                     record_order=(record_order == "shared" or record_order or False),
                     free_shapes=free_shapes)
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
              help=f"GPU preset for --dry-run ({', '.join(PRESETS)}).")
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


@main.command()
@click.argument("exports", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the summaries here, keyed by each export's name.")
def stalls(exports, json_path):
    """Where each kernel's warps wait, per instruction group, from Nsight Compute source-page
    exports (`ncu -i R.ncu-rep --page source --csv --print-source sass > sass_full.csv`);
    data/d128_limits/sass/ holds what it made."""
    from wavefront.measure.stalls import summarise, summary_text
    summaries = {}
    for path in exports:  # keyed by the export's name: sass_full.csv -> "full"
        key = Path(path).name.split(".")[0].removeprefix("sass_")
        summaries[key] = summarise(path)
        click.echo(f"== {key}" + summary_text(summaries[key]))
    if json_path:
        Path(json_path).write_text(json.dumps(summaries, indent=0))
