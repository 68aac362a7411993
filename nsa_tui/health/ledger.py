"""A run's alerts.jsonl: the ledger that writes it, the book that reads it back.

The watchdog checks its run every second and gets the alerts that hold now
(nsa_tui/health/alerts.py). The :class:`AlertLedger` turns that into events, one line each
(``AlertEvent``): ``raised`` when a condition starts, ``updated`` when its facts change
(severity, rank, step, phase, evidence, wording beyond the numbers; a mere age at most every
``update_every_s``), ``resolved`` once it has been absent for ``resolve_after_s`` (so a flapping
condition costs one pair of lines per few seconds at worst, and the file's growth is bounded by
the run's troubles, not its age). ``acknowledged`` lines come from the agent's ``ack``.

The :class:`AlertBook` folds those lines, incrementally (only new bytes), into one
``AlertState`` per alert id: what the agent serves and the CLI prints.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from nsa.contract import Alert, AlertEvent, JsonlWriter, decode_lines
from nsa.contract.appended import AppendedReader
from nsa.contract.io import LineStats
from nsa.contract.replies import AlertState
from nsa.contract.rundir import ALERTS_JSONL

ALERTS_FILE = ALERTS_JSONL
LOG_TAIL_MAX = 15
LINE_CHARS_MAX = 300


def _slim(alert: Alert) -> Alert:
    """An alert as stored: a bounded log tail (each event line stays a few KB)."""
    tail = [ln[:LINE_CHARS_MAX] for ln in alert.log_tail[-LOG_TAIL_MAX:]]
    return msgspec.structs.replace(alert, log_tail=tail) if tail != alert.log_tail else alert


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _signature(a: Alert) -> tuple:
    """What makes an alert materially different (an age or a free-space figure does not)."""
    return (a.severity, a.rank, a.gpu, a.phase, a.last_step, tuple(a.evidence), _NUMBER.sub("#", a.message))


@dataclass
class _Open:
    id: str
    alert: Alert  # the newest
    raised_at: float
    written_at: float
    written: Alert | None = None  # as last written
    absent_since: float | None = None


@dataclass
class AlertLedger:
    """Writes alert transitions of one run to its alerts.jsonl (see the module docstring)."""

    path: Path
    run_id: str
    resolve_after_s: float = 10.0
    update_every_s: float = 60.0
    by: str = "watchdog"
    clock: Callable[[], float] = time.time
    open: dict[str, _Open] = field(default_factory=dict)  # alert key -> its open record
    seq: int = 0
    pending: list[AlertEvent] = field(default_factory=list)  # written when the disk has room again

    def __post_init__(self) -> None:
        book = AlertBook(self.path)
        book.refresh()
        self.seq = book.max_seq
        for st in book.states.values():  # a watchdog started again keeps the alerts it had raised
            if st.state != "resolved":
                self.open[st.alert.key] = _Open(st.id, st.alert, st.raised_at, st.updated_at, st.alert)
        self._writer: JsonlWriter | None = None

    def step(self, current: list[Alert], now: float | None = None, final: bool = False) -> list[AlertEvent]:
        """Compare the alerts that hold now with the open ones; write and return the events.
        ``final``: the run has ended; what no longer holds is resolved now."""
        now = self.clock() if now is None else now
        events: list[AlertEvent] = []
        seen = set()
        for a in current:
            a = _slim(msgspec.structs.replace(a, run=self.run_id))
            seen.add(a.key)
            rec = self.open.get(a.key)
            if rec is None:
                self.seq += 1
                rec = self.open[a.key] = _Open(f"{self.seq}-{a.kind}", a, now, now, a)
                events.append(AlertEvent(ts=now, action="raised", id=rec.id, alert=a, by=self.by))
                continue
            rec.absent_since = None
            # evidence comes by attach(), never from the detector
            rec.alert = a = msgspec.structs.replace(a, evidence=rec.alert.evidence)
            old = rec.written or a
            if _signature(a) == _signature(old):
                continue
            urgent = (a.severity, a.rank, _NUMBER.sub("#", a.message)) != \
                (old.severity, old.rank, _NUMBER.sub("#", old.message))
            if urgent or now - rec.written_at >= self.update_every_s:
                events.append(AlertEvent(ts=now, action="updated", id=rec.id, alert=a, by=self.by))
                rec.written_at, rec.written = now, a
        for key, rec in list(self.open.items()):
            if key in seen:
                continue
            if rec.absent_since is None:
                rec.absent_since = now
            if final or now - rec.absent_since >= self.resolve_after_s:
                events.append(AlertEvent(ts=now, action="resolved", id=rec.id, alert=rec.alert, by=self.by))
                del self.open[key]
        self.write(events)
        return events

    def attach(self, key: str, files: list[str], note: str = "") -> AlertEvent | None:
        """Evidence captured for an open alert: an ``updated`` event that links it."""
        rec = self.open.get(key)
        if rec is None or not files:
            return None
        merged = sorted(set(rec.alert.evidence) | set(files))
        rec.alert = rec.written = msgspec.structs.replace(rec.alert, evidence=merged)
        rec.written_at = self.clock()
        ev = AlertEvent(ts=rec.written_at, action="updated", id=rec.id, alert=rec.alert, by=self.by,
                        note=note)
        self.write([ev])
        return ev

    def id_of(self, key: str) -> str | None:
        rec = self.open.get(key)
        return rec.id if rec is not None else None

    def write(self, events: list[AlertEvent]) -> None:
        """Append events; on a full disk keep them and try again with the next ones."""
        todo = self.pending + events
        self.pending = []
        for i, ev in enumerate(todo):
            try:
                if self._writer is None:
                    self._writer = JsonlWriter(self.path)
                self._writer.write(ev)
            except OSError:
                self.pending = todo[i:][-1000:]
                return

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class AlertBook:
    """The alerts of one run folded from its alerts.jsonl, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.reader = AppendedReader(self.path, rotates=False)
        self.states: dict[str, AlertState] = {}
        self.stats = LineStats()
        self.max_seq = 0

    def refresh(self) -> list[AlertState]:
        """Fold lines written since the last call; returns the states they changed. A file
        replaced since (another generation: nsa.contract.appended) is folded from its start."""
        changed: dict[str, AlertState] = {}
        while True:
            lost = self.reader.lost
            lines = self.reader.read(4 << 20)
            if self.reader.lost != lost:  # replaced: start over with the new file's lines
                self.states, self.stats, self.max_seq, changed = {}, LineStats(), 0, {}
            if not lines:
                break
            for ev in decode_lines([ln.text for ln in lines], AlertEvent, self.stats, str(self.path)):
                s = self.apply(ev)
                if s is not None:
                    changed[s.id] = s
        return list(changed.values())

    def apply(self, ev: AlertEvent) -> AlertState | None:
        run = ev.alert.run or self.path.parent.name
        head = ev.id.split("-", 1)[0]
        if head.isdigit():
            self.max_seq = max(self.max_seq, int(head))
        old = self.states.get(ev.id)
        if old is None:
            if ev.action not in ("raised", "updated"):
                return None  # a resolution or acknowledgement of an alert this file never raised
            new = AlertState(id=ev.id, run=run, state="open", raised_at=ev.ts, updated_at=ev.ts,
                             alert=ev.alert)
        elif ev.action == "acknowledged":
            new = msgspec.structs.replace(old, acked_at=ev.ts, acked_by=ev.by or None,
                                          state="resolved" if old.state == "resolved" else "acknowledged")
        elif ev.action == "resolved":
            new = msgspec.structs.replace(old, state="resolved", resolved_at=ev.ts, updated_at=ev.ts,
                                          alert=ev.alert)
        else:
            new = msgspec.structs.replace(old, updated_at=ev.ts, alert=ev.alert)
        self.states[ev.id] = new
        return new

    def listing(self, history: int = 100) -> list[AlertState]:
        """Every alert not resolved and the newest ``history`` resolved ones, oldest first."""
        return bounded(list(self.states.values()), history)

    def find(self, ref: str) -> AlertState | None:
        """An alert by id, or by kind when exactly one alert of that kind is not resolved."""
        if ref in self.states:
            return self.states[ref]
        live = [s for s in self.states.values() if s.alert.kind == ref and s.state != "resolved"]
        return live[0] if len(live) == 1 else None


