"""Alerts: newest first, each with its evidence and what to do about it."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from nsa.contract import Alert
from nsa_tui.app.state import PanelState
from nsa_tui.fmt import NA, fmt_duration, is_num

ACTION_KEYS = {"dump": "d", "kill": "k", "fallback": "f", "resume": "r", "logs": "t"}
SEVERITY_STYLE = {"critical": "bold white on red", "error": "bold red", "warning": "bold yellow",
                  "info": "bold cyan"}


def alert_text(alert: Alert, log_lines: int = 3) -> Text:
    """One alert as a few lines: headline, evidence, log tail, suggested actions (all plain
    text: a run name or log line from a host is never markup)."""
    t = Text()
    t.append(f" {alert.severity.upper()} ", style=SEVERITY_STYLE.get(alert.severity, "bold"))
    t.append(f" {alert.kind}", style="bold")
    t.append(f"  {alert.message}\n")
    ev = [f"run {alert.run or NA}"]
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
    if alert.suggested_actions:
        said = [f"{ACTION_KEYS[a]}: {a}" if a in ACTION_KEYS else a for a in alert.suggested_actions]
        t.append("   → " + " · ".join(said) + "\n", style="cyan")
    return t


class AlertsPane(Static):
    """Open alerts of every host; `a` acknowledges the newest one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._signature: tuple = ()

    def update_from(self, state: PanelState, now: float) -> None:
        open_alerts = state.open_alerts()
        signature: tuple = tuple((a.key, round(a.heartbeat_age_s or 0)) for a in open_alerts)
        signature += (len(state.acked),)
        if signature == self._signature:
            return
        self._signature = signature
        if not open_alerts:
            acked = f" ({len(state.acked)} acknowledged)" if state.acked else ""
            self.update(Text(f"No alerts{acked}.", style="dim green"))
            self.border_title = "alerts"
            return
        self.border_title = f"alerts ({len(open_alerts)}) — a: acknowledge"
        self.update(Group(*(alert_text(a) for a in open_alerts)))
