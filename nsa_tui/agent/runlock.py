"""One run's lock (``<run>/.lock``, flock): every change of a run's state holds it.

Several agents (two panels, a panel and a script, a run's own watchdog) may act on one run
at once; stop, fallback, resume and relaunch each take this lock, so they happen one after
another and a second fallback finds the first one's record.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from nsa.contract.rundir import LOCK


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Exclusive lock of one run (blocking): across agents, threads and requests alike."""
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.asynccontextmanager
async def run_lock_async(run_dir: Path) -> AsyncIterator[None]:
    """``run_lock`` for coroutines: waiting for it does not block the agent's event loop."""
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
