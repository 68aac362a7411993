"""The keys of daily use, mixed into NsaApp: marks and the comparison, which charts and by
what, the run list's filter and lineage folding, archive and delete, the small layout's views.

Each changes the state through the reducer only; archive and delete go to the run's host
(services/actions.py) and show what the agent answered. The chart set and the x axis are
remembered (viewprefs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import work

from nsa_tui.app import reducer
from nsa_tui.app.chartdata import CHARTS, next_preset, valid_charts
from nsa_tui.app.listing import lineage_root
from nsa_tui.app.screens.dialogs import ConfirmScreen
from nsa_tui.app.state import PanelState
from nsa_tui.app.viewprefs import load_prefs, save_prefs
from nsa_tui.fmt import fmt_bytes

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel

    from nsa_tui.app.screens.main import MainScreen
    from nsa_tui.app.services.host import HostService


class ViewActions:
    """Actions for NsaApp (``self`` is the app: state, services, notify, main_screen, select)."""

    state: PanelState
    services: dict[str, Any]
    # NsaApp's and textual's App's, declared for the type checker
    push_screen: Callable[..., Any]
    main_screen: Callable[[], MainScreen | None]
    select: Callable[[str, str], None]
    _selected_or_warn: Callable[[str], Any]
    _connected: Callable[[str], HostService | None]

    if TYPE_CHECKING:
        def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
                   timeout: float | None = None, markup: bool = True) -> None: ...

    def load_view_prefs(self) -> None:
        prefs = load_prefs()
        reducer.set_charts(self.state, valid_charts(prefs.charts))
        reducer.set_x_axis(self.state, prefs.x_axis)

    def _save_view_prefs(self) -> None:
        save_prefs(self.state.view)

    def _rewatch(self) -> None:
        """Marked runs need their metrics: let every host's watches follow the marks."""
        for svc in self.services.values():
            svc.focus(svc.focused)

    # -- comparison -------------------------------------------------------------------------
    def action_mark(self) -> None:
        run = self._selected_or_warn("mark")
        if run is None:
            return
        marked = reducer.toggle_mark(self.state, run.host, run.run_id)
        n = len(self.state.view.marks)
        more = " (c: compare them)" if n >= 2 else " (mark one more)"
        self.notify(f"marked {run.name}: {n} marked{more}" if marked else f"unmarked {run.name}: {n} marked",
                    markup=False)
        self._rewatch()

    def action_compare(self) -> None:
        if self.state.view.compare:
            reducer.set_compare(self.state, False)
            return
        if not reducer.set_compare(self.state, True):
            self.notify(f"mark two or more runs with m to compare them ({len(self.state.marked_runs())} "
                        "marked)", severity="warning")
            return
        screen = self.main_screen()
        if screen is not None and screen.compact:
            screen.action_view("charts")

    def action_x_axis(self) -> None:
        reducer.set_x_axis(self.state, "tokens" if self.state.view.x_axis == "step" else "step")
        self._save_view_prefs()

    def action_charts(self) -> None:
        reducer.set_charts(self.state, next_preset(self.state.view.charts))
        self._save_view_prefs()
        names = " · ".join(CHARTS[k].title for k in self.state.view.charts)
        self.notify(f"charts: {names}", timeout=3)

    # -- run list ---------------------------------------------------------------------------
    def action_filter(self) -> None:
        screen = self.main_screen()
        if screen is not None:
            screen.action_filter()

    def set_run_filter(self, text: str) -> None:
        reducer.set_filter(self.state, text)

    def action_fold(self) -> None:
        run = self._selected_or_warn("fold")
        if run is None:
            return
        root = lineage_root(self.state, run)
        members = [r for r in self.state.all_runs() if lineage_root(self.state, r) == root]
        if len(members) < 2:
            self.notify(f"{run.name} has no fallback or resume to fold", markup=False)
            return
        if not reducer.toggle_expanded(self.state, root) and run is not members[0]:
            self.select(members[0].host, members[0].run_id)

    def action_next_view(self) -> None:
        screen = self.main_screen()
        if screen is not None:
            screen.action_next_view()

    # -- archive and delete -----------------------------------------------------------------
    def action_archive(self) -> None:
        run = self._selected_or_warn("archive")
        if run is None:
            return
        if run.alive:
            self.notify(f"{run.name} is {run.status.value}: stop it (k) before archiving it",
                        severity="warning", markup=False)
            return
        archived = bool(run.view and run.view.archived)
        self._housekeeping(run.host, run.run_id, "archive", not archived)

    def action_delete_run(self) -> None:
        run = self._selected_or_warn("delete")
        if run is None:
            return
        if run.alive:
            self.notify(f"{run.name} is {run.status.value}: stop it (k) before deleting it",
                        severity="warning", markup=False)
            return
        self._ask_delete(run.host, run.run_id, run.name)

    @work(group="actions")
    async def _ask_delete(self, host: str, run_id: str, name: str) -> None:
        svc = self._connected(host)
        if svc is None:
            return
        try:
            plan = await svc.actions.delete_plan(run_id)
        except Exception as exc:
            self.notify(str(exc), title="delete refused", severity="error", timeout=10,
                        markup=False)
            return
        body = (f"{run_id} on {host}: its directory, {fmt_bytes(plan.bytes)} in {plan.files} files "
                "(checkpoints, logs, metrics), is removed for good.")
        if plan.children:
            body += (f"\n{', '.join(plan.children)} continue(s) it and keep their own files; their charts "
                     "lose the part before they resumed.")

        def answered(yes: bool | None) -> None:
            if yes:
                self._housekeeping(host, run_id, "delete", True)

        self.push_screen(ConfirmScreen(f"Delete {name}? It frees {fmt_bytes(plan.bytes)}", body,
                                       yes="Delete"), answered)

    @work(group="actions")
    async def _housekeeping(self, host: str, run_id: str, op: str, flag: bool) -> None:
        svc = self._connected(host)
        if svc is None:
            return
        try:
            act = svc.actions
            said = await (act.archive(run_id, flag) if op == "archive" else act.delete(run_id))
        except Exception as exc:
            self.notify(str(exc) or type(exc).__name__, title=f"{op} failed", severity="error",
                        timeout=15, markup=False)
            return
        self.notify(f"{run_id}: {said}", title=op, markup=False)
