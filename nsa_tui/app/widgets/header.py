"""Header: hosts and their connection state, the selected run's status, phase and progress."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from nsa_tui.app.state import HostState, PanelState, RunState
from nsa_tui.fmt import NA, fmt_count, fmt_duration

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
    if conn in ("reconnecting", "lost") and host.detail:
        t.append(f" ({host.detail.splitlines()[0][:60]})", style="dim")  # why: not a bare "reconnecting"
    return t


def run_progress(run: RunState, now: float) -> Text:
    """Run name, status, phase (and for how long), step/total, elapsed, ETA, tokens."""
    t = Text()
    t.append(run.name, style="bold")
    t.append("  ")
    status = run.status.value
    t.append(status, style=STATUS_STYLE.get(status, ""))
    phase, since = run.phase()
    info = run.view.info if run.view is not None else None
    exited = run.view.exit if run.view is not None else None
    t.append(" · ")
    if run.alive and phase:
        age = fmt_duration(now - since) if since else NA
        t.append(f"{phase}", style="bold magenta")
        t.append(f" {age}")
    elif not run.alive and ((info and info.exit_reason) or (exited and exited.exit_code is not None)):
        reason = (info.exit_reason if info else None) or f"exit code {exited.exit_code if exited else NA}"
        t.append(reason.splitlines()[0][:60], style="red" if status in ("failed", "crashed") else "")
    else:
        t.append(phase or NA, style="dim")
    step = run.step
    total = info.total_steps if info else None
    t.append(f" · step {step}/{total if total is not None else NA}")
    started = info.started_at if info else None
    ended = info.ended_at if info else None
    elapsed = ((ended or now) - started) if started else None
    t.append(f" · {fmt_duration(elapsed)} elapsed")
    eta = None
    m = run.metrics.last_train
    if run.alive and total is not None and m is not None and m.step_time_s is not None:
        eta = m.step_time_s * max(0, total - step)
    t.append(f" · ETA {fmt_duration(eta)}")
    tokens = max(info.tokens if info else 0, (m.tokens or 0) if m else 0)
    t.append(f" · {fmt_count(tokens, 'tok')}" if tokens else " · tokens N/A")
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
