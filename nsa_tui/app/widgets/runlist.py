"""Run list: every host's runs as app/listing.py folds and filters them, with marks, status,
name (cut in the middle), age, parameters, world size, config and parent. A run over several
hosts is one row: its hosts joined with "+", the status of the merged run."""

from __future__ import annotations

import os
from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from nsa_tui.app.chartdata import PALETTE
from nsa_tui.app.listing import Row, counts, lineage_root, run_rows
from nsa_tui.app.state import PanelState, RunState
from nsa_tui.app.widgets.header import STATUS_STYLE, clip
from nsa_tui.fmt import NA, fmt_age, fmt_count
from nsa_tui.hosts.merge import MergedRun, hosts_of

# (column, width); the name's width follows the pane's (NAME_MIN..NAME_MAX)
COLUMNS = (("", 1), ("status", 8), ("name", 0), ("age", 6), ("params", 7), ("world", 5), ("config", 16),
           ("parent", 16))
NAME_MIN, NAME_MAX = 12, 40


def row_key(run: RunState) -> str:
    return f"{run.host}\x1f{run.run_id}"


def name_width(pane_width: int, multi_host: bool) -> int:
    """The name column's width: what the pane leaves after every other column when they all
    fit beside a name of 20, else after mark, status and age (cell padding 2, scrollbar 2)."""
    host = 12 if multi_host else 0
    every = sum(w + 2 for name, w in COLUMNS if name != "name") + 2 + host
    if pane_width - every >= 20:
        return min(NAME_MAX, pane_width - every)
    fixed = sum(w + 2 for name, w in COLUMNS if name in ("", "status", "age")) + 2 + host
    return max(NAME_MIN, min(NAME_MAX, pane_width - fixed - 1))


def cell_sig(t: Text) -> tuple:
    """What a cell shows, styles included (a mark's colour)."""
    return t.plain, str(t.style), tuple((s.start, s.end, str(s.style)) for s in t.spans)


def name_cell(row: Row, width: int) -> Text:
    """The name with its place in the lineage: '▾' an unfolded lineage, '└' an older run of
    it, '+N' the older runs a folded entry holds."""
    prefix = "└ " if row.depth else ("▾ " if row.expanded else "")
    suffix = f" +{row.folded}" if row.folded else ""
    t = Text(prefix, style="dim")
    t.append(clip(row.run.name, max(4, width - len(prefix) - len(suffix))))
    t.append(suffix, style="bold magenta")
    return t


def mark_of(state: PanelState, row: Row) -> tuple[int, bool] | None:
    """(index among the marks, the row's own run) of the row's run, else of a marked run its
    folded entry holds, else None."""
    marks = state.view.marks
    if row.run.key in marks:
        return marks.index(row.run.key), True
    if row.folded:
        for i, key in enumerate(marks):
            run = state.run_by_key(key)
            if run is not None and key[0] == row.run.host and lineage_root(state, run) == row.root:
                return i, False
    return None


