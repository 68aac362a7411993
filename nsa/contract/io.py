"""Reading and writing the contract's records: one JSON encoder, one atomic writer, one
JSONL appender, one tail reader. Every file a run writes goes through here.

JSON rules (docs/run-directory.md): UTF-8, standard JSON. A non-finite float (a NaN loss)
is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` and read back as the
float, so a NaN stays visible without breaking standard JSON parsers. Lines written by
older versions with bare ``NaN`` literals are still read.

Files are created private to their user (0600; directories 0700).
"""

from __future__ import annotations

import enum
import json
import math
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

import msgspec
import msgspec.structs

T = TypeVar("T")
# The readers below take a record class (and give its instances) or any other type msgspec
# reads, such as the union ``Metric`` (and give ``Any``): their overloads say so to mypy.

FILE_MODE = 0o600
DIR_MODE = 0o700
MAX_CHUNK = 1 << 20  # bytes per read_lines call: bounds memory and the size of one burst


class ContractError(ValueError):
    """Bytes that are not a valid record of the expected type (the message says where)."""


# -- encoding ---------------------------------------------------------------------------------
def _safe(x: Any) -> Any:
    if isinstance(x, float):
        if math.isfinite(x):
            return x
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, dict):
        return {k: _safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_safe(v) for v in x]
    return x


_ENCODER = msgspec.json.Encoder()


def _as_text(obj: Any) -> Any:
    """Text-like objects msgspec does not know (torch's TorchVersion, paths) as their text;
    raw JSON (a line passed on as it was read) as the plain Python it holds."""
    if isinstance(obj, (str, os.PathLike)):
        return os.fspath(obj) if isinstance(obj, os.PathLike) else str.__str__(obj)
    if isinstance(obj, msgspec.Raw):
        return msgspec.json.decode(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} in a record")


def to_builtins(obj: Any) -> Any:
    """A record (Struct, enum, dict, ...) as plain JSON-able Python, non-finite floats as strings."""
    return _safe(msgspec.to_builtins(obj, enc_hook=_as_text))


_DIRECT = msgspec.json.Encoder(enc_hook=_as_text)
_PLAIN = frozenset({str, int, bool, type(None), msgspec.Raw})  # raw JSON: msgspec parsed it, no NaN


def _finite(x: Any) -> bool:
    """Whether ``x`` (a record, or what records hold) surely has no NaN or infinite float:
    False for one, and for any value of a kind not looked into (the slow path is then exact)."""
    t = type(x)
    if t in _PLAIN:
        return True
    if t is float:
        return math.isfinite(x)
    if isinstance(x, msgspec.Struct):
        values: Any = msgspec.structs.astuple(x)
    elif isinstance(x, (list, tuple)):
        values = x
    elif isinstance(x, dict):
        values = x.values()
    elif isinstance(x, enum.Enum):
        values = (x.value,)
    else:  # subclasses of str, int or float (numpy's float64, torch's version): the slow path
        return False
    return all(type(v) in _PLAIN or _finite(v) for v in values)


def encode(obj: Any) -> bytes:
    """Compact JSON of a record (one JSONL line without its newline). A record without a
    non-finite float (nearly all) is encoded as it is; one with NaN or infinity is first
    rebuilt as plain Python with those as strings (``to_builtins``), which costs 2-3x more:
    the agent encodes every line a panel watches (the lines it passes on as read are raw
    JSON, nothing to look into)."""
    if _finite(obj):
        return _DIRECT.encode(obj)
    return _ENCODER.encode(to_builtins(obj))


def encode_pretty(obj: Any) -> bytes:
    """Indented JSON (for the small JSON files people also read by eye)."""
    return msgspec.json.format(encode(obj), indent=1)


# -- decoding ---------------------------------------------------------------------------------
_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder(typ: Any) -> msgspec.json.Decoder[Any]:
    dec = _DECODERS.get(typ)
    if dec is None:
        dec = _DECODERS[typ] = msgspec.json.Decoder(typ, strict=False)
    return dec


