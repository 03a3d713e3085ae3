"""Measured carry-over: a shape nobody tuned times its GPU's tuned configurations on its first
call and keeps the fastest.

The tuned table (`wavefront.kernel.tuning`) holds a few entries per GPU, head dim and mask, each
the winner of a search at one shape. A shape without an entry of its own takes the nearest
entry's configuration by default, and the nearest is not always the fastest there: at B1 H32
S4k D64 non-causal, equally near two entries, the configuration it took ran 0.981x cuDNN and
the other 1.027x (data/untuned_shapes/tie_s4k/). The entries' configurations are few (two or
three distinct ones per head dim and mask), so timing them all on the caller's own arrays costs
a few launches each, and a compile each: seconds, once. `WAVEFRONT_CARRY_OVER=measure` turns it
on (`wavefront.kernel.tuning.carry_over_mode`); the choice is kept per (GPU, shapes, mask) for
the process (`wavefront.kernel.tuning.carry_over_choices`), and with
`WAVEFRONT_CARRY_OVER_FILE=<path>` in a JSON file too, which later processes read before
timing again (`stored_choice`, `store_choice`).
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

CARRY_OVER_FILE_VARIABLE = "WAVEFRONT_CARRY_OVER_FILE"

# Interleaved rounds, each launching every candidate a few times between one event pair, the
# candidates' order rotated per round so that none always runs first after another's L2 state.
CARRY_OVER_ROUNDS = 7
LAUNCHES_PER_ROUND = 3
# A candidate's output must match the nearest entry's, element by element, within this share
# of the largest output magnitude (two bf16 roundings of float32 sums differ by about 2^-8),
# and leave NaN exactly where the nearest's does: an output left unwritten stays NaN.
AGREEMENT = 2e-2


@dataclass(frozen=True)
class CarryOverChoice:
    """What a measured carry-over timed and chose. `timed`: (config, median ms per launch,
    (fastest, slowest) round) per candidate that ran and agreed, in the table's order (nearest
    entry first); `left_out`: (config, why) per candidate that failed or disagreed; `seconds`:
    the host's wall time for all of it, the candidates' launchers (and compiles) included."""

    config: dict
    timed: tuple
    left_out: tuple = ()
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"config": self.config,
                "timed": [{"config": c, "ms": ms, "range_ms": list(span)}
                          for c, ms, span in self.timed],
                "left_out": [{"config": c, "why": why} for c, why in self.left_out],
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict) -> "CarryOverChoice":
        return cls(d["config"], tuple((t["config"], t["ms"], tuple(t["range_ms"]))
                                      for t in d["timed"]),
                   tuple((x["config"], x["why"]) for x in d.get("left_out", ())),
                   d.get("seconds", 0.0))


def choices_file() -> Path | None:
    """The file measured choices are kept in across processes (`CARRY_OVER_FILE_VARIABLE`),
    None where it is unset."""
    path = os.environ.get(CARRY_OVER_FILE_VARIABLE, "").strip()
    return Path(path).expanduser() if path else None


def _file_key(gpu_name: str, q_shape, k_shape, causal: bool, table: str) -> str:
    return (f"{gpu_name} q={list(q_shape)} k={list(k_shape)} "
            f"{'causal' if causal else 'full'} table={table}")


def _read_choices(path: Path) -> dict:
    # the one reader (a regular file, bounded, unique keys) and the file's schema
    from wavefront.files import read_json
    from wavefront.kernel.table_schema import check_choices
    try:
        return check_choices(read_json(path, "a file of measured choices"),
                             f"{CARRY_OVER_FILE_VARIABLE}={path}")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ValueError(f"{CARRY_OVER_FILE_VARIABLE}={path}: not a file of measured choices "
                         f"({type(exc).__name__}: {exc})") from None


def stored_choice(path: Path, gpu_name: str, q_shape, k_shape, causal: bool, table: str,
                  candidates: list) -> CarryOverChoice | None:
    """The choice a process stored in `path` for this problem and version of the tuned table
    (`table`: its digest), if its configuration is still one of `candidates`; else None."""
    found = _read_choices(path).get(_file_key(gpu_name, q_shape, k_shape, causal, table))
    if found is None:
        return None
    choice = CarryOverChoice.from_dict(found)
    return choice if choice.config in candidates else None


def store_choice(path: Path, gpu_name: str, q_shape, k_shape, causal: bool, table: str,
                 choice: CarryOverChoice) -> None:
    """Add this problem's choice to `path` (the others kept), through a temporary file and an
    atomic rename: a reader sees the old file or the new one. Two processes storing at once
    may each keep only its own new choice; the other's is timed again later."""
    from wavefront.files import write_file
    stored = _read_choices(path)
    stored[_file_key(gpu_name, q_shape, k_shape, causal, table)] = choice.as_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    # the one writer: atomic, a link refused, never fewer choices than the file held
    write_file(path, json.dumps(stored, indent=1, sort_keys=True, allow_nan=False),
               what="a file of measured choices", rows=lambda text: len(json.loads(text or b"{}")))


