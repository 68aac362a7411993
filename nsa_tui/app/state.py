"""Plain-data state of the panel: what the reducer (reducer.py) writes, what the widgets draw.

Nothing here does I/O or knows Textual, so snapshot tests fill it with fixed records. It
holds the records (hosts, runs, the user's view choices, alerts) and the queries that read
across them (a run over several hosts merged, a chart continued through a run's ancestors,
the alerts pane's list). It is bounded: the log is a ring, and a run's metrics are kept as
chart points by runmetrics.py. The records are the contract's (nsa.contract): a run's
``view`` is exactly what its agent said.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nsa.contract import (
    Alert,
    Beat,
    Hello,
    HostSample,
    RunStatus,
    RunView,
    StreamPos,
)
from nsa.contract.protocol import Gap
from nsa.contract.replies import AlertState
from nsa_tui.app.runmetrics import Points, RunMetrics
from nsa_tui.hosts.merge import MergedRun, Part, hosts_of, merge, primary_of

LOG_LINES_MAX = 20_000


class LogBuffer:
    """Bounded log lines with a running total, so a view knows how many are new."""

    def __init__(self, maxlen: int = LOG_LINES_MAX) -> None:
        self.lines: deque[str] = deque(maxlen=maxlen)
        self.total = 0

    def append_many(self, lines: list[str]) -> None:
        """Append complete lines and count them."""
        self.lines.extend(lines)
        self.total += len(lines)

    @property
    def dropped(self) -> int:
        """Lines that fell off the front of the ring."""
        return self.total - len(self.lines)


@dataclass(eq=False)
class RunState:
    """Everything the panel knows about one run on one host."""

    host: str
    run_id: str
    view: RunView | None = None
    metrics: RunMetrics = field(default_factory=RunMetrics)
    log: LogBuffer = field(default_factory=LogBuffer)
    log_gap: Gap | None = None  # the start of train.log that was not sent (its tail is shown)
    beats: dict[int, Beat] = field(default_factory=dict)
    offsets: dict[str, StreamPos] = field(default_factory=dict)  # where a re-watch continues each stream
    synced: bool = False
    version: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.host, self.run_id)

    @property
    def status(self) -> RunStatus:
        return self.view.status if self.view is not None else RunStatus.UNKNOWN

    @property
    def alive(self) -> bool:
        return self.view.alive if self.view is not None else False

    @property
    def name(self) -> str:
        return self.view.name if self.view is not None else self.run_id

    @property
    def parent_run(self) -> str | None:
        return self.view.parent_run if self.view is not None else None

    @property
    def step(self) -> int:
        """The newest step known: run.json (rewritten every ~10 s), beats and metrics (live)."""
        steps = [self.view.info.step if self.view else 0, *(b.step for b in self.beats.values())]
        if self.metrics.last_train is not None:
            steps.append(self.metrics.last_train.step)
        return max(steps)

    @property
    def created(self) -> float:
        return self.view.created if self.view is not None else 0.0

    def phase(self) -> tuple[str | None, float | None]:
        """The phase of the slowest rank (lowest step) and when it began."""
        if not self.beats:
            return None, None
        beat = min(self.beats.values(), key=lambda b: (b.step, b.ts))
        return beat.phase.value, beat.phase_since

    def newest_beat_ts(self) -> float | None:
        return max((b.ts for b in self.beats.values()), default=None)


@dataclass(eq=False)
class HostState:
    """One destination: its connection, hello, runs and latest host sample."""

    dest: str
    conn: str = "connecting"
    retry_at: float | None = None
    detail: str = ""  # why it is not connected (the last error), or the agent's notes
    hello: Hello | None = None
    runs: dict[str, RunState] = field(default_factory=dict)
    sample: HostSample | None = None
    runs_loaded: bool = False
    recorded: dict[tuple[str, str], AlertState] = field(default_factory=dict)  # (run, id): alerts.jsonl
    alerts_loaded: bool = False

    @property
    def label(self) -> str:
        return self.hello.host if self.hello is not None and self.hello.host else self.dest

    @property
    def gpu_count(self) -> int:
        return self.hello.gpus if self.hello is not None else 0

    def run(self, run_id: str) -> RunState:
        if run_id not in self.runs:
            self.runs[run_id] = RunState(host=self.dest, run_id=run_id)
        return self.runs[run_id]


RunKey = tuple[str, str]  # (host, run id)
STALL_KINDS = frozenset({"stall", "no_heartbeat"})  # alerts that say a rank of a live run is frozen
DEFAULT_CHARTS = ("loss", "tokens_per_s")


@dataclass
class ViewState:
    """What the user chose to look at: the panel's own choices, not facts from a host. The
    charts and the x axis persist between sessions (viewprefs.py)."""

    marks: list[RunKey] = field(default_factory=list)  # runs to compare, in the order marked
    compare: bool = False  # the charts overlay the marked runs
    x_axis: str = "step"  # "step" | "tokens"
    charts: tuple[str, ...] = DEFAULT_CHARTS  # chart kinds shown (app/chartdata.py)
    filter: str = ""  # the run list's filter (app/listing.py)
    expanded: set[RunKey] = field(default_factory=set)  # lineages shown unfolded (by their root)


@dataclass
class ShownAlert:
    """An alert as the panel lists it: recorded on the host (alerts.jsonl, ``id`` set) or
    detected by the panel itself for a run without a watchdog (``id`` None)."""

    dest: str
    alert: Alert
    state: str  # open | acknowledged | resolved
    raised_at: float | None = None
    resolved_at: float | None = None
    id: str | None = None

    @property
    def key(self) -> str:
        return recorded_key(self.dest, self.alert.run, self.id) if self.id else self.alert.key


def recorded_key(dest: str, run: str | None, alert_id: str) -> str:
    return f"{dest}|{run}|#{alert_id}"


@dataclass
class PanelState:
    """The whole panel: hosts, the selected run, alerts, what the user chose to see, the clock."""

    hosts: dict[str, HostState] = field(default_factory=dict)
    selected: tuple[str, str] | None = None
    view: ViewState = field(default_factory=ViewState)
    alerts: list[Alert] = field(default_factory=list)
    acked: set[str] = field(default_factory=set)
    announced: set[str] = field(default_factory=set)  # alerts already toasted and rung
    clock: Callable[[], float] = time.time
    version: int = 0

    @classmethod
    def for_destinations(cls, destinations: list[str], clock: Callable[[], float] = time.time) -> PanelState:
        return cls(hosts={d: HostState(dest=d) for d in destinations}, clock=clock)

    def host(self, dest: str) -> HostState:
        if dest not in self.hosts:
            self.hosts[dest] = HostState(dest=dest)
        return self.hosts[dest]

    def selected_run(self) -> RunState | None:
        """The selected run; of a run over several hosts, its part with rank 0 (run.json,
        metrics, the loss curve), whichever host's part was selected."""
        if self.selected is None:
            return None
        host, run_id = self.selected
        h = self.hosts.get(host)
        run = h.runs.get(run_id) if h else None
        return self.main_part(run) if run is not None else None

    # -- runs over several hosts (nsa_tui/hosts/merge.py merges their parts) ----------------------
    def parts_of(self, run: RunState) -> list[RunState]:
        """The parts of ``run`` on every host this panel knows, in node order; [run] for a
        run on one host."""
        if not hosts_of(run.view):
            return [run]
        found = [h.runs[run.run_id] for h in self.hosts.values()
                 if run.run_id in h.runs and h.runs[run.run_id].view is not None]
        order = hosts_of(run.view)
        return sorted(found, key=lambda r: order.index(r.host) if r.host in order else len(order))

    def merged(self, run: RunState) -> MergedRun:
        """The run as one: its parts merged, a host that is not connected shown as lost."""
        parts = []
        for r in self.parts_of(run):
            host = self.hosts.get(r.host)
            up = host is not None and host.conn == "connected"
            parts.append(Part(host=r.host, view=r.view, beats=list(r.beats.values()), reachable=up,
                              why="" if up else (host.detail if host else "") or (host.conn if host else "")))
        known = {p.host for p in parts}
        for name in hosts_of(run.view):
            if name not in known and name not in self.hosts:  # a host of the run this panel does not watch
                parts.append(Part(host=name, reachable=False, why="not connected in this panel"))
        return merge(run.run_id, parts)

    def main_part(self, run: RunState) -> RunState:
        """The part with rank 0 of a run over several hosts (itself for a run on one host)."""
        parts = self.parts_of(run)
        if len(parts) == 1:
            return run
        main = primary_of([Part(host=r.host, view=r.view, beats=list(r.beats.values())) for r in parts])
        return next(r for r in parts if r.host == main.host)

    def current_host(self) -> HostState | None:
        if self.selected and self.selected[0] in self.hosts:
            return self.hosts[self.selected[0]]
        return next(iter(self.hosts.values()), None)

    def all_runs(self) -> list[RunState]:
        """Runs of every host that the agents reported, newest first; a run over several hosts
        once (its part with rank 0)."""
        runs = [r for h in self.hosts.values() for r in h.runs.values() if r.view is not None]
        out, seen = [], set()
        for r in runs:
            if hosts_of(r.view):
                if r.run_id in seen:
                    continue
                seen.add(r.run_id)
                r = self.main_part(r)
            out.append(r)
        return sorted(out, key=lambda r: -r.created)

    def run_by_key(self, key: RunKey) -> RunState | None:
        h = self.hosts.get(key[0])
        return h.runs.get(key[1]) if h else None

    def marked_runs(self) -> list[RunState]:
        """The marked runs the hosts still have, in the order they were marked."""
        return [r for r in map(self.run_by_key, self.view.marks) if r is not None and r.view is not None]

    def parent_of(self, run: RunState) -> RunState | None:
        parent = run.parent_run
        if not parent or run.host not in self.hosts:
            return None
        return self.hosts[run.host].runs.get(parent)

    def chart_series(self, run: RunState, name: str) -> tuple[list[float], list[float]]:
        """(steps, means) of :meth:`chart_points`."""
        p = self.chart_points(run, name)
        return p.x, p.y

    def chart_points(self, run: RunState, name: str) -> Points:
        """A run's series, preceded by its ancestors' points up to where it resumed.

        A fallback run resumes from its parent's checkpoint, so its chart continues from
        the parent's steps instead of starting over.
        """
        p = run.metrics.points(name)
        seen = {run.run_id}
        cur = run
        while (parent := self.parent_of(cur)) is not None and parent.run_id not in seen:
            seen.add(parent.run_id)
            first = p.x[0] if p.x else float("inf")
            p = parent.metrics.points(name).before(first).then(p)
            cur = parent
        return p

    def stalled_ranks(self, run: RunState) -> list[int | None]:
        """The ranks of ``run`` that an unresolved stall or no_heartbeat alert names (recorded by
        a host's watchdog or raised by the panel; acknowledged ones too: the rank is still
        frozen), in order; None: an alert that names no rank. Why: the header showed a calm ETA
        while a rank was frozen. A scan of this run's hosts' alerts, once per header redraw."""
        hosts = set(hosts_of(run.view)) or {run.host}
        ranks: set[int | None] = set()
        for dest in hosts:
            host = self.hosts.get(dest)
            for st in host.recorded.values() if host is not None else ():
                if st.run == run.run_id and st.state != "resolved" and st.alert.kind in STALL_KINDS:
                    ranks.add(st.alert.rank)
        ranks |= {a.rank for a in self.alerts
                  if a.run == run.run_id and a.host in hosts and a.kind in STALL_KINDS}
        return sorted(ranks, key=lambda r: -1 if r is None else r)

    def open_alerts(self) -> list[Alert]:
        """Unacknowledged, unresolved alerts of both kinds, newest first."""
        return [s.alert for s in self.shown_alerts() if s.state == "open"]

    def shown_alerts(self, history: int = 50) -> list[ShownAlert]:
        """What the alerts pane lists: open ones (newest first), then acknowledged ones still
        unresolved, then the newest ``history`` resolved ones (newest first)."""
        recorded = [ShownAlert(dest, st.alert, st.state, st.raised_at, st.resolved_at, st.id)
                    for dest, h in self.hosts.items() for st in h.recorded.values()]
        mine = [ShownAlert(a.host, a, "acknowledged" if a.key in self.acked else "open") for a in self.alerts]
        # the panel's own alerts (no time of their own) come first in their order: they are live
        newest = sorted(recorded, key=lambda s: -(s.raised_at or 0.0))
        by_state = {st: [s for s in mine if s.state == st] + [s for s in newest if s.state == st]
                    for st in ("open", "acknowledged", "resolved")}
        return by_state["open"] + by_state["acknowledged"] + by_state["resolved"][:history]
