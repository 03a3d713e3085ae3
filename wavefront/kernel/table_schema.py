"""What the tuned table (`tuned.json`) and a carry-over choices file hold, checked on load.

Both files steer every `wavefront.attention` call that reads them, so a hand edit, a torn
write of an older version or a planted file must fail on load with the file and the field
named, not as a traceback deep in a launch or as a silently wrong configuration. Checked:
types, finite positive numbers (within a bound no GPU reaches), known schedules, tiles and
lever values, keys of the form the lookup reads; duplicated keys are refused by the
reader (`wavefront.files.read_json`).
"""
from __future__ import annotations

import math
import re

from wavefront.point import (HEAD_DIMS, KERNEL_LEVERS, check_levers, parse_schedule,
                             parse_tiles)

# No GPU runs attention at 100 PFLOP/s (a B200 peaks near 2.3 PFLOP/s dense bf16): a recorded
# speed above this was not measured.
MAX_TFLOPS = 1e5
# cuDNN ratios and carry-over timings: generous bounds that no measurement reaches
MAX_RATIO = 1e3
MAX_MS = 1e7
_KEY = re.compile(r"d(\d+)_(full|causal)(?:_b(\d+)_h(\d+)_kv(\d+)_s(\d+))?")
_SHAPE = re.compile(r"B=(\d+) H=(\d+) KV=(\d+) S=(\d+)(?: \w+)?")
CONFIG_LEVERS = tuple(KERNEL_LEVERS)


class TableError(ValueError):
    """A tuned table or choices file that does not hold what it must; names file and field."""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def plausible(value, upper: float) -> bool:
    """A finite number above zero and at most `upper`."""
    return _is_number(value) and math.isfinite(value) and 0 < value <= upper


def _positive(where: str, field: str, value, upper: float, *, none_ok=False) -> None:
    if value is None and none_ok:
        return
    if not plausible(value, upper):
        raise TableError(f"{where}: field {field!r} must be a finite number above 0 and at most "
                         f"{upper:g}, got {value!r}")


def check_config(where: str, config) -> None:
    """An `attention` configuration as a table entry or a stored choice holds it: a known
    schedule, tile shape, occupancy and lever values."""
    if not isinstance(config, dict):
        raise TableError(f"{where}: must be a JSON object, got {type(config).__name__}")
    for field in ("schedule", "tiles", "occupancy"):
        if field not in config:
            raise TableError(f"{where}: lacks field {field!r}")
    from wavefront.schedules import schedule_names
    try:
        cta, kv = parse_schedule(config["schedule"])
    except ValueError as exc:
        raise TableError(f"{where}: field 'schedule': {exc}") from None
    if f"{cta}+{kv}" not in schedule_names():
        raise TableError(f"{where}: field 'schedule' names no registered schedule, got "
                         f"{config['schedule']!r}")
    try:
        parse_tiles(config["tiles"])
    except (ValueError, TypeError) as exc:
        raise TableError(f"{where}: field 'tiles': {exc}") from None
    occupancy = config["occupancy"]
    if isinstance(occupancy, bool) or not isinstance(occupancy, int) or not 1 <= occupancy <= 32:
        raise TableError(f"{where}: field 'occupancy' must be an integer 1 to 32, got "
                         f"{occupancy!r}")
    for lever in CONFIG_LEVERS:
        if lever in config:
            try:
                check_levers(**{lever: config[lever]})
            except (ValueError, TypeError) as exc:
                raise TableError(f"{where}: field {lever!r}: {exc}") from None


def entry_shape(where: str, entry: dict) -> tuple[int, int, int, int]:
    text = entry.get("shape")
    match = _SHAPE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise TableError(f"{where}: field 'shape' must read 'B=<b> H=<h> KV=<kv> S=<s> "
                         f"<dtype>', got {text!r}")
    shape = tuple(int(g) for g in match.groups())
    if min(shape) < 1 or shape[1] % shape[2]:
        raise TableError(f"{where}: field 'shape' {text!r}: every size at least 1 and the heads "
                         "a multiple of the K/V heads")
    return shape


