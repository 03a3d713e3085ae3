"""Choosing the configuration a call runs: the tuned table `wavefront.attention` uses by default,
the one-wave causal tiles, and the carry-over to shapes nobody tuned (`resolve_config`).

`wavefront tune` measures the kernel's levers on a GPU and writes the fastest configuration
per (GPU, head dim, causal, shape) into `tuned.json` beside this module (committed, small). A
call takes the entry of its GPU, head dim and mask whose tuned shape is nearest to its own
(`shape_distance`): the best configuration moves with the shape (at B8 H16 S2k D64 causal the
B1 H32 S8k winner's 128x128 tiles ran 0.91x cuDNN where 128x64 ran 1.05x). A GPU, head dim or
mask the table does not know runs the defaults (persistent+linear, the default tiles and
occupancy), as do calls that name any schedule, tile shape, occupancy or lever themselves.

"Nearest" can lose: at B1 H32 S4k D64 non-causal, equally near two entries, the one it took ran
0.981x cuDNN where the other's configuration ran 1.027x (data/untuned_shapes/tie_s4k/). With
`WAVEFRONT_CARRY_OVER=measure` a shape without an entry of its own times the distinct
configurations of its GPU's entries (same head dim and mask) on its first call instead, and
keeps the fastest (`carry_over_configs`; the timing: `wavefront.kernel.carry_over`).
"""
from __future__ import annotations

import copy
import functools
import json
import math
import os
import re
from pathlib import Path

from wavefront.device import current_device
from wavefront.kernel import carry_over
from wavefront.point import KERNEL_LEVERS, plan

TUNED_TABLE = Path(__file__).with_name("tuned.json")
# The fields of an entry that become `attention` arguments; the rest is its evidence. Entries
# written before a lever existed lack it and mean its default.
CONFIG_FIELDS = ("schedule", "tiles", "occupancy", *KERNEL_LEVERS)
LATER_FIELDS = ("rescale_threshold", "exp2_poly", "qk_ahead")
REQUIRED_FIELDS = tuple(f for f in CONFIG_FIELDS if f not in LATER_FIELDS)
# The shape the first searches used; its entries keep the short key.
DEFAULT_TUNE_SHAPE = (1, 32, 32, 8192)  # batch, heads, kv_heads, seqlen
_SHAPE_TEXT = re.compile(r"B=(\d+) H=(\d+) KV=(\d+) S=(\d+)")


def entry_key(head_dim: int, causal: bool, shape=DEFAULT_TUNE_SHAPE) -> str:
    """`d128_causal` for the default shape, `d128_causal_b4_h32_kv8_s4096` for another."""
    base = f"d{head_dim}_{'causal' if causal else 'full'}"
    if tuple(shape) == DEFAULT_TUNE_SHAPE:
        return base
    batch, heads, kv_heads, seqlen = shape
    return f"{base}_b{batch}_h{heads}_kv{kv_heads}_s{seqlen}"


def shape_text(shape) -> str:
    batch, heads, kv_heads, seqlen = shape
    return f"B={batch} H={heads} KV={kv_heads} S={seqlen}"


def _entry_shape(entry: dict, where: str) -> tuple[int, int, int, int]:
    match = _SHAPE_TEXT.search(str(entry.get("shape", "")))
    if match is None:
        raise ValueError(f"{where}: 'shape' must read 'B=<b> H=<h> KV=<kv> S=<s> ...', got "
                         f"{entry.get('shape')!r}")
    return tuple(int(g) for g in match.groups())


def shape_distance(a, b) -> float:
    """How far apart two (batch, heads, kv_heads, seqlen) shapes are for tuning: octaves of
    the total query rows (how many waves of work), of the sequence (how long each item
    scans) and of the GQA group (how many heads share K/V)."""
    rows = lambda s: s[0] * s[1] * s[3]  # noqa: E731
    return (abs(math.log2(rows(a) / rows(b))) + abs(math.log2(a[3] / b[3]))
            + abs(math.log2((a[1] / a[2]) / (b[1] / b[2]))))


def load_table(path: Path = TUNED_TABLE) -> dict:
    """The tuned table (a fresh copy: callers may edit it), read again only when the file
    changed: a new shape's first call looks it up, and parsing it cost about a millisecond
    under cProfile."""
    return copy.deepcopy(_table_for(path))


