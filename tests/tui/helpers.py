"""Helpers for pilot tests: wait for a condition while the app runs; ask the host directly."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


async def wait_for(pilot: Any, cond: Callable[[], Any], timeout: float, what: str = "") -> Any:
    """Let the app run until `cond()` is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        await pilot.pause(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or cond}")


def info(run: Any) -> Any:
    """A panel run's run.json record as its agent sent it (an empty one before any)."""
    from nsa.contract import RunInfo

    return run.view.info if run is not None and run.view is not None else RunInfo(run_id="?")


def points(run: Any, series: str = "loss") -> int:
    """How many points a panel run's chart of ``series`` has."""
    return len(run.metrics.series(series)[0])


def run_alive_on_host(root: Path, run_id: str) -> bool:
    from nsa_tui.agent.runs import RunStore

    return RunStore(root).view(run_id, with_tail=False).alive



def plain(widget: Any) -> str:
    """The text a Static-like widget currently shows (its content rendered without styles)."""
    import io

    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.export_text()
