"""Appended files of a run (heartbeats, metrics, train.log, alerts): how they rotate and the
one reader that follows them.

A rotating file is renamed to ``<name>.1`` (replacing the older one) once it holds
:func:`rotate_bytes` bytes, and a fresh file starts under its name. A byte offset alone
cannot tell the fresh file from the one it replaced, so a reader's position names the
file too: :class:`StreamPos` is (generation, byte offset). A generation is the file's
inode and a checksum of its first line: an inode alone may be reused by the fresh file
(the rotation frees the old ``.1``'s inode just before the fresh file is created), the
first line alone may repeat; together they identify one file for as long as it exists.
The first line never changes once written (files are only appended to), so a
generation, once known, stays the same.

:class:`AppendedReader` reads the complete lines after a position and follows a rotation:
what was left of the old file (now ``<name>.1``) first, then the fresh file from its
start, so no line is lost or read twice. A position whose file is gone (rotated twice
since) is reported as lost (:meth:`AppendedReader.behind` is None); the reader then goes
on with the current file from its start.
"""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path
from typing import Any

from nsa.contract.io import MAX_CHUNK, JsonlWriter, Line, split_lines
from nsa.contract.records import Record

ROTATE_ENV = "NSA_ROTATE_BYTES"
DEFAULT_ROTATE_BYTES = 32 << 20
MIN_ROTATE_BYTES = 1024  # a rotation per few beats at most: below this the files would churn
ROTATED_SUFFIX = ".1"
GEN_HEAD_BYTES = 256  # the first line, up to this many bytes, names the generation
# a file's time stamps are coarse (a clock tick): a file written this recently may be written
# again with the same stamps, so an unchanged stat proves nothing about it yet
STAMP_SETTLE_S = 0.1


class StreamPos(Record, kw_only=True):
    """Where a reader of an appended file is: ``offset`` bytes into the file generation
    ``gen`` (``""``: not known yet, the offset then counts in the current file)."""

    gen: str = ""
    offset: int = 0


def rotate_bytes(environ: Any = None) -> int:
    """The size at which rotating files rotate: ``NSA_ROTATE_BYTES`` (bytes; ``16k``, ``32m``
    accepted), else 32 MiB. Why a setting: tests and users make files rotate in seconds."""
    env = os.environ if environ is None else environ
    text = str(env.get(ROTATE_ENV, "") or "").strip().lower()
    if not text:
        return DEFAULT_ROTATE_BYTES
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if scale > 1 else text
    try:
        value = int(digits) * scale
    except ValueError:
        raise ValueError(f"{ROTATE_ENV}={text!r}: expected a number of bytes (e.g. 4096, 16k, 32m)") from None
    if value < MIN_ROTATE_BYTES:
        raise ValueError(f"{ROTATE_ENV}={text!r}: at least {MIN_ROTATE_BYTES} bytes")
    return value


def rotated_path(path: Path) -> Path:
    """Where a rotating file's previous generation is kept: ``<name>.1``."""
    return path.with_name(path.name + ROTATED_SUFFIX)


class RotatingJsonl(JsonlWriter):
    """A JSONL file that moves itself to ``<name>.1`` (replacing the older one) past ``max_bytes``.

    The write and the rotation happen under one lock, so no line lands in the old file after
    it was renamed: a renamed file is complete, and readers may leave it once they read its end."""

    def __init__(self, path: Path, max_bytes: int | None = None) -> None:
        super().__init__(path)
        self.max_bytes = rotate_bytes() if max_bytes is None else max_bytes
        self._size = self.size()

    def write(self, record: Any) -> int:
        line = self.line(record)
        with self._lock:
            self._f.write(line)
            self._size += len(line)
            if self._size >= self.max_bytes:
                os.replace(self.path, rotated_path(self.path))
                self._open()
                self._size = 0
        return len(line)