def choose(configs, make_launcher, q, k, v, stream, make_lse=None, *, rounds=CARRY_OVER_ROUNDS,
           per_round=LAUNCHES_PER_ROUND) -> CarryOverChoice | None:
    """Time each configuration's launcher (`make_launcher(config)`) on q, k, v on `stream` (the
    caller's: its inputs are ready there) and choose the fastest median; a tie keeps the nearer
    entry. None where the stream is being captured into a CUDA graph (timing would wait on it:
    the caller takes the nearest entry) or where no candidate ran. `make_lse()`: scratch for the
    LSE, where the launchers return it. Outputs go to scratch arrays, made on the current
    stream (the caller makes `stream` current); the caller's are not touched."""
    import cupy

    from wavefront.kernel.streams import _stream_handle, cupy_stream
    handle = stream if type(stream) is int else _stream_handle(stream)
    if cupy.cuda.runtime.streamIsCapturing(handle):
        return None
    started = time.perf_counter()
    launchers, left_out = [], []
    for config in configs:
        try:
            launchers.append((config, make_launcher(config)))
        except Exception as exc:  # a configuration this shape cannot run is not a candidate
            left_out.append((config, f"{type(exc).__name__}: {exc}"))
    lse = make_lse() if make_lse is not None else None
    reference, candidates = None, []
    for config, launcher in launchers:
        out = _poisoned_output(launcher, q)
        try:
            launcher(q, k, v, out, stream, lse, True)
            why = None if reference is None else _disagreement(out, reference)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            left_out.append((config, why))
            continue
        if reference is None:
            reference = out
        candidates.append((config, launcher, out))
    if not candidates:
        return None
    timed_stream = cupy.cuda.Stream.null if handle == 0 else cupy_stream(handle)
    spans = {i: [] for i in range(len(candidates))}
    for r in range(rounds):
        order = list(range(len(candidates)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            _, launcher, out = candidates[i]
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(timed_stream)
            for _ in range(per_round):
                launcher(q, k, v, out, stream, lse, True)
            end.record(timed_stream)
            spans[i].append((start, end))
    timed_stream.synchronize()
    timed = []
    for i, (config, _, _) in enumerate(candidates):
        ms = [cupy.cuda.get_elapsed_time(s, e) / per_round for s, e in spans[i]]
        timed.append((config, statistics.median(ms), (min(ms), max(ms))))
    return CarryOverChoice(timed[fastest(timed)][0], tuple(timed), tuple(left_out),
                           time.perf_counter() - started)


def fastest(timed) -> int:
    """The index of the fastest median in `timed` ((config, median ms, span), ...); a tie
    keeps the first (the nearer entry)."""
    return min(range(len(timed)), key=lambda i: (timed[i][1], i))


def _poisoned_output(launcher, q):
    out = launcher.new_output(q)
    if type(out).__module__.startswith("torch"):
        out.fill_(float("nan"))
    else:
        out.fill(float("nan"))
    return out


def _disagreement(out, reference) -> str | None:
    """None where `out` matches `reference` (`AGREEMENT`), else what differs."""
    import cupy
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy/CuPy)
    a, b = (cupy.from_dlpack(x).astype(cupy.float32) for x in (out, reference))
    nan_a, nan_b = cupy.isnan(a), cupy.isnan(b)
    if bool((nan_a != nan_b).any()):
        return f"{int((nan_a != nan_b).sum())} elements NaN in one output only"
    scale = float(cupy.abs(cupy.where(nan_b, 0, b)).max())
    worst = float(cupy.abs(cupy.where(nan_b, 0, a - b)).max())
    if worst > AGREEMENT * max(scale, 1e-30):
        return f"differs from the nearest entry's output by {worst:.3g} (largest {scale:.3g})"
    return None
