"""The run's log: a virtual line view over a bounded ring buffer.

Only the visible lines are rendered, and new lines are taken in batches by `sync()`
(called from the UI timer, at most once a second for new lines), so a log writing 10,000
lines/s costs a redraw a second, not 10,000. A line once rendered is kept (by its number in
the log) while the view's width, scroll column, style and search stay the same: following a
log, a redraw renders the new lines only, not every line that moved up. Follow mode sticks
to the end; scrolling up leaves it, a resize does not.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from nsa_tui.app.state import LogBuffer, RunState
from nsa_tui.fmt import fmt_duration

ERROR_RE = re.compile(
    r"Traceback|Error\b|ERROR|Exception|FAILED|exception|NaN|\bnan\b|Killed|Segmentation fault|"
    r"^\s+File \"|CUDA out of memory|[Ff]atal|exitcode\s*:\s*[1-9-]|exited with [1-9]"
)
CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]|\x1b\[[0-9;?]*[A-Za-z]")
MAX_WIDTH = 1000
LINE_CACHE = 512  # rendered lines kept: several panes' worth
ERROR_STYLE = Style(color="red", bold=True)
MATCH_STYLE = Style(color="black", bgcolor="yellow")
CURRENT_STYLE = Style(color="black", bgcolor="bright_magenta", bold=True)


def waiting_note(run: RunState, now: float) -> str:
    """The log pane's line while a run has written nothing yet: which phase it is in and for how
    long (docs/lessons.md#visible-start-up), instead of a blank pane."""
    if run.log.total:
        return ""
    if run.alive:
        phase, since = run.phase()
        if phase:
            age = fmt_duration(now - since) if since else "?"
            return f"{run.name} is in phase {phase} for {age}; no log output yet"
        start = run.created or (run.view.info.started_at if run.view is not None else None)
        age = f" for {fmt_duration(now - start)}" if start else ""
        return f"{run.name} is starting{age}: no heartbeat and no log output yet"
    if run.synced:
        return f"{run.name} ({run.status.value}) wrote no log output"
    return "loading the log …"


class LogView(ScrollView, can_focus=True):
    """Follow, scrollback, search (n/N) and a red highlight on error lines."""

    BINDINGS = [
        Binding("n", "next_match", "next match", show=False),
        Binding("N", "prev_match", "prev match", show=False),
        Binding("end", "follow", "follow", show=False),
    ]

    DEFAULT_CSS = """
    LogView { background: $surface; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.buffer: LogBuffer | None = None
        self.follow = True
        self.pattern: str | None = None
        self.current_match: int | None = None  # absolute line number
        self._seen_total = -1
        self._width = 0
        self._programmatic = False
        self.waiting = ""  # shown while the log has no line yet (a run that boots: phase and age)
        self._strips: dict[int, Strip] = {}  # line number in the log -> its rendered line
        self._strips_key: tuple = ()  # what those were rendered for (buffer, width, style, search)
        self._base: Style | None = None  # the widget's style, taken once per render
        self.lines_rendered = 0  # lines rendered anew (tests)

    # -- data ---------------------------------------------------------------------------------
    def set_buffer(self, buffer: LogBuffer | None) -> None:
        """Show another run's log (from its end, following)."""
        if buffer is self.buffer:
            return
        self.buffer = buffer
        self._strips.clear()
        self._seen_total = -1
        self._width = 0
        self.current_match = None
        self.follow = True
        self.sync()

    def sync(self) -> bool:
        """Take in new lines since the last call; returns whether anything changed."""
        buf = self.buffer
        total = buf.total if buf else 0
        if total == self._seen_total:
            return False
        previous_dropped = self._dropped_at_seen
        fresh = total - max(self._seen_total, 0) if self._seen_total >= 0 else total
        self._seen_total = total
        lines = buf.lines if buf else ()
        if buf is not None:
            for line in itertools.islice(reversed(lines), min(fresh, 200)):
                if len(line) > self._width:
                    self._width = min(MAX_WIDTH, len(line))
        self._programmatic = True
        try:
            self._set_virtual_size(Size(self._width, len(lines)))
            if self.follow:
                self.scroll_end(animate=False, immediate=True, x_axis=False)
                self.call_after_refresh(self._stick_to_end)
            elif buf is not None and buf.dropped > previous_dropped:
                # keep the same lines in view while old ones fall off the front
                self.scroll_to(y=max(0, self.scroll_y - (buf.dropped - previous_dropped)),
                               animate=False, immediate=True)
        finally:
            self._programmatic = False
        self._dropped_at_seen = buf.dropped if buf else 0
        self.refresh()
        return True

    _dropped_at_seen = 0

    def _set_virtual_size(self, new: Size) -> None:
        """Grow the scrollable area, re-laying out the screen only when the scrollbar appears,
        disappears or the width changes. Textual re-lays out the whole screen on every
        virtual-size change, which was most of the panel's CPU while a log grows; a growing
        log otherwise only moves the scrollbar thumb, which `_scroll_update` handles."""
        old = self.virtual_size
        if new == old:
            return
        height = self.scrollable_content_region.height
        if new.width != old.width or (old.height > height) != (new.height > height) or not height:
            self.virtual_size = new
        else:
            self.set_reactive(ScrollView.virtual_size, new)
            self._scroll_update(new)
            self.refresh()

    def set_waiting(self, text: str) -> None:
        """What to show while the log is empty (redrawn only when it changes)."""
        if text != self.waiting:
            self.waiting = text
            self.refresh()

    def _stick_to_end(self) -> None:
        """Scroll to the end once the new virtual size is laid out (follow mode)."""
        if self.follow:
            self._programmatic = True
            try:
                self.scroll_end(animate=False, immediate=True, x_axis=False)
            finally:
                self._programmatic = False

    def on_resize(self) -> None:
        self._stick_to_end()

    def set_follow(self, follow: bool) -> None:
        self.follow = follow
        self._seen_total = -1
        self.sync()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        # a taller pane (a resize) pulls the offset back to the new end: still the end, still following
        at_end = new_value >= self.max_scroll_y
        if not self._programmatic and new_value < old_value and not (self.follow and at_end):
            self.follow = False
        elif not self._programmatic and self.is_vertical_scroll_end:
            self.follow = True

    # -- search ---------------------------------------------------------------------------------
    def search(self, pattern: str) -> bool:
        """Jump to the newest line containing `pattern` (case-insensitive); False if none."""
        self.pattern = pattern or None
        self.current_match = None
        if not self.pattern:
            self.refresh()
            return False
        return self._find(-1, from_end=True)

    def action_next_match(self) -> None:
        self._find(+1)

    def action_prev_match(self) -> None:
        self._find(-1)

    def action_follow(self) -> None:
        self.set_follow(True)

    def _find(self, direction: int, from_end: bool = False) -> bool:
        buf = self.buffer
        if not buf or not self.pattern:
            return False
        needle = self.pattern.lower()
        lines = buf.lines
        n = len(lines)
        if from_end or self.current_match is None:
            i = n - 1 if direction < 0 else 0
        else:
            i = self.current_match - buf.dropped + direction
        while 0 <= i < n:
            if needle in lines[i].lower():
                self.current_match = buf.dropped + i
                self.follow = False
                self._programmatic = True
                try:
                    height = self.scrollable_content_region.height
                    self.scroll_to(y=max(0, i - height // 2), animate=False, immediate=True)
                finally:
                    self._programmatic = False
                self.refresh()
                return True
            i += direction
        self.app.bell()
        return False

    # -- rendering --------------------------------------------------------------------------------
    def render_lines(self, crop: Region) -> list[Strip]:
        self._base = self.rich_style  # the same for every line of one render (costly to work out)
        try:
            return super().render_lines(crop)
        finally:
            self._base = None

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self._base or self.rich_style
        buf = self.buffer
        idx = scroll_y + y
        if buf is None or idx >= len(buf.lines):
            if y == 0 and self.waiting and (buf is None or not buf.lines):
                text = Text(self.waiting, style="dim italic", no_wrap=True, end="")
                segments = [Segment(s.text, base + s.style if s.style else base)
                            for s in text.render(self.app.console)]
                return Strip(segments).crop_extend(0, width, base)
            return Strip.blank(width, base)
        absolute = buf.dropped + idx  # a line's number in the log: its text never changes
        key = (id(buf), scroll_x, width, base, self.pattern, self.current_match if self.pattern else None)
        if key != self._strips_key:
            self._strips.clear()
            self._strips_key = key
        strip = self._strips.get(absolute)
        if strip is None:
            strip = self._render_text_line(buf.lines[idx], absolute, base, scroll_x, width)
            if len(self._strips) >= LINE_CACHE:
                del self._strips[next(iter(self._strips))]  # the one kept longest
            self._strips[absolute] = strip
        return strip.apply_offsets(scroll_x, idx)

    def _render_text_line(self, line: str, absolute: int, base: Style, scroll_x: int, width: int) -> Strip:
        """One line of the log as drawn: control characters out, errors red, matches marked."""
        self.lines_rendered += 1
        raw = CONTROL_RE.sub("", line.expandtabs(4))[:MAX_WIDTH]
        text = Text(raw, no_wrap=True, end="")
        if ERROR_RE.search(raw):
            text.stylize(ERROR_STYLE)
        if self.pattern:
            style = CURRENT_STYLE if absolute == self.current_match else MATCH_STYLE
            lower, needle = raw.lower(), self.pattern.lower()
            start = lower.find(needle)
            while start >= 0 and needle:
                text.stylize(style, start, start + len(needle))
                start = lower.find(needle, start + len(needle))
        segments = [Segment(s.text, base + s.style if s.style else base)
                    for s in text.render(self.app.console)]
        return Strip(segments).crop_extend(scroll_x, scroll_x + width, base)
