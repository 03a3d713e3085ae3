"""One harness for the unfriendly cases of `test_unfriendly_new.py` and
`test_gpu_unfriendly_new.py`: a call, what its error must say, and how it ended.

Outcome classes: "clear" (the expected exception type, its message naming what was wrong),
"unclear" (the expected type, but the message does not say it), "traceback" (any other
exception), "silent" (returned where it must refuse), "hang" (still running after `seconds`),
"memory" (Python-side allocations past `memory_bytes`, tracemalloc's peak, NumPy and torch CPU
buffers included), "damaged" (a file snapshot taken before the call differs after it), and
"ok" for a hostile but valid call that must simply finish within the bounds."""
from __future__ import annotations

import signal
import tracemalloc
from dataclasses import dataclass, field
from typing import Callable

CLASSES = ("ok", "clear", "unclear", "traceback", "silent", "hang", "memory", "damaged")


class _Hang(BaseException):
    pass


class Damaged(Exception):
    """Raised by a case's call that found data it must not touch changed (a GPU buffer)."""


@dataclass
class Case:
    name: str
    call: Callable
    expected: str | None  # text the error must hold; None: the call must succeed
    errors: tuple = (ValueError,)
    seconds: float = 20.0
    memory_bytes: int = 256 << 20
    snapshot: Callable | None = None  # () -> state that the call must leave unchanged
    setup: Callable | None = None  # (tmp_path) -> None, run before `call`
    tags: tuple = field(default=())


def _alarm(signum, frame):
    raise _Hang()


def outcome(case: Case) -> tuple[str, str]:
    """-> (class, what happened)."""
    before = case.snapshot() if case.snapshot else None
    previous = signal.signal(signal.SIGALRM, _alarm)
    tracemalloc.start()
    signal.setitimer(signal.ITIMER_REAL, case.seconds)
    try:
        result = case.call()
        kind = "silent" if case.expected is not None else "ok"
        detail = f"returned {type(result).__name__}"
    except _Hang:
        kind, detail = "hang", f"still running after {case.seconds} s"
    except MemoryError as exc:
        kind, detail = "memory", f"MemoryError {exc}"
    except Damaged as exc:
        kind, detail = "damaged", str(exc)
    except case.errors as exc:
        text = str(exc)
        if case.expected is None:
            kind = "traceback"
        else:
            kind = "clear" if case.expected in text and "Traceback" not in text else "unclear"
        detail = f"{type(exc).__name__}: {text[:300]}"
    except Exception as exc:  # noqa: BLE001 (classified, not hidden: the test fails on it)
        kind, detail = "traceback", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if peak > case.memory_bytes and kind != "hang":
        kind, detail = "memory", f"peak {peak >> 20} MiB; {detail}"
    if case.snapshot and case.snapshot() != before:
        kind, detail = "damaged", f"the file changed; {detail}"
    return kind, detail


def wanted(case: Case) -> str:
    return "ok" if case.expected is None else "clear"


def count(cases, prepare=None) -> dict:
    """Every case's class, counted (`prepare(case)` runs a case's setup first)."""
    counts = dict.fromkeys(CLASSES, 0)
    bad = []
    for case in cases:
        if prepare is not None:
            prepare(case)
        kind, detail = outcome(case)
        counts[kind] += 1
        if kind != wanted(case):
            bad.append((case.name, kind, detail))
    return counts, bad
