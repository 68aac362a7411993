"""The dashboard: header, run list + summary, charts, GPUs + alerts, log, search bar, footer."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Input

from nsa_tui.app.state import PanelState
from nsa_tui.app.widgets.alerts import AlertsPane
from nsa_tui.app.widgets.charts import MetricChart
from nsa_tui.app.widgets.gpus import GpuTable
from nsa_tui.app.widgets.header import PanelHeader
from nsa_tui.app.widgets.logview import LogView, waiting_note
from nsa_tui.app.widgets.runlist import RunList
from nsa_tui.app.widgets.summary import RunSummary

# (binding id, default key, action, footer label, what it does)
KEYS: list[tuple[str, str, str, str, str]] = [
    ("launch", "l", "launch", "launch", "Launch a run: config, nproc, strategy, data, name"),
    ("kill", "k", "kill", "kill", "Stop the selected run (whole process group; checkpoint first)"),
    ("fallback", "f", "fallback", "1-GPU", "Stop and relaunch on one GPU from the newest checkpoint"),
    ("resume", "r", "resume", "resume", "Resume the selected run from its newest checkpoint"),
    ("dump", "d", "dump", "stacks", "Dump every rank's Python stack and show it"),
    ("follow", "t", "follow", "follow", "Follow the log (jump to its end and stay there)"),
    ("search", "slash", "search", "search", "Search the log (n / N: next / previous match)"),
    ("ack", "a", "ack", "ack", "Acknowledge the newest alert"),
    ("help", "question_mark", "help", "help", "Keys and panes"),
    ("quit", "q", "quit_panel", "quit", "Quit the panel; runs keep going on their hosts"),
]

SCREEN_ACTIONS = ("follow", "search")
CHART_MIN_S = 0.5


class MainScreen(Screen):
    """Everything about the selected run at once, fitting 100×30 and growing with the terminal."""

    BINDINGS = [
        Binding(key, action if action in SCREEN_ACTIONS else f"app.{action}", label, id=bid)
        for bid, key, action, label, _ in KEYS
    ] + [
        Binding("escape", "close_search", "close search", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield PanelHeader(id="header")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                yield RunList(id="runs")
                yield RunSummary(id="summary")
            with Vertical(id="right"):
                with Horizontal(id="charts"):
                    yield MetricChart("loss: train ─ val ●", "loss", id="loss")
                    yield MetricChart("tokens/s", "tokens/s", id="tps")
                with Horizontal(id="mid"):
                    yield GpuTable(id="gpus")
                    yield AlertsPane(id="alerts")
                yield LogView(id="log")
                yield Input(placeholder="search the log (enter: find, esc: close)", id="search")
        yield Footer()

    ready = False
    _chart_sig: tuple = ()
    _chart_at = 0.0

    def on_mount(self) -> None:
        self.ready = True
        self.query_one("#runs").border_title = "runs"
        self.query_one("#summary").border_title = "summary"
        self.query_one("#gpus").border_title = "GPUs / host"
        self.query_one("#alerts").border_title = "alerts"
        self.query_one("#log").border_title = "log (following)"
        self.query_one("#runs").focus()

    def on_unmount(self) -> None:
        self.ready = False

    def update_from(self, state: PanelState, now: float) -> None:
        """Redraw every pane from `state`; each pane skips work when nothing changed."""
        try:
            self._update_from(state, now)
        except NoMatches:  # the app is shutting down and the panes are already gone
            self.ready = False

    def _update_from(self, state: PanelState, now: float) -> None:
        self.query_one(PanelHeader).update_from(state, now)
        self.query_one(RunList).update_from(state, now)
        self.query_one(RunSummary).update_from(state, now)
        self.query_one(GpuTable).update_from(state, now)
        self.query_one(AlertsPane).update_from(state, now)
        run = state.selected_run()
        log = self.query_one(LogView)
        log.set_buffer(run.log if run else None)
        log.set_waiting(waiting_note(run, now) if run else "")
        log.sync()
        title = "log (following)" if log.follow else "log (scrollback — t: follow)"
        if log.pattern:
            title += f"  /{log.pattern}"
        if log.border_title != title:
            log.border_title = title
        loss, tps = self.query_one("#loss", MetricChart), self.query_one("#tps", MetricChart)
        if run is None:
            loss.set_lines([], ())
            tps.set_lines([], ())
            self._chart_sig = ()
            return
        lineage = [run]
        while (parent := state.parent_of(lineage[-1])) is not None and all(parent is not r for r in lineage):
            lineage.append(parent)
        sig = tuple((r.key, r.metrics.count) for r in lineage)
        if sig == self._chart_sig:  # series are only copied when a point arrived
            return
        mono = time.monotonic()
        if self._chart_sig and sig[0][0] == self._chart_sig[0][0] and mono - self._chart_at < CHART_MIN_S:
            return  # same run, drawn moments ago: plotting is the costly part, do it ≤ 2x/s
        self._chart_sig, self._chart_at = sig, mono
        train = state.chart_series(run, "loss")
        val = state.chart_series(run, "val_loss")
        speed = state.chart_series(run, "tokens_per_s")
        loss.set_lines([("train", *train), ("val", *val)], sig)
        tps.set_lines([("tokens/s", *speed)], sig)

    # -- search bar -------------------------------------------------------------------------
    def action_search(self) -> None:
        bar = self.query_one("#search", Input)
        bar.display = True
        bar.focus()

    def action_close_search(self) -> None:
        bar = self.query_one("#search", Input)
        if bar.display:
            bar.display = False
            self.query_one(LogView).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "search":
            return
        log = self.query_one(LogView)
        if not log.search(event.value):
            self.notify(f"'{event.value}' not found in the log", severity="warning")
        event.input.display = False
        log.focus()

    def action_follow(self) -> None:
        log = self.query_one(LogView)
        log.set_follow(True)
        log.pattern = None
        log.focus()