def entry_shapes(gpu_name: str, path: Path = TUNED_TABLE) -> list[tuple[int, int, int, int]]:
    """The shapes (batch, heads, kv_heads, seqlen) a GPU's entries were tuned at, any head dim
    or mask."""
    entries = _table_for(path).get(gpu_name, {})
    return sorted({_entry_shape(e, f"{path}: {k}") for k, e in entries.items()})


@functools.lru_cache(maxsize=8)
def _parsed_table(path: str, stamp: tuple) -> dict:
    # the one reader (a regular file, bounded, unique keys) and the table's schema
    from wavefront.files import read_json
    from wavefront.kernel.table_schema import check_tuned_table
    return check_tuned_table(read_json(path, "the tuned table"), path)


def _stamp(path) -> tuple | None:
    """What tells one version of the table file from the next; None: no file."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _table_for(path) -> dict:
    """The tuned table to read, not to edit (no copy)."""
    stamp = _stamp(path)
    return {} if stamp is None else _parsed_table(str(path), stamp)


@functools.lru_cache(maxsize=64)
def _candidates(path: str, stamp: tuple | None, gpu_name: str, base: str) -> tuple:
    """((key, shape, entry), ...) of one GPU, head dim and mask, in one version of the table:
    a new shape's first call compares its shape with these, parsed once."""
    entries = {} if stamp is None else _parsed_table(path, stamp).get(gpu_name, {})
    return tuple((k, _entry_shape(e, f"{path}: {k}"), e) for k, e in sorted(entries.items())
                 if k == base or k.startswith(base + "_"))


def _problem_shape(q_shape, k_shape) -> tuple[int, int, int, int] | None:
    if q_shape is None or k_shape is None:
        return None
    return (q_shape[0], q_shape[1], k_shape[1], q_shape[2])


def ranked_entries(gpu_name: str, head_dim: int, causal: bool, shape=DEFAULT_TUNE_SHAPE,
                   path: Path = TUNED_TABLE) -> list[tuple[float, str, tuple, dict]]:
    """This GPU's entries for the head dim and mask as (distance to `shape`, key, tuned
    shape, entry), nearest first; a tie goes to the key first in name order."""
    mine = _candidates(str(path), _stamp(path), gpu_name, entry_key(head_dim, causal))
    return sorted(((shape_distance(shape, tuned), key, tuned, entry)
                   for key, tuned, entry in mine), key=lambda c: (c[0], c[1]))


def tuned_entry(gpu_name: str, head_dim: int, causal: bool, shape=DEFAULT_TUNE_SHAPE,
                path: Path = TUNED_TABLE) -> tuple[str, dict] | None:
    """(key, entry) of the tuned shape nearest to `shape` for this GPU, head dim and mask."""
    ranked = ranked_entries(gpu_name, head_dim, causal, shape, path)
    return (ranked[0][1], ranked[0][3]) if ranked else None


def _config(gpu_name: str, key: str, entry: dict, path) -> dict:
    """An entry's `attention` arguments (a lever written before it existed: its default)."""
    missing = [f for f in REQUIRED_FIELDS if f not in entry]
    if missing:
        raise ValueError(f"{path}: entry {gpu_name} {key} lacks {missing}")
    return {f: entry.get(f, KERNEL_LEVERS.get(f)) for f in CONFIG_FIELDS}


def tuned_config(gpu_name: str, q_shape, k_shape, causal: bool, path: Path = TUNED_TABLE):
    """The tuned `attention` arguments for this GPU and problem, or None. q_shape, k_shape:
    (batch, heads, seqlen, head_dim) and (batch, kv_heads, seqlen, head_dim)."""
    shape = _problem_shape(q_shape, k_shape)
    if shape is None:
        return None
    found = tuned_entry(gpu_name, q_shape[3], causal, shape, path)
    if found is None:
        return None
    return _config(gpu_name, *found, path)


CARRY_OVER_VARIABLE = "WAVEFRONT_CARRY_OVER"
CARRY_OVER_MODES = ("nearest", "measure")