@overload
def decode(data: bytes | str, typ: type[T], where: str = "") -> T: ...
@overload
def decode(data: bytes | str, typ: Any, where: str = "") -> Any: ...
def decode(data: bytes | str, typ: Any, where: str = "") -> Any:
    """Validate JSON ``data`` as ``typ``; raises ContractError naming ``where`` and the field."""
    try:
        return _decoder(typ).decode(data)
    except msgspec.ValidationError as exc:
        raise ContractError(f"{where}: {exc}" if where else str(exc)) from None
    except msgspec.DecodeError as exc:
        legacy = _legacy(data, typ)
        if legacy is not None:
            return legacy
        raise ContractError(f"{where}: {exc}" if where else str(exc)) from None


def _legacy(data: bytes | str, typ: Any) -> Any:
    """Lines of older writers: Python's json with bare NaN/Infinity literals."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    if "NaN" not in text and "Infinity" not in text:
        return None
    try:
        return msgspec.convert(json.loads(text), typ, strict=False)
    except (ValueError, msgspec.ValidationError):
        return None


@overload
def convert(obj: Any, typ: type[T], where: str = "") -> T: ...
@overload
def convert(obj: Any, typ: Any, where: str = "") -> Any: ...
def convert(obj: Any, typ: Any, where: str = "") -> Any:
    """Validate already-parsed Python data (e.g. a YAML or a request's args) as ``typ``."""
    try:
        return msgspec.convert(obj, typ, strict=False)
    except msgspec.ValidationError as exc:
        raise ContractError(f"{where}: {exc}" if where else str(exc)) from None


@dataclass
class LineStats:
    """Lines a reader took and the ones it skipped as malformed (never fatal, always counted)."""

    good: int = 0
    bad: int = 0
    last_error: str = ""


@overload
def decode_lines(lines: Iterable[str | bytes], typ: type[T], stats: LineStats | None = None,
                 where: str = "") -> list[T]: ...
@overload
def decode_lines(lines: Iterable[str | bytes], typ: Any, stats: LineStats | None = None,
                 where: str = "") -> list[Any]: ...
def decode_lines(lines: Iterable[str | bytes], typ: Any, stats: LineStats | None = None,
                 where: str = "") -> list[Any]:
    """The valid records among ``lines``; a bad line is skipped and counted in ``stats``."""
    return [rec for rec, _ in decode_lines_raw(lines, typ, stats, where)]


def decode_lines_raw(lines: Iterable[str | bytes], typ: Any, stats: LineStats | None = None,
                     where: str = "") -> list[tuple[Any, msgspec.Raw | None]]:
    """``decode_lines``, each record beside its line as raw JSON to pass on unchanged: a
    reader of the same contract decodes it to the same record (NaN written as text too), and
    passing it on costs nothing where encoding the record again costs a walk through it. None
    for an older writer's line with bare NaN literals, which is not JSON: send the record."""
    out: list[tuple[Any, msgspec.Raw | None]] = []
    dec = _decoder(typ)
    for line in lines:
        data = line.encode() if isinstance(line, str) else line
        try:
            out.append((dec.decode(data), msgspec.Raw(data)))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            rec = _legacy(line, typ) if isinstance(exc, msgspec.DecodeError) else None
            if rec is not None:
                out.append((rec, None))
            elif stats is not None:
                stats.bad += 1
                stats.last_error = f"{where}: {exc}" if where else str(exc)
            continue
        if stats is not None:
            stats.good += 1
    return out


# -- files ------------------------------------------------------------------------------------
def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) private to its user."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(path, DIR_MODE)
    return path


