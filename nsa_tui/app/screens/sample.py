"""The sample screen: a prompt for the selected run, and the answer as it is generated.

The host's agent generates from the run's newest checkpoint (the ``sample`` op, in a process
of its own, on a GPU no process uses or the CPU); each token's text is appended here as it
comes. Escape closes the screen and stops the generation (the agent kills its process).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, TextArea

# control characters as visible symbols: a byte-level model emits any byte, and a raw \r or
# form feed would break the text area's lines; newline and tab stay what they are
_SHOWN = {c: chr(0x2400 + c) for c in range(0x20) if c not in (9, 10)}
_SHOWN.update({0x7F: "\u2421", 0x2028: " ", 0x2029: " "})
_SHOWN.update({c: "\ufffd" for c in range(0x80, 0xA0)})


def shown(text: str) -> str:
    """``text`` as the screen shows it (control characters as their visible symbols)."""
    return text.translate(_SHOWN)


# (prompt) -> the events of one sample (HostClient.sample with the run and settings bound)
SampleFn = Callable[[str], AsyncIterator[Any]]


class SampleScreen(ModalScreen[None]):
    """Enter sends the prompt; the answer streams into the text below. Again: a new answer."""

    BINDINGS = [Binding("escape", "close", "close")]

    def __init__(self, run_name: str, sample: SampleFn) -> None:
        super().__init__()
        self._run_name, self._sample = run_name, sample
        self.answer = ""  # the generated text so far (tests read it)
        self.shown: list[str] = []  # the answer as each piece put it on the screen (tests read it)
        self.done = False  # the last answer is complete
        self.result: Any = None  # its SampleDone

    def compose(self) -> ComposeResult:
        with Vertical(classes="-dialog", id="sample"):
            yield Label(Text(f"sample from {self._run_name}", style="bold"))
            yield Input(placeholder="prompt (enter: generate; empty: from the start of a document)",
                        id="sample-prompt")
            yield TextArea("", read_only=True, show_line_numbers=False, soft_wrap=True, id="sample-text")
            yield Label(Text("enter: generate   esc: close", style="dim"), id="sample-status")

    def on_mount(self) -> None:
        self.query_one("#sample-prompt", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._generate(event.value)

    def _status(self, text: str, style: str = "dim") -> None:
        self.query_one("#sample-status", Label).update(Text(text, style=style))

    @work(exclusive=True, group="sample")
    async def _generate(self, prompt: str) -> None:
        """One answer: replaces the previous one; a new enter cancels one under way."""
        area = self.query_one("#sample-text", TextArea)
        self.answer, self.shown, self.done, self.result = "", [], False, None
        area.load_text(shown(prompt))
        self._status("loading the checkpoint...")
        try:
            async for ev in self._sample(prompt):
                if ev.kind == "sample_start":  # again after a reconnect: the answer starts over
                    d = ev.data
                    self.answer, self.shown = "", []
                    area.load_text(shown(prompt))
                    self._status(f"{d.checkpoint} on {d.device}, seed {d.seed}: generating...   esc: close")
                elif ev.kind == "sample_text" and ev.data.text:
                    self.answer += ev.data.text
                    self.shown.append(self.answer)
                    area.load_text(shown(prompt + self.answer))
                    area.scroll_end(animate=False)
                elif ev.kind == "sample_done":
                    d = self.result = ev.data
                    self.done = True
                    self._status(f"{d.checkpoint} on {d.device}, seed {d.seed}: {len(d.tokens)} tokens in "
                                 f"{d.seconds:.1f} s ({d.stop})   enter: again   esc: close")
                    return
        except Exception as exc:  # noqa: BLE001 - the host's message, on the screen
            self._status(getattr(exc, "message", None) or str(exc) or type(exc).__name__, "bold red")

    def action_close(self) -> None:
        self.workers.cancel_group(self, "sample")
        self.dismiss(None)