def bounded(states: list[AlertState], history: int) -> list[AlertState]:
    """Every unresolved alert and the newest ``history`` resolved ones, oldest first."""
    live = [s for s in states if s.state != "resolved"]
    done = sorted((s for s in states if s.state == "resolved"), key=lambda s: s.raised_at)
    keep = live + (done[-history:] if history > 0 else [])
    return sorted(keep, key=lambda s: (s.raised_at, s.id))


def acknowledge(run_dir: Path, ref: str, by: str, now: float | None = None) -> AlertState:
    """Append an ``acknowledged`` event for alert ``ref`` (the caller holds the run's lock).
    Raises KeyError when the run has no such alert."""
    book = AlertBook(run_dir / ALERTS_FILE)
    book.refresh()
    st = book.find(ref)
    if st is None:
        raise KeyError(ref)
    ev = AlertEvent(ts=time.time() if now is None else now, action="acknowledged", id=st.id, alert=st.alert,
                    by=by)
    w = JsonlWriter(run_dir / ALERTS_FILE)
    try:
        w.write(ev)
    finally:
        w.close()
    return book.apply(ev) or st


class AlertBooks:
    """The books of every run under a runs root, each read once then only its new bytes (the
    agent's cache: watch_alerts polls them every half second)."""

    def __init__(self) -> None:
        self.books: dict[str, AlertBook] = {}

    def book(self, run_dir: Path) -> AlertBook:
        key = str(run_dir)
        b = self.books.get(key)
        if b is None:
            b = self.books[key] = AlertBook(run_dir / ALERTS_FILE)
        return b

    def refresh(self, run_dir: Path) -> list[AlertState]:
        return self.book(run_dir).refresh()

    def forget(self, keep: set[str]) -> None:
        """Drop the books of runs that are gone (``keep``: run directories that exist)."""
        for key in [k for k in self.books if k not in keep]:
            del self.books[key]
