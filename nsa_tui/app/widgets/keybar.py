"""The key line at the bottom: as many key hints as the width holds, most useful first, and
always ``? help`` and ``q quit`` (Textual's footer drops the last keys of a narrow terminal,
which were exactly those). Keys as currently mapped (keymap file); a click runs the key's
action."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import events
from textual.widgets import Static

Hint = tuple[str, str, str]  # (key as shown, label, action to run on click)


def fit_hints(hints: list[Hint], always: list[Hint], width: int) -> list[Hint]:
    """The first hints that fit in ``width`` cells (in priority order: none skipped for a later
    one), with every one of ``always`` at the end."""
    def cost(h: Hint) -> int:
        return len(h[0]) + 1 + len(h[1]) + 2

    room = width - sum(cost(h) for h in always)
    shown: list[Hint] = []
    for h in hints:
        if cost(h) > room:
            break
        shown.append(h)
        room -= cost(h)
    return shown + always


class KeyBar(Static):
    """One line of key hints; ``hints()`` is asked again when the width changes."""

    DEFAULT_CSS = """
    KeyBar { dock: bottom; height: 1; background: $panel; color: $foreground; padding: 0 1; }
    """

    def __init__(self, hints: Callable[[], tuple[list[Hint], list[Hint]]], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._hints = hints
        self._spans: list[tuple[int, int, str]] = []
        self._sig: tuple = ()

    def on_resize(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        hints, always = self._hints()
        width = self.content_region.width or self.size.width
        sig = (width, tuple(hints), tuple(always))
        if sig == self._sig:
            return
        self._sig = sig
        t = Text(no_wrap=True, overflow="crop")
        self._spans = []
        for key, label, action in fit_hints(hints, always, width):
            start = t.cell_len
            t.append(key, style="bold orange1")
            t.append(f" {label}  ")
            self._spans.append((start, t.cell_len, action))
        self.update(t)

    async def on_click(self, event: events.Click) -> None:
        x = event.x - 1  # padding
        for start, end, action in self._spans:
            if start <= x < end:
                await self.screen.run_action(action)
                return
