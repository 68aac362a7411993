"""Run list: every host's runs with status, age, config, parameters, world size, parent. A run
over several hosts is one row: its hosts joined with "+", the status of the merged run."""

from __future__ import annotations

import os
from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from nsa_tui.app.state import PanelState, RunState
from nsa_tui.app.widgets.header import STATUS_STYLE
from nsa_tui.fmt import NA, fmt_count, fmt_duration
from nsa_tui.multihost import MergedRun, hosts_of

COLUMNS = (("status", 8), ("name", 14), ("age", 6), ("params", 7), ("world", 5), ("config", 18),
           ("parent", 18))


def row_key(run: RunState) -> str:
    return f"{run.host}\x1f{run.run_id}"


def clip(text: str, width: int) -> str:
    """Keep the end of long names visible (run ids differ at the end)."""
    return text if len(text) <= width else "…" + text[-(width - 1):]


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
        self._multi_host = False
        self._suppress = False
        self._keys: tuple = ()
        self._rows: list = []
        self._column_keys: list[str] = []

    def on_mount(self) -> None:
        self._columns(False)

    def _columns(self, multi_host: bool) -> None:
        self.clear(columns=True)
        self._multi_host = multi_host
        self._keys = ()
        self._column_keys = (["host"] if multi_host else []) + [name for name, _ in COLUMNS]
        if multi_host:
            self.add_column("host", key="host", width=10)
        # fixed widths: the layout does not jump as runs come and go
        for name, width in COLUMNS:
            self.add_column(name, key=name, width=width)

    def update_from(self, state: PanelState, now: float) -> None:
        """Rebuild rows when the set of runs or their shown fields change."""
        runs = state.all_runs()
        multi = len(state.hosts) > 1
        rows = [self._row(r, now, multi, state.merged(r) if hosts_of(r.view) else None) for r in runs]
        signature = (multi, tuple(row_key(r) for r in runs), tuple(tuple(map(str, row)) for row in rows))
        if signature == self._signature:
            self._follow_selection(state)
            return
        keys = tuple(row_key(r) for r in runs)
        if multi == self._multi_host and keys == self._keys:
            # same runs in the same order: change the cells that changed, no rebuild, no re-layout
            for key, row, old in zip(keys, rows, self._rows):
                for col, (value, before) in enumerate(zip(row, old)):
                    if str(value) != str(before):
                        self.update_cell(key, self._column_keys[col], value)
            self._rows = rows
            self._signature = signature
            self._follow_selection(state)
            return
        self._signature = signature
        self._keys, self._rows = keys, rows
        if multi != self._multi_host:
            self._columns(multi)
        self._suppress = True
        try:
            self.clear()
            for run, row in zip(runs, rows):
                self.add_row(*row, key=row_key(run))
            selected = state.selected_run()
            if selected is not None:
                key = row_key(selected)
                try:
                    self.move_cursor(row=self.get_row_index(key), animate=False)
                except Exception:
                    pass
        finally:
            self.call_after_refresh(self._unsuppress)

    def _follow_selection(self, state: PanelState) -> None:
        """Put the cursor on the selected run when the app selected it (fallback, resume)."""
        selected = state.selected_run()
        if selected is None or not self.row_count:
            return
        key = row_key(selected)
        try:
            index = self.get_row_index(key)
        except Exception:
            return
        if index != self.cursor_row:
            self._suppress = True
            self.move_cursor(row=index, animate=False)
            self.call_after_refresh(self._unsuppress)

    def _unsuppress(self) -> None:
        self._suppress = False

    @staticmethod
    def _row(run: RunState, now: float, multi: bool, merged: MergedRun | None = None) -> list:
        """Cells as Text: names and paths from a host are never parsed as markup. ``merged``: the
        run over several hosts that ``run`` is rank 0's part of."""
        view = run.view
        started = run.created or None
        age = fmt_duration(now - started) if started else NA
        config = None
        if view is not None:
            config = view.info.config_path or (view.launch.config_file if view.launch else None)
        config = os.path.basename(str(config)) if config else NA
        info = view.info if view else None
        status = merged.status.value if merged is not None else run.status.value
        row = [Text(status, style=STATUS_STYLE.get(status, "")), Text(clip(run.name, 14)), Text(age),
               Text(fmt_count(info.param_count) if info else NA), Text(str(info.world_size) if info else NA),
               Text(clip(config, 18)), Text(clip(run.parent_run or "", 18))]
        if multi:
            row.insert(0, Text("+".join(merged.hosts) if merged is not None else run.host))
        return row

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self._suppress or event.row_key is None or event.row_key.value is None:
            return
        host, _, run_id = str(event.row_key.value).partition("\x1f")
        self.post_message(self.Selected(host, run_id))
