"""Room on the runs root's disk: a launch or resume that cannot fit refuses before it creates
anything, and one that fails half-way on a full disk leaves nothing behind.

Why: on a full disk ``resume`` used to fail while writing the new run's files and leave an
empty run directory each time it was tried, and the panel only saw an ``OSError``.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from nsa_tui.agent.errors import OpError

# A launch needs at least this much free space (beyond the checkpoint a resume starts from).
MIN_FREE_BYTES = 1 << 20

creating = threading.local()  # the run directory the current thread's launch created


def dir_size(path: Path) -> int:
    """Bytes of the files directly in ``path`` (a checkpoint directory), 0 if unreadable."""
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except OSError:
        return 0


def need_room(root: Path, need: int, what: str) -> None:
    """Refuse (``no_space``) before creating anything when the runs root's disk is too full."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return
    if free < need:
        raise OpError("no_space", f"no space left on the disk of {root}: {free / 2**20:.1f} MiB free, {what} "
                                  f"needs {need / 2**20:.1f} MiB; free space first (nothing was created)")


def no_space(exc: OSError, root: Path) -> Exception:
    """``exc`` as the launcher's ``no_space`` error when it is ENOSPC (else ``exc`` itself)."""
    if exc.errno != errno.ENOSPC:
        return exc
    return OpError("no_space", f"no space left on the disk of {root} ({exc.strerror}); free space first "
                               "(nothing was created)")


def launch_safely(launch: Any) -> Any:
    """A launch that fails after creating its run directory (ENOSPC writing the config, launch.json
    or train.log) leaves no directory behind, and a full disk is said as such (``no_space``)."""

    @functools.wraps(launch)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        creating.dir = None
        try:
            return launch(*args, **kwargs)
        except OSError as exc:
            created = getattr(creating, "dir", None)
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise no_space(exc, args[0].store.root) from exc
        finally:
            creating.dir = None

    return wrapper
