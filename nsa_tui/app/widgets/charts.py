"""Loss and throughput charts (textual-plotext), thinned to the plot width on redraw."""

from __future__ import annotations

from typing import Any

from textual_plotext import PlotextPlot

from nsa_tui.app.state import thin
from nsa_tui.fmt import fmt_short

Line = tuple[str, list[float], list[float]]


SERIES_COLORS = ("cyan", "orange", "magenta")


short = fmt_short


class MetricChart(PlotextPlot):
    """A line chart of one or more series against step; redraws only on new data."""

    def __init__(self, title: str, ylabel: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._title = title
        self._ylabel = ylabel
        self._lines: list[Line] = []
        self._signature: tuple = ()

    def on_mount(self) -> None:
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def set_lines(self, lines: list[Line], signature: tuple) -> None:
        """Replace the data; `signature` changes when the data does (cheap to compare)."""
        if signature == self._signature:
            return
        self._signature = signature
        self._lines = lines
        self._draw()

    def _draw(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self._title)
        plt.xlabel("step")
        width = max(10, self.size.width - 12)
        drawn = False
        # no plotext legend: it paints over the newest-left data; the title names the series
        for i, (_label, steps, values) in enumerate(self._lines):
            if not steps:
                continue
            xs, ys = thin(steps, values, width)
            color = SERIES_COLORS[i % len(SERIES_COLORS)]
            if i > 0 or len(xs) == 1:
                plt.scatter(xs, ys, marker="●" if i > 0 else "dot", color=color)
            else:
                plt.plot(xs, ys, marker="braille", color=color)
            drawn = True
        if drawn:
            ys_all = [v for _, _, vs in self._lines for v in vs]
            lo, hi = min(ys_all), max(ys_all)
            if hi > lo:
                ticks = [lo, (lo + hi) / 2, hi]
                plt.yticks(ticks, [short(v) for v in ticks])
            xs_all = [x for _, xs, _ in self._lines for x in xs[:1] + xs[-1:]]
            x0, x1 = min(xs_all), max(xs_all)
            if x1 > x0:
                xt = [x0 + (x1 - x0) * k / 3 for k in range(4)]
                plt.xticks(xt, [str(round(x)) if x < 1e4 else short(x) for x in xt])
        if not drawn:
            plt.title(f"{self._title.split(':')[0]} — N/A (no data yet)")
        self.refresh()
