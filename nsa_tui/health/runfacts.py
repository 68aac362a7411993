"""What the alert detector knows of each run and rank: the facts its rules read.

Fed from events by ``AlertDetector.feed_*`` (``nsa_tui.health.alerts``); bounded whatever the
run's length or step rate (deques of fixed length, throughput in time bins).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from nsa.contract import Beat, RunView


class RateBins:
    """tokens/s in bins of ``bin_s`` seconds (mean per bin), the last hour: what the throughput
    rule compares, bounded whatever the step rate (100 steps/s or one per minute)."""

    def __init__(self, bin_s: float = 5.0, keep: int = 720) -> None:
        self.bin_s = bin_s
        self.bins: deque[list[float]] = deque(maxlen=keep)  # [start, sum, n]

    def add(self, ts: float, value: float) -> None:
        if not (finite(ts) and finite(value)):
            return
        start = math.floor(ts / self.bin_s) * self.bin_s
        if self.bins and self.bins[-1][0] == start:
            self.bins[-1][1] += value
            self.bins[-1][2] += 1
        elif not self.bins or start > self.bins[-1][0]:
            self.bins.append([start, value, 1])

    def split(self, window_s: float) -> tuple[tuple[float, int], tuple[float, int]] | None:
        """((median, points) of the bins in the last ``window_s``, the same of the 2 windows before)."""
        if not self.bins:
            return None
        newest = self.bins[-1][0]
        recent = [b for b in self.bins if b[0] > newest - window_s]
        base = [b for b in self.bins if newest - 3 * window_s < b[0] <= newest - window_s]
        if not recent or not base:
            return None
        med = lambda bins: statistics.median(b[1] / b[2] for b in bins)  # noqa: E731
        return (med(recent), int(sum(b[2] for b in recent))), (med(base), int(sum(b[2] for b in base)))


@dataclass
class RankFacts:
    step: int = 0  # a rank exists once it beat: feed_beat creates it and sets its step
    phase: str | None = None
    phase_since: float = 0.0
    last_ts: float = 0.0
    advanced_at: float = 0.0
    gpu: int | None = None  # the CUDA index the rank reported (shown; placement uses on_gpu)
    beat: Beat | None = None  # the newest beat
    history: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=256))  # (ts, step)

    def steps_around(self, ts: float) -> tuple[int, int] | None:
        """The least and the most step this rank can have had at host time ``ts``: its step at
        the last beat before ``ts`` and at the first beat from ``ts`` on. Beats that never
        arrived (a heartbeat file rotated twice before anyone read it) leave a gap in the
        history, and the step within a gap is only known to lie between its two ends."""
        lo = None
        for t, s in self.history:
            if t >= ts:
                return (s if lo is None else lo), s
            lo = s
        return None if lo is None else (lo, lo)


@dataclass
class RunFacts:
    view: RunView | None = None
    ranks: dict[int, RankFacts] = field(default_factory=dict)
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=50))
    tps: RateBins = field(default_factory=lambda: RateBins())
    nan_step: int | None = None
    log: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    backfilling: bool = False  # a live subscription's backlog is still arriving
    gone: dict[int, float] = field(default_factory=dict)  # rank -> when its process was seen gone


def finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and math.isfinite(x)
