"""Number formatting with units on everything (a MiB labelled GB once hid a bug) and N/A for the unknown.

The one place numbers become text, for the panel and the CLI alike.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

NA = "N/A"
GIB = 1024**3
MIB = 1024**2


def is_num(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def fmt_bytes(n: Any) -> str:
    """Bytes as GiB or MiB with the right label."""
    if not is_num(n):
        return NA
    if abs(n) >= GIB:
        return f"{n / GIB:.1f} GiB"
    if abs(n) >= MIB:
        return f"{n / MIB:.0f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n:.0f} B"


def fmt_pair_bytes(used: Any, total: Any, short: bool = False) -> str:
    """"used/total UNIT" with one unit chosen from the total; ``short``: whole GiB from 10 GiB
    (``61/80 GiB``, for narrow places)."""
    if not is_num(used) or not is_num(total):
        return NA
    if total >= 1024 * GIB:
        return f"{used / GIB / 1024:.2f}/{total / GIB / 1024:.2f} TiB"
    if total >= GIB:
        digits = 0 if short and total >= 10 * GIB else 1
        return f"{used / GIB:.{digits}f}/{total / GIB:.{digits}f} GiB"
    return f"{used / MIB:.0f}/{total / MIB:.0f} MiB"


def fmt_duration(s: Any) -> str:
    """Seconds as 42s, 3m07s, 2h05m, 3d04h."""
    if not is_num(s) or s < 0:
        return NA
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def fmt_age(s: Any) -> str:
    """A run's age in a list that stays put: whole minutes (<1m, 3m, 2h05m, 3d04h), so a row
    changes at most once a minute and the list is not drawn again every second for it (the
    header gives the selected run's time to the second)."""
    if not is_num(s) or s < 0:
        return NA
    if s < 60:
        return "<1m"
    if s < 3600:
        return f"{int(s) // 60}m"
    return fmt_duration(s)


def fmt_count(n: Any, unit: str = "") -> str:
    """Large counts with k/M/G suffixes (parameters, tokens)."""
    if not is_num(n):
        return NA
    suffix = f" {unit}" if unit else ""
    for div, tag in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f}{tag}{suffix}"
    return f"{n:.0f}{suffix}"


def fmt_count3(n: Any, unit: str = "") -> str:
    """A count in three significant digits, for places that must stay short (the header fits 80
    columns): ``496k tok``, ``78.6M tok``, ``1.00M`` (never ``1000k``)."""
    if not is_num(n):
        return NA
    suffix = f" {unit}" if unit else ""
    r = float(f"{n:.3g}")  # rounded first: 999,600 is 1.00M
    for div, tag in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(r) >= div:
            v = r / div
            return f"{v:.{max(0, 2 - math.floor(math.log10(abs(v))))}f}{tag}{suffix}"
    return f"{n:.0f}{suffix}"


def fmt_float(x: Any, digits: int = 4, unit: str = "") -> str:
    if not is_num(x):
        return NA
    return f"{x:.{digits}f}{' ' + unit if unit else ''}"


def fmt_pct(x: Any) -> str:
    return f"{x:.0f} %" if is_num(x) else NA


def bar(frac: Any, width: int) -> str:
    """A text bar of `width` cells; empty-looking when unknown."""
    if not is_num(frac) or width <= 0:
        return "·" * max(width, 0)
    filled = round(max(0.0, min(1.0, float(frac))) * width)
    return "█" * filled + "░" * (width - filled)


def fmt_short(v: float) -> str:
    """Compact numbers for narrow places (chart ticks, tables): 41k, 2.83, 0.0012."""
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.1f}G"
    if a >= 1e6:
        return f"{v / 1e6:.1f}M"
    if a >= 1e4:
        return f"{v / 1e3:.0f}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.2g}"


def nice_ticks(lo: float, hi: float, n: int = 4, integer: bool = False) -> list[float]:
    """Up to ``n`` round values (multiples of 1, 2, 2.5 or 5 × 10^k) inside ``lo..hi``, as many
    as fit: the axis labels of a chart whose limits are ``lo..hi``, so every label is drawn
    inside the frame and they move only when the range does. ``integer``: whole numbers only
    (steps: never ``1 1 2 2``)."""
    if not (is_num(lo) and is_num(hi)) or math.isinf(lo) or math.isinf(hi) or n < 1:
        return []
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        return [lo]
    mag = 10 ** math.floor(math.log10((hi - lo) / max(1, n)))
    for step in (m * mag * f for f in (0.1, 1, 10, 100) for m in (1, 2, 2.5, 5)):
        if integer and (step < 1 or step != int(step)):
            continue
        first = math.ceil(lo / step - 1e-9)
        count = math.floor(hi / step + 1e-9) - first + 1
        if count <= n:
            return [_clean((first + k) * step, step) for k in range(count)]
    return [lo, hi]


def _clean(x: float, step: float) -> float:
    """``x`` rounded to the step's precision (no 0.30000000000000004 labels, no -0.0)."""
    digits = max(0, -math.floor(math.log10(step)) + 2)
    return round(x, digits) + 0.0


def fmt_ticks(ticks: list[float]) -> list[str]:
    """Labels for evenly spaced axis values: one precision for all of them, as much as the
    spacing needs (``1.9 2.0 2.1``, ``41.0k 41.5k``, ``2e-4 4e-4``), so no two are alike
    and no label has digits the axis cannot resolve."""
    if not ticks:
        return []
    gaps = [abs(b - a) for a, b in zip(ticks, ticks[1:]) if b != a]
    top = max(abs(t) for t in ticks)
    step = min(gaps) if gaps else (top or 1.0)
    if top >= 1e4:
        div, tag = next((d, t) for d, t in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")) if top >= d)
        d = _decimals(step / div)
        return ["0" if t == 0 else f"{t / div:.{d}f}{tag}" for t in ticks]
    if 0 < top < 1e-2:
        e = math.floor(math.log10(top))
        d = _decimals(step / 10**e)
        return ["0" if t == 0 else f"{t / 10**e:.{d}f}e{e}" for t in ticks]
    d = _decimals(step)
    return [f"{t:.{d}f}" for t in ticks]


def _decimals(step: float) -> int:
    """Decimals that show a multiple of ``step`` exactly (2.5 needs one more than 2)."""
    if step <= 0:
        return 0
    for d in range(0, 12):
        if abs(round(step, d) - step) <= step * 1e-6:
            return d
    return 12
