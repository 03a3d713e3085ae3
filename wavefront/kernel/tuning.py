"""The tuned kernel configurations `wavefront.attention` uses by default.

`wavefront tune` measures the kernel's levers on a GPU and writes the fastest configuration
per (GPU, head dim, causal) into `tuned.json` beside this module (committed, small). A GPU or
shape the table does not know runs the defaults (persistent+linear, the default tiles and
occupancy), as do calls that name any schedule, tile shape, occupancy or lever themselves.
"""
from __future__ import annotations

import json
from pathlib import Path

TUNED_TABLE = Path(__file__).with_name("tuned.json")
# The fields of an entry that become `attention` arguments; the rest is its evidence.
CONFIG_FIELDS = ("schedule", "tiles", "occupancy", "worker_warps", "cluster", "kv_latency")


def _key(head_dim: int, causal: bool) -> str:
    return f"d{head_dim}_{'causal' if causal else 'full'}"


def load_table(path: Path = TUNED_TABLE) -> dict:
    if not Path(path).exists():
        return {}
    table = json.loads(Path(path).read_text())
    if not isinstance(table, dict):
        raise ValueError(f"{path}: expected a JSON object of GPUs, got {type(table).__name__}")
    return table


def tuned_config(gpu_name: str, head_dim: int, causal: bool, path: Path = TUNED_TABLE):
    """The tuned `attention` arguments for this GPU and shape, or None."""
    entry = load_table(path).get(gpu_name, {}).get(_key(head_dim, causal))
    if entry is None:
        return None
    missing = [f for f in CONFIG_FIELDS if f not in entry]
    if missing:
        raise ValueError(f"{path}: entry {gpu_name} {_key(head_dim, causal)} lacks {missing}")
    return {f: entry[f] for f in CONFIG_FIELDS}


def write_entry(gpu_name: str, head_dim: int, causal: bool, entry: dict,
                path: Path = TUNED_TABLE) -> None:
    """Set one (GPU, head dim, causal) entry; the rest of the table is kept."""
    missing = [f for f in CONFIG_FIELDS if f not in entry]
    if missing:
        raise ValueError(f"a tuned entry needs {CONFIG_FIELDS}, missing {missing}")
    table = load_table(path)
    table.setdefault(gpu_name, {})[_key(head_dim, causal)] = entry
    Path(path).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
