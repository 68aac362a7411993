"""One run's watch: its streams (status, heartbeats, metrics, log) with resumable positions.

The host-wide subscriptions (the run list, host samples, recorded alerts) are in watchlists.py.

A run's watch is bounded whatever the run's age (docs/agent-protocol.md, "watch"): the
newest beat of each rank (not the history), the metrics as their summary plus the last
lines at full resolution, the log's tail; then live lines as they are written. A client
that reconnects passes the positions it saw: a stream it missed little of continues exactly
(no gap, no duplicate), across a rotation of its file too; one it missed much of, or whose
file is gone (rotated twice since), starts again from its bounded view. Every file is read
through the contract's rotation-aware reader (nsa.contract.appended): a position names the
file's generation, so a fresh file after a rotation is never taken for the old one.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from nsa.contract import (
    Beat,
    Metric,
    MetricsFolder,
    MetricsSummary,
    RunView,
    decode_lines,
    encode,
    read_json,
)
from nsa.contract.appended import AppendedReader, StreamPos, position_at_end, rotated_path, tail
from nsa.contract.io import LineStats, decode_lines_raw, read_lines, tail_with_offset
from nsa.contract.protocol import EventMsg, Gap, LogLines, Synced
from nsa.contract.requests import WATCH_STREAMS, WatchArgs
from nsa.contract.rundir import (
    METRICS_JSONL,
    METRICS_SUMMARY_JSON,
    TRAIN_LOG,
    heartbeat_stream,
)
from nsa_tui.agent.follow import BeatFiles, coalesce_beats
from nsa_tui.agent.owners import shown_part
from nsa_tui.agent.runs import RunStore, beat_files

# How often a watch looks at its run's files. A panel draws new data at most once a second,
# so a poll every half second adds at most half a second to what a person sees; a watch
# without the log (alert rules, a marked run's charts) waits a second: the alert rules'
# floor is seconds. Each poll costs a stat or a read per file: 8 ranks make 10 files a run.
POLL_S = 0.5
QUIET_POLL_S = 1.0
STATUS_EVERY_S = 1.0
SHARED_VIEW_S = 0.5  # a view of the run this recent (another watch's, the run list's) will do
BEATS_RESUME_BYTES = 64 << 10  # a rank's missed beats sent exactly when fewer; else its newest
METRICS_RESUME_BYTES = 1 << 20
METRIC_LINE_BYTES = 1024  # budget per line when reading the last N metric lines
CATCH_UP_BYTES = 32 << 20  # lines after a summary folded in place; more means a stale summary

Send = Callable[[EventMsg], None]


def _as_read(rec: Any, raw: msgspec.Raw | None) -> Any:
    """What to send of a live line: the line as it was read (valid, and the client decodes
    it to the same record), or the record where the line is not JSON as it stands."""
    return raw if raw is not None else rec


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class SummaryCache:
    """Metric summaries of runs that have no metrics-summary.json (older or hand-made runs):
    built once by reading metrics.jsonl, then extended with new lines only."""

    def __init__(self) -> None:
        self._folders: dict[str, tuple[int, MetricsFolder]] = {}

    def folder(self, path: Path) -> MetricsFolder:
        key = str(path)
        try:
            inode = os.stat(path).st_ino
        except OSError:
            return MetricsFolder()
        cached = self._folders.get(key)
        folder = cached[1] if cached and cached[0] == inode else MetricsFolder()
        fold_from(path, folder, limit=None)
        self._folders[key] = (inode, folder)
        return folder


def fold_from(path: Path, folder: MetricsFolder, limit: int | None, keep: int = 0) -> list[Metric] | None:
    """Fold metrics.jsonl lines after ``folder.upto_offset`` into ``folder``; returns the last
    ``keep`` of them. None (nothing folded) when more than ``limit`` bytes would be read."""
    size = _file_size(path)
    if size < folder.upto_offset:  # replaced: start over
        folder.__init__()  # type: ignore[misc]
    if limit is not None and size - folder.upto_offset > limit:
        return None
    kept: list[Metric] = []
    offset = folder.upto_offset
    while True:
        lines, end = read_lines(path, offset, 4 << 20)
        if not lines:
            break
        for line in lines:
            for m in decode_lines([line.text], Metric):
                folder.add(m)
                if keep:
                    kept.append(m)
        if keep and len(kept) > 4 * keep:
            kept = kept[-keep:]
        offset = end
    folder.upto_offset = offset
    return kept[-keep:] if keep else []


def metrics_view(run_dir: Path, points: int, recent: int, cache: SummaryCache
                 ) -> tuple[MetricsSummary, list[Metric], int]:
    """(summary of the whole file, its last ``recent`` lines, the offset after them)."""
    path = run_dir / METRICS_JSONL
    saved = read_json(run_dir / METRICS_SUMMARY_JSON, MetricsSummary)
    folder = MetricsFolder(summary=saved) if saved is not None else None
    last: list[Metric] | None = None
    if folder is not None:
        last = fold_from(path, folder, CATCH_UP_BYTES, keep=recent)
    if last is None:  # no summary, or a stale one: the cache reads the file once
        folder = cache.folder(path)
        last = []
    assert folder is not None  # a summary (last) comes only with a folder
    end = folder.upto_offset
    if len(last) < recent:
        tail, _ = tail_with_offset(path, recent, recent * METRIC_LINE_BYTES)
        tail = [ln for ln in tail if ln.offset <= end]
        last = decode_lines([ln.text for ln in tail], Metric)
    return folder.summary(points), last[-recent:], end


class RunWatch:
    """One ``watch`` subscription (see the module docstring)."""

    def __init__(self, store: RunStore, args: WatchArgs, sub_id: Any, send: Send, cache: SummaryCache,
                 poll_s: float | None = None) -> None:
        self.store, self.args, self.sub_id, self.send, self.cache = store, args, sub_id, send, cache
        self.run_id = args.run
        self.dir = store.run_dir(args.run)
        self.streams = set(args.streams or WATCH_STREAMS)
        self.resume: dict[str, StreamPos] = {str(k): v for k, v in args.offsets.items()}
        self.readers: dict[str, AppendedReader] = {}  # stream -> where it is read
        self.poll_s = poll_s if poll_s is not None else POLL_S if "log" in self.streams else QUIET_POLL_S
        self.stats: dict[str, LineStats] = {}
        self.beat_files = BeatFiles(self.dir)
        self.beat_steps: dict[int, int] = {}  # rank -> the step of the last beat sent
        self.more = False  # the last poll left lines to read now
        self.polls = self.empty_polls = 0  # live polls, and those that found no line

    def _event(self, kind: str, data: Any, stream: str = "", pos: StreamPos | None = None,
               initial: bool = False) -> None:
        pos = pos or StreamPos()
        self.send(EventMsg(id=self.sub_id, event=kind, run=self.run_id, stream=stream, offset=pos.offset,
                           gen=pos.gen, initial=initial, data=data))

    def _stats(self, stream: str) -> LineStats:
        return self.stats.setdefault(stream, LineStats())

    def _reader(self, stream: str, path: Path, rotates: bool = False) -> AppendedReader:
        r = self.readers.get(stream)
        if r is None:  # a file that appeared after the backlog (a rank's first beats): from its start
            r = self.readers[stream] = AppendedReader(path, self.resume.get(stream), rotates)
        return r

    def _resumes(self, stream: str, path: Path, limit: int, rotates: bool = False) -> bool:
        """Whether ``stream`` continues exactly from the client's position: its file (or the
        generation before it, for a rotating file) holds at most ``limit`` bytes after it."""
        pos = self.resume.get(stream)
        if pos is None:
            return False
        reader = AppendedReader(path, pos, rotates)
        behind = reader.behind()
        if behind is None or behind > limit:
            return False
        self.readers[stream] = reader
        return True

    # -- the bounded first view -----------------------------------------------------------------
    def _backlog_beats(self) -> None:
        for rank, path in beat_files(self.dir).items():
            stream = heartbeat_stream(rank)
            if self._resumes(stream, path, BEATS_RESUME_BYTES, rotates=True):
                continue  # the live loop reads exactly what was missed (coalesced per rank)
            lines, pos = tail(path, 64, 64 << 10)
            beats = decode_lines([ln.text for ln in lines], Beat)
            if not beats:  # just rotated: the newest beat is the last of the previous file
                older, _ = tail(rotated_path(path), 64, 64 << 10)
                beats = decode_lines([ln.text for ln in older], Beat)
            self.readers[stream] = AppendedReader(path, pos, rotates=True)
            if beats:
                self.beat_steps[rank] = beats[-1].step
                self._event("beats", beats[-1:], stream, pos)

    def _backlog_metrics(self) -> None:
        path = self.dir / METRICS_JSONL
        if self._resumes("metrics", path, METRICS_RESUME_BYTES):
            return
        gen = position_at_end(path).gen
        summary, recent, end = metrics_view(self.dir, self.args.summary_points, self.args.recent_metrics,
                                            self.cache)
        pos = StreamPos(gen=gen, offset=end if gen else 0)
        self._event("summary", summary, "metrics", pos)
        if recent:
            self._event("metrics", recent, "metrics", pos)
        self.readers["metrics"] = AppendedReader(path, pos, rotates=False)

    def _backlog_log(self) -> None:
        path = shown_part(self.dir) / TRAIN_LOG
        want = self.args.log_tail_bytes
        if self._resumes("log", path, want):
            return
        size = _file_size(path)
        lines, pos = tail(path, 1 << 30, want)
        skipped = (lines[0].offset - len(lines[0].text.encode()) - 1) if lines else pos.offset
        if skipped > 0:
            self._event("gap", Gap(stream="log", skipped_bytes=skipped, size=size), "log")
        if lines:
            self._event("log", LogLines(lines=[ln.text for ln in lines]), "log", pos)
        self.readers["log"] = AppendedReader(path, pos, rotates=False)

    # -- live -------------------------------------------------------------------------------------
    def _poll(self) -> tuple[list[tuple[str, Any, str, StreamPos]], bool]:
        """One look at every watched file (in a worker thread: one hop per poll, whatever the
        number of files): the events to send, in order, and whether any lines came. Each
        event's position is its stream's after every line the poll consumed (coalesced beats
        too), so a client resuming from it misses nothing and repeats nothing."""
        events: list[tuple[str, Any, str, StreamPos]] = []
        found = False
        self.more = False
        if "heartbeats" in self.streams:
            for rank, path in self.beat_files.files().items():
                stream = heartbeat_stream(rank)
                reader = self._reader(stream, path, rotates=True)
                lines = reader.read()
                self.more = self.more or reader.more
                if not lines:
                    continue
                found = True
                pairs = decode_lines_raw([ln.text for ln in lines], Beat, self._stats(stream), stream)
                sent = coalesce_beats([b for b, _ in pairs], self.beat_steps.get(rank))
                if sent:
                    self.beat_steps[rank] = sent[-1].step
                    raw = {id(b): r for b, r in pairs}
                    events.append(("beats", [_as_read(b, raw[id(b)]) for b in sent], stream, reader.pos))
        # a shared run's log is this host's part's (nodes/<node>/train.log); metrics are the run's
        log = shown_part(self.dir) / TRAIN_LOG if "log" in self.streams else self.dir / TRAIN_LOG
        for stream, path in (("metrics", self.dir / METRICS_JSONL), ("log", log)):
            if stream not in self.streams:
                continue
            reader = self._reader(stream, path)
            lines = reader.read()
            self.more = self.more or reader.more
            if not lines:
                continue
            found = True
            if stream == "log":
                events.append(("log", LogLines(lines=[ln.text for ln in lines]), "log", reader.pos))
            else:
                recs = [_as_read(m, r) for m, r in
                        decode_lines_raw([ln.text for ln in lines], Metric, self._stats(stream), stream)]
                if recs:
                    events.append(("metrics", recs, stream, reader.pos))
        self.polls += 1
        self.empty_polls += not found
        return events, found

    async def run(self) -> None:
        """Status, the bounded backlog, ``synced``, then live lines and status changes."""
        current = await asyncio.to_thread(self.store.view, self.run_id)
        self._event("status", current, "status", initial=True)
        last = encode(current)
        await asyncio.to_thread(self._backlog)
        synced = False
        next_status = time.monotonic() + STATUS_EVERY_S
        while True:
            now = time.monotonic()
            fresh: RunView | None = None
            if now >= next_status:
                # the view first, the files after: every line written before an end status was
                # observed is sent before that status
                next_status = now + STATUS_EVERY_S
                try:
                    fresh = await asyncio.to_thread(self.store.view, self.run_id, True, SHARED_VIEW_S)
                except (KeyError, OSError):
                    fresh = None
            events, busy = await asyncio.to_thread(self._poll)
            for kind, data, stream, pos in events:
                self._event(kind, data, stream, pos)
            ending = False
            if fresh is not None:
                current = fresh
                if busy and fresh.status.is_terminal():
                    next_status = 0.0  # an end status goes out after the lines, never before them
                    ending = True
                elif encode(fresh) != last:
                    last = encode(fresh)
                    self._event("status", fresh, "status", initial=not synced)
            if not synced and not busy:
                synced = True
                bad = {k: s.bad for k, s in self.stats.items() if s.bad}
                offsets = {k: r.pos for k, r in self.readers.items()}
                self._event("synced", Synced(ts=time.time(), offsets=offsets, bad_lines=bad), "synced")
                if current.status.is_terminal():
                    # subscribed to a run that had already ended: its end, again, after the backlog
                    self._event("status", current, "status", initial=False)
            # at once again while a read was cut at its chunk, the backlog is not yet in, or an
            # end status waits for a poll that finds nothing; else one poll per interval
            again = self.more or (busy and (not synced or ending))
            await asyncio.sleep(0 if again else self.poll_s)

    def _backlog(self) -> None:
        if "heartbeats" in self.streams:
            self._backlog_beats()
        if "metrics" in self.streams:
            self._backlog_metrics()
        if "log" in self.streams:
            self._backlog_log()
