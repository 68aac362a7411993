"""The live part of a run's watch at a small, steady cost: what one poll of a run's files
reads and what of it is sent.

A panel is left open for days beside the runs it watches, and its agent polls every watched
run's files twice a second. What keeps that cheap:

- a rank's heartbeats are coalesced per poll (:func:`coalesce_beats`): its newest beat, and
  before it the first beat of that beat's step when the step advanced within the poll. A
  watcher keeps each rank's newest beat (the panel's state) and when its step last advanced
  (the stall rule measures from that beat's time), and both stay exact; the beats between
  them say nothing either needs. Metrics and log lines are never coalesced: charts and the
  log need every line.
- the heartbeat directory is listed again only when it changed (:class:`BeatFiles`), and an
  unchanged file costs one ``stat`` (nsa.contract.appended.AppendedReader).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from nsa.contract import Beat
from nsa.contract.rundir import HEARTBEATS, rank_of_file

SETTLE_S = 2.0  # a directory changed this recently is listed again: its time stamp is coarse


def coalesce_beats(beats: list[Beat], last_step: int | None) -> list[Beat]:
    """What of one rank's beats (in file order) a poll sends: the newest, preceded by the first
    beat of its step when that step began within ``beats`` (``last_step``: the step of the
    last beat sent for the rank, None before any)."""
    if not beats:
        return []
    newest = beats[-1]
    first = newest
    for b in reversed(beats[:-1]):
        if b.step != newest.step:
            break
        first = b
    else:  # every beat of the poll is at the newest step: it began here unless already sent
        if last_step == newest.step:
            first = newest
    return [newest] if first is newest else [first, newest]


class BeatFiles:
    """rank -> its heartbeat file (``heartbeats/rank-R.jsonl``), listed again only when the
    directory changed (a rank's first beat, a rotation) or changed too recently to tell."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir / HEARTBEATS
        self._stamp: tuple[int, int] | None = None
        self._files: dict[int, Path] = {}
        self.listings = 0  # how often the directory was read (tests)

    def files(self) -> dict[int, Path]:
        """The current files, by rank (what ``nsa_tui.agent.runs.beat_files`` lists)."""
        try:
            st = os.stat(self.dir)
        except OSError:
            self._stamp, self._files = None, {}
            return {}
        stamp = (st.st_ino, st.st_mtime_ns)
        if stamp == self._stamp and time.time() - st.st_mtime > SETTLE_S:
            return self._files
        out: dict[int, Path] = {}
        try:
            entries = list(os.scandir(self.dir))
        except OSError:
            entries = []
        for e in entries:
            rank = rank_of_file(e.name)
            if rank is not None:
                out[rank] = Path(e.path)
        self.listings += 1
        self._stamp, self._files = stamp, dict(sorted(out.items()))
        return self._files
