"""One host's alert detector, fed with its events, checked every second into the state."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from nsa_tui.alerts import AlertDetector, Thresholds
from nsa_tui.app import reducer
from nsa_tui.app.state import PanelState
from nsa_tui.client import Event

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
        try:
            current = self.detector.check(time.time())
        except Exception as exc:  # noqa: BLE001 - a detector bug must not take the panel down
            self.log_error(f"alert check failed: {exc}")
            return
        reducer.alerts(self.state, self.dest, current)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            self.check_now()
