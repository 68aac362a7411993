"""Read complete lines of a growing file from a byte offset.

Why offsets: a client that reconnects passes the offset just after the last line it
saw, and gets every later line exactly once (no gap, no duplicate). A line without its
newline is still being written (the trainer appends whole lines), so it is held back
until the newline arrives.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MAX_CHUNK = 1 << 20  # bytes read per call: bounds memory and the size of one burst


@dataclass
class Line:
    """One complete line; ``offset`` is the byte offset just after its newline."""

    text: str
    offset: int


def read_lines(path: str, offset: int, max_bytes: int = MAX_CHUNK) -> tuple[list[Line], int]:
    """Return the complete lines of ``path`` from ``offset`` and the offset to resume at.

    A missing file yields nothing. A file shorter than ``offset`` (truncated or
    replaced) is read again from 0, because a rewrite means the old offsets are void.
    A single line longer than ``max_bytes`` is returned cut, so a reader never stalls.
    """
    try:
        size = os.stat(path).st_size
    except OSError:
        return [], offset
    if size < offset:
        offset = 0
    if size == offset:
        return [], offset
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(min(max_bytes, size - offset))
    except OSError:
        return [], offset
    lines: list[Line] = []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        lines.append(Line(data[pos:nl].decode("utf-8", "replace"), offset + nl + 1))
        pos = nl + 1
    if not lines and len(data) >= max_bytes:  # one huge line: deliver what we have
        lines.append(Line(data.decode("utf-8", "replace"), offset + len(data)))
        pos = len(data)
    return lines, offset + pos


def tail_text(path: str, max_lines: int = 20, max_bytes: int = 16384) -> list[str]:
    """The last ``max_lines`` lines of a file (for crash evidence), [] if absent."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is probably cut
    return lines[-max_lines:]
