"""Plain-data state of the panel: what the services learn, what the widgets draw.

Services (workers owning a HostClient) append to these objects; a UI timer redraws
from them at most ~10x/s. Keeping this layer free of Textual makes it cheap to fill with
deterministic data for snapshot tests, and bounded: every growing thing is a ring
buffer or a downsampling series, so a week-long run costs the same memory as an hour.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LOG_LINES_MAX = 20_000
SERIES_POINTS_MAX = 2_048
ALIVE_STATUSES = ("starting", "running", "stopping")


class Series:
    """A (step, value) series that keeps at most `cap` points by averaging neighbours.

    When full, adjacent pairs are merged and the bucket width doubles, so a million
    appended steps cost `cap` points and O(1) amortised work per append.
    """

    def __init__(self, cap: int = SERIES_POINTS_MAX) -> None:
        self.cap = max(4, cap)
        self.steps: list[float] = []
        self.values: list[float] = []
        self.stride = 1
        self._acc_n = 0
        self._acc_step = 0.0
        self._acc_sum = 0.0
        self.count = 0
        self.last_step: float | None = None

    def append(self, step: float, value: float) -> None:
        """Add one raw point; steps must not go backwards (older duplicates are dropped)."""
        if self.last_step is not None and step <= self.last_step:
            return
        self.last_step = step
        self.count += 1
        self._acc_n += 1
        self._acc_step = step
        self._acc_sum += value
        if self._acc_n >= self.stride:
            self.steps.append(self._acc_step)
            self.values.append(self._acc_sum / self._acc_n)
            self._acc_n, self._acc_sum = 0, 0.0
            if len(self.steps) >= self.cap:
                self._halve()

    def _halve(self) -> None:
        steps, values = self.steps, self.values
        self.steps = [steps[i + 1] for i in range(0, len(steps) - 1, 2)]
        self.values = [(values[i] + values[i + 1]) / 2 for i in range(0, len(values) - 1, 2)]
        if len(steps) % 2:
            self.steps.append(steps[-1])
            self.values.append(values[-1])
        self.stride *= 2

    def points(self) -> tuple[list[float], list[float]]:
        """All stored points plus the partial bucket, oldest first."""
        steps, values = list(self.steps), list(self.values)
        if self._acc_n:
            steps.append(self._acc_step)
            values.append(self._acc_sum / self._acc_n)
        return steps, values

    def __len__(self) -> int:
        return len(self.steps) + (1 if self._acc_n else 0)


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
        self.partial = ""

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
    record: dict[str, Any] = field(default_factory=dict)
    loss: Series = field(default_factory=Series)
    val_loss: Series = field(default_factory=Series)
    tokens_per_s: Series = field(default_factory=Series)
    last_metric: dict[str, Any] = field(default_factory=dict)
    log: LogBuffer = field(default_factory=LogBuffer)
    heartbeats: dict[int, dict[str, Any]] = field(default_factory=dict)
    liveness: dict[str, Any] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    synced: bool = False
    version: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.host, self.run_id)

    @property
    def status(self) -> str:
        return str(self.record.get("status") or "unknown")

    @property
    def alive(self) -> bool:
        if "alive" in self.record:
            return bool(self.record["alive"])
        return self.status in ALIVE_STATUSES

    @property
    def name(self) -> str:
        return str(self.record.get("name") or self.run_id)

    def add_metric(self, data: dict[str, Any]) -> None:
        """Fold one metrics.jsonl line into the series."""
        kind = data.get("kind", "train")
        step = data.get("step")
        if step is None:
            return
        if kind == "train":
            if isinstance(data.get("loss"), (int, float)):
                self.loss.append(step, float(data["loss"]))
            if isinstance(data.get("tokens_per_s"), (int, float)):
                self.tokens_per_s.append(step, float(data["tokens_per_s"]))
            self.last_metric = data
            rec = self.record
            rec["step"] = max(int(step), int(rec.get("step") or 0))
            if data.get("tokens") is not None:
                rec["tokens"] = data["tokens"]
        elif kind == "eval" and isinstance(data.get("val_loss"), (int, float)):
            self.val_loss.append(step, float(data["val_loss"]))
        elif kind == "epoch":
            self.log.append_many([f"[epoch] {data.get('message', '')}"])
        self.version += 1

    def add_heartbeat(self, data: dict[str, Any]) -> None:
        rank = int(data.get("rank", 0))
        self.heartbeats[rank] = data
        self.version += 1

    def phase(self) -> tuple[str | None, float | None]:
        """The phase of the slowest rank (lowest step) and when it began."""
        if not self.heartbeats:
            return None, None
        beat = min(self.heartbeats.values(), key=lambda b: (b.get("step") or 0, b.get("ts") or 0))
        return beat.get("phase"), beat.get("phase_since")

    def newest_beat_ts(self) -> float | None:
        ts = [b.get("ts") for b in self.heartbeats.values() if b.get("ts")]
        return max(ts) if ts else None


@dataclass(eq=False)
class HostState:
    """One destination: its connection, hello, runs and latest host sample."""

    dest: str
    conn: str = "connecting"
    retry_at: float | None = None
    detail: str = ""
    hello: dict[str, Any] = field(default_factory=dict)
    runs: dict[str, RunState] = field(default_factory=dict)
    sample: dict[str, Any] = field(default_factory=dict)
    runs_loaded: bool = False

    @property
    def label(self) -> str:
        return str(self.hello.get("host") or self.dest)

    @property
    def gpu_count(self) -> int:
        try:
            return int(self.hello.get("gpus") or 0)
        except (TypeError, ValueError):
            return 0

    def run(self, run_id: str) -> RunState:
        if run_id not in self.runs:
            self.runs[run_id] = RunState(host=self.dest, run_id=run_id)
        return self.runs[run_id]


@dataclass
class PanelState:
    """The whole panel: hosts, the selected run, alerts, and the clock."""

    hosts: dict[str, HostState] = field(default_factory=dict)
    selected: tuple[str, str] | None = None
    alerts: list[Any] = field(default_factory=list)
    acked: set[str] = field(default_factory=set)
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
        if self.selected is None:
            return None
        host, run_id = self.selected
        h = self.hosts.get(host)
        return h.runs.get(run_id) if h else None

    def current_host(self) -> HostState | None:
        if self.selected and self.selected[0] in self.hosts:
            return self.hosts[self.selected[0]]
        return next(iter(self.hosts.values()), None)

    def all_runs(self) -> list[RunState]:
        """Runs of every host, newest first."""
        runs = [r for h in self.hosts.values() for r in h.runs.values()]
        return sorted(runs, key=lambda r: -(r.record.get("started_at")
                                            or (r.record.get("launch") or {}).get("created") or 0))

    def parent_of(self, run: RunState) -> RunState | None:
        parent = run.record.get("parent_run")
        if not parent:
            return None
        return self.hosts[run.host].runs.get(parent) if run.host in self.hosts else None

    def chart_series(self, run: RunState, name: str) -> tuple[list[float], list[float]]:
        """A run's series, preceded by its ancestors' points up to where it resumed.

        A fallback run resumes from its parent's checkpoint, so its chart continues from
        the parent's steps instead of starting over.
        """
        steps, values = getattr(run, name).points()
        seen = {run.run_id}
        cur = run
        while (parent := self.parent_of(cur)) is not None and parent.run_id not in seen:
            seen.add(parent.run_id)
            p_steps, p_values = getattr(parent, name).points()
            first = steps[0] if steps else float("inf")
            keep = [i for i, s in enumerate(p_steps) if s < first]
            steps = [p_steps[i] for i in keep] + steps
            values = [p_values[i] for i in keep] + values
            cur = parent
        return steps, values

    def open_alerts(self) -> list[Any]:
        """Unacknowledged alerts, newest first."""
        return [a for a in self.alerts if alert_key(a) not in self.acked]


def alert_key(alert: Any) -> str:
    """An alert's identity (AlertDetector gives one; fall back to its fields)."""
    key = getattr(alert, "key", None)
    if key:
        return str(key)
    return f"{getattr(alert, 'kind', '?')}:{getattr(alert, 'host', '')}:{getattr(alert, 'run', '')}"
