"""Records other than sweep results: bench rounds, tune candidates, lever summaries, one-shot
benches. Each kind is typed and versioned like `results.csv`, with one reader.

A record is one JSON object a line (`.jsonl`, or `.jsonl.gz`). It carries `record_version`
from version 2 on; a line without one is version 1. Reading upgrades every line to the kind's
current version, step by step (`RecordKind.upgrades`), so committed data stays readable when a
field is added: adding a field is a new version and one upgrade function that fills it for
older lines. A line that lacks a required field after the upgrade is refused with its file and
line number.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from wavefront.point import KERNEL_LEVERS
from wavefront.results.store import SchemaError, read_results_bytes, require_regular_file


@dataclass(frozen=True)
class Column:
    """One printed column of a record kind: its header, a format spec (numbers; text: "") and
    how a record gives its value (None: '-')."""

    header: str
    spec: str
    value: Callable[[dict], object]


@dataclass(frozen=True)
class RecordKind:
    name: str
    version: int
    required: tuple[str, ...]
    # version v -> the function that turns a version-v line into version v + 1 (none: the
    # version only stamps the line, whose fields did not change)
    upgrades: dict[int, Callable[[dict], dict]] = field(default_factory=dict)
    # lines that are no measurement (a failed shape's error row) are kept out unless asked for
    measured: Callable[[dict], bool] = lambda row: True
    # applied to every line after its upgrade: what any line may lack and means a default of
    # (a kernel lever declared after the line was written ran at its default)
    complete: Callable[[dict], dict] = lambda row: row
    # what a command prints of each record, in order (`cells`)
    columns: tuple[Column, ...] = ()

    def cells(self, row: dict) -> dict:
        """{header: value} of one record, for a table of `columns`."""
        return {c.header: c.value(row) for c in self.columns}

    def stamp(self, row: dict) -> dict:
        """A row as a writer appends it: with this kind's current version."""
        return {**row, "record_version": self.version}

    def upgrade(self, row: dict, where: str) -> dict:
        version = row.get("record_version", 1)
        if not isinstance(version, int) or not 1 <= version <= self.version:
            raise SchemaError(f"{where}: {self.name} record version {version!r}; this "
                              f"wavefront reads versions 1 to {self.version}")
        while version < self.version:
            try:
                step = self.upgrades.get(version, dict)
                row = {**step(row), "record_version": version + 1}
            except (KeyError, TypeError, AttributeError) as exc:
                raise SchemaError(f"{where}: a {self.name} record without what version "
                                  f"{version} had ({type(exc).__name__}: {exc})") from None
            version += 1
        missing = [f for f in self.required if f not in row]
        if missing:
            raise SchemaError(f"{where}: a {self.name} record without {missing}")
        try:
            return self.complete(row)
        except (KeyError, TypeError, AttributeError) as exc:
            raise SchemaError(f"{where}: a {self.name} record without "
                              f"({type(exc).__name__}: {exc})") from None

    def read(self, path, *, failed: bool = False) -> list[dict]:
        """Every measured line of one file, upgraded to the current version (with `failed`,
        the lines that record a failure instead)."""
        path = Path(path)
        if not path.exists():
            raise SchemaError(f"{path}: no such {self.name} record file")
        require_regular_file(path, f"a {self.name} record file")
        rows = []
        # Plain or packed alike; a gzip member cut by a crash mid-append is left out.
        try:
            text = read_results_bytes(path, f"{self.name} record file").decode()
        except UnicodeDecodeError as exc:
            raise SchemaError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") \
                from None
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SchemaError(f"{where}: not a JSON line ({exc.msg})") from None
            if not isinstance(row, dict):
                raise SchemaError(f"{where}: a record is a JSON object")
            if self.measured(row) != failed:
                rows.append(row if failed else self.upgrade(row, where))
        return rows


def _shape_with_default_levers(row: dict) -> dict:
    # A shape written before a kernel lever (or chunk_tiles) existed ran it at its default.
    return {**row, "shape": {**KERNEL_LEVERS, "chunk_tiles": None, **row["shape"]}}


