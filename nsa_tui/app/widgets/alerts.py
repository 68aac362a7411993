"""Alerts: open ones first (newest first), then acknowledged ones, then the resolved history.

Most come from the hosts (alerts.jsonl, recorded by each run's watchdog whether or not a
panel was open): a panel opened in the morning lists the night's alerts with their times.
The pane takes the focus (tab): ↑/↓ choose an alert, ``a`` acknowledges it, ``d`` shows the
evidence captured for it.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.text import Text
from textual.binding import Binding
from textual.widgets import Static

from nsa.contract import Alert
from nsa_tui.app.state import PanelState, ShownAlert
from nsa_tui.fmt import NA, fmt_duration, is_num

ACTION_KEYS = {"dump": "d", "kill": "k", "fallback": "f", "resume": "r", "logs": "t"}
SEVERITY_STYLE = {"critical": "bold white on red", "error": "bold red", "warning": "bold yellow",
                  "info": "bold cyan"}
STATE_STYLE = {"open": "bold", "acknowledged": "dim", "resolved": "dim green"}


def _clock(ts: float | None, now: float) -> str:
    """When, in local time: the time of day within the last day, else the date too."""
    if not ts:
        return ""
    return time.strftime("%H:%M:%S" if now - ts < 86_400 else "%m-%d %H:%M", time.localtime(ts))


def alert_text(alert: Alert, log_lines: int = 3, item: ShownAlert | None = None,
               selected: bool = False, now: float = 0.0) -> Text:
    """One alert as a few lines: headline, evidence, log tail, suggested actions (all plain
    text: a run name or log line from a host is never markup)."""
    t = Text()
    state = item.state if item is not None else "open"
    if selected:
        t.append("▶", style="bold reverse")
    t.append(f" {alert.severity.upper()} ", style=SEVERITY_STYLE.get(alert.severity, "bold")
             if state == "open" else "dim")
    t.append(f" {alert.kind}", style="bold" if state == "open" else "dim")
    if item is not None and item.raised_at:
        t.append(f"  {_clock(item.raised_at, now)}", style="dim")
    if state != "open":
        done = f" {_clock(item.resolved_at, now)}" if item is not None and item.resolved_at else ""
        t.append(f"  [{state}{done}]", style=STATE_STYLE.get(state, ""))
    t.append(f"  {alert.message}\n", style="" if state == "open" else "dim")
    if state == "resolved":
        return t
    ev = [f"run {alert.run or NA}"]
    if item is not None and item.id:
        ev.append(f"id {item.id}")
    if alert.rank is not None:
        ev.append(f"rank {alert.rank}")
    if alert.gpu is not None:
        ev.append(f"gpu {alert.gpu}")
    ev.append(f"phase {alert.phase or NA}")
    ev.append(f"last step {alert.last_step if alert.last_step is not None else NA}")
    age = alert.heartbeat_age_s
    ev.append(f"heartbeat age {fmt_duration(age) if is_num(age) else NA}")
    t.append("   " + " · ".join(ev) + "\n", style="dim")
    for line in alert.log_tail[-log_lines:]:
        t.append(f"   │ {line}\n", style="red" if "Error" in line or "Traceback" in line else "dim")
    actions = [a for a in alert.suggested_actions if not (alert.evidence and a == "dump")]
    said = [f"{ACTION_KEYS[a]}: {a}" if a in ACTION_KEYS else a for a in actions]
    if alert.evidence:  # what `d` shows on this alert (a fresh dump is `d` in the run list)
        said.insert(0, f"d: evidence ({len(alert.evidence)} files)")
    if said:
        t.append("   → " + " · ".join(said) + "\n", style="cyan")
    return t


class AlertsPane(Static, can_focus=True):
    """Every host's alerts; with the focus, ↑/↓ choose one for ``a`` and ``d``."""

    BINDINGS = [Binding("up", "move(-1)", "previous alert", show=False),
                Binding("down", "move(1)", "next alert", show=False)]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._signature: tuple = ()
        self.items: list[ShownAlert] = []
        self.cursor = 0

    def selected(self) -> ShownAlert | None:
        """The alert under the cursor while the pane has the focus, else None."""
        if not self.has_focus or not self.items:
            return None
        return self.items[min(self.cursor, len(self.items) - 1)]

    def action_move(self, delta: int) -> None:
        if self.items:
            self.cursor = max(0, min(len(self.items) - 1, self.cursor + delta))
            self._signature = ()

    def on_focus(self) -> None:
        self._signature = ()

    def on_blur(self) -> None:
        self._signature = ()

    def update_from(self, state: PanelState, now: float) -> None:
        items = state.shown_alerts()
        focus = self.has_focus
        self.cursor = min(self.cursor, max(0, len(items) - 1))
        signature: tuple = tuple((s.key, s.state, round(s.alert.heartbeat_age_s or 0), len(s.alert.evidence))
                                 for s in items)
        signature += (focus, self.cursor)
        if signature == self._signature:
            return
        self._signature = signature
        self.items = items
        n_open = sum(1 for s in items if s.state == "open")
        if not items:
            self.update(Text("No alerts.", style="dim green"))
            self.border_title = "alerts"
            return
        keys = "↑↓ a: acknowledge · d: evidence" if focus else "a: acknowledge · tab: choose"
        self.border_title = f"alerts ({n_open} open) — {keys}"
        if n_open == 0:
            head = [Text("No open alerts.", style="dim green")]
        else:
            head = []
        self.update(Group(*head, *(alert_text(s.alert, item=s, selected=focus and i == self.cursor, now=now)
                                   for i, s in enumerate(items))))
