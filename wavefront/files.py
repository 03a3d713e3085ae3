"""The one writer and the one reader of every file the tools keep (results, records, manifests,
the tuned table, carry-over choices, timelines, traces, the paper).

Writing (`write_file`): the new content goes to a temporary file in the target's directory, is
fsync'd and checked, then renamed over the target in one step; the directory is fsync'd. A
crash, a full disk or any other failure leaves the old file exactly as it was (the temporary is
removed). A target that is a symbolic link is refused (writing through it would change a file
somewhere else; replacing it would leave its target stale). Where the caller says how to count
a file's rows (`rows=`), a rewrite that would hold fewer rows than the file it replaces is
refused unless asked (`allow_shrink=True`): a short new file beside a long packed one must not
silently replace it.

Reading (`read_file`, `read_packed`): only a regular file is opened (a FIFO would block, a
device like /dev/zero read forever, a directory is no file), and only up to a size bound; a
gzip file is unpacked member by member up to a bound on the unpacked size (a decompression bomb
is refused after reading at most the bound). A packed file grows by one gzip member per
appended row, so a crash mid-append can leave the last member incomplete: such a torn final
append is recoverable and is dropped with a warning (`TornAppend`). Anything else that does
not unpack (a truncated single-member file, a corrupt member, a file that is not gzip at all,
bytes after the last member) is an error naming the file: it must never read as fewer rows.

This module sits below every layer of wavefront (it imports nothing of it).
"""
from __future__ import annotations

import errno
import gzip
import math
import os
import stat
import tempfile
import warnings
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

# Bounds on what one read may take: committed data files unpack to a few MB (the largest,
# data/tune/tune_runs.jsonl.gz, 3.3 MB); a sweep's results table grows by ~1 KB a row.
MAX_FILE_BYTES = 512 << 20          # on disk
MAX_UNPACKED_BYTES = 512 << 20      # a packed file's text (what a bomb can cost at most)
MAX_TABLE_BYTES = 16 << 20          # a small JSON file (tuned table, carry-over choices)
# The store appends one row per gzip member, a few hundred bytes packed; a torn remainder much
# larger than any appended row was not a torn append but a cut committed file.
MAX_TORN_APPEND_BYTES = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 22


class FileRefused(ValueError):
    """A file the tools cannot read or write as asked; the message names it."""


class UnsafePath(FileRefused):
    """A target that is a symbolic link: the tools write only files of their own."""


class DamagedFile(FileRefused):
    """A packed file that is truncated, corrupt or not gzip at all."""


class ShrinkRefused(FileRefused):
    """A rewrite that would leave fewer rows than the file it replaces."""


class TornAppend(UserWarning):
    """A packed file's last gzip member is incomplete (a crash mid-append): left out."""


def is_packed(path) -> bool:
    return str(path).endswith(".gz")


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------

def _open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of `path`, refused unless it is a regular file. Opened
    non-blocking (a FIFO without a writer would block an ordinary open) and checked on the
    descriptor itself (no window between the check and the open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise FileRefused(f"{path}: {what} must be a regular file, not a directory") from None
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"no such {what}", str(path)) from None
    except OSError as exc:
        raise FileRefused(f"{path}: cannot read {what}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
                if stat.S_ISSOCK(mode) else "not a regular file")
        raise FileRefused(f"{path}: {what} must be a regular file, not {kind}")
    os.set_blocking(fd, True)
    return fd


def require_regular(path, what: str = "file") -> None:
    """Refuse, by name, what is not a regular file (without reading it)."""
    os.close(_open_regular(Path(path), what))


