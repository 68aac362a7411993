"""Number formatting with units on everything (LESSONS 3) and N/A for the unknown.

The one place numbers become text, for the panel and the CLI alike.
"""

from __future__ import annotations

from typing import Any

NA = "N/A"
GIB = 1024**3
MIB = 1024**2


def is_num(x: Any) -> bool:
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


def fmt_pair_bytes(used: Any, total: Any) -> str:
    """"used/total UNIT" with one unit chosen from the total."""
    if not is_num(used) or not is_num(total):
        return NA
    if total >= 1024 * GIB:
        return f"{used / GIB / 1024:.2f}/{total / GIB / 1024:.2f} TiB"
    if total >= GIB:
        return f"{used / GIB:.1f}/{total / GIB:.1f} GiB"
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


def fmt_count(n: Any, unit: str = "") -> str:
    """Large counts with k/M/G suffixes (parameters, tokens)."""
    if not is_num(n):
        return NA
    suffix = f" {unit}" if unit else ""
    for div, tag in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f}{tag}{suffix}"
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
