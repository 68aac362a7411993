"""Header: hosts and their connection state, the selected run's status, phase and progress."""

from __future__ import annotations

import weakref

from rich.text import Text
from textual.widgets import Static

from nsa.contract import FAILED_STATUSES, UNHEALTHY_STATUSES, RunStatus, TrainMetric
from nsa_tui.app.runmetrics import RunMetrics
from nsa_tui.app.state import HostState, PanelState, RunState
from nsa_tui.fmt import NA, fmt_count, fmt_duration

CONN_STYLE = {"connected": "bold green", "connecting": "yellow", "reconnecting": "bold yellow",
              "lost": "bold red"}
STATUS_STYLE = {RunStatus.RUNNING.value: "bold green", RunStatus.STARTING.value: "yellow",
                RunStatus.QUEUED.value: "magenta",
                RunStatus.STOPPING.value: "yellow", RunStatus.FINISHED.value: "bold cyan",
                RunStatus.STOPPED.value: "cyan", **{s.value: "bold red" for s in UNHEALTHY_STATUSES}}


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
        t.append(f" ({clip_words(why_not_connected(host), 60)})", style="dim")  # not a bare "reconnecting"
    return t


def why_not_connected(host: HostState) -> str:
    """The first line of the host's last connection error, without the host's name in front
    (wherever it is shown, the host is named already)."""
    detail = host.detail.splitlines()[0] if host.detail else ""
    for prefix in (f"{host.dest}: ", f"{host.label}: "):
        detail = detail.removeprefix(prefix)
    return detail


REASON_CHARS = 60
ETA_ALPHA = 0.05  # weight of the newest step time in the ETA's running average (~20 steps)
ETA_LINES = 400  # step times the average looks back over


def clip_words(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters at a word boundary, with "…" when cut: never mid-word."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:·-") + "…"


def smoothed_step_time(run: RunState) -> float | None:
    """An exponential moving average of the recent step times, oldest first. Why: the ETA was the
    last step's time × the steps left, and on a shared machine single steps took 0.9-9.4 s:
    the ETA jumped between 1h24m and 9h34m from one second to the next."""
    times = [m.step_time_s for m in run.metrics.recent
             if isinstance(m, TrainMetric) and m.step_time_s is not None and m.step_time_s == m.step_time_s]
    if not times:
        return None
    times = times[-ETA_LINES:]
    avg = times[0]
    for x in times[1:]:
        avg += ETA_ALPHA * (x - avg)
    return avg


def eta_s(run: RunState, total: int | None) -> float | None:
    """Seconds to ``total`` steps at the smoothed step time (cached per metrics update)."""
    if total is None:
        return None
    cache = _STEP_TIME.get(run.metrics)
    if cache is None or cache[0] != run.metrics.count:
        cache = (run.metrics.count, smoothed_step_time(run))
        _STEP_TIME[run.metrics] = cache
    per_step = cache[1]
    return None if per_step is None else per_step * max(0, total - run.step)


# the header is drawn again for each new step: the average is computed again only when a metric line arrived
_STEP_TIME: weakref.WeakKeyDictionary[RunMetrics, tuple[int, float | None]] = weakref.WeakKeyDictionary()


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
        t.append(clip_words(reason.splitlines()[0], REASON_CHARS),
                 style="red" if run.status in FAILED_STATUSES else "")
    else:
        t.append(phase or NA, style="dim")
    step = run.step
    total = info.total_steps if info else None
    t.append(f" · step {step}/{total if total is not None else NA}")
    started = info.started_at if info else None
    ended = info.ended_at if info else None
    elapsed = ((ended or now) - started) if started else None
    t.append(f" · {fmt_duration(elapsed)} elapsed")
    m = run.metrics.last_train
    eta = eta_s(run, total) if run.alive else None
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