def read_file(path, what: str = "file", limit: int | None = None) -> bytes:
    """A regular file's bytes, at most `limit` of them (default MAX_FILE_BYTES; more is
    refused by name)."""
    path = Path(path)
    limit = MAX_FILE_BYTES if limit is None else limit
    fd = _open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise FileRefused(f"{path}: {what} of {size} bytes, more than the {limit} this "
                              "reader takes")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # grew while read
                raise FileRefused(f"{path}: {what} grew past the {limit} bytes this reader "
                                  "takes")
        return b"".join(chunks)
    except OSError as exc:
        raise FileRefused(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def unpack_members(data: bytes, name: str, limit: int | None = None,
                   what: str = "packed file") -> tuple[bytes, int]:
    """-> (the text of every complete gzip member of `data`, bytes of a torn final append
    left out). Raises DamagedFile for anything else that does not unpack, FileRefused when the
    text would pass `limit` (default MAX_UNPACKED_BYTES)."""
    limit = MAX_UNPACKED_BYTES if limit is None else limit
    if not data:
        raise DamagedFile(f"{name}: {what} is empty (0 bytes): not gzip data; a packed file "
                          "holds at least one gzip member")
    if not data.startswith(_GZIP_MAGIC):
        raise DamagedFile(f"{name}: {what} is not gzip data (it starts {data[:8]!r})")
    out, total, used, members = [], 0, 0, 0
    while used < len(data):
        rest = data[used:]
        if len(rest) < 2 and _GZIP_MAGIC.startswith(rest):
            break  # a torn append that wrote one byte of its header
        if not rest.startswith(_GZIP_MAGIC):
            raise DamagedFile(f"{name}: {what} has {len(rest)} bytes after its last gzip member "
                              "that are not gzip data (appended to or damaged)")
        member = zlib.decompressobj(wbits=31)
        parts = []
        try:
            pending = rest
            while True:
                want = max(1, min(_CHUNK, limit + 1 - total))
                part = member.decompress(pending, want)
                total += len(part)
                parts.append(part)
                if total > limit:
                    raise FileRefused(f"{name}: {what} unpacks to more than {limit} bytes "
                                      "(a decompression bomb, or a file this reader does not "
                                      "take)")
                if member.eof:
                    break
                if member.unconsumed_tail:
                    pending = member.unconsumed_tail
                elif len(part) == want:  # output held back by the bound: ask for the rest
                    pending = b""
                else:
                    break
        except zlib.error as exc:
            raise DamagedFile(f"{name}: {what} is damaged: gzip member {members + 1} does not "
                              f"unpack ({exc})") from None
        if not member.eof:
            # The data ended inside this member: a torn final append only if a complete member
            # came before it and it is no bigger than an appended row can be.
            if members == 0:
                raise DamagedFile(f"{name}: {what} is truncated: its only gzip member ends "
                                  f"early ({len(data)} bytes); restore it (git checkout) or "
                                  "delete it")
            if len(rest) > MAX_TORN_APPEND_BYTES:
                raise DamagedFile(f"{name}: {what} is truncated: its last gzip member "
                                  f"({len(rest)} bytes) ends early, too large to be a torn "
                                  "append")
            return b"".join(out), len(rest)
        out.append(b"".join(parts))
        members += 1
        used = len(data) - len(member.unused_data)
    return b"".join(out), len(data) - used


def read_packed(path, what: str = "packed file", *, limit: int | None = None,
                file_limit: int | None = None) -> bytes:
    """The text of a stored file, packed (`.gz`) or plain, through the bounds and checks above.
    A torn final append of a packed file is left out with a `TornAppend` warning."""
    path = Path(path)
    data = read_file(path, what, file_limit)
    if not is_packed(path):
        return data
    text, torn = unpack_members(data, str(path), limit, what)
    if torn:
        warnings.warn(TornAppend(f"{path}: its last gzip member ({torn} bytes) is incomplete "
                                 "(a crash mid-append); left out, the rows before it read"),
                      stacklevel=2)
    return text


def read_json(path, what: str = "JSON file", limit: int | None = None, *,
              nan_ok: bool = False):
    """A small JSON file, parsed; errors name the file. Duplicated keys in one object are
    refused (JSON readers keep the last silently), and so are NaN and Infinity unless
    `nan_ok` (they are not JSON; Python writes them)."""
    import json
    path = Path(path)
    limit = MAX_TABLE_BYTES if limit is None else limit
    data = read_packed(path, what, limit=limit, file_limit=limit)
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys,
                          **({} if nan_ok else {"parse_constant": _no_constant,
                                                "parse_float": _finite_float}))
    except UnicodeDecodeError as exc:
        raise FileRefused(f"{path}: {what} is not UTF-8 text ({exc.reason})") from None
    except _DuplicateKey as exc:
        raise FileRefused(f"{path}: {what} has the key {exc.args[0]!r} twice in one object")
    except _Constant as exc:
        raise FileRefused(f"{path}: {what} holds {exc.args[0]}, which JSON does not allow")
    except ValueError as exc:
        raise FileRefused(f"{path}: {what} is not valid JSON ({exc})") from None
    except RecursionError:
        raise FileRefused(f"{path}: {what} is not valid JSON (nested too deeply)") from None


class _DuplicateKey(Exception):
    pass


class _Constant(Exception):
    pass


def _unique_keys(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _no_constant(name):
    raise _Constant(name)


def _finite_float(text):
    """A JSON number; one past float's range (1e400) reads as infinity, refused as
    Infinity is."""
    value = float(text)
    if math.isinf(value):
        raise _Constant(f"{text} (past float's range: infinite)")
    return value


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

def line_rows(text: bytes) -> int:
    """Rows of a line-oriented file (CSV with its header, JSON lines): its non-empty lines."""
    return sum(1 for line in text.split(b"\n") if line.strip())


def refuse_link(path, what: str = "file") -> None:
    path = Path(path)
    if path.is_symlink():
        raise UnsafePath(f"{path}: {what} is a symbolic link; the tools write only files of "
                         "their own (remove the link, or name its target)")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]


