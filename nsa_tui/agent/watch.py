"""The ``watch`` stream of one run: file lines with offsets, then status changes.

Streams: ``metrics`` (metrics.jsonl), ``log`` (train.log) and ``heartbeats/rank-R``
(heartbeats/rank-R.jsonl). Each event's offset is the byte offset just after its
line, so a client resumes with the offsets it last saw and misses nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsa_tui.agent.runs import RunStore
from nsa_tui.agent.tail import read_lines

POLL_S = 0.25
FINAL = ("finished", "failed", "stopped", "crashed", "lost")
STATUS_EVERY_S = 1.0
STATUS_KEYS = ("status", "trainer_status", "step", "alive", "exit_code", "exit_reason", "pids", "updated_at")

Send = Callable[[dict[str, Any]], None]


def stream_files(run_dir: Path) -> dict[str, Path]:
    """Stream name -> file, including heartbeat files of ranks that appeared so far."""
    files = {"metrics": run_dir / "metrics.jsonl", "log": run_dir / "train.log"}
    try:
        for e in os.scandir(run_dir / "heartbeats"):
            if e.name.startswith("rank-") and e.name.endswith(".jsonl"):
                files[f"heartbeats/{e.name[:-6]}"] = Path(e.path)
    except OSError:
        pass
    return files


def _parse(stream: str, text: str) -> tuple[str, dict[str, Any]]:
    if stream == "log":
        return "log", {"line": text}
    try:
        data = json.loads(text)
    except ValueError:
        data = {"raw": text}
    if not isinstance(data, dict):
        data = {"raw": text}
    return ("metric" if stream == "metrics" else "heartbeat"), data


def _status_key(rec: dict[str, Any]) -> tuple[str, ...]:
    return tuple(json.dumps(rec.get(k), sort_keys=True) for k in STATUS_KEYS)


def _status_event(sub_id: Any, run_id: str, rec: dict[str, Any], initial: bool) -> dict[str, Any]:
    return {"id": sub_id, "event": "status", "run": run_id, "stream": "status", "offset": 0,
            "data": {**rec, "ts": time.time(), "initial": initial}}


async def watch_run(
    store: RunStore, run_id: str, sub_id: Any, send: Send, offsets: dict[str, int],
    streams: list[str] | None = None, poll_s: float = POLL_S,
) -> None:
    """Send backfill from ``offsets``, a ``synced`` marker, then live lines and status."""
    run_dir = store.run_dir(run_id)
    offsets = {str(k): int(v) for k, v in (offsets or {}).items()}
    wanted = set(streams) if streams else None
    last_status: tuple[Any, ...] | None = None
    next_status = 0.0
    synced = False
    while True:
        busy = False
        rec = None
        now = time.monotonic()
        if now >= next_status or not synced:
            # the record first, the files after: every line written before a final status
            # was observed is sent before that status
            next_status = now + STATUS_EVERY_S
            try:
                rec = await asyncio.to_thread(store.record, run_id)
            except (KeyError, OSError):
                rec = {"run_id": run_id, "status": "missing"}
            if last_status is None:  # the subscription's first status goes before its backlog
                last_status = _status_key(rec)
                send(_status_event(sub_id, run_id, rec, initial=True))
        for name, path in stream_files(run_dir).items():
            if wanted is not None and name not in wanted and not (
                name.startswith("heartbeats/") and "heartbeats" in wanted
            ):
                continue
            lines, offsets[name] = await asyncio.to_thread(read_lines, str(path), offsets.get(name, 0))
            for line in lines:
                kind, data = _parse(name, line.text)
                send({"id": sub_id, "event": kind, "run": run_id, "stream": name, "offset": line.offset,
                      "data": data})
            busy = busy or len(lines) > 0
        if rec is not None and busy and rec.get("status") in FINAL:
            next_status = 0.0  # a final status goes out after the backlog, never before it
        elif rec is not None:
            key = _status_key(rec)
            if key != last_status:
                last_status = key
                send(_status_event(sub_id, run_id, rec, initial=not synced))
        if not synced and not busy:
            synced = True
            send({"id": sub_id, "event": "synced", "run": run_id, "stream": "synced", "offset": 0,
                  "data": {"ts": time.time(), "offsets": dict(offsets)}})
            if rec is not None and rec.get("status") in FINAL:
                # subscribed to a run that had already ended: its end, again, after the backlog
                send(_status_event(sub_id, run_id, rec, initial=False))
        if not busy:
            await asyncio.sleep(poll_s)
        else:
            await asyncio.sleep(0)


async def watch_host(sampler: Any, sub_id: Any, send: Send, interval_s: float = 1.0) -> None:
    """One host sample per interval; ``offset`` counts samples of this subscription."""
    seq = 0
    while True:
        seq += 1
        sample = await asyncio.to_thread(sampler.sample)
        send({"id": sub_id, "event": "host", "run": None, "stream": "host", "offset": seq, "data": sample})
        await asyncio.sleep(interval_s)
