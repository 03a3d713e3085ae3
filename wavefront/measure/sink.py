"""Where a measurement's records go: JSON lines appended as they are measured, each run with a
manifest beside them (GPU, driver, CUDA, cuda-tile, tileiras, ncu, commit, date, command)."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path


def environment() -> dict:
    """This machine's GPU (None without one) and software versions."""
    from wavefront.device import current_device, software_versions
    dev = current_device()
    return {"gpu": dev.as_dict() if dev else None, **software_versions()}


def write_run_manifest(out_dir, files) -> None:
    """Where and how this run measured, beside the files it appends to, one entry per run."""
    from wavefront.results.store import manifest, write_manifest
    data = manifest(environment(), extra={"files": files})
    write_manifest(out_dir, data["date"].replace(":", "") + f"-{os.getpid()}", data)


class JsonlSink:
    """Rows appended to <out_dir>/<name>, one JSON object a line, flushed as each is written,
    with a run manifest beside them; nothing at all without `out_dir`."""

    def __init__(self, out_dir, name, manifest_files=None):
        """`manifest_files`: the files the run's manifest names (default: this one; () where
        another sink of the same run writes the manifest)."""
        self.file = None
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            files = [name] if manifest_files is None else list(manifest_files)
            if files:
                write_run_manifest(out_dir, files)
            path = Path(out_dir) / name
            packed = path.with_name(path.name + ".gz")
            # Committed data keeps its records packed (`wavefront compress`): a run into it
            # appends to the packed file, a gzip member a line, as the results store appends
            # rows; a plain file beside it would be read as the same records, one of the two
            # shadowing the other, and packing it would overwrite the packed one.
            self.packed = packed.exists() and not path.exists()
            target = packed if self.packed else path
            # Appends follow no link, and go only after whole lines or members: a torn last one
            # is cut (and logged, as the results store does), a packed file that is cut or
            # foreign refused by name before anything is added behind the damage.
            from wavefront.results.store import repair_tail
            repair_tail(target)
            self.file = open(target, "ab" if self.packed else "a")

    def write(self, row) -> None:
        if self.file:
            line = json.dumps(row, default=str) + "\n"
            self.file.write(gzip.compress(line.encode(), mtime=0) if self.packed else line)
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
