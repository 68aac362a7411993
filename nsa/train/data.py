"""Packing documents into exact windows, data streams, and a prefetching batch loader.

Packing: a stream's documents, each followed by end-of-text, form one token sequence; a
window is ``seq_len + 1`` consecutive tokens (inputs ``w[:-1]``, targets ``w[1:]``) and the
next window starts at the last token of the previous one, so every token transition is
trained once, nothing is truncated or dropped. A stream's position is
``(epoch, doc, offset)``: the next window starts at token ``offset`` of the ``doc``-th
document of that stream's split; checkpoints store it, so resume neither replays nor skips.

Streams: a fresh run of W ranks with accumulation A reads W streams, rank r stream r. A
resume on W' ranks keeps the global batch (A' = W*A/W'); when W' divides W, rank r' reads
the W/W' streams ``r'*W/W' ...`` in turn, A micro-batches each, so every optimizer step sees
exactly the same sequences as the original run would have (2 ranks -> 1 is exact).
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np
import torch

from nsa.train.sources import DataSourceError, Doc, DocSource
from nsa.train.tokenizer import Tokenizer


class EmptySplit(DataSourceError):
    """A stream has no document at all in its split (e.g. no validation document)."""


@dataclass
class StreamPos:
    epoch: int = 0
    doc: int = 0
    offset: int = 0


class Packer:
    """Windows of ``window`` tokens from one stream's split, overlapping by one token."""

    def __init__(self, source: DocSource, tokenizer: Tokenizer, stream: int, n_streams: int, split: str,
                 window: int, pos: StreamPos | None = None, wrap: bool = True,
                 on_epoch: Callable[[str], None] | None = None) -> None:
        self.source, self.tok, self.stream, self.n_streams = source, tokenizer, stream, n_streams
        self.split, self.window, self.wrap, self.on_epoch = split, window, wrap, on_epoch
        self.pos = pos or StreamPos()
        self._epoch = self.pos.epoch
        self._next_doc = self.pos.doc  # index of the next document the iterator yields
        self._it = self._open(self._epoch, self._next_doc)
        self._loaded: list[tuple[int, int, np.ndarray]] = []  # (epoch, doc, tokens+eot), from pos.doc on
        first = self._load()
        if first is None:
            raise EmptySplit(
                f"{source.description}: stream {stream}/{n_streams} has no {split} documents")
        if self.pos.offset >= len(first[2]):
            raise DataSourceError(
                f"{split} stream {stream}: offset {self.pos.offset} beyond document {self.pos.doc} "
                f"({len(first[2])} tokens): the data changed since the checkpoint")

    def _open(self, epoch: int, start: int) -> Iterator[Doc]:
        return iter(self.source.docs(self.stream, self.n_streams, self.split, start, epoch))

    def _encode(self, doc: Doc) -> np.ndarray:
        ids = np.asarray(doc, dtype=np.int32) if isinstance(doc, np.ndarray) else self.tok.encode(doc)
        return np.concatenate([ids, np.array([self.tok.eot], dtype=np.int32)])

    def _load(self) -> tuple[int, int, np.ndarray] | None:
        """Append the next document; at the end of the split start the next epoch (or None)."""
        for attempt in range(2):
            doc = next(self._it, None)
            if doc is not None:
                entry = (self._epoch, self._next_doc, self._encode(doc))
                self._next_doc += 1
                self._loaded.append(entry)
                return entry
            if not self.wrap or attempt == 1 or self._next_doc == 0:
                return None
            msg = (f"{self.split} stream {self.stream}/{self.n_streams} ran out after {self._next_doc} "
                   f"documents: epoch {self._epoch} ends, epoch {self._epoch + 1} starts from the first one")
            self._epoch, self._next_doc = self._epoch + 1, 0
            self._it = self._open(self._epoch, 0)
            if self.on_epoch:
                self.on_epoch(msg)
        return None

    def _entry(self, k: int) -> tuple[int, int, np.ndarray] | None:
        while len(self._loaded) <= k:
            if self._load() is None:
                return None
        return self._loaded[k]

    def next_window(self) -> np.ndarray | None:
        """The next ``window`` tokens, or None when a non-wrapping split is exhausted."""
        out = np.empty(self.window, dtype=np.int64)
        k, off, filled = 0, self.pos.offset, 0
        new_pos: tuple[int, int] | None = None
        while filled < self.window:
            entry = self._entry(k)
            if entry is None:
                return None
            toks = entry[2]
            take = min(len(toks) - off, self.window - filled)
            out[filled:filled + take] = toks[off:off + take]
            filled += take
            off += take
            if new_pos is None and filled >= self.window - 1:
                new_pos = (k, off - (filled - (self.window - 1)))
            if off == len(toks):
                k, off = k + 1, 0
        assert new_pos is not None  # set once the window was (almost) filled
        nk, noff = new_pos
        if noff == len(self._loaded[nk][2]):  # the last token opens the next document (loaded)
            nk, noff = nk + 1, 0
        del self._loaded[:nk]
        epoch, doc, _ = self._loaded[0]
        self.pos = StreamPos(epoch, doc, noff)
        return out


