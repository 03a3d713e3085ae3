"""Measured work-item orders: the (start, end) tickets a RECORD_ORDER launch took, one small
compressed file per (point, repeat) beside the results of the sweep that measured it.

The file is named by a hash of the point key, so a resumed or distributed sweep writes each
order once under the same name; the key itself is stored inside for checking.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

ORDERS_DIR = "orders"


def order_path(directory, point: str, repeat: int) -> Path:
    digest = hashlib.sha1(point.encode()).hexdigest()[:12]
    return Path(directory) / f"order-{digest}-r{int(repeat)}.npz"


def save_order(directory, point: str, repeat: int, start, end) -> Path:
    """Tickets fit in int32 (2 x work items); stored compressed, the key beside them."""
    path = order_path(directory, point, repeat)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, start=np.asarray(start, np.int32), end=np.asarray(end, np.int32),
                        point=np.array(point))
    tmp.replace(path)
    return path


def load_order(directory, point: str, repeat: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(start, end) tickets of one measured launch, or None where none was recorded."""
    path = order_path(directory, point, repeat)
    if not path.exists():
        return None
    with np.load(path) as f:
        if str(f["point"]) != point:
            raise ValueError(f"{path} holds the order of {f['point']}, not {point}")
        return f["start"].astype(np.int64), f["end"].astype(np.int64)
