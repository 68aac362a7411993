"""One host: its connection, run list and samples flowing into the state, its watches, alerts
and actions. Everything runs as tasks on the app's event loop; events only go through the
reducer (cheap appends), the app's 10 Hz timer draws. A dead host costs nothing but a
"reconnecting" label with the reason.

This module knows no screen: what needs the UI (a host-key question, a toast) is a message
posted to the app (app/messages.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from textual.message import Message

from nsa.contract.protocol import RunRemoved, RunsList
from nsa.contract.replies import AlertList, AlertState
from nsa_tui.app import reducer
from nsa_tui.app.messages import AskHostKey, Toast
from nsa_tui.app.services.actions import HostActions
from nsa_tui.app.services.alerting import AlertChecker
from nsa_tui.app.services.watches import WatchManager
from nsa_tui.app.state import PanelState
from nsa_tui.health.thresholds import Thresholds
from nsa_tui.hosts.client import AgentError, ConnectionState, Event, HostClient
from nsa_tui.hosts.spec import split_runs_root
from nsa_tui.transport.ssh import SshTransport


class HostService:
    """Owns the HostClient of one destination."""

    def __init__(self, state: PanelState, dest: str, post: Callable[[Message], Any],
                 client: HostClient | None = None, thresholds: Thresholds | None = None,
                 log_error: Callable[[str], None] | None = None, runs_root: str | None = None) -> None:
        self.state = state
        self.dest = dest
        self.runs_root = runs_root  # the host's own (a spec's ``:/path`` or the settings'), else the agent's
        self.host = state.host(dest)
        self.post = post
        self.client = client
        self.focused: str | None = None
        self.alerts = AlertChecker(state, dest, thresholds, log_error)
        self.actions = HostActions(state, dest, lambda: self.client)
        self.watches: WatchManager | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._stopped = False

    # -- life cycle -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Connect (retrying what a retry can fix), then keep the streams flowing until stopped."""
        if self.client is None:
            self.client = HostClient(split_runs_root(self.dest)[0], runs_root=self.runs_root,
                                     on_state=self._on_state, confirm_host_key=self._ask_host_key)
        else:
            self.client.on_state = self._on_state
            transport = self.client.transport
            if isinstance(transport, SshTransport) and transport.confirm_host_key is None:
                transport.confirm_host_key = self._ask_host_key
        try:
            await self.client.start(retry=True)
        except Exception as exc:  # a fatal error: changed host key, no agent, refused keys
            reducer.connection(self.state, self.dest, ConnectionState("lost", None, str(exc)), time.time())
            self.post(Toast(str(exc), title=f"cannot connect to {self.dest}", severity="error", timeout=30))
            return
        reducer.hello(self.state, self.dest, self.client.hello)
        self.watches = WatchManager(self.host, self.client, self._on_watch_event, self._watch_ended)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._runs()), loop.create_task(self._samples()),
                       loop.create_task(self._recorded_alerts()), loop.create_task(self.alerts.run())]
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Close the connection; runs keep running on the host."""
        self._stopped = True
        if self.watches is not None:
            self.watches.stop()
        for task in self._tasks:
            task.cancel()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.close(), 5)

    async def _ask_host_key(self, host: str, fingerprint: str) -> bool:
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.post(AskHostKey(host, fingerprint, answer))
        return await answer

    def _on_state(self, st: ConnectionState) -> None:
        reducer.connection(self.state, self.dest, st, time.time())
        if st.status == "connected" and self.client is not None:
            reducer.hello(self.state, self.dest, self.client.hello)
        elif st.status != "connected":
            self.alerts.link_down()

    # -- streams --------------------------------------------------------------------------------
    async def _runs(self) -> None:
        """The agent pushes the run list and every change of it: the panel's one source for it."""
        assert self.client is not None
        while not self._stopped:
            try:
                async for ev in self.client.watch_runs():
                    if ev.kind == "runs" and isinstance(ev.data, RunsList):
                        reducer.runs_list(self.state, self.dest, ev.data)
                    elif ev.kind == "run":
                        reducer.run_view(self.state, self.dest, ev.data)
                    elif ev.kind == "run_removed" and isinstance(ev.data, RunRemoved):
                        reducer.run_removed(self.state, self.dest, ev.data.run_id)
                    self._ensure_watches()
            except AgentError:
                await asyncio.sleep(1.0)

    async def _recorded_alerts(self) -> None:
        """The host's recorded alerts of every run (no run needs to be selected or watched)."""
        assert self.client is not None
        first = True
        while not self._stopped:
            try:
                async for ev in self.client.watch_alerts():
                    if ev.kind == "alerts" and isinstance(ev.data, AlertList):
                        n, still = reducer.recorded_alerts(self.state, self.dest, ev.data)
                        if first and n:
                            text = (f"{n} alert(s) recorded on {self.host.label}, {still} still open: "
                                    "see the alerts pane")
                            self.post(Toast(text, title="alerts", timeout=10))
                        first = False
                    elif ev.kind == "alert" and isinstance(ev.data, AlertState):
                        reducer.recorded_alert(self.state, self.dest, ev.data)
            except AgentError as exc:
                if exc.code == "unknown_op":
                    return  # an older agent: the panel's own detector is all there is
                await asyncio.sleep(1.0)

    async def _samples(self) -> None:
        assert self.client is not None
        while not self._stopped:
            try:
                async for ev in self.client.host_events():
                    reducer.host_sample(self.state, self.dest, ev.data)
                    self.alerts.feed(ev)
            except AgentError:
                await asyncio.sleep(1.0)

    def _on_watch_event(self, ev: Event) -> None:
        reducer.watch_event(self.state, self.dest, ev)
        self.alerts.feed(ev)

    def _watch_ended(self, run_id: str, mode: str) -> None:
        run = self.host.runs.get(run_id)
        if run is not None and mode == "full":
            reducer.forget_log(run)

    def focus(self, run_id: str | None) -> None:
        """Stream ``run_id`` in full (log included); None: this host has no selected run."""
        self.focused = run_id
        self._ensure_watches()

    def _ensure_watches(self) -> None:
        if self.watches is not None and self.host.conn == "connected":
            marked = [rid for host, rid in self.state.view.marks if host == self.dest]
            self.watches.ensure(self.focused, marked)
