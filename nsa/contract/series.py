"""Bounded summaries of metric series: a run of any length in a fixed number of buckets.

Why: a week-long run logs millions of steps; a panel needs the whole curve in a few
hundred points without reading them all. Rank 0 keeps one :class:`SeriesSummary` per
charted value and writes them as ``metrics-summary.json`` (a :class:`MetricsSummary`)
every few seconds; the agent sends that, plus the last lines at full resolution, instead
of the whole metrics.jsonl. The panel folds live lines into the same structure.

A bucket covers an aligned step range ``[k * stride, (k + 1) * stride)`` and keeps the
count, sum, min, max and last of its finite values, and how many were NaN/inf: a one-step
spike survives any amount of downsampling (it is the bucket's max), and a NaN is counted,
never averaged into its neighbours. When a series would exceed its capacity the stride
doubles and neighbouring buckets merge, so appending is O(1) amortised.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import msgspec

from nsa.contract.records import EvalMetric, Metric, Record, TrainMetric

SUMMARY_BUCKETS = 1024  # per series, as written by the trainer
SUMMARY_VERSION = 1


class Bucket(msgspec.Struct, array_like=True):
    """Steps ``first..last`` (the steps actually seen) of one aligned range."""

    first: int
    last: int
    n: int = 0  # finite values
    total: float = 0.0  # sum of the finite values
    lo: float | None = None  # min of the finite values
    hi: float | None = None  # max
    end: float | None = None  # the last value seen (may be NaN/inf)
    bad: int = 0  # NaN/inf values

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None

    def add(self, step: int, value: float) -> None:
        self.last = step
        self.end = value
        if math.isfinite(value):
            self.n += 1
            self.total += value
            self.lo = value if self.lo is None else min(self.lo, value)
            self.hi = value if self.hi is None else max(self.hi, value)
        else:
            self.bad += 1

    def merged(self, other: Bucket) -> Bucket:
        """This bucket followed by ``other`` (later steps) as one."""
        los = [x for x in (self.lo, other.lo) if x is not None]
        his = [x for x in (self.hi, other.hi) if x is not None]
        return Bucket(self.first, other.last, self.n + other.n, self.total + other.total,
                      min(los) if los else None, max(his) if his else None, other.end, self.bad + other.bad)


class SeriesData(Record, kw_only=True):
    """One series' buckets and their stride (steps per bucket, a power of two)."""

    stride: int = 1
    buckets: list[Bucket] = []


class SeriesSummary:
    """A growing series kept in at most ``cap`` buckets (see the module docstring)."""

    def __init__(self, cap: int = SUMMARY_BUCKETS, data: SeriesData | None = None) -> None:
        self.cap = max(4, cap)
        self.stride = data.stride if data else 1
        self.buckets: list[Bucket] = [msgspec.structs.replace(b) for b in data.buckets] if data else []
        while len(self.buckets) > self.cap:
            self._halve()

    @property
    def last_step(self) -> int | None:
        return self.buckets[-1].last if self.buckets else None

    def append(self, step: int, value: float) -> None:
        """Add one point; a step at or before the last one is ignored (a resumed run logs
        the steps after its checkpoint again: the first report of a step is kept)."""
        last = self.last_step
        if last is not None and step <= last:
            return
        k = step // self.stride
        if self.buckets and self.buckets[-1].first // self.stride == k:
            self.buckets[-1].add(step, value)
            return
        b = Bucket(step, step)
        b.add(step, value)
        self.buckets.append(b)
        if len(self.buckets) > self.cap:
            self._halve()

    def _halve(self) -> None:
        """Double the stride: buckets in the same new range merge (ranges stay aligned)."""
        self.stride *= 2
        out: list[Bucket] = []
        for b in self.buckets:
            if out and out[-1].first // self.stride == b.first // self.stride:
                out[-1] = out[-1].merged(b)
            else:
                out.append(b)
        self.buckets = out

    def data(self, max_points: int | None = None) -> SeriesData:
        """The buckets, coarsened to at most ``max_points`` (a copy)."""
        s = SeriesSummary(self.cap, SeriesData(stride=self.stride, buckets=self.buckets))
        if max_points:
            s.cap = max(4, max_points)
            while len(s.buckets) > s.cap:
                s._halve()
        return SeriesData(stride=s.stride, buckets=s.buckets)

    def __len__(self) -> int:
        return len(self.buckets)


class MetricsSummary(Record, kw_only=True):
    """metrics-summary.json: every charted series of metrics.jsonl up to ``upto_offset``."""

    version: int = SUMMARY_VERSION
    upto_offset: int = 0  # bytes of metrics.jsonl summarised
    upto_step: int = 0
    lines: int = 0  # metric lines summarised
    series: dict[str, SeriesData] = {}


def metric_values(m: Metric) -> Iterator[tuple[str, float]]:
    """(series name, value) of every charted quantity in one metrics line: the one place that
    says which series exist (the panel's chart menu lists these names)."""
    if isinstance(m, TrainMetric):
        yield "loss", m.loss
        for name in ("lr", "grad_norm", "tokens_per_s", "step_time_s"):
            v = getattr(m, name)
            if v is not None:
                yield name, float(v)
        if m.tokens is not None:
            yield "tokens", float(m.tokens)
        if m.mem_allocated_bytes is not None:
            yield "mem_allocated_bytes", float(m.mem_allocated_bytes)
        if m.gate_shares is not None:
            yield "gate.compressed", m.gate_shares.compressed
            yield "gate.selected", m.gate_shares.selected
            yield "gate.window", m.gate_shares.window
    elif isinstance(m, EvalMetric):
        yield "val_loss", m.val_loss


class MetricsFolder:
    """Folds metric lines into one SeriesSummary per series (trainer, agent and panel alike)."""

    def __init__(self, cap: int = SUMMARY_BUCKETS, summary: MetricsSummary | None = None) -> None:
        self.cap = cap
        self.series: dict[str, SeriesSummary] = {}
        self.upto_offset = 0
        self.upto_step = 0
        self.lines = 0
        if summary is not None:
            self.series = {k: SeriesSummary(cap, v) for k, v in summary.series.items()}
            self.upto_offset, self.upto_step = summary.upto_offset, summary.upto_step
            self.lines = summary.lines

    def add(self, m: Metric, offset: int | None = None) -> None:
        for name, value in metric_values(m):
            s = self.series.get(name)
            if s is None:
                s = self.series[name] = SeriesSummary(self.cap)
            s.append(m.step, value)
        self.upto_step = max(self.upto_step, m.step)
        self.lines += 1
        if offset is not None:
            self.upto_offset = offset

    def summary(self, max_points: int | None = None) -> MetricsSummary:
        return MetricsSummary(upto_offset=self.upto_offset, upto_step=self.upto_step, lines=self.lines,
                              series={k: s.data(max_points) for k, s in self.series.items()})
