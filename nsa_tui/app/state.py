"""Plain-data state of the panel: what the reducer (reducer.py) writes, what the widgets draw.

Nothing here does I/O or knows Textual, so snapshot tests fill it with fixed records. It is
bounded: the log is a ring, metrics are the contract's bucketed summaries plus a short
window at full resolution, so a week-long run costs the same memory as an hour. The
records are the contract's (nsa.contract): a run's ``view`` is exactly what its agent said.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nsa.contract import Alert, Beat, Hello, HostSample, MetricsFolder, RunStatus, RunView, TrainMetric
from nsa.contract.protocol import Gap
from nsa.contract.records import Metric
from nsa.contract.series import metric_values
from nsa_tui.multihost import MergedRun, Part, hosts_of, merge, primary_of

LOG_LINES_MAX = 20_000
SERIES_POINTS_MAX = 2_048
RECENT_POINTS = 512  # metric lines kept at full resolution (the newest part of a chart)


def thin(steps: list[float], values: list[float], width: int) -> tuple[list[float], list[float]]:
    """Reduce to about `width` points (bucket means) so a plot redraw stays cheap."""
    n = len(steps)
    if width <= 0 or n <= width:
        return steps, values
    size = n / width
    out_s: list[float] = []
    out_v: list[float] = []
    for b in range(width):
        lo, hi = int(b * size), max(int((b + 1) * size), int(b * size) + 1)
        out_s.append(steps[min(hi, n) - 1])
        chunk = values[lo:hi]
        out_v.append(sum(chunk) / len(chunk))
    return out_s, out_v


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


class RunMetrics:
    """A run's metrics as the panel holds them: every series bucketed over the whole run (the
    agent's summary, extended by live lines) and the newest lines at full resolution."""

    def __init__(self) -> None:
        self.folder = MetricsFolder(cap=SERIES_POINTS_MAX)
        self.recent: deque[Metric] = deque(maxlen=RECENT_POINTS)
        self.last_train: TrainMetric | None = None
        self.count = 0  # lines taken (a redraw signature)

    def add(self, m: Metric) -> None:
        self.folder.add(m)
        self.recent.append(m)
        if isinstance(m, TrainMetric) and (self.last_train is None or m.step >= self.last_train.step):
            self.last_train = m
        self.count += 1

    def series(self, name: str) -> tuple[list[float], list[float]]:
        """(steps, values) of one series: bucket means before the recent window, then every
        recent point."""
        recent = [(m.step, v) for m in self.recent for k, v in metric_values(m) if k == name]
        first = recent[0][0] if recent else None
        steps: list[float] = []
        values: list[float] = []
        s = self.folder.series.get(name)
        for b in s.buckets if s is not None else []:
            if first is not None and b.last >= first:
                break
            mean = b.mean
            if mean is not None:
                steps.append(b.last)
                values.append(mean)
        for step, v in recent:
            if v == v and abs(v) != float("inf") and (not steps or step > steps[-1]):
                steps.append(step)
                values.append(v)
        return steps, values


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
    offsets: dict[str, int] = field(default_factory=dict)
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


@dataclass
class PanelState:
    """The whole panel: hosts, the selected run, alerts, and the clock."""

    hosts: dict[str, HostState] = field(default_factory=dict)
    selected: tuple[str, str] | None = None
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

    # -- runs over several hosts (nsa_tui/multihost.py merges their parts) ----------------------
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

    def parent_of(self, run: RunState) -> RunState | None:
        parent = run.parent_run
        if not parent or run.host not in self.hosts:
            return None
        return self.hosts[run.host].runs.get(parent)

    def chart_series(self, run: RunState, name: str) -> tuple[list[float], list[float]]:
        """A run's series, preceded by its ancestors' points up to where it resumed.

        A fallback run resumes from its parent's checkpoint, so its chart continues from
        the parent's steps instead of starting over.
        """
        steps, values = run.metrics.series(name)
        seen = {run.run_id}
        cur = run
        while (parent := self.parent_of(cur)) is not None and parent.run_id not in seen:
            seen.add(parent.run_id)
            p_steps, p_values = parent.metrics.series(name)
            first = steps[0] if steps else float("inf")
            keep = [i for i, s in enumerate(p_steps) if s < first]
            steps = [p_steps[i] for i in keep] + steps
            values = [p_values[i] for i in keep] + values
            cur = parent
        return steps, values

    def open_alerts(self) -> list[Alert]:
        """Unacknowledged alerts, newest first."""
        return [a for a in self.alerts if a.key not in self.acked]
