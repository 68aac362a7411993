"""Header: hosts and their connection state, the selected run's status, phase and progress."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from nsa_tui.app.fmt import NA, fmt_count, fmt_duration
from nsa_tui.app.state import HostState, PanelState, RunState

CONN_STYLE = {"connected": "bold green", "connecting": "yellow", "reconnecting": "bold yellow",
              "lost": "bold red"}
STATUS_STYLE = {"running": "bold green", "starting": "yellow", "stopping": "yellow",
                "finished": "bold cyan", "stopped": "cyan", "failed": "bold red",
                "crashed": "bold red", "lost": "bold red"}


def host_text(host: HostState, now: float) -> Text:
    """'host: connected' or 'reconnecting in 3 s' or 'lost'."""
    t = Text()
    t.append(host.label, style="bold")
    t.append(" ")
    conn = host.conn
    label = conn
    if conn == "reconnecting" and host.retry_at is not None:
        label = f"reconnecting in {max(0, round(host.retry_at - now))} s"
    t.append(label, style=CONN_STYLE.get(conn, ""))
    return t


def run_progress(run: RunState, now: float) -> Text:
    """Run name, status, phase (and for how long), step/total, elapsed, ETA, tokens."""
    rec = run.record
    t = Text()
    t.append(run.name, style="bold")
    t.append("  ")
    t.append(run.status, style=STATUS_STYLE.get(run.status, ""))
    phase, since = run.phase()
    t.append(" · ")
    if run.alive and phase:
        age = fmt_duration(now - since) if since else NA
        t.append(f"{phase}", style="bold magenta")
        t.append(f" {age}")
    elif not run.alive and (rec.get("exit_reason") or rec.get("exit_code") is not None):
        reason = rec.get("exit_reason") or f"exit code {rec.get('exit_code')}"
        t.append(str(reason)[:40], style="red" if run.status in ("failed", "crashed") else "")
    else:
        t.append(phase or NA, style="dim")
    step, total = rec.get("step"), rec.get("total_steps")
    t.append(f" · step {step if step is not None else NA}/{total if total is not None else NA}")
    started = rec.get("started_at")
    ended = rec.get("ended_at")
    elapsed = ((ended or now) - started) if started else None
    t.append(f" · {fmt_duration(elapsed)} elapsed")
    eta = None
    step_time = run.last_metric.get("step_time_s")
    if run.alive and isinstance(step, int) and isinstance(total, int) and isinstance(step_time, (int, float)):
        eta = step_time * max(0, total - step)
    t.append(f" · ETA {fmt_duration(eta)}")
    tokens = rec.get("tokens")
    t.append(f" · {fmt_count(tokens, 'tok')}" if tokens is not None else " · tokens N/A")
    return t


class PanelHeader(Static):
    """Two lines: the hosts, then the selected run."""

    DEFAULT_CSS = """
    PanelHeader { height: 2; background: $panel; color: $foreground; padding: 0 1; }
    """

    _last = ""

    def update_from(self, state: PanelState, now: float) -> None:
        line1 = Text("nsa-tui ", style="bold")
        for i, host in enumerate(state.hosts.values()):
            if i:
                line1.append(" │ ", style="dim")
            selected = state.selected is not None and state.selected[0] == host.dest
            line1.append("▸" if selected and len(state.hosts) > 1 else " ")
            line1.append_text(host_text(host, now))
        run = state.selected_run()
        line2 = run_progress(run, now) if run else Text("no run selected — press l to launch one",
                                                           style="dim")
        text = Text("\n").join([line1, line2])
        if text.plain != self._last:  # redraw only on change: the timer runs 10x/s
            self._last = text.plain
            self.update(text, layout=False)  # fixed height: no re-layout