class RunList(DataTable):
    """A table of runs; moving the cursor selects the run everything else shows."""

    class Selected(Message):
        """The user moved to another run."""

        def __init__(self, host: str, run_id: str) -> None:
            super().__init__()
            self.host = host
            self.run_id = run_id

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._signature: tuple = ()
        self._layout: tuple = ()
        self._suppress = False
        self._keys: tuple = ()
        self._rows: list = []
        self._column_keys: list[str] = []
        self.rows_shown: list[Row] = []
        self._title_shown = ""

    def on_mount(self) -> None:
        self._columns(False, NAME_MIN)

    def _columns(self, multi_host: bool, name_w: int) -> None:
        self.clear(columns=True)
        self._layout = (multi_host, name_w)
        self._keys = ()
        self._column_keys = (["host"] if multi_host else []) + [name or "mark" for name, _ in COLUMNS]
        if multi_host:
            self.add_column("host", key="host", width=10)
        # fixed widths: the layout does not jump as runs come and go
        for name, width in COLUMNS:
            self.add_column(name, key=name or "mark", width=width or name_w)

    def update_from(self, state: PanelState, now: float, listed: list[Row] | None = None) -> None:
        """Rebuild rows when the set of rows or their shown fields change; ``listed``: run_rows(state)
        when the caller has them already."""
        rows_shown = run_rows(state) if listed is None else listed
        self.rows_shown = rows_shown
        multi = len(state.hosts) > 1
        name_w = name_width(self.content_region.width or self.size.width, multi)
        rows = [self._row(r, now, multi, name_w, mark_of(state, r),
                          state.merged(r.run) if hosts_of(r.run.view) else None) for r in rows_shown]
        keys = tuple(row_key(r.run) for r in rows_shown)
        signature = ((multi, name_w), keys, tuple(tuple(map(cell_sig, row)) for row in rows))
        self._title(state)
        if signature == self._signature:
            self._follow_selection(state)
            return
        if (multi, name_w) == self._layout and keys == self._keys:
            # same runs in the same order: change the cells that changed, no rebuild, no re-layout
            for key, row, old in zip(keys, rows, self._rows):
                for col, (value, before) in enumerate(zip(row, old)):
                    if cell_sig(value) != cell_sig(before):
                        self.update_cell(key, self._column_keys[col], value)
            self._rows = rows
            self._signature = signature
            self._follow_selection(state)
            return
        self._signature = signature
        if (multi, name_w) != self._layout:
            self._columns(multi, name_w)
        self._keys, self._rows = keys, rows
        self._suppress = True
        try:
            self.clear()
            for shown, cells in zip(rows_shown, rows):
                self.add_row(*cells, key=row_key(shown.run))
            selected = state.selected_run()  # of a run over several hosts: its row's part
            if selected is not None:
                key = row_key(selected)
                if key in keys:
                    self.move_cursor(row=self.get_row_index(key), animate=False)
        finally:
            self.call_after_refresh(self._unsuppress)

    def _title(self, state: PanelState) -> None:
        shown, total = counts(state)
        title = f"runs {shown}/{total}" if shown != total else "runs"
        if state.view.filter:
            title += f" · filter: {state.view.filter}"
        if state.view.marks:
            title += f" · {len(state.view.marks)} marked"
        if title != self._title_shown:  # setting a title redraws the table: only when it changed
            self._title_shown = title
            self.border_title = Text(title)

    def _follow_selection(self, state: PanelState) -> None:
        """Put the cursor on the selected run when the app selected it (fallback, resume)."""
        selected = state.selected_run()
        if selected is None or not self.row_count:
            return
        key = row_key(selected)
        if key not in self._keys:
            return
        index = self.get_row_index(key)
        if index != self.cursor_row:
            self._suppress = True
            self.move_cursor(row=index, animate=False)
            self.call_after_refresh(self._unsuppress)

    def _unsuppress(self) -> None:
        self._suppress = False

    @staticmethod
    def _row(row: Row, now: float, multi: bool, name_w: int, mark: tuple[int, bool] | None,
             merged: MergedRun | None = None) -> list:
        """Cells as Text: names and paths from a host are never parsed as markup. ``merged``: the
        run over several hosts that ``row.run`` is rank 0's part of."""
        run = row.run
        view = run.view
        started = run.created or None
        age = fmt_age(now - started) if started else NA
        config = None
        if view is not None:
            config = view.info.config_path or (view.launch.config_file if view.launch else None)
        config = os.path.basename(str(config)) if config else NA
        info = view.info if view else None
        status = merged.status.value if merged is not None else run.status.value
        c = PALETTE[mark[0] % len(PALETTE)] if mark is not None else None
        dot = "●" if mark is not None and mark[1] else "○"  # ○: a marked run folded in this entry
        cells = [Text(dot, style=f"bold rgb({c[0]},{c[1]},{c[2]})") if c else Text(" "),
                 Text(status, style=STATUS_STYLE.get(status, "")),
                 name_cell(row, name_w), Text(age), Text(fmt_count(info.param_count) if info else NA),
                 Text(str(info.world_size) if info else NA),
                 Text(clip(config, 16)), Text(clip(run.parent_run or "", 16))]
        if view is not None and view.archived:
            cells[1] = Text(status, style="dim strike")
        if multi:
            cells.insert(0, Text("+".join(merged.hosts) if merged is not None else run.host))
        return cells

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self._suppress or event.row_key is None or event.row_key.value is None:
            return
        host, _, run_id = str(event.row_key.value).partition("\x1f")
        self.post_message(self.Selected(host, run_id))
