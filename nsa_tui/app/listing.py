"""Which runs the run list shows, in which rows: the filter, the archive, lineages folded.

Pure (no Textual): the run list widget draws what ``run_rows`` returns. Why: with dozens of
runs the list must stay short. A run and its fallbacks and resumes are one entry (its newest
run, with how many older ones it folds) that unfolds on a key; archived runs are hidden
unless the filter asks for them; the filter picks statuses and name words.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nsa.contract import RunStatus
from nsa_tui.app.state import PanelState, RunKey, RunState

STATUS_WORDS = {s.value for s in RunStatus}
FILTER_HELP = ("words match a run's name, id or host; status words (running, crashed, finished, …) "
               "pick statuses, 'alive' / 'ended' the live or ended ones; 'archived' shows archived runs too")


@dataclass
class RunFilter:
    """A parsed filter: statuses (any of), liveness, words (all of), archived shown or not."""

    statuses: set[str] = field(default_factory=set)
    alive: bool | None = None
    words: list[str] = field(default_factory=list)
    archived: bool = False

    def matches(self, run: RunState) -> bool:
        if run.view is not None and run.view.archived and not self.archived:
            return False
        if self.statuses and run.status.value not in self.statuses:
            return False
        if self.alive is not None and run.alive != self.alive:
            return False
        text = f"{run.name} {run.run_id} {run.host}".lower()
        return all(w in text for w in self.words)


def parse_filter(text: str) -> RunFilter:
    """``"running nsa"``: running runs whose name has "nsa" (see FILTER_HELP)."""
    f = RunFilter()
    for word in text.lower().split():
        if word in STATUS_WORDS:
            f.statuses.add(word)
        elif word in ("alive", "live"):
            f.alive = True
        elif word in ("ended", "dead"):
            f.alive = False
        elif word in ("archived", "all"):
            f.archived = True
        else:
            f.words.append(word)
    return f


@dataclass
class Row:
    """One line of the run list: a run, its indent, and how many runs of its lineage it folds."""

    run: RunState
    root: RunKey  # the lineage's first run (what unfolds it)
    depth: int = 0  # 0: an entry; 1: an older run of an unfolded lineage
    folded: int = 0  # older runs of its lineage hidden in this entry
    expanded: bool = False


def lineage_root(state: PanelState, run: RunState) -> RunKey:
    """The first run of ``run``'s lineage (parents followed on its host)."""
    cur, seen = run, {run.run_id}
    while (parent := state.parent_of(cur)) is not None and parent.run_id not in seen:
        seen.add(parent.run_id)
        cur = parent
    return cur.key


def run_rows(state: PanelState) -> list[Row]:
    """The rows to draw, newest entry first. A lineage is shown by its newest run that passes
    the filter; unfolded (or when the selected run is an older one of it) its other runs
    follow, indented."""
    f = parse_filter(state.view.filter)
    runs = [r for r in state.all_runs() if f.matches(r)]
    groups: dict[RunKey, list[RunState]] = {}
    for r in runs:  # newest first, so each group's first run is its newest
        groups.setdefault(lineage_root(state, r), []).append(r)
    rows: list[Row] = []
    for root, members in groups.items():
        selected_inside = any(m.key == state.selected for m in members[1:])
        expanded = len(members) > 1 and (root in state.view.expanded or selected_inside)
        rows.append(Row(members[0], root, 0, 0 if expanded else len(members) - 1, expanded))
        if expanded:
            rows += [Row(m, root, 1) for m in members[1:]]
    return rows


def shown_selection(state: PanelState, rows: list[Row]) -> RunKey | None:
    """What should be selected so that the header, summary, charts and log show a run the list
    shows: the selected run while the list shows it (or while it is not listed yet: a run just
    launched), else the first alive run of ``rows``, else their first, else nothing. Why: a
    filter (``failed``) or an archive hid the selected run and the panes went on showing it."""
    selected = state.selected_run()
    if selected is not None and (selected.view is None or any(r.run is selected for r in rows)):
        return state.selected
    pick = next((r.run for r in rows if r.run.alive), rows[0].run if rows else None)
    return pick.key if pick is not None else None


def counts(state: PanelState) -> tuple[int, int]:
    """(runs shown by the filter, runs known): for the list's title."""
    f = parse_filter(state.view.filter)
    every = state.all_runs()
    return sum(f.matches(r) for r in every), len(every)
