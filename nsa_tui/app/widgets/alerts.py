"""Alerts: newest first, each with its evidence and what to do about it."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from nsa_tui.app.fmt import NA, fmt_duration, is_num
from nsa_tui.app.state import PanelState, alert_key

ACTION_KEYS = {"dump": "d", "kill": "k", "fallback": "f", "resume": "r", "logs": "t"}
SEVERITY_STYLE = {"critical": "bold white on red", "error": "bold red", "warning": "bold yellow",
                  "info": "bold cyan"}


def alert_text(alert: Any, log_lines: int = 3) -> Text:
    """One alert as a few lines: headline, evidence, log tail, suggested actions."""
    g = lambda name: getattr(alert, name, None)  # noqa: E731 - Alert comes from nsa_tui.alerts
    sev = str(g("severity") or "warning")
    t = Text()
    t.append(f" {sev.upper()} ", style=SEVERITY_STYLE.get(sev, "bold"))
    t.append(f" {g('kind') or 'alert'}", style="bold")
    t.append(f"  {g('message') or ''}\n")
    ev = [f"run {g('run') or NA}"]
    if g("rank") is not None:
        ev.append(f"rank {g('rank')}")
    if g("gpu") is not None:
        ev.append(f"gpu {g('gpu')}")
    ev.append(f"phase {g('phase') or NA}")
    ev.append(f"last step {g('last_step') if g('last_step') is not None else NA}")
    age = g("heartbeat_age_s")
    ev.append(f"heartbeat age {fmt_duration(age) if is_num(age) else NA}")
    t.append("   " + " · ".join(ev) + "\n", style="dim")
    for line in list(g("log_tail") or [])[-log_lines:]:
        t.append(f"   │ {line}\n", style="red" if "Error" in line or "Traceback" in line else "dim")
    actions = g("suggested_actions") or []
    if actions:
        said = [f"{ACTION_KEYS[a]}: {a}" if a in ACTION_KEYS else str(a) for a in actions]
        t.append("   → " + " · ".join(said) + "\n", style="cyan")
    return t


class AlertsPane(Static):
    """Open alerts of every host; `a` acknowledges the newest one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._signature: tuple = ()

    def update_from(self, state: PanelState, now: float) -> None:
        open_alerts = state.open_alerts()
        signature: tuple = tuple((alert_key(a), round(getattr(a, "heartbeat_age_s", None) or 0))
                                 for a in open_alerts)
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