def write_json_atomic(path: Path, obj: Any, durable: bool = True) -> None:
    """Write a record as JSON through a temporary file in the same directory, then rename.

    ``durable``: fsync before the rename (records that must survive a power cut). Readers
    never see half a file. The file is private to its user (0600)."""
    data = encode_pretty(obj) + b"\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:  # mkstemp creates 0600
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_in_place(path: Path, obj: Any) -> None:
    """Last resort on a full disk (ENOSPC): overwrite the existing file's own blocks with the
    compact record, then cut the file to its length. A new file (the atomic writer's) needs
    blocks the disk no longer has; the old file's are already allocated. Not atomic: a reader
    may see a half-written file for an instant and skips it (``read_json`` returns None)."""
    data = encode(obj) + b"\n"
    fd = os.open(path, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


@overload
def read_json(path: Path, typ: type[T]) -> T | None: ...
@overload
def read_json(path: Path, typ: Any) -> Any: ...
def read_json(path: Path, typ: Any) -> Any:
    """A record from a JSON file, or None when absent, half-written or not of ``typ``."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        return decode(data, typ, str(path))
    except ContractError:
        return None


class JsonlWriter:
    """Appends one complete JSON line per record (a single write), thread-safe, flushed."""

    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        self.path = path
        self._open()
        self._lock = threading.Lock()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        self._f = os.fdopen(fd, "ab", buffering=0)

    @staticmethod
    def line(record: Any) -> bytes:
        """One record as its JSONL line, newline included."""
        return encode(record) + b"\n"

    def write(self, record: Any) -> int:
        """Append one record; returns the bytes written."""
        line = self.line(record)
        with self._lock:
            self._f.write(line)
        return len(line)

    def size(self) -> int:
        with self._lock:
            return os.fstat(self._f.fileno()).st_size

    def reopen(self) -> None:
        """Start a fresh file at ``path`` (after the caller renamed the old one away)."""
        with self._lock:
            self._f.close()
            self._open()

    def close(self) -> None:
        with self._lock:
            self._f.close()


@dataclass
class Line:
    """One complete line of a growing file; ``offset`` is the byte offset just after its newline."""

    text: str
    offset: int


def split_lines(data: bytes, base: int) -> tuple[list[Line], int]:
    """The complete lines of ``data`` (read at file offset ``base``) and the bytes they span."""
    lines: list[Line] = []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return lines, pos
        lines.append(Line(data[pos:nl].decode("utf-8", "replace"), base + nl + 1))
        pos = nl + 1


def read_lines(path: str | Path, offset: int, max_bytes: int = MAX_CHUNK) -> tuple[list[Line], int]:
    """The complete lines of ``path`` from ``offset`` and the offset to resume at.

    A line without its newline is still being written (writers append whole lines): it
    is held back. A missing file yields nothing; a file shorter than ``offset`` was
    replaced or rotated, so it is read again from 0. A single line longer than
    ``max_bytes`` is returned cut, so a reader never stalls.
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
    lines, pos = split_lines(data, offset)
    if not lines and len(data) >= max_bytes:  # one huge line: deliver what we have
        lines.append(Line(data.decode("utf-8", "replace"), offset + len(data)))
        pos = len(data)
    return lines, offset + pos


def tail_lines(path: str | Path, max_lines: int = 20, max_bytes: int = 16384) -> list[str]:
    """The last ``max_lines`` complete lines within the last ``max_bytes`` of a file ([] if
    absent). O(max_bytes) whatever the file's size."""
    lines, _ = tail_with_offset(path, max_lines, max_bytes)
    return [ln.text for ln in lines]


def tail_with_offset(path: str | Path, max_lines: int, max_bytes: int) -> tuple[list[Line], int]:
    """The last complete lines of a file with their offsets, and the file's end offset."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read(size - start)
    except OSError:
        return [], 0
    end = data.rfind(b"\n") + 1  # a last line without its newline is still being written
    body = data[:end]
    first = 0
    if start > 0:
        nl = body.find(b"\n")
        first = nl + 1 if nl >= 0 else len(body)  # the first line is probably cut
    out: list[Line] = []
    pos = first
    while pos < len(body):
        nl = body.find(b"\n", pos)
        out.append(Line(body[pos:nl].decode("utf-8", "replace"), start + nl + 1))
        pos = nl + 1
    return out[-max_lines:] if max_lines > 0 else [], start + end


@overload
def last_record(path: str | Path, typ: type[T], max_bytes: int = 65536) -> T | None: ...
@overload
def last_record(path: str | Path, typ: Any, max_bytes: int = 65536) -> Any: ...
def last_record(path: str | Path, typ: Any, max_bytes: int = 65536) -> Any:
    """The newest valid record of a JSONL file (a heartbeat file's last beat): O(1) in the
    file's length. Malformed or cut lines at the end are skipped."""
    lines = tail_lines(path, 64, max_bytes)
    for text in reversed(lines):
        recs = decode_lines([text], typ)
        if recs:
            return recs[0]
    return None