def own_streams(n_streams: int, world: int, rank: int) -> list[int] | None:
    """The streams ``rank`` reads when ``world`` divides ``n_streams``, else None (re-shard)."""
    if n_streams % world:
        return None
    per = n_streams // world
    return list(range(rank * per, (rank + 1) * per))


def reshard_positions(old: dict[int, StreamPos], old_streams: int, new_streams: int) -> dict[int, StreamPos]:
    """New stream positions when the world size does not divide the stream count: every new
    stream starts past the furthest document any old stream reached (nothing replayed; the
    documents in between are skipped, and the caller says so)."""
    epoch = max(p.epoch for p in old.values())
    furthest = max(p.doc * old_streams + s + (1 if p.offset else 0)
                   for s, p in old.items() if p.epoch == epoch)
    start = -(-furthest // new_streams)
    return {s: StreamPos(epoch, start, 0) for s in range(new_streams)}


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, seq_len + 1]
    stream: int
    positions: dict[int, StreamPos]  # every stream of this rank, after this batch
    events: list[str] = field(default_factory=list)

    def digest(self) -> str:
        return hashlib.sha256(self.tokens.numpy().tobytes()).hexdigest()[:16]


RawBatch = tuple[np.ndarray, int, dict[int, StreamPos], list[str]]  # tokens, stream, positions, events


def micro_batches(packers: dict[int, Packer], micro_per_stream: int, batch_size: int, slow_s: float,
                  events: list[str]) -> Iterator[RawBatch]:
    """This rank's micro-batches, endlessly: per optimizer step each owned stream in turn,
    ``micro_per_stream`` batches each, with the positions of every stream after the batch and the
    messages ``events`` collected since the last one (the packers' ``on_epoch`` appends to it)."""
    while True:
        for s, packer in packers.items():
            for _ in range(micro_per_stream):
                rows = [packer.next_window() for _ in range(batch_size)]
                # training packers wrap around their split: a window is never None here
                tokens = np.stack(cast("list[np.ndarray]", rows))
                said, events[:] = list(events), []
                positions = {k: StreamPos(**asdict(p.pos)) for k, p in packers.items()}
                if slow_s:
                    time.sleep(slow_s)  # debug.slow_data_s: a slow data source
                yield tokens, s, positions, said


class PrefetchLoader:
    """Produces this rank's micro-batches in a background thread, ``prefetch`` ahead.

    Its Python holds the GIL that the training thread needs between kernel launches: a step
    bound by the host waits for it (``data.loader: process`` makes the batches in a process of
    their own, loader_process.py).
    """

    def __init__(self, packers: dict[int, Packer], micro_per_stream: int, batch_size: int, prefetch: int,
                 slow_s: float = 0.0, pin: bool = False) -> None:
        self.packers, self.micro, self.batch_size = packers, micro_per_stream, batch_size
        self.slow_s, self.pin = slow_s, pin
        self._q: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._events: list[str] = []
        for p in packers.values():
            p.on_epoch = self._events.append
        self._thread = threading.Thread(target=self._run, name="nsa-data", daemon=True)
        self._thread.start()

    def _batches(self) -> Iterator[Batch]:
        made = micro_batches(self.packers, self.micro, self.batch_size, self.slow_s, self._events)
        for rows, s, positions, events in made:
            tokens = torch.from_numpy(rows)
            yield Batch(tokens.pin_memory() if self.pin else tokens, s, positions, events)

    def _run(self) -> None:
        try:
            for batch in self._batches():
                while not self._stop.is_set():
                    try:
                        self._q.put(batch, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # handed to the training thread, never swallowed
            self._q.put(exc)

    def next(self) -> Batch:
        item = self._q.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def ready(self) -> bool:
        return not self._q.empty()

    def close(self) -> None:
        self._stop.set()
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=5)


def val_batches(packers: list[Packer], n_batches: int, batch_size: int) -> list[torch.Tensor]:
    """Up to ``n_batches`` validation batches from this rank's val streams, in turn; the same
    batches at every eval so the curve compares like with like."""
    out: list[torch.Tensor] = []
    live = list(packers)
    while live and len(out) < n_batches:
        for p in list(live):
            rows = []
            for _ in range(batch_size):
                w = p.next_window()
                if w is None:
                    break
                rows.append(w)
            if len(rows) < batch_size:
                live.remove(p)
                continue
            out.append(torch.from_numpy(np.stack(rows)))
            if len(out) == n_batches:
                break
    return out


def positions_to_json(pos: dict[int, StreamPos]) -> dict[str, Any]:
    return {str(k): asdict(v) for k, v in pos.items()}


def positions_from_json(raw: dict[str, Any]) -> dict[int, StreamPos]:
    return {int(k): StreamPos(**v) for k, v in raw.items()}
