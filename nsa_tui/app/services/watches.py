"""Which runs of a host are watched, in which detail, and the tasks that watch them.

The focused (selected) run is watched in full (log included); every other alive run for
its status, beats and metrics (what the alerts need); the focused run's ancestors and the
runs marked for comparison once, for their charts. A watch of a run that ended stops by
itself after the agent delivered the end status (which comes after every line the run
wrote), so a run's end is never lost to the run list noticing it first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from nsa.contract.requests import WatchStream
from nsa_tui.app import reducer
from nsa_tui.app.state import HostState
from nsa_tui.hosts.client import AgentError, Event, HostClient

ANCESTORS = 3
MODES: dict[str, list[WatchStream] | None] = {"full": None, "alerts": ["status", "heartbeats", "metrics"],
                                      "chart": ["status", "metrics"]}


def plan_watches(host: HostState, focused: str | None, marked: Iterable[str] = ()) -> dict[str, str]:
    """run id -> mode (see the module docstring). Pure."""
    wanted: dict[str, str] = {r.run_id: "alerts" for r in host.runs.values() if r.alive}
    for run_id in marked:  # compared runs need their metrics once (alive ones stream them anyway)
        run = host.runs.get(run_id)
        if run is not None and run_id not in wanted and not run.synced:
            wanted[run_id] = "chart"
    if focused and focused in host.runs:  # a deleted run is not watched again
        wanted[focused] = "full"
        run = host.runs.get(focused)
        for _ in range(ANCESTORS):
            parent = run.parent_run if run else None
            if not parent or parent in wanted:
                break
            run = host.runs.get(parent)
            if run is not None and not run.synced:
                wanted[parent] = "chart"
    return wanted


class WatchManager:
    """Runs one watch task per wanted run; every event goes to ``on_event``."""

    def __init__(self, host: HostState, client: HostClient, on_event: Callable[[Event], None],
                 on_ended: Callable[[str, str], None]) -> None:
        self.host = host
        self.client = client
        self.on_event = on_event
        self.on_ended = on_ended  # (run id, mode) when a watch stopped
        self.tasks: dict[str, tuple[asyncio.Task[None], str]] = {}

    def ensure(self, focused: str | None, marked: Iterable[str] = ()) -> None:
        """Start, stop or change watches to match the plan."""
        wanted = plan_watches(self.host, focused, marked)
        for run_id, (task, mode) in list(self.tasks.items()):
            want = wanted.get(run_id)
            if task.done() or (want is not None and want != mode) or run_id not in self.host.runs or (
                    want is None and mode != "alerts"):
                task.cancel()
                del self.tasks[run_id]
                self.on_ended(run_id, mode)
            # a run no longer alive keeps its "alerts" watch until the watch sees the end itself
        loop = asyncio.get_running_loop()
        for run_id, mode in wanted.items():
            if run_id not in self.tasks:
                self.tasks[run_id] = (loop.create_task(self._watch(run_id, mode)), mode)

    def stop(self) -> None:
        for task, _mode in self.tasks.values():
            task.cancel()
        self.tasks.clear()

    async def _watch(self, run_id: str, mode: str) -> None:
        run = self.host.runs.get(run_id)
        if run is None:  # gone (deleted) since the plan was made
            return
        n = 0
        try:
            async for ev in self.client.watch(run_id, offsets=dict(run.offsets), streams=MODES[mode]):
                self.on_event(ev)
                n += 1
                if n % 256 == 0:
                    await asyncio.sleep(0)  # a backlog must not starve the UI
                if mode == "chart" and ev.kind == "synced":
                    return
                ended = ev.kind == "status" and not ev.initial and ev.data.status.is_terminal()
                if mode == "alerts" and ended:
                    return
        except AgentError as exc:
            if exc.code not in ("closed", "lost", "disconnected"):
                reducer.note(run, f"[nsa-tui] watch of {run_id} ended: {exc}")
