"""The evaluation screen: long-context results of the selected run, or of the marked runs
side by side (NSA against dense): passkey accuracy per length x depth and loss by position,
from the runs' recorded evaluations (the agents' ``evals`` op). r reloads; escape closes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from nsa_tui.app.evalview import RunEvals, render

LoadFn = Callable[[], Awaitable[list[RunEvals]]]


class EvalScreen(ModalScreen[None]):
    """Draws what ``load`` returns (each run's records); ``runs`` holds it for tests."""

    BINDINGS = [Binding("escape", "close", "close"), Binding("r", "reload", "reload")]

    def __init__(self, title: str, load: LoadFn) -> None:
        super().__init__()
        self._title, self._load = title, load
        self.runs: list[RunEvals] | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="-dialog", id="evals"):
            yield Label(Text(self._title, style="bold"))
            with VerticalScroll():
                yield Static(Text("reading the evaluations...", style="dim"), id="evals-body")
            yield Label(Text("r: reload   esc: close", style="dim"))

    def on_mount(self) -> None:
        self.action_reload()

    @work(exclusive=True, group="evals")
    async def action_reload(self) -> None:
        body = self.query_one("#evals-body", Static)
        try:
            runs = await self._load()
        except Exception as exc:  # noqa: BLE001 - the host's message, on the screen
            body.update(Text(getattr(exc, "message", None) or str(exc), style="bold red"))
            return
        body.update(render(runs))
        self.runs = runs

    def action_close(self) -> None:
        self.workers.cancel_group(self, "evals")
        self.dismiss(None)
