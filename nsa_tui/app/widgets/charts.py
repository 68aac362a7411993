"""Charts (textual-plotext) drawn from app/chartdata.py: readable at any size.

The chart's name, series legend and notes (NaN count, MFU) are in the pane's borders,
arranged for its width (chart_labels), so the plot gets every row. Axis labels are round
values inside the plot's limits, with one precision per axis (fmt.nice_ticks /
fmt.fmt_ticks): they never come and go, never repeat, never leave the frame. Each line is
its bucket means; the bucket min/max around it is a faint envelope (a one-step spike stays
visible after any downsampling), and a NaN or inf is a red vertical mark.
"""

from __future__ import annotations

import math
from typing import Any

from rich.text import Text
from textual_plotext import PlotextPlot

from nsa_tui.app.chartdata import ENVELOPE, ChartData
from nsa_tui.app.runmetrics import Points, thin_points
from nsa_tui.fmt import fmt_ticks, nice_ticks

Y_LABEL_COLS = 8  # room plotext keeps left of the plot for y labels (roughly)
NAN_COLOR = (230, 60, 60)


def rgb(c: tuple[int, int, int]) -> str:
    return f"rgb({c[0]},{c[1]},{c[2]})"


def legend_text(data: ChartData, compact: bool) -> Text:
    """'━ cmp  ━ sel  ━ win', each mark in its line's colour; ``compact``: '━cmp ━sel ━win'."""
    t = Text()
    for i, line in enumerate(data.lines):
        if i:
            t.append(" " if compact else "  ")
        t.append("●" if line.style == "dots" else "━", style=rgb(line.color))
        t.append(line.label if compact else f" {line.label}")
    return t


def chart_labels(data: ChartData, compare: bool, width: int) -> tuple[Text, Text | None]:
    """(top border, bottom border) of a chart ``width`` cells wide (0: not laid out yet): its
    name, its legend, its note (NaN/inf count, MFU). A border holds ``width - 6`` cells; the
    first arrangement that fits wins: the legend beside the name (wide charts), the legend
    under the plot with the note, then without its spaces, then the note beside the name.
    Why: with three charts in a row (120x40) the legend was cut after its first word, so the
    gate shares' colours could not be told apart."""
    note = Text(data.note, style="bold red" if "NaN" in data.note else "") if data.note else None
    title = Text(data.title, style="bold")
    if compare or len(data.lines) < 2:
        return title, note
    room = width - 6

    def beside(a: Text, b: Text | None) -> Text:
        return Text("  ").join([a, b]) if b is not None and b.plain else a

    full, short = legend_text(data, compact=False), legend_text(data, compact=True)
    tries = [(beside(title, full), note), (title, beside(full, note)), (title, beside(short, note))]
    if note is not None:
        tries += [(beside(title, note), full), (beside(title, note), short)]
    for top, bottom in tries:
        if width <= 0 or (top.cell_len <= room and (bottom is None or bottom.cell_len <= room)):
            return top, bottom
    return title, beside(short, note)  # cut at the end by the border: the legend comes first


def y_axis(lo: float, hi: float, rows: int, max_ticks: int) -> tuple[float, float, list[float]]:
    """(lower limit, upper limit, ticks) of a y axis drawn on ``rows`` text rows: round ticks
    (steps of 1, 2, 2.5, 5 × 10^k) that each fall exactly on a row, evenly spaced (a tick
    between rows is drawn a row off: uneven, jumpy labels), limits as tight around ``lo..hi``
    as that allows, three to ``max_ticks`` ticks where the rows hold them well, else two."""
    if hi == lo:
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    if rows < 3:
        return lo, hi, nice_ticks(lo, hi, max(1, rows))
    mag = 10 ** math.floor(math.log10(hi - lo))
    steps = [m * mag * f for f in (0.01, 0.1, 1, 10) for m in (1, 2, 2.5, 5)]
    found: list[tuple[float, float, float, list[float]]] = []
    for min_ticks in sorted({min(3, max_ticks), 2}, reverse=True):
        best: tuple[float, float, float, list[float]] | None = None
        for step in steps:
            digits = max(0, 2 - math.floor(math.log10(step)))
            for q in range(1 if rows < 6 else 2, rows):  # rows from one tick to the next
                u = step / q
                first = math.ceil(lo / step - 1e-9) * step
                y0 = first - math.ceil((first - lo) / u - 1e-9) * u
                y1 = y0 + (rows - 1) * u
                if y1 < hi - 1e-9 * abs(hi) or (best is not None and u >= best[0]):
                    continue
                ks = range(math.ceil(y0 / step - 1e-9), math.floor(y1 / step + 1e-9) + 1)
                if min_ticks <= len(ks) <= max_ticks:
                    best = (u, y0, y1, [round(k * step, digits) + 0.0 for k in ks])
        if best is not None:
            found.append(best)
    if not found:
        return lo, hi, nice_ticks(lo, hi, max_ticks)
    # three ticks unless two use the rows much better (a short chart)
    pick = found[0] if len(found) == 1 or found[0][0] <= 1.25 * found[1][0] else found[1]
    return pick[1], pick[2], pick[3]