def _generation(fd: int, size: int, ino: int) -> str:
    """The generation of an open file, ``""`` while its first line is still incomplete."""
    head = os.pread(fd, GEN_HEAD_BYTES, 0)
    nl = head.find(b"\n")
    if nl >= 0:
        head = head[:nl + 1]
    elif len(head) < GEN_HEAD_BYTES:
        return ""
    return f"{ino:x}-{zlib.crc32(head):08x}"


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What changes when a file is written, cut, replaced or renamed over: compared to tell
    an unchanged file with one stat instead of opening it."""
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class _Open:
    """One open generation of a file: its fd, size and generation, read consistently."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        try:
            st = os.fstat(self.fd)
            self.size = st.st_size
            self.stamp = _stamp(st)
            self.gen = _generation(self.fd, st.st_size, st.st_ino)
        except OSError:
            os.close(self.fd)
            raise

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> _Open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(path: Path) -> _Open | None:
    try:
        return _Open(path)
    except OSError:
        return None


def position_at_end(path: str | Path) -> StreamPos:
    """The position after everything a file holds now (``StreamPos()`` when it is absent)."""
    f = _open(Path(path))
    if f is None:
        return StreamPos()
    with f:
        return StreamPos(gen=f.gen, offset=f.size if f.gen else 0)


def tail(path: str | Path, max_lines: int, max_bytes: int) -> tuple[list[Line], StreamPos]:
    """The last complete lines (within the last ``max_bytes``) and the position after them, read
    from one open file, so the position names the file the lines came from."""
    f = _open(Path(path))
    if f is None:
        return [], StreamPos()
    with f:
        start = max(0, f.size - max_bytes)
        data = os.pread(f.fd, f.size - start, start)
    end = data.rfind(b"\n") + 1  # a last line without its newline is still being written
    first = 0
    if start > 0:
        nl = data.find(b"\n", 0, end)
        first = nl + 1 if nl >= 0 else end  # the first line is probably cut
    lines, _ = split_lines(data[first:end], start + first)
    lines = lines[-max_lines:] if max_lines > 0 else []
    return lines, StreamPos(gen=f.gen, offset=start + end if f.gen else 0)


