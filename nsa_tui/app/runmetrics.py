"""A run's metrics as chart points: held bounded, read cheaply, thinned to a chart's width.

Kept apart from the panel's records (state.py) because this is numeric work with its own
invariants: every series is the contract's bucketed summary over the whole run plus a short
window at full resolution, so a week-long run costs the same memory as an hour; a one-step
spike survives downsampling as a max; NaN/inf values are marked, never averaged; and a chart
asking once a second does not rebuild what has not changed. No I/O, no Textual.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nsa.contract import MetricsFolder, TrainMetric
from nsa.contract.records import Metric
from nsa.contract.series import Bucket, metric_values

SERIES_POINTS_MAX = 2_048
RECENT_POINTS = 512  # metric lines kept at full resolution (the newest part of a chart)


def thin(steps: list[float], values: list[float], width: int) -> tuple[list[float], list[float]]:
    """Reduce to about `width` points (bucket means) so a plot redraw stays cheap."""
    p = thin_points(Points(list(steps), list(values), list(values), list(values)), width)
    return p.x, p.y


@dataclass
class Points:
    """One chart line: x, the mean of what each point stands for, the min and max of it (a
    one-step spike survives any downsampling as a max), and the x of NaN/inf values, which
    are marked, never averaged into their neighbours."""

    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    bad: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.x)

    def before(self, x0: float) -> Points:
        """The points (and NaN marks) left of ``x0``."""
        k = next((i for i, x in enumerate(self.x) if x >= x0), len(self.x))
        return Points(self.x[:k], self.y[:k], self.lo[:k], self.hi[:k], [b for b in self.bad if b < x0])

    def then(self, other: Points) -> Points:
        """This line followed by ``other`` (which starts further right)."""
        return Points(self.x + other.x, self.y + other.y, self.lo + other.lo, self.hi + other.hi,
                      self.bad + other.bad)

    def mapped(self, fx: Callable[[float], float | None] = lambda x: x, k: float = 1.0) -> Points:
        """x through ``fx`` (points it maps to None are left out), values times ``k`` (> 0)."""
        out = Points()
        for x, y, lo, hi in zip(self.x, self.y, self.lo, self.hi):
            nx = fx(x)
            if nx is not None:
                out.x.append(nx)
                out.y.append(y * k)
                out.lo.append(lo * k)
                out.hi.append(hi * k)
        out.bad = [nx for nx in map(fx, self.bad) if nx is not None]
        return out


def thin_points(p: Points, width: int) -> Points:
    """About ``width`` points: each keeps the last x, the mean of the means and the min/max of
    its group, so a spike is still the max where it was; NaN marks thinned to one per group."""
    n = len(p.x)
    if width <= 0 or n <= width:
        return p
    size = n / width
    out = Points(bad=p.bad)
    for b in range(width):
        lo, hi = int(b * size), max(int((b + 1) * size), int(b * size) + 1)
        hi = min(hi, n)
        out.x.append(p.x[hi - 1])
        out.y.append(sum(p.y[lo:hi]) / (hi - lo))
        out.lo.append(min(p.lo[lo:hi]))
        out.hi.append(max(p.hi[lo:hi]))
    if len(p.bad) > width and out.x:
        span = (out.x[-1] - p.x[0]) / width or 1.0
        out.bad = sorted({p.x[0] + round((b - p.x[0]) / span) * span for b in p.bad})
    return out


class RunMetrics:
    """A run's metrics as the panel holds them: every series bucketed over the whole run (the
    agent's summary, extended by live lines) and the newest lines at full resolution.

    A chart asks for a series about once a second while lines arrive at any rate, so nothing
    is rebuilt per line: each series' recent values are kept as they come, and the buckets left
    of the recent window (closed: no new step can reach them) are turned into points once and
    extended as the window slides; they are built again only when the buckets merge (the
    stride doubled) or a new summary replaced them. ``rebuilds`` counts those."""

    def __init__(self) -> None:
        self.folder = MetricsFolder(cap=SERIES_POINTS_MAX)
        self.recent: deque[Metric] = deque(maxlen=RECENT_POINTS)
        self.last_train: TrainMetric | None = None
        self.count = 0  # lines taken (a redraw signature)
        self.rebuilds = 0  # series whose points were built from all their buckets
        self._taken = 0  # lines in `recent` since the last summary (their index)
        self._values: dict[str, deque[tuple[int, int, float]]] = {}  # name -> (index, step, value)
        self._closed: dict[str, tuple[object, int, int, Points]] = {}  # name -> (series, stride, k, points)

    def add(self, m: Metric) -> None:
        self.folder.add(m)
        self.recent.append(m)
        for name, v in metric_values(m):
            values = self._values.get(name)
            if values is None:
                values = self._values[name] = deque(maxlen=RECENT_POINTS)
            values.append((self._taken, m.step, v))
        self._taken += 1
        if isinstance(m, TrainMetric) and (self.last_train is None or m.step >= self.last_train.step):
            self.last_train = m
        self.count += 1

    def reset(self, folder: MetricsFolder) -> None:
        """A new summary of the whole run: it replaces the buckets and the recent lines."""
        self.folder = folder
        self.recent.clear()
        self._values.clear()
        self._closed.clear()
        self.count += 1

    def series(self, name: str) -> tuple[list[float], list[float]]:
        """(steps, values) of one series (the means of :meth:`points`)."""
        p = self.points(name)
        return p.x, p.y

    def points(self, name: str) -> Points:
        """One series: bucket summaries (mean, min, max, NaN count) before the recent window,
        then every recent point at full resolution (a new object: callers may change it)."""
        oldest = self._taken - len(self.recent)  # the index of the oldest line still in `recent`
        recent = [(step, v) for i, step, v in self._values.get(name, ()) if i >= oldest]
        first = recent[0][0] if recent else None
        s = self.folder.series.get(name)
        buckets = s.buckets if s is not None else []
        k = len(buckets) if first is None else bisect.bisect_left(buckets, first, key=lambda b: b.last)
        cached = self._closed.get(name)
        same = cached is not None and s is not None and cached[0] is s and cached[1] == s.stride
        if cached is not None and same and cached[2] <= k:
            closed = cached[3]
            _add_buckets(closed, buckets[cached[2]:k])
        else:
            closed = Points()
            _add_buckets(closed, buckets[:k])
            self.rebuilds += k > 0
        self._closed[name] = (s, s.stride if s is not None else 0, k, closed)
        p = Points(closed.x.copy(), closed.y.copy(), closed.lo.copy(), closed.hi.copy(), closed.bad.copy())
        for step, v in recent:
            if p.x and step <= p.x[-1]:
                continue
            if not math.isfinite(v):
                p.bad.append(step)
                continue
            p.x.append(step)
            p.y.append(v)
            p.lo.append(v)
            p.hi.append(v)
        return p


def _add_buckets(p: Points, buckets: list[Bucket]) -> None:
    """Append closed buckets as points: their mean, min and max; a NaN count as a mark."""
    for b in buckets:
        if b.bad:
            p.bad.append(b.last)
        mean = b.mean
        if mean is not None:
            p.x.append(b.last)
            p.y.append(mean)
            p.lo.append(b.lo if b.lo is not None else mean)
            p.hi.append(b.hi if b.hi is not None else mean)