def spikes(p: Points) -> list[int]:
    """Indexes of points whose max stands far above their own mean and both neighbours' (mean
    and max): a one-step spike averaged away in its bucket (thresholds: 4× the typical
    max-mean gap and 5 % of the line's range; a steep but smooth stretch is no spike)."""
    n = len(p.y)
    if n < 3:
        return []
    gaps = sorted(h - y for y, h in zip(p.y, p.hi))
    limit = max(4 * gaps[n // 2], 0.05 * (max(p.hi) - min(p.lo)))
    return [i for i in range(1, n - 1) if p.hi[i] - max(p.y[i - 1:i + 2]) > limit
            and p.hi[i] - max(p.hi[i - 1], p.hi[i + 1]) > limit / 2]


class MetricChart(PlotextPlot):
    """One chart; redraws only when its data (signature) or its size changes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data = ChartData("")
        self.compare = False
        self._signature: tuple = ()

    def on_mount(self) -> None:
        self._draw()

    def on_resize(self) -> None:
        self._label()
        self._draw()

    def show(self, data: ChartData, signature: tuple, compare: bool = False) -> None:
        """Replace what is drawn; ``signature`` changes when the data does (cheap to compare)."""
        if signature == self._signature and signature:
            return
        self._signature = signature
        self.data, self.compare = data, compare
        self._label()
        self._draw()

    def _label(self) -> None:
        """Name, legend and note in the borders, arranged for the chart's width."""
        self.border_title, self.border_subtitle = chart_labels(self.data, self.compare, self.outer_size.width)

    def _draw(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        data = self.data
        width = max(10, self.size.width - Y_LABEL_COLS - 2)
        rows = max(1, self.size.height - 3)  # frame and x labels
        lines = [(line, thin_points(line.points, width)) for line in data.lines if len(line.points)]
        if not lines:
            plt.xticks([], [])
            plt.yticks([], [])
            self.refresh()
            return
        envelope = not self.compare and rows >= 4
        for line, p in lines:  # envelopes first: the means are drawn over them
            if envelope and line.envelope and any(h > y or lo < y for y, lo, h in zip(p.y, p.lo, p.hi)):
                plt.plot(p.x, p.hi, marker="braille", color=ENVELOPE)
                plt.plot(p.x, p.lo, marker="braille", color=ENVELOPE)
        ys: list[float] = []
        for line, p in lines:
            if line.style == "dots" or len(p.x) == 1:
                plt.scatter(p.x, p.y, marker="●" if line.style == "dots" else "dot", color=line.color)
            else:
                plt.plot(p.x, p.y, marker="braille", color=line.color)
            peaks = spikes(p) if line.style == "line" else []
            if peaks:  # the max of a spike's bucket, also where no envelope is drawn
                plt.scatter([p.x[i] for i in peaks], [p.hi[i] for i in peaks], marker="▲", color=line.color)
            ys += [p.hi[i] for i in peaks]
            ys += p.hi + p.lo if envelope and line.envelope else p.y
        y0, y1, yt = y_axis(min(ys), max(ys), rows, max(2, min(5, rows // 2 + 1)))
        plt.ylim(y0, y1)
        plt.yticks(yt, fmt_ticks(yt))
        xs = [x for _, p in lines for x in (p.x[0], p.x[-1])] + [b for _, p in lines for b in p.bad]
        x0, x1 = min(xs), max(xs)
        if x1 == x0:
            x0, x1 = x0 - 1, x1 + 1
        plt.xlim(x0, x1)
        xt = nice_ticks(x0, x1, max(2, min(6, width // 9)), integer=data.x_label == "step")
        plt.xticks(xt, fmt_ticks(xt))
        for bad in sorted({b for _, p in lines for b in p.bad}):
            plt.vertical_line(bad, color=NAN_COLOR)
        self.refresh()