# `wavefront bench`: one line per contender per shape, from interleaved rounds. Version 2 stamps
# the version; a line of either names the levers that existed when it was written.
def steal_share(jiffies) -> str:
    """'1.2' (% of the host's CPU time stolen over the rounds), '' where not recorded."""
    if not jiffies:
        return ""
    stolen, total = (sum(j[i] for j in jiffies) for i in (0, 1))
    return f"{100 * stolen / total:.1f}" if total else ""


def _interval(low_high, spec: str, sep: str = "-") -> str:
    return f"{low_high[0]:{spec}}{sep}{low_high[1]:{spec}}"


def _paired(key: str):
    """A paired ratio with its 95% interval ('0.981 [0.975,0.990]'), '' where not paired."""
    return lambda r: (f"{r[f'x_{key}']:.3f} [{_interval(r[f'x_{key}_ci95'], '.3f', ',')}]"
                      if f"x_{key}" in r else "")


def _probe(r: dict) -> str:
    probe = r.get("host_probe_us")
    if not probe:
        return ""
    import statistics
    return f"{statistics.median(probe):.2f} [{min(probe):.2f}-{max(probe):.2f}]"


BENCH_RECORDS = RecordKind(
    "bench", 2,
    ("gpu", "shape", "contender", "samples_ms", "median_ms", "tflops", "tflops_ci95", "rounds",
     "throttled_rounds"),
    measured=lambda row: "contender" in row, complete=_shape_with_default_levers,
    columns=(
        Column("contender", "", lambda r: r.get("contender", "-")),
        Column("S", "d", lambda r: r["shape"]["seqlen"]),
        Column("D", "d", lambda r: r["shape"]["head_dim"]),
        Column("causal", "", lambda r: r["shape"]["causal"]),
        Column("TFLOP/s", ".1f", lambda r: r.get("tflops")),
        Column("95% interval", "",
               lambda r: _interval(r["tflops_ci95"], ".1f") if "tflops_ci95" in r else ""),
        Column("/cuDNN", ".3f", lambda r: r.get("x_cudnn")),
        Column("/FA2", ".3f", lambda r: r.get("x_fa2")),
        Column("/TileGym", ".3f", lambda r: r.get("x_tilegym")),
        Column("vs own linear", "", _paired("linear")),
        Column("vs grid", "", _paired("grid")),
        Column("api vs bound", "", _paired("bound")),
        Column("host us/call", ".1f", lambda r: r.get("host_us")),
        Column("host us, 1st call", ".1f", lambda r: r.get("host_first_us")),
        Column("host probe us [range]", "", _probe),
        Column("CPU stolen %", "", lambda r: steal_share(r.get("host_cpu_jiffies"))),
        Column("throttled rounds", "d", lambda r: r.get("throttled_rounds")),
        Column("status", "", lambda r: r.get("error", "ok")[:40])))

# `wavefront tune`: one line per candidate (timed or refused on its SASS; `levers`) or peer
# (`peer`).
TUNE_RECORDS = RecordKind("tune", 2, ("gpu", "shape"), complete=_shape_with_default_levers)

# `wavefront tune`: per shape, lever and value, the best candidate with that value.
LEVER_RECORDS = RecordKind(
    "levers", 2, ("gpu", "shape", "lever", "value", "timed", "best_tflops", "of_best",
                  "best_label"),
    complete=_shape_with_default_levers)

# The first kernel's one-shot bench (`data/foundation_bench`): a point timed once, the peers
# beside it. Written by no command today.
BENCH_ONCE_RECORDS = RecordKind("bench_once", 1, ("gpu", "config", "tflops", "timing", "peers"))

# A bench whose JSONL did not come back from the device, transcribed from the table it
# printed: contender, S, D, causal, TFLOP/s.
PRINTOUT_RECORDS = RecordKind("bench_printout", 1, ("contender", "seqlen", "head_dim", "causal",
                                                  "tflops"))