class AppendedReader:
    """The complete lines of an appended file after a position, across rotations (see the
    module docstring). ``rotates``: the file may be renamed to ``<name>.1``; a file that
    never rotates (train.log, metrics.jsonl, alerts.jsonl) may still be replaced or cut,
    which is a new generation read from its start.

    Polling is cheap when nothing changed: once a read reached the end of the current file,
    last written more than :data:`STAMP_SETTLE_S` before, the next read first compares one
    ``stat`` of the path (inode, size, modification and change times) with what that file
    was, and returns nothing at once when it is the same. Any later write, cut, rotation or
    replacement changes the stamp, and the full read follows."""

    def __init__(self, path: str | Path, pos: StreamPos | None = None, rotates: bool = True) -> None:
        self.path = Path(path)
        self.pos = pos if pos is not None else StreamPos()
        self.rotates = rotates
        self.lost = 0  # positions whose file was gone (replaced, or rotated twice between reads)
        self.more = False  # the last read stopped at its byte limit: lines are waiting
        self.opens = 0  # reads that opened the file (the others were answered by one stat)
        # (the file's stamp, the position) after a read to the current file's end
        self._idle: tuple[tuple[int, int, int, int], StreamPos] | None = None

    def _find(self) -> tuple[_Open | None, _Open | None]:
        """(the current file, the rotated one if it is the generation of ``pos``)."""
        cur = _open(self.path)
        old = None
        if self.rotates and self.pos.gen and (cur is None or cur.gen != self.pos.gen):
            old = _open(rotated_path(self.path))
            if old is not None and old.gen != self.pos.gen:
                old.close()
                old = None
        return cur, old

    def behind(self) -> int | None:
        """Bytes written after the position (a rotated remainder included); None when the
        position's file is gone, so how much was missed is unknown."""
        cur, old = self._find()
        try:
            size = cur.size if cur is not None else 0
            if old is not None:
                return max(0, old.size - self.pos.offset) + size
            if cur is None:
                return 0 if not self.pos.gen else None
            if self.pos.gen in ("", cur.gen) and self.pos.offset <= size:
                return size - self.pos.offset
            return None
        finally:
            for f in (cur, old):
                if f is not None:
                    f.close()

    def read(self, max_bytes: int = MAX_CHUNK) -> list[Line]:
        """The next complete lines (of one generation, at most ``max_bytes``), the position
        moved after them. A line without its newline is held back until it is complete;
        ``more`` says whether the byte limit left lines to read now."""
        self.more = False
        if self._idle is not None:
            stamp, pos = self._idle
            self._idle = None
            try:
                if pos == self.pos and _stamp(os.stat(self.path)) == stamp:
                    self._idle = stamp, pos
                    return []
            except OSError:
                pass
        self.opens += 1
        cur, old = self._find()
        try:
            if old is not None:  # rotated since the last read: its remainder first
                lines = self._read_from(old, max_bytes)
                if lines or self.pos.offset < old.size:
                    self.more = self.more or (bool(lines) and cur is not None)  # the fresh file next
                    return lines
                self.pos = StreamPos()  # the old generation is read to its end
            if cur is None:
                return []
            if self.pos.gen and self.pos.gen != cur.gen and old is None:
                self.lost += 1  # replaced, or rotated twice: the current file from its start
                self.pos = StreamPos()
            if not self.pos.gen and self.pos.offset > cur.size:
                self.pos = StreamPos()  # an offset from before a replacement
            if self.pos.gen == cur.gen and self.pos.offset > cur.size:
                self.lost += 1  # the same file cut shorter: read it again from its start
                self.pos = StreamPos()
            if not cur.gen:
                return []  # not even a first line yet
            self.pos = StreamPos(gen=cur.gen, offset=self.pos.offset)
            lines = self._read_from(cur, max_bytes)
            settled = time.time() - cur.stamp[2] / 1e9 > STAMP_SETTLE_S
            if old is None and self.pos.offset == cur.size and settled:
                self._idle = cur.stamp, self.pos  # read to its end: unchanged, nothing new
            return lines
        finally:
            for f in (cur, old):
                if f is not None:
                    f.close()

    def _read_from(self, f: _Open, max_bytes: int) -> list[Line]:
        offset = self.pos.offset
        if f.size <= offset:
            return []
        data = os.pread(f.fd, min(max_bytes, f.size - offset), offset)
        lines, used = split_lines(data, offset)
        if not lines and len(data) >= max_bytes:  # one huge line: deliver what there is
            lines, used = [Line(data.decode("utf-8", "replace"), offset + len(data))], len(data)
        self.pos = StreamPos(gen=f.gen, offset=offset + used)
        self.more = len(data) >= max_bytes and offset + len(data) < f.size
        return lines

    def skip_to_tail(self, keep_bytes: int) -> int:
        """Move to the start of the first complete line within the current file's last
        ``keep_bytes`` (a reader far behind catches up at a bounded cost); returns the bytes
        skipped (what was left of a rotated generation not counted)."""
        cur = _open(self.path)
        if cur is None or not cur.gen:
            if cur is not None:
                cur.close()
            return 0
        with cur:
            here = self.pos.offset if self.pos.gen == cur.gen else 0
            start = max(here, cur.size - keep_bytes)
            if start > 0 and start > here:
                window = os.pread(cur.fd, min(keep_bytes, cur.size - start) + 1, start - 1)
                nl = window.find(b"\n")
                start = start - 1 + nl + 1 if nl >= 0 else cur.size
            self.pos = StreamPos(gen=cur.gen, offset=start)
            return max(0, start - here)


def read_chunk(path: str | Path, offset: int, max_bytes: int) -> tuple[bytes, int, int, str]:
    """Up to ``max_bytes`` raw bytes of a file from ``offset``: (data, offset after them, the
    file's size, its generation). Absent: (b"", 0, 0, "")."""
    f = _open(Path(path))
    if f is None:
        return b"", 0, 0, ""
    with f:
        start = max(0, min(offset, f.size))
        data = os.pread(f.fd, max(0, min(max_bytes, f.size - start)), start)
        return data, start + len(data), f.size, f.gen
