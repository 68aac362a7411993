"""The dashboard: header, run list + summary, charts, GPUs + alerts, log, search bar, key line.

Two layouts. From 100×30 up every pane is on screen at once and each grows with the
terminal. Below that (a tmux split, 80×24) panes would be cut to uselessness, so the screen
switches to three full-size views, one at a time (``v`` or 1 2 3): runs + log, charts, and
run + GPUs + alerts; a tab line says which one shows and how many alerts are open.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input, Static

from nsa_tui.app import chartdata
from nsa_tui.app.budget import RedrawBudget
from nsa_tui.app.listing import FILTER_HELP, run_rows, shown_selection
from nsa_tui.app.state import PanelState
from nsa_tui.app.widgets.alerts import AlertsPane
from nsa_tui.app.widgets.charts import MetricChart, rgb
from nsa_tui.app.widgets.gpus import GpuTable
from nsa_tui.app.widgets.header import PanelHeader
from nsa_tui.app.widgets.keybar import Hint, KeyBar
from nsa_tui.app.widgets.logview import LogView, waiting_note
from nsa_tui.app.widgets.runlist import RunList
from nsa_tui.app.widgets.summary import RunSummary

# (binding id, default key, action, key-line label, what it does)
KEYS: list[tuple[str, str, str, str, str]] = [
    ("launch", "l", "launch", "launch", "Launch a run: config, nproc, strategy, data, name"),
    ("kill", "k", "kill", "kill", "Stop the selected run (whole process group; checkpoint first)"),
    ("fallback", "f", "fallback", "1-GPU", "Stop and relaunch on one GPU from the newest checkpoint"),
    ("resume", "r", "resume", "resume", "Resume the selected run from its newest checkpoint"),
    ("dump", "d", "dump", "stacks", "Dump every rank's Python stack and show it"),
    ("follow", "t", "follow", "follow", "Follow the log (jump to its end and stay there)"),
    ("search", "slash", "search", "search", "Search the log (n / N: next / previous match)"),
    ("ack", "a", "ack", "ack", "Acknowledge the newest alert"),
    ("mark", "m", "mark", "mark", "Mark the selected run for comparison (again: unmark)"),
    ("compare", "c", "compare", "compare", "Overlay the marked runs on the charts (again: back)"),
    ("x_axis", "x", "x_axis", "x-axis", "Charts by step or by tokens"),
    ("charts", "g", "charts", "charts",
     "Next set of charts: loss, tokens/s, grad norm, lr, TFLOP/s + MFU, memory, gate shares, val loss"),
    ("filter", "s", "filter", "filter", "Filter the run list: " + FILTER_HELP),
    ("fold", "z", "fold", "fold", "Unfold / fold the selected run's lineage (its fallbacks and resumes)"),
    ("archive", "h", "archive", "archive",
     "Archive the selected run (hidden unless the filter says archived); again: unarchive. Never a live run"),
    ("delete", "delete", "delete_run", "delete", "Delete the selected run (asks; says what it frees)"),
    ("sample", "p", "sample", "sample", "Prompt the selected run's newest checkpoint; the answer streams in"),
    ("evals", "e", "evals", "evals",
     "Long-context evaluations (passkey grid, loss by position) of the selected run, or of the marked runs"),
    ("view", "v", "next_view", "view", "Small terminal: next view (runs + log, charts, run + GPUs)"),
    ("help", "question_mark", "help", "help", "Keys and panes"),
    ("quit", "q", "quit_panel", "quit", "Quit the panel; runs keep going on their hosts"),
]

SCREEN_ACTIONS = ("follow", "search")
# key-line hints, most useful first; help and quit always show
KEY_LINE = ("launch", "kill", "fallback", "resume", "dump", "mark", "compare", "charts", "filter", "ack",
            "follow", "search", "x_axis", "fold", "archive")
PAGES = (("runs", "runs · log"), ("charts", "charts"), ("host", "run · GPUs · alerts"))
COMPACT_BELOW = (100, 30)  # width, height under which one view shows at a time
# The refresh cap: new data from the hosts (a step, a log line, a beat) redraws the panes at most
# every DATA_REDRAW_S, and the charts (plotting is the costliest draw) every CHART_MIN_S; what the
# user chose (another run, a key, a resize) shows at the next tick. Without it every event of a
# 10 steps/s run redrew header, summary, run list, log and charts up to 10x/s. On a slow
# machine the panel's CPU budget stretches both (nsa_tui/app/budget.py; docs/panel.md, "What
# the panel costs").
DATA_REDRAW_S = 1.0
CHART_MIN_S = 2.0


class PageTabs(Static):
    """The small layout's view line: ' 1 runs · log │ 2 charts │ 3 run · GPUs · alerts (1) '."""

    _sig: tuple = ()

    def show(self, page: str, alerts: int) -> None:
        if (page, alerts) == self._sig:
            return
        self._sig = (page, alerts)
        t = Text(no_wrap=True, overflow="ellipsis")
        for i, (key, label) in enumerate(PAGES):
            if i:
                t.append(" │ ", style="dim")
            text = f" {i + 1} {label}" + (f" ({alerts})" if key == "host" and alerts else "") + " "
            t.append(text, style="bold reverse" if key == page else ("bold red" if key == "host" and alerts
                                                                     else ""))
        t.append("   v: next view", style="dim")
        self.update(t)