def carry_over_mode() -> str:
    """How a shape without an entry of its own takes one (`CARRY_OVER_VARIABLE`): "nearest"
    (the default) or "measure" (`wavefront.kernel.carry_over`; its choices are kept across
    processes where WAVEFRONT_CARRY_OVER_FILE names a file)."""
    mode = os.environ.get(CARRY_OVER_VARIABLE, "nearest").strip().lower() or "nearest"
    if mode not in CARRY_OVER_MODES:
        raise ValueError(f"{CARRY_OVER_VARIABLE} must be one of {', '.join(CARRY_OVER_MODES)}, "
                         f"got {os.environ[CARRY_OVER_VARIABLE]!r}")
    return mode


def table_digest(path: Path = TUNED_TABLE) -> str:
    """A short digest of the tuned table's content ('none' without a file): what a stored
    measured choice was made from."""
    stamp = _stamp(path)
    return "none" if stamp is None else _digest(str(path), stamp)


@functools.lru_cache(maxsize=8)
def _digest(path: str, stamp: tuple) -> str:
    import hashlib
    from wavefront.files import read_file
    return hashlib.sha1(read_file(path, "the tuned table")).hexdigest()[:12]


def carry_over_configs(gpu_name: str, q_shape, k_shape, causal: bool,
                       path: Path = TUNED_TABLE) -> tuple[bool, list[dict]]:
    """-> (whether an entry was tuned at exactly this problem's shape, the distinct `attention`
    arguments of this GPU's entries for its head dim and mask, nearest entry first): what a
    measured carry-over chooses from. Entries that share a configuration count once, at the
    nearest of them. A shape at distance 0 from an entry but not its shape (B4 H8 S8k from
    B1 H32 S8k: as many rows, as long) is not exact: the distance is a guess, the shape's own
    search is not."""
    shape = _problem_shape(q_shape, k_shape)
    if shape is None:
        return False, []
    ranked = ranked_entries(gpu_name, q_shape[3], causal, shape, path)
    configs = []
    for _, key, _, entry in ranked:
        config = _config(gpu_name, key, entry, path)
        if config not in configs:
            configs.append(config)
    return any(tuned == shape for _, _, tuned, _ in ranked), configs


def write_entry(gpu_name: str, head_dim: int, causal: bool, entry: dict,
                path: Path = TUNED_TABLE) -> str:
    """Set the entry of this GPU, head dim, mask and the entry's shape (its 'shape' text);
    the rest of the table is kept. Returns the key."""
    missing = [f for f in CONFIG_FIELDS if f not in entry]
    if missing:
        raise ValueError(f"a tuned entry needs {CONFIG_FIELDS}, missing {missing}")
    from wavefront.files import write_file
    from wavefront.kernel.table_schema import check_tuned_entry, table_rows
    key = entry_key(head_dim, causal, _entry_shape(entry, "the new entry"))
    check_tuned_entry(f"the new entry {gpu_name} {key}", key, entry)
    table = load_table(path)
    table.setdefault(gpu_name, {})[key] = entry
    # atomic (a full disk leaves the old table), links refused, never fewer entries
    write_file(path, json.dumps(table, indent=1, sort_keys=True, allow_nan=False) + "\n",
               what="the tuned table", rows=table_rows)
    _parsed_table.cache_clear()  # a rewrite within the file system's clock tick keeps its stamp
    _candidates.cache_clear()
    return key


DEFAULT_SCHEDULE = "persistent+linear"


# A causal launch of at most one wave of CTAs lasts as long as its longest work item, the last
# Q tile, which scans every K/V tile up to the diagonal; 64-row tiles halve that item. Under
# CUDA-graph replay on the H100 (data/public_call/graph_replay/) they ran 1.42x the nearest
# entry's 128-row tiles at B1 H8 S1k D64 causal and 1.59x at B1 H16 S2k D128 causal; without
# the mask, where items are equal, they lost (0.94x, 0.86x).
ONE_WAVE_CAUSAL = dict(tiles="64x64", occupancy=2, worker_warps=None, cluster=1, qk_ahead=0)


def _one_wave_causal(config: dict, q_shape, k_shape, causal: bool, *, sms: int,
                     l2_bytes: int) -> dict:
    """A tuned entry's configuration, or for a causal launch whose work items (as the entry
    would plan them) fit one wave of resident CTAs, the same with ONE_WAVE_CAUSAL's tiles."""
    if not causal:
        return config
    launch = plan(q_shape, k_shape, sms=sms, l2_bytes=l2_bytes, causal=True,
                  schedule=config["schedule"], tiles=config["tiles"],
                  occupancy=config["occupancy"])
    return config if launch.num_items > launch.resident_ctas else {**config, **ONE_WAVE_CAUSAL}


