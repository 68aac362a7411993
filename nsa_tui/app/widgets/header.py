"""Header: hosts and their connection state, the selected run's status, phase and progress."""

from __future__ import annotations

import weakref

from rich.text import Text
from textual.widgets import Static

from nsa.contract import FAILED_STATUSES, UNHEALTHY_STATUSES, RunStatus, TrainMetric
from nsa_tui.app.runmetrics import RunMetrics
from nsa_tui.app.state import HostState, PanelState, RunState
from nsa_tui.fmt import NA, fmt_count3, fmt_duration

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


def clip(text: str, width: int) -> str:
    """Cut a long name in the middle: its start says what it is, its end which one (a relaunch
    suffix, a time stamp), e.g. ``nsa-125…-fallback``."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    left = width // 2
    right = width - 1 - left
    return text[:left] + "…" + (text[-right:] if right else "")


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


def run_progress(run: RunState, now: float, width: int = 0, stalled: list[int | None] | None = None) -> Text:
    """Run name, status, phase (and for how long), step/total, elapsed, ETA, tokens, cut to
    ``width`` columns (0: no limit): the elapsed time goes first, then the tokens, the ETA, the
    phase; then the name is cut in the middle. Why: at 80 columns the line wrapped and its end
    was lost. ``stalled``: the ranks a stall alert names (PanelState.stalled_ranks): the header
    says ``STALLED r1`` instead of an ETA that assumes the run moves."""
    status = run.status.value
    head = Text(status, style=STATUS_STYLE.get(status, ""))
    if stalled and run.alive:
        ranks = ",".join(f"r{r}" for r in stalled if r is not None)
        head.append(" · ")
        head.append(f"STALLED {ranks}".strip(), style="bold reverse red")
    phase, since = run.phase()
    info = run.view.info if run.view is not None else None
    exited = run.view.exit if run.view is not None else None
    if run.alive and phase:
        where = Text(phase, style="bold magenta")
        where.append(f" {fmt_duration(now - since) if since else NA}")
    elif not run.alive and ((info and info.exit_reason) or (exited and exited.exit_code is not None)):
        reason = (info.exit_reason if info else None) or f"exit code {exited.exit_code if exited else NA}"
        where = Text(clip_words(reason.splitlines()[0], REASON_CHARS),
                     style="red" if run.status in FAILED_STATUSES else "")
    else:
        where = Text(phase or NA, style="dim")
    total = info.total_steps if info else None
    started = info.started_at if info else None
    ended = info.ended_at if info else None
    elapsed = ((ended or now) - started) if started else None
    m = run.metrics.last_train
    tokens = max(info.tokens if info else 0, (m.tokens or 0) if m else 0)
    # (text, drop rank: the highest goes first while the line is too long; 0: always kept)
    parts: list[tuple[Text, int]] = [
        (head, 0), (where, 2), (Text(f"step {run.step}/{total if total is not None else NA}"), 0),
        (Text(f"{fmt_duration(elapsed)} elapsed"), 5)]
    if not (stalled and run.alive):
        parts.append((Text(f"ETA {fmt_duration(eta_s(run, total) if run.alive else None)}"), 3))
    parts.append((Text(fmt_count3(tokens, "tok") if tokens else "tokens N/A"), 4))
    while True:
        body = Text(" · ").join([t for t, _ in parts])
        if not width or len(run.name) + 2 + body.cell_len <= width or max(d for _, d in parts) == 0:
            break
        worst = max(d for _, d in parts)
        parts = [(t, d) for t, d in parts if d != worst]
    name = run.name if not width else clip(run.name, max(8, width - 2 - body.cell_len))
    t = Text(name, style="bold")
    t.append("  ")
    t.append_text(body)
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
        width = self.content_region.width  # 0 before the first layout: not cut then
        if run is not None:
            line2 = run_progress(run, now, width, state.stalled_ranks(run))
        elif state.view.filter:  # the list shows no run (docs/panel.md: the selection follows the list)
            line2 = Text(f"no run selected: none matches the filter '{state.view.filter}' (s: change it)",
                         style="dim")
        else:
            line2 = Text("no run selected — press l to launch one", style="dim")
        text = Text("\n").join([line1, line2])
        text.no_wrap, text.overflow = True, "ellipsis"  # two lines, never a third cut off below
        if text.plain != self._last:  # redraw only on change: the timer runs 10x/s
            self._last = text.plain
            self.update(text, layout=False)  # fixed height: no re-layout