class MainScreen(Screen):
    """Everything about the selected run: all at once from 100×30, one view at a time below."""

    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(key, action if action in SCREEN_ACTIONS else f"app.{action}", label, id=bid, show=False)
          for bid, key, action, label, _ in KEYS),
        Binding("escape", "close_bars", "close search / filter", show=False),
        Binding("1", "view('runs')", "runs view", show=False),
        Binding("2", "view('charts')", "charts view", show=False),
        Binding("3", "view('host')", "host view", show=False),
    ]

    page = "runs"
    ready = False
    _chart_sig: tuple = ()
    _chart_shape: tuple = ()
    _chart_at = 0.0
    _choice: tuple = ()
    _drawn_at = 0.0
    _budget: RedrawBudget | None = None
    _sized: tuple[Widget, ...] = ()  # the panes whose size user_choice compares
    _alerts: AlertsPane
    _gpus: GpuTable

    def compose(self) -> ComposeResult:
        yield PanelHeader(id="header")
        yield PageTabs(id="pages")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                yield RunList(id="runs")
                yield RunSummary(id="summary")
            with Vertical(id="right"):
                with Horizontal(id="charts"):
                    for i in range(3):
                        yield MetricChart(id=f"chart{i}", classes="chart")
                yield Static(id="legend")
                with Horizontal(id="mid"):
                    yield GpuTable(id="gpus")
                    yield AlertsPane(id="alerts")
                yield LogView(id="log")
        yield Input(placeholder="search the log (enter: find, esc: close)", id="search")
        yield Input(placeholder="filter runs: name words, running/crashed/…, alive/ended, archived "
                                "(esc: clear)", id="filter")
        yield KeyBar(self.key_hints, id="keys")

    def on_mount(self) -> None:
        self.ready = True
        self.query_one("#runs").border_title = "runs"
        self.query_one("#summary").border_title = "summary"
        self.query_one("#gpus").border_title = "GPUs / host"
        self.query_one("#alerts").border_title = "alerts"
        self.query_one("#log").border_title = "log (following)"
        self.query_one("#runs").focus()
        self._layout_for(self.size.width, self.size.height)

    def on_unmount(self) -> None:
        self.ready = False

    # -- layout -----------------------------------------------------------------------------
    def on_resize(self) -> None:
        self._layout_for(self.size.width, self.size.height)

    @property
    def compact(self) -> bool:
        return self.has_class("-compact")

    def _layout_for(self, width: int, height: int) -> None:
        compact = width < COMPACT_BELOW[0] or height < COMPACT_BELOW[1]
        self.set_class(compact, "-compact")
        for key, _ in PAGES:
            self.set_class(compact and key == self.page, f"-page-{key}")
        self._chart_sig = self._chart_shape = ()  # chart heights changed: draw again
        self._choice = ()
        try:
            self.query_one(KeyBar).redraw()
        except NoMatches:
            pass

    def action_view(self, page: str) -> None:
        """Show one view of the small layout (no effect on the large one, which shows all)."""
        self.page = page
        self._layout_for(self.size.width, self.size.height)
        if self.compact:
            target = {"runs": "#runs", "charts": None, "host": "#summary"}[page]
            if target:
                self.query_one(target).focus()

    def action_next_view(self) -> None:
        keys = [k for k, _ in PAGES]
        self.action_view(keys[(keys.index(self.page) + 1) % len(keys)])

    def key_hints(self) -> tuple[list[Hint], list[Hint]]:
        """(hints by priority, hints always shown) with the keys as currently mapped."""
        keymap = getattr(self.app, "keymap", {})
        by_id = {bid: (key, action, label) for bid, key, action, label, _ in KEYS}

        def hint(bid: str) -> Hint:
            key, action, label = by_id[bid]
            shown = ",".join({"slash": "/", "question_mark": "?", "delete": "del"}.get(k, k)
                             for k in keymap.get(bid, key).split(","))
            return shown, label, action if action in SCREEN_ACTIONS else f"app.{action}"

        always = [hint("help"), hint("quit")]
        if self.compact:
            always.insert(0, hint("view"))
        return [hint(b) for b in KEY_LINE], always

    # -- drawing ----------------------------------------------------------------------------
    def user_choice(self, state: PanelState) -> tuple:
        """What the user chose to see: when it changes, the panes redraw at once (no cap). A
        chosen run's arrival in full (synced) counts: its first full paint waits for no cap; so
        does a pane's new size (a pane lays its lines out for its width and scroll bar), and the
        first runs to arrive while none is selected (the first is selected at once)."""
        v = state.view
        if not self._sized:  # asked 10 times a second: the panes are found once (they stay)
            self._sized = tuple(self.query_one(q) for q in ("#runs", "#summary", "#gpus", "#log"))
            self._alerts, self._gpus = self.query_one(AlertsPane), self.query_one(GpuTable)
        alerts, gpus = self._alerts, self._gpus
        run = state.selected_run()
        sizes = tuple(w.region.size for w in self._sized)
        unselected = state.selected is None and any(h.runs for h in state.hosts.values())  # pick one now
        return (state.selected, run.synced if run else None, tuple(v.marks), v.compare, v.x_axis, v.charts,
                v.filter, tuple(sorted(v.expanded)), len(state.acked), self.size, self.page,
                self.app.focused.id if self.app.focused else None, alerts.cursor, sizes,
                gpus.max_scroll_y > 0, unselected)

    def update_from(self, state: PanelState, now: float) -> None:
        """Redraw the panes from `state` (each pane skips work when nothing changed): at once
        after a choice of the user, else at most every DATA_REDRAW_S (stretched by the budget)."""
        try:
            if self._budget is None:
                self._budget = RedrawBudget(DATA_REDRAW_S, CHART_MIN_S)
            self._budget.observe()
            choice = self.user_choice(state)
            mono = time.monotonic()
            if choice == self._choice and mono - self._drawn_at < self._budget.data_s:
                return
            self._choice, self._drawn_at = choice, mono
            self._update_from(state, now)
        except NoMatches:  # the app is shutting down and the panes are already gone
            self.ready = False

    def _update_from(self, state: PanelState, now: float) -> None:
        rows = run_rows(state)
        want = shown_selection(state, rows)  # the list decides what the other panes show
        if want != state.selected:
            self.app.select_key(want)  # type: ignore[attr-defined]
            rows = run_rows(state)  # a lineage unfolds to show an older run when it is selected
        self.query_one(PanelHeader).update_from(state, now)
        self.query_one(RunList).update_from(state, now, rows)
        self.query_one(RunSummary).update_from(state, now)
        self.query_one(GpuTable).update_from(state, now)
        self.query_one(AlertsPane).update_from(state, now)
        if self.compact:
            self.query_one(PageTabs).show(self.page, len(state.open_alerts()))
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
        self._update_charts(state)

    def _update_charts(self, state: PanelState) -> None:
        """The chosen charts of the selected run (its lineage), or the marked runs overlaid."""
        view = state.view
        run = state.selected_run()
        compared = state.marked_runs() if view.compare else []
        compare = len(compared) >= 2
        kinds = chartdata.valid_charts(view.charts)
        runs = compared if compare else ([run] if run else [])
        lineage = list(runs)
        if not compare and run is not None:
            while (parent := state.parent_of(lineage[-1])) is not None and parent not in lineage:
                lineage.append(parent)
        # a point arrived, or run.json changed (FLOPs per token, global batch): not every log line
        sig = (kinds, view.x_axis, compare, tuple((r.key, r.metrics.count, id(r.view)) for r in lineage))
        if sig == self._chart_sig:  # series are only copied when a point arrived
            return
        mono = time.monotonic()
        shape = (kinds, view.x_axis, compare, tuple((r.key, r.synced) for r in lineage))
        cap = self._budget.chart_s if self._budget else CHART_MIN_S
        if shape == self._chart_shape and mono - self._chart_at < cap:
            return  # same charts of the same runs, drawn moments ago: new points wait for the cap
        self._chart_sig, self._chart_shape, self._chart_at = sig, shape, mono
        legend = self.query_one("#legend", Static)
        legend.display = compare
        if compare:
            t = Text(no_wrap=True, overflow="ellipsis")
            for label, color in chartdata.legend(compared):
                t.append("━━ ", style=f"bold {rgb(color)}")
                t.append(f"{label}   ")
            t.append("c: back · x: step/tokens", style="dim")
            legend.update(t)
        for i in range(3):
            chart = self.query_one(f"#chart{i}", MetricChart)
            chart.display = i < len(kinds)
            if i >= len(kinds):
                continue
            if not runs:
                data = chartdata.ChartData(chartdata.CHARTS[kinds[i]].title, note="N/A (no run selected)")
            elif compare:
                data = chartdata.compare(state, compared, kinds[i], view.x_axis)
            else:
                data = chartdata.single(state, runs[0], kinds[i], view.x_axis)
            if view.x_axis == "tokens":
                data.title += " · by tokens"
            chart.show(data, sig + (i,), compare)

    # -- search and filter bars -------------------------------------------------------------
    def action_search(self) -> None:
        bar = self.query_one("#search", Input)
        bar.display = True
        bar.focus()

    def action_filter(self) -> None:
        bar = self.query_one("#filter", Input)
        bar.value = self.app.state.view.filter  # type: ignore[attr-defined]
        bar.display = True
        bar.focus()

    def action_close_bars(self) -> None:
        search, filt = self.query_one("#search", Input), self.query_one("#filter", Input)
        if search.display:
            search.display = False
            self.query_one(LogView).focus()
        if filt.display:
            filt.display = False
            self.app.set_run_filter("")  # type: ignore[attr-defined]
            self.query_one(RunList).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter" and event.input.display:
            self.app.set_run_filter(event.value)  # type: ignore[attr-defined]

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            event.input.display = False
            self.query_one(RunList).focus()
            return
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