# `experiments/starved_launch.py`: the stream's bandwidth alone, and the attention's rounds
# beside a stream on the spare SMs.
STARVED_RECORDS = RecordKind("starved", 1, ("kind", "gpu"))
# The exposure experiments (`experiments/exposure_*.py`, `production_bytes.py`,
# `warp_states.py`): a co-runner's or probe's solo row, a paired round beside a co-runner or an
# L2 hold, or one ncu row of a contender.
EXPOSURE_RECORDS = RecordKind("exposure", 1, ("kind", "gpu"))
# The serving experiments (`experiments/shared_prefix.py`, `short_prompts.py`, `generate.py`):
# a round of a contender, an ncu row, a generate run, or a failed one with its error.
SERVING_RECORDS = RecordKind("serving", 1, ("kind", "gpu"))
# `wavefront timeline`: one launch's PM-sampling series and totals
TIMELINE_RECORDS = RecordKind("timeline", 1, ("launch", "gpu", "series", "totals"))
# one `profile` row of a launch as another harness measured it (kernel_drift's harness check)
HARNESS_RECORDS = RecordKind("harness", 1, ("kernel", "gpu", "dram_read_bytes",
                                            "l2_tex_write_sectors", "ncu_duration_ns"))

# `wavefront bench-varlen`: one line per contender per mask of a packed batch, from
# interleaved rounds.
VARLEN_BENCH_RECORDS = RecordKind(
    "bench_varlen", 1, ("gpu", "lengths", "heads", "kv_heads", "head_dim", "causal",
                        "contender", "samples_ms", "median_ms", "tflops", "tflops_ci95"))

# One decode step against a full KV cache (`wavefront bench-decode`): GB/s of K/V read.
DECODE_BENCH_RECORDS = RecordKind(
    "bench_decode", 1, ("gpu", "batch", "context", "heads", "kv_heads", "head_dim",
                        "page_size", "contender", "kv_bytes", "samples_ms", "median_ms",
                        "gbps", "gbps_ci95", "dram_peak_gbps"),
    # a shape that failed is recorded as an error line (read with failed=True)
    measured=lambda row: "error" not in row)

# `scripts/backward_bench.py`: one line per contender per shape, head dim and mask of the
# backward's interleaved rounds (wavefront's two dQ modes, torch SDPA's cuDNN and FA2).
BACKWARD_BENCH_RECORDS = RecordKind(
    "backward_bench", 1, ("gpu", "shape", "head_dim", "causal", "name", "samples_ms",
                          "median_ms", "tflops", "tflops_ci95", "throttled_rounds"))
# `experiments/backward_bench.py`: what one backward binary compiled to for sm_90 (registers,
# spills, warpgroup MMAs), ahead of time on a CPU.
BACKWARD_SASS_RECORDS = RecordKind(
    "backward_sass", 1, ("label", "registers", "local_loads", "local_stores", "hgmma"))

KINDS = {k.name: k for k in (BENCH_RECORDS, TUNE_RECORDS, LEVER_RECORDS, BENCH_ONCE_RECORDS,
                              PRINTOUT_RECORDS, STARVED_RECORDS, TIMELINE_RECORDS,
                              HARNESS_RECORDS, VARLEN_BENCH_RECORDS, EXPOSURE_RECORDS,
                              SERVING_RECORDS, DECODE_BENCH_RECORDS, BACKWARD_BENCH_RECORDS,
                              BACKWARD_SASS_RECORDS)}


def seqlen_label(seqlen: int) -> str:
    """'S4k' for a whole number of 1024s, else 'S768'."""
    return f"S{seqlen // 1024}k" if seqlen % 1024 == 0 else f"S{seqlen}"


def shape_name(shape: dict) -> str:
    """'B4 H32 KV8 S4k D128 causal': how tables name a bench or tune shape."""
    return (f"B{shape['batch']} H{shape['heads']}"
            + (f" KV{shape['kv_heads']}" if shape.get("kv_heads") else "")
            + f" {seqlen_label(shape['seqlen'])} D{shape['head_dim']}"
            + (" causal" if shape["causal"] else ""))


def by_shape(rows: list[dict], per_gpu: bool = False) -> dict:
    """Bench rows as {shape name: {contender: row}}; with `per_gpu` (a file appended to on
    several GPUs), {(GPU, shape name): {contender: row}}."""
    shapes: dict = {}
    for r in rows:
        key = (r["gpu"], shape_name(r["shape"])) if per_gpu else shape_name(r["shape"])
        shapes.setdefault(key, {})[r["contender"]] = r
    return shapes
