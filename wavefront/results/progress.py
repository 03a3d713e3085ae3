"""One progress display for a sweep: a bar on a terminal, plain lines elsewhere (Slurm logs).

Counts tasks done and failed, tasks per worker where the runner says which, and an ETA from the
rate so far.
"""
from __future__ import annotations

import sys
import time
from collections import Counter


class Progress:
    def __init__(self, total: int, label: str, *, enabled: bool = True, stream=None,
                 every_s: float = 30.0):
        self.total, self.label, self.enabled = total, label, enabled
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.done = self.failed = 0
        self.by_worker: Counter = Counter()
        self.start = time.monotonic()
        self._last_line = 0.0
        self._tty = enabled and getattr(self.stream, "isatty", lambda: False)()

    def eta_s(self) -> float | None:
        if not self.done:
            return None
        rate = self.done / max(1e-9, time.monotonic() - self.start)
        return (self.total - self.done) / rate

    def line(self) -> str:
        eta = self.eta_s()
        workers = (" | " + ", ".join(f"{w}: {n}" for w, n in sorted(self.by_worker.items()))
                   if self.by_worker else "")
        return (f"{self.label}: {self.done}/{self.total} done, {self.failed} failed, "
                f"ETA {'?' if eta is None else f'{eta:.0f} s'}{workers}")

    def update(self, *, ok: bool = True, where: str | None = None) -> None:
        self.done += 1
        self.failed += not ok
        if where:
            self.by_worker[where] += 1
        if not self.enabled:
            return
        now = time.monotonic()
        if self._tty:
            width = 30
            filled = int(width * self.done / max(1, self.total))
            self.stream.write(f"\r[{'#' * filled}{'-' * (width - filled)}] {self.line()}")
            self.stream.flush()
        elif now - self._last_line >= self.every_s or self.done == self.total:
            self._last_line = now
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._tty:
            self.stream.write("\n")
            self.stream.flush()


def peak_rss_mib() -> float:
    """This process's peak resident memory. Linux: VmHWM of this program's own address space
    (ru_maxrss would carry over the high-water mark of a parent it was forked from, e.g. a
    large test runner); elsewhere ru_maxrss (macOS reports bytes)."""
    from pathlib import Path
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**10
    except OSError:
        pass
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10
