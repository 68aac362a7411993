"""The host-wide subscriptions: the list of runs, host samples, the recorded alerts.

Each sends the whole list first, then a change as it happens: ``run`` for a run whose view
changed (a cheap stamp of its state files says when to look), ``run_removed``, a host sample
per interval, an ``alert`` per changed alert. One run's own streams are watch.py's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from nsa.contract import (
    RunView,
    encode,
)
from nsa.contract.protocol import EventMsg, RunRemoved, RunsList
from nsa.contract.replies import AlertList
from nsa.contract.rundir import (
    NODE_FILES,
    STATE_FILES,
)
from nsa_tui.agent.owners import shown_part
from nsa_tui.agent.runs import RunStore
from nsa_tui.agent.watch import SHARED_VIEW_S

RUNS_EVERY_S = 1.0
ALERTS_EVERY_S = 0.5

Send = Callable[[EventMsg], None]


async def watch_runs(store: RunStore, sub_id: Any, send: Send, every_s: float = RUNS_EVERY_S) -> None:
    """The list of runs, then a ``run`` event whenever one's view changes (a new run, a status,
    a step written to run.json) and ``run_removed`` when its directory goes. Ended runs are
    re-read only when one of their files changes."""
    known: dict[str, tuple[bytes, bool]] = {}  # run id -> (its encoded view, ended)
    stamps: dict[str, tuple[float, ...]] = {}
    first = True
    while True:
        views = await asyncio.to_thread(_changed_views, store, known, stamps)
        if first:
            send(EventMsg(id=sub_id, event="runs", stream="runs", data=RunsList(runs=views[0])))
            first = False
        else:
            for v in views[0]:
                send(EventMsg(id=sub_id, event="run", run=v.run_id, stream="runs", data=v))
        for rid in views[1]:
            send(EventMsg(id=sub_id, event="run_removed", run=rid, stream="runs",
                          data=RunRemoved(run_id=rid)))
        await asyncio.sleep(every_s)


def _stamp(d: Path) -> tuple[float, ...]:
    out = []
    part = shown_part(d)  # a shared run's per-node files (launch, exit, stop) are this host's part's
    for name in STATE_FILES:
        try:
            out.append(os.stat((part if name in NODE_FILES else d) / name).st_mtime)
        except OSError:
            out.append(0.0)
    return tuple(out)


def _without_ages(view: RunView) -> RunView:
    if not view.owners:
        return view
    return msgspec.structs.replace(view, owners=[msgspec.structs.replace(o, age_s=None) for o in view.owners])


def _changed_views(store: RunStore, known: dict[str, tuple[bytes, bool]],
                   stamps: dict[str, tuple[float, ...]]) -> tuple[list[RunView], list[str]]:
    """(views that changed since the last call, ids that disappeared); updates ``known``."""
    ids = store.ids()
    changed: list[RunView] = []
    for rid in ids:
        d = store.root / rid
        stamp = _stamp(d)
        if rid in known and stamps.get(rid) == stamp and known[rid][1]:
            continue  # an ended run changes only through its files
        try:
            view = store.view(rid, with_tail=False, max_age_s=SHARED_VIEW_S)
        except (KeyError, OSError):
            continue
        data = encode(_without_ages(view))  # an owner's lease age changes every look: no change
        stamps[rid] = stamp
        if rid not in known or known[rid][0] != data:
            changed.append(view)
        known[rid] = (data, view.status.is_terminal())
    gone = [rid for rid in known if rid not in set(ids)]
    for rid in gone:
        known.pop(rid, None)
        stamps.pop(rid, None)
    return changed, gone


async def watch_host(sampler: Any, sub_id: Any, send: Send, interval_s: float = 1.0) -> None:
    """One host sample per interval; ``offset`` counts samples of this subscription."""
    seq = 0
    while True:
        seq += 1
        sample = await asyncio.to_thread(sampler.sample)
        send(EventMsg(id=sub_id, event="host", stream="host", offset=seq, data=sample))
        await asyncio.sleep(interval_s)


async def watch_alerts(store: RunStore, books: Any, sub_id: Any, send: Send, history: int = 100,
                       run: str | None = None, every_s: float = ALERTS_EVERY_S) -> None:
    """Every run's alerts (or one run's): an ``alerts`` event with each unresolved alert and the
    newest ``history`` resolved ones per run, then an ``alert`` event for every change of a
    run's alerts.jsonl (new runs included). A stat per run per poll; only new bytes are read."""
    from nsa_tui.health.ledger import bounded

    def first() -> AlertList:
        states = []
        ids = [run] if run else store.ids()
        for rid in ids:
            try:
                book = books.book(shown_part(store.run_dir(rid)))
            except KeyError:
                continue
            book.refresh()
            states += book.listing(history)
        return AlertList(alerts=bounded(states, history * max(1, len(ids))))

    def changes() -> list[Any]:
        out = []
        ids = [run] if run else store.ids()
        for rid in ids:
            try:
                out += books.refresh(shown_part(store.run_dir(rid)))
            except KeyError:
                continue
        if run is None:
            books.forget({str(shown_part(store.root / rid)) for rid in ids})
        return out

    send(EventMsg(id=sub_id, event="alerts", stream="alerts", data=await asyncio.to_thread(first)))
    while True:
        await asyncio.sleep(every_s)
        for st in await asyncio.to_thread(changes):
            send(EventMsg(id=sub_id, event="alert", run=st.run, stream="alerts", data=st))