def pack(text: bytes) -> bytes:
    """One gzip member without a timestamp: the same text always packs to the same bytes."""
    return gzip.compress(text, compresslevel=9, mtime=0)


def pack_smallest(text: bytes, iterations: int = 15) -> bytes:
    """`text` as one gzip member that every gzip reader reads (this module's among them), about
    10% smaller than `pack`'s level 9 on the committed tables and records: zopfli's exhaustive
    deflate search (the `zopfli` package, needed only here; slow: seconds per 100 KB).
    Deterministic, no timestamp."""
    try:
        from zopfli.gzip import compress
    except ImportError:
        raise FileRefused("packing smallest needs the zopfli package (pip install zopfli); "
                          "nothing written") from None
    payload = compress(bytes(text), numiterations=iterations)
    if gzip.decompress(payload) != text:
        raise DamagedFile("zopfli's gzip did not reproduce the text; nothing written")
    return payload


def repack_smallest(path, what: str = "packed file") -> tuple[int, int]:
    """A committed packed file (.gz) packed again by `pack_smallest` where that is smaller (its
    text unchanged, checked before the atomic replace; every gzip member of the old file
    becomes one); -> (bytes before, bytes after)."""
    path = Path(path)
    if not is_packed(path):
        raise FileRefused(f"{path}: not a packed (.gz) file")
    data = read_file(path, what)
    text, torn = unpack_members(data, str(path), None, what)
    if torn:
        raise DamagedFile(f"{path}: its last gzip member is incomplete; repair it before "
                          "packing it again (nothing written)")
    payload = pack_smallest(text)
    if len(payload) >= len(data):
        return len(data), len(data)
    write_file(path, payload, what=what, pack_it=False)  # checked above, replaced atomically
    return len(data), len(payload)


def write_file(path, data: bytes | str, *, what: str = "file", pack_it: bool | None = None,
               rows: Callable[[bytes], int] | None = None, allow_shrink: bool = False,
               mode: int | None = None) -> Path:
    """Write `data` (the plain text; packed here where the target ends in .gz, or as
    `pack_it` says) as `path`, atomically (see the module's docstring). `rows`: how to count
    the rows of a file's text; with it, a rewrite to fewer rows than the existing file holds is
    refused unless `allow_shrink`. `mode`: the new file's permissions (default: the replaced
    file's, else 0644). Returns the path."""
    path = Path(path)
    text = data.encode() if isinstance(data, str) else bytes(data)
    refuse_link(path, what)
    pack_it = is_packed(path) if pack_it is None else pack_it
    old_mode = None
    if path.exists():
        require_regular(path, what)
        old_mode = stat.S_IMODE(os.stat(path).st_mode)
        if rows is not None and not allow_shrink:
            try:
                before = rows(read_packed(path, what) if pack_it else read_file(path, what))
            except FileRefused as exc:
                raise ShrinkRefused(f"{exc}; not replaced (the file on disk cannot be read "
                                    "to count its rows)") from None
            after = rows(text)
            if after < before:
                raise ShrinkRefused(f"{path}: the new {what} holds {after} rows, the file it "
                                    f"would replace {before}: not replaced (nothing written)")
    payload = pack(text) if pack_it else text
    if pack_it and gzip.decompress(payload) != text:  # paranoia costs one unpack
        raise DamagedFile(f"{path}: packing did not reproduce the text; nothing written")
    with replacing(path, what, mode=mode if mode is not None else old_mode) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            _write_all(fd, payload)
        finally:
            os.close(fd)
    return path


@contextmanager
def replacing(path, what: str = "file", *, mode: int | None = None):
    """The writer for what is written by another library (numpy, matplotlib): yields a fresh
    temporary path in `path`'s directory to write; on leaving without an error it is fsync'd
    and renamed over `path` (a link at `path` refused, before and after); on an error it is
    removed and `path` left as it was. `mode`: the new file's permissions (default: the
    replaced file's, else 0644)."""
    path = Path(path)
    refuse_link(path, what)
    if mode is None and path.exists():
        require_regular(path, what)
        mode = stat.S_IMODE(os.stat(path).st_mode)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.close(fd)
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
            os.fchmod(fd, 0o644 if mode is None else mode)  # not mkstemp's 0600
        finally:
            os.close(fd)
        refuse_link(path, what)  # planted while we wrote
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def os_error_text(exc: OSError) -> str:
    """A failed write's reason in words (ENOSPC: the disk is full)."""
    return exc.strerror or str(exc)
