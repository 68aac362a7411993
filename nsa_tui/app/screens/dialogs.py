"""Small modal screens: a yes/no confirmation, help, and the stack-dump viewer."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static, TextArea


class ConfirmScreen(ModalScreen[bool]):
    """Ask once; y / enter confirms, n / escape cancels."""

    BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, title: str, body: str, yes: str = "Yes") -> None:
        super().__init__()
        self._title, self._body, self._yes = title, body, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="-dialog", id="confirm"):
            yield Label(Text(self._title, style="bold"))
            yield Static(Text(self._body), id="confirm-body")  # host strings: never markup
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self._yes} (y)", variant="error", id="yes")
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class HelpScreen(ModalScreen[None]):
    """The keys as currently mapped (keymap file included) and what each pane shows. Its first
    line, which never scrolls away, says how to close it: it is taller than a small terminal."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss_help", "close")]

    def __init__(self, keys: list[tuple[str, str]], keymap_note: str) -> None:
        super().__init__()
        self._keys, self._note = keys, keymap_note

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for key, what in self._keys:
            table.add_row(key, what)
        panes = Text.from_markup(  # a line per pane: each wraps at the dialog's width
            "\n[b]Panes[/b]\n"
            "header: hosts and their connection; the selected run's status (STALLED rN while a stall "
            "alert is open), phase (and how long), step/total, elapsed, ETA, tokens\n"
            "runs: ↑/↓ select a run (all hosts); the selected run is always one the list shows\n"
            "summary: config, params, seq len, global batch, dtype, data, gate shares per NSA branch\n"
            "charts: loss (train/val), tokens/s, … by step or by tokens (x); g: the next set\n"
            "GPUs: memory bar, util, power, temp, rank per GPU; host CPU/RAM/disk\n"
            "alerts: newest first with evidence and suggested actions\n"
            "log: follow, scrollback, search (n/N), errors in red\n"
        )
        with Vertical(classes="-dialog", id="help-dialog"):
            yield Label(Text.assemble(("nsa-tui keys", "bold"), ("   esc/q/? to close · ↑↓ PgUp PgDn scroll",
                                                                   "dim")), id="help-title")
            with VerticalScroll(id="help"):
                yield Static(table)
                yield Static(panes)
                yield Static(Text(self._note, style="dim"))

    def on_mount(self) -> None:
        self.query_one("#help").focus()  # the arrow keys scroll it

    def action_dismiss_help(self) -> None:
        self.dismiss(None)


class StacksScreen(ModalScreen[None]):
    """Every rank's stack from a dump, scrollable and selectable."""

    BINDINGS = [Binding("escape,q", "close", "close")]

    def __init__(self, title: str, text: str) -> None:
        super().__init__()
        self._title, self._text = title, text

    def compose(self) -> ComposeResult:
        with Vertical(classes="-dialog", id="stacks"):
            yield Label(Text(self._title, style="bold"))
            yield TextArea(self._text, read_only=True, show_line_numbers=False, id="stacks-text")
            yield Label(Text("esc: close", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)
