"""The panel's own alert detector for one host, for what the host does not record itself.

Runs launched through the agent have a watchdog on the host that records their alerts
(alerts.jsonl; the panel receives them through ``watch_alerts``): the panel shows those and
detects nothing of its own for them. It still detects, with the same rules, for runs that
have no watchdog (``RunView.watchdog`` false: started by hand with nsa-train, or whose
supervisor was killed), and the host-level disk alert when no run of the host has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from nsa_tui.app import reducer
from nsa_tui.app.state import PanelState
from nsa_tui.health.alerts import AlertDetector, Thresholds
from nsa_tui.hosts.client import Event

CHECK_S = 1.0


class AlertChecker:
    def __init__(self, state: PanelState, dest: str, thresholds: Thresholds | None = None,
                 log_error: Any = None) -> None:
        self.state = state
        self.dest = dest
        self.detector = AlertDetector(dest, thresholds)
        self.log_error = log_error or (lambda msg: None)

    def feed(self, ev: Event) -> None:
        with contextlib.suppress(Exception):  # a detector bug must not take the panel down
            self.detector.feed(ev)

    def link_down(self) -> None:
        """No heartbeat arrives while the link is down: that silence is the network's, not the
        ranks'. Liveness rules wait until each watch's resubscription has synced again."""
        for known in self.detector.runs.values():
            known.backfilling = True

    def check_now(self) -> None:
        host = self.state.host(self.dest)
        if host.runs_loaded:  # a run gone from the host's list (deleted): its rules no longer hold
            for rid in [r for r in self.detector.runs if r not in host.runs]:
                del self.detector.runs[rid]
        try:
            current = self.detector.check(time.time())
        except Exception as exc:  # noqa: BLE001 - a detector bug must not take the panel down
            self.log_error(f"alert check failed: {exc}")
            return
        reducer.alerts(self.state, self.dest, [a for a in current if self._ours(a)])

    def _ours(self, alert: Any) -> bool:
        """Whether the panel must say this alert itself (the host records none for it)."""
        runs = self.state.host(self.dest).runs
        if alert.run is None:
            return not any(r.view is not None and r.view.watchdog and r.alive for r in runs.values())
        run = runs.get(alert.run)
        if run is None:  # not (or not yet) in the host's list: said until the list says it is gone
            return not self.state.host(self.dest).runs_loaded
        return run.view is None or not run.view.watchdog

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            self.check_now()
