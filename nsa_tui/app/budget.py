"""How often new data may redraw the panel: the refresh cap, stretched on a slow machine so
that the panel's own CPU stays within a share of one core.

A frame costs about the same work everywhere, but not the same time: a frame that takes 25 ms
of CPU on one machine took 57 ms on another of the same kind. A fixed cap (a redraw a second,
the charts every 2 s) therefore costs 2 % of a core on one and 6 % on the other. The budget
measures what the panel process actually used over the last window and, while that is over
the share, spaces data redraws further apart (up to ``MAX_STRETCH`` times the base cap); as
the use falls back under it, the cap returns to the base. What the user chooses (another run,
a key, a resize) is never delayed: only redraws for new data from the hosts wait.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

__all__ = ["RedrawBudget", "SHARE", "MAX_STRETCH"]

SHARE = 0.02  # of one core, for the whole panel process (drawing is most of it)
MAX_STRETCH = 4.0  # at worst a data redraw every 4 s, the charts every 8 s
WINDOW_S = 10.0  # the use is measured over this much of the recent past
SETTLE_S = 20.0  # start-up (imports, the first paint, a backlog of lines) is not a steady cost


class RedrawBudget:
    """The data-redraw interval (``data_s``) and the charts' (``chart_s``): the base intervals
    times a stretch in [1, ``max_stretch``], re-judged once per half window from the process's
    CPU time (``cpu``) over wall time (``clock``) in the last ``window_s``."""

    def __init__(self, data_s: float = 1.0, chart_s: float = 2.0, share: float = SHARE,
                 max_stretch: float = MAX_STRETCH, window_s: float = WINDOW_S, settle_s: float = SETTLE_S,
                 cpu: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_data_s, self.base_chart_s = data_s, chart_s
        self.share, self.max_stretch, self.window_s = share, max_stretch, window_s
        self._cpu, self._clock = cpu, clock
        self._samples: deque[tuple[float, float]] = deque()
        self._start = clock() + settle_s
        self._judged_at = self._start
        self.stretch = 1.0
        self.used = 0.0  # the share of a core used over the last window (0 until measured)

    @property
    def data_s(self) -> float:
        return self.base_data_s * self.stretch

    @property
    def chart_s(self) -> float:
        return self.base_chart_s * self.stretch

    def observe(self) -> None:
        """Take a sample (called on every tick); at most once per half window, set the stretch
        so that the last window's use would have met the share: cost per second scales with
        redraws per second, so the stretch moves by the ratio of use to share."""
        now = self._clock()
        if now < self._start:
            return
        self._samples.append((now, self._cpu()))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        t0, c0 = self._samples[0]
        if now - t0 < self.window_s * 0.9 or now - self._judged_at < self.window_s / 2:
            return
        self._judged_at = now
        self.used = (self._cpu() - c0) / (now - t0)
        wanted = self.stretch * self.used / self.share
        # move halfway in log terms toward what the window asks for: no swinging between extremes
        self.stretch = min(self.max_stretch, max(1.0, (self.stretch * wanted) ** 0.5))
