"""Helpers for the end-to-end tests that launch real tiny ``nsa-train`` runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from nsa_tui.agent.procs import run_processes
from nsa_tui.hosts.client import Event, HostClient

REPO = Path(__file__).resolve().parents[2]
SMOKE = str(REPO / "configs" / "smoke-cpu.yaml")
# a run that goes on until stopped: checkpoints often, no eval pauses
LONG = ["train.steps=100000", "train.save_every=5", "train.eval_every=100000"]


async def until(it: AsyncIterator[Event], pred: Any, timeout: float) -> Event:
    """The first event of ``it`` for which ``pred(event)`` holds (TimeoutError otherwise)."""

    async def go() -> Event:
        async for ev in it:
            if pred(ev):
                return ev
        raise AssertionError("stream ended")

    return await asyncio.wait_for(go(), timeout)


def is_step(n: int) -> Any:
    """A metrics event with a train line at step >= n."""
    from nsa.contract import TrainMetric

    return lambda ev: ev.kind == "metrics" and any(
        isinstance(m, TrainMetric) and m.step >= n for m in ev.data)


def is_over(ev: Event) -> bool:
    return ev.kind == "status" and not ev.initial and ev.data.status.is_terminal()


async def stop_all(c: HostClient, run_ids: list[str]) -> None:
    """Teardown: no process of these runs may outlive the test."""
    for rid in run_ids:
        if run_processes(rid):
            try:
                await c.kill(rid, grace_s=5)
            except Exception:  # noqa: BLE001 - fall through to the check below
                pass
    deadline = time.monotonic() + 15
    while any(run_processes(r) for r in run_ids) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not any(run_processes(r) for r in run_ids)