def check_tuned_table(table, path) -> dict:
    """`table` as read from `path`, checked; -> it."""
    if not isinstance(table, dict):
        raise TableError(f"{path}: expected a JSON object of GPUs, got {type(table).__name__}")
    for gpu, entries in table.items():
        if not gpu.strip():
            raise TableError(f"{path}: a GPU name is empty")
        if not isinstance(entries, dict):
            raise TableError(f"{path}: GPU {gpu!r} must map entry keys to entries, got "
                             f"{type(entries).__name__}")
        for key, entry in entries.items():
            check_tuned_entry(f"{path}: {gpu} {key}", key, entry)
    return table


def check_tuned_entry(where: str, key: str, entry) -> None:
    match = _KEY.fullmatch(key)
    if match is None:
        raise TableError(f"{where}: the key must read d<D>_<full|causal>[_b<b>_h<h>_kv<kv>_s<s>]")
    if int(match.group(1)) not in HEAD_DIMS:
        raise TableError(f"{where}: head dim {match.group(1)} is not one of {HEAD_DIMS}")
    check_config(where, entry)
    # (the key's shape and the entry's may differ: the entry's is what ranking reads)
    entry_shape(where, entry)
    _positive(where, "tflops", entry.get("tflops"), MAX_TFLOPS, none_ok=True)
    _positive(where, "x_cudnn", entry.get("x_cudnn"), MAX_RATIO, none_ok=True)
    if "measured" in entry and not isinstance(entry["measured"], str):
        raise TableError(f"{where}: field 'measured' must be a date text, got "
                         f"{entry['measured']!r}")


def table_rows(text: bytes) -> int:
    """Entries of a tuned table's text (what a rewrite must not lose); 0 where it does not
    parse (a broken table may be replaced)."""
    import json
    try:
        table = json.loads(text)
        return sum(len(e) for e in table.values() if isinstance(e, dict))
    except (ValueError, AttributeError):
        return 0


# --------------------------------------------------------------------------------------------
# Carry-over choices (`wavefront.kernel.carry_over`)
# --------------------------------------------------------------------------------------------

def check_choices(stored, path) -> dict:
    """A choices file: {problem key: choice}, each choice {config, timed: [{config, ms,
    range_ms}], left_out: [{config, why}], seconds}."""
    where = f"{path}"
    if not isinstance(stored, dict):
        raise TableError(f"{where}: expected a JSON object of choices, got "
                         f"{type(stored).__name__}")
    for key, choice in stored.items():
        at = f"{where}: choice {key!r}"
        if not isinstance(choice, dict):
            raise TableError(f"{at}: must be a JSON object, got {type(choice).__name__}")
        check_config(f"{at}: field 'config'", choice.get("config"))
        timed = choice.get("timed")
        if not isinstance(timed, list) or not timed:
            raise TableError(f"{at}: field 'timed' must be a non-empty list, got {timed!r}")
        for i, t in enumerate(timed):
            if not isinstance(t, dict):
                raise TableError(f"{at}: timed[{i}] must be a JSON object")
            check_config(f"{at}: timed[{i}].config", t.get("config"))
            _positive(at, f"timed[{i}].ms", t.get("ms"), MAX_MS)
            span = t.get("range_ms")
            if not isinstance(span, list) or len(span) != 2:
                raise TableError(f"{at}: field 'timed[{i}].range_ms' must be [fastest, "
                                 f"slowest], got {span!r}")
            for j, value in enumerate(span):
                _positive(at, f"timed[{i}].range_ms[{j}]", value, MAX_MS)
            if span[0] > span[1]:
                raise TableError(f"{at}: field 'timed[{i}].range_ms' must be [fastest, "
                                 f"slowest], got {span!r} (reversed)")
        if choice["config"] not in [t["config"] for t in timed]:
            raise TableError(f"{at}: field 'config' is none of the timed configurations")
        left_out = choice.get("left_out", [])
        if not isinstance(left_out, list) or not all(
                isinstance(x, dict) and isinstance(x.get("why"), str) and "config" in x
                for x in left_out):
            raise TableError(f"{at}: field 'left_out' must be a list of {{config, why}}")
        seconds = choice.get("seconds", 0.0)
        if not (_is_number(seconds) and math.isfinite(seconds) and 0 <= seconds <= MAX_MS):
            raise TableError(f"{at}: field 'seconds' must be a finite number of seconds, got "
                             f"{seconds!r}")
    return stored