def resolve_config(q_shape, k_shape, causal: bool, schedule, tiles, occupancy,
                   levers: dict, measure=None, dev=None) -> dict:
    """The caller's choices, or where the caller chose nothing, the tuned table's entry for this
    GPU and the nearest tuned shape (`wavefront tune`; 64x64 tiles for a causal launch of one
    wave, `ONE_WAVE_CAUSAL`), or the defaults. `levers`: the kernel levers by name, None where
    not chosen. `measure(configs)` -> `carry_over.CarryOverChoice` or None: how a measured
    carry-over times the candidates (`WAVEFRONT_CARRY_OVER=measure`, `_carried_over`). `dev`:
    the GPU (its name, sms and l2_bytes; a `wavefront.device.DeviceInfo`), default the current
    one (none: the defaults)."""
    chosen = dict(schedule=schedule, tiles=tiles, occupancy=occupancy, **levers)
    if all(v is None for v in chosen.values()):
        dev = dev or current_device()
        tuned = _carried_over(dev, q_shape, k_shape, causal, measure) if dev else None
        if tuned is not None:
            return tuned
    chosen["schedule"] = schedule or DEFAULT_SCHEDULE
    for name, default in KERNEL_LEVERS.items():
        if chosen.get(name) is None:
            chosen[name] = default
    return chosen


# Per (GPU, q shape, k shape, mask): what a measured carry-over timed and chose
# (`carry_over.CarryOverChoice`), kept for the process: later launchers of the same problem
# (another dtype, strides, options) take its choice without timing again.
_carry_over_choices: dict = {}


def carry_over_choices() -> dict:
    """{(GPU name, q shape, k shape, causal): CarryOverChoice} of this process's measured
    carry-overs (`WAVEFRONT_CARRY_OVER=measure`)."""
    return dict(_carry_over_choices)


def _carried_over(dev, q_shape, k_shape, causal: bool, measure) -> dict | None:
    """The tuned configuration for a call that chose nothing: the nearest entry's, or under
    `WAVEFRONT_CARRY_OVER=measure`, for a shape without an entry of its own, the fastest of
    the entries' distinct configurations timed on its first call (`measure`; None: not
    timed now, the nearest's then). None: no entry for this GPU, head dim and mask."""

    def fitted(config):
        return _one_wave_causal(config, q_shape, k_shape, causal, sms=dev.sms,
                                l2_bytes=dev.l2_bytes)
    if carry_over_mode() == "measure":
        exact, configs = carry_over_configs(dev.name, q_shape, k_shape, causal)
        candidates = []
        for config in map(fitted, configs):  # as each would run: alike there, counted once
            if config not in candidates:
                candidates.append(config)
        if not exact and len(candidates) > 1:
            key = (dev.name, tuple(q_shape), tuple(k_shape), causal)
            choice = _carry_over_choices.get(key)
            if choice is None:
                choice = _stored_or_measured(key, candidates, measure)
            if choice is not None:
                return choice.config
    return nearest_config(q_shape, k_shape, causal, dev)


def _stored_or_measured(key, candidates, measure):
    """A choice for `key` from the choices file (`WAVEFRONT_CARRY_OVER_FILE`), else timed now
    (`measure`) and stored there; kept for the process either way. None: neither."""
    path = carry_over.choices_file()
    table = table_digest()
    choice = None if path is None else carry_over.stored_choice(path, *key, table, candidates)
    if choice is None and measure is not None:
        choice = measure(candidates)
        if choice is not None and path is not None:
            carry_over.store_choice(path, *key, table, choice)
    if choice is not None:
        _carry_over_choices[key] = choice
    return choice


def nearest_config(q_shape, k_shape, causal: bool, dev=None) -> dict | None:
    """The configuration a call that chose nothing takes by "nearest": the nearest tuned
    entry's (`ONE_WAVE_CAUSAL`'s tiles for a causal launch of one wave). None: no entry for
    this GPU (default: the current one), head dim and mask."""
    dev = dev or current_device()
    tuned = tuned_config(dev.name, q_shape, k_shape, causal) if dev is not None else None
    if tuned is None:
        return None
    return _one_wave_causal(tuned, q_shape, k_shape, causal, sms=dev.sms,
                            l2_bytes=dev.l2_bytes)
