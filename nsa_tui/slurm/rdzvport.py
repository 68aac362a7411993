"""The rendezvous port of a Slurm job, chosen on the allocation's first node as the job starts.

Why: a port computed from the job id alone (``29400 + id % 1000``) is the same for two jobs
whose ids are 1000 apart, and says nothing of a port something else already listens on; two
jobs sharing a first node then share one c10d store, and the second dies with the first. The
batch shell runs on the first node (Slurm's rule), so there, before torchrun starts:

- a port is taken only if it can be bound now, on every address (IPv4 and IPv6): nothing
  listens on it, whoever started it;
- a port given to a job is recorded, under a lock, in the runs root (a filesystem every node
  and every job of this user sees, unlike /tmp, which a job may have to itself) for
  ``RESERVE_S``: another job starting meanwhile on the same node skips it, in the moments
  before this job's torchrun binds it. After that the bind check sees the store listening.

The search starts at the old formula's port (a job gets the port it always had when it is
free) and walks the range; when all of it is taken, the kernel picks one (port 0).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PORTS = range(29400, 30400)  # the old formula's range, from torchrun's default port
RESERVE_S = 900.0  # from the choice to torchrun's store listening: its start, on a loaded node
REGISTRY = ".rdzv-ports.json"  # in the runs root; RunStore lists directories only
LOCK = ".rdzv-ports.lock"
_BUSY = (errno.EADDRINUSE, errno.EACCES)


def port_is_free(port: int) -> bool:
    """Whether ``port`` can be bound now on every address of this node (IPv6 where it exists)."""
    for family, addr in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        with sock:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((addr, port))
            except OSError as exc:
                if family == socket.AF_INET or exc.errno in _BUSY:
                    return False
    return True


def kernel_port() -> int:
    """A port the kernel says is free (port 0): the last resort when the range is all taken."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _registry(root: Path) -> Iterator[dict[str, Any]]:
    """The reservations (``node:port`` -> job, until), read and written back under the lock."""
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            held = json.loads((root / REGISTRY).read_text())
            if not isinstance(held, dict):
                held = {}
        except (OSError, ValueError):
            held = {}
        yield held
        tmp = root / f"{REGISTRY}.{os.getpid()}"
        tmp.write_text(json.dumps(held))
        os.replace(tmp, root / REGISTRY)
    finally:
        os.close(fd)


def _choose(job_id: str, taken: set[int], free: Callable[[int], bool]) -> int:
    start = int(job_id) % len(PORTS) if job_id.isdigit() else 0
    for i in range(len(PORTS)):
        port = PORTS[(start + i) % len(PORTS)]
        if port not in taken and free(port):
            return port
    return kernel_port()


def _other_live(entry: Any, job_id: str, now: float) -> bool:
    """A reservation of another job, not yet expired (anything unreadable is dropped)."""
    return (isinstance(entry, dict) and entry.get("job") != job_id
            and isinstance(entry.get("until"), (int, float)) and entry["until"] > now)


def rdzv_port(root: Path, job_id: str, node: str | None = None, now: float | None = None,
              free: Callable[[int], bool] = port_is_free) -> int:
    """The port job ``job_id`` serves its rendezvous on, on this node (``node``), reserved in the
    registry of the runs root ``root``. A requeued job's earlier reservation is its own again.
    Without a usable registry (a read-only root) the bind check alone decides."""
    node = node or socket.gethostname()
    now = time.time() if now is None else now
    try:
        with _registry(root) as held:
            for key in [k for k, v in held.items() if not _other_live(v, job_id, now)]:
                del held[key]
            taken = {int(k.rpartition(":")[2]) for k in held
                     if k.rpartition(":")[0] == node and k.rpartition(":")[2].isdigit()}
            port = _choose(job_id, taken, free)
            held[f"{node}:{port}"] = {"job": job_id, "until": now + RESERVE_S}
            return port
    except OSError:
        return _choose(job_id, set(), free)
