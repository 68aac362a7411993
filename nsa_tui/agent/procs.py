"""Which processes belong to a run, from /proc.

Liveness survives PID reuse and reboots, so a stop finds all of a run: a process belongs to a run only
while it carries ``NSA_RUN_ID=<run id>`` in its environment (every process of a run
inherits it from the agent's launch). ``RANK`` in that environment marks a rank (torchrun
sets it for its workers, never for itself or the supervisor). ``NSA_RUN_DIR`` says which
directory's part of the run it is: one run over several hosts shares its id, and two
"hosts" may be one machine (two runs roots, as in the tests), so a host's agent counts only
its own part. Processes started before NSA_RUN_DIR existed carry none and still count.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

GROUPS_MAX_AGE_S = 0.5


@dataclass(frozen=True)
class RunProcess:
    pid: int
    pgid: int | None
    rank: int | None  # None: the supervisor or torchrun


@functools.cache
def boot_id() -> str:
    """This boot's id; it changes on every reboot, so a stale run is recognisable. Read once:
    no process outlives its boot, and the status check asks for it on every look."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pgrp(pid: int) -> int | None:
    """The process group of ``pid`` (None if it is gone). A system call, not a read of
    /proc/PID/stat: the /proc scan below asks it of every process on the host."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


RUN_KEYS = ("NSA_RUN_ID", "NSA_RUN_DIR", "RANK")  # what says whose a process is


def environ_of(pid: int, keys: tuple[str, ...] | None = None) -> dict[str, str]:
    """The environment ``pid`` started with ({} if it is gone or not ours to read); only
    ``keys`` when given: the liveness check looks at a few variables of a few processes
    every second, and a process's whole environment is hundreds of them."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    if keys is not None:
        raw = b"\0" + raw
        for key in keys:
            mark = b"\0" + key.encode() + b"="
            at = raw.rfind(mark)  # the last of a repeated variable, as the full parse keeps
            if at >= 0:
                start = at + len(mark)
                end = raw.find(b"\0", start)
                env[key] = raw[start:end if end >= 0 else len(raw)].decode("utf-8", "replace")
        return env
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def settle(pid: int, timeout_s: float = 0.5) -> bool:
    """Wait (at most ``timeout_s``) until ``pid`` shows its environment; False if it never did.

    Why: a parent learns that exec succeeded before the kernel has set up the new image's
    environment, and until then /proc/PID/environ reads empty (here, 9 reads in 10 just
    after ``Popen`` returned): a run launched a moment ago would look as if none of its
    processes were up, i.e. crashed. Only a look at a just-launched run waits here.
    """
    deadline = time.monotonic() + timeout_s
    path = Path(f"/proc/{pid}/environ")
    while True:
        try:
            if path.read_bytes():
                return True
        except OSError:
            return False  # gone (or not ours to read)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def rank_of(env: dict[str, str]) -> int | None:
    rank = env.get("RANK", "")
    return int(rank) if rank.isdigit() else None


_GROUPS: tuple[float, dict[int, list[int]]] = (0.0, {})


def process_groups(max_age_s: float = GROUPS_MAX_AGE_S) -> dict[int, list[int]]:
    """{process group id: pids}, one /proc scan shared by every caller for ``max_age_s``.

    Why: the agent checks every watched run's liveness each second; one scan per second
    instead of one per run keeps it cheap on hosts with thousands of processes.
    """
    global _GROUPS
    now = time.monotonic()
    if now - _GROUPS[0] > max_age_s:
        groups: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                grp = pgrp(int(entry.name))
                if grp is not None:
                    groups.setdefault(grp, []).append(int(entry.name))
        _GROUPS = (now, groups)
    return _GROUPS[1]


def belongs(env: dict[str, str], run_id: str, run_dir: str | None) -> bool:
    """Whether a process with environment ``env`` is part of ``run_id`` (in ``run_dir``)."""
    if env.get("NSA_RUN_ID") != run_id:
        return False
    mine = env.get("NSA_RUN_DIR")
    return run_dir is None or mine is None or mine == run_dir


def run_processes(run_id: str, pgid: int | None = None, fresh: bool = False,
                  run_dir: str | None = None) -> list[RunProcess]:
    """Processes of ``run_id`` (in group ``pgid`` when given; of ``run_dir``'s part when given).

    ``fresh`` rescans /proc now (kill's confirmation must not trust a cached scan).
    """
    groups = process_groups(0.0 if fresh or pgid is None else GROUPS_MAX_AGE_S)
    found = []
    for grp, pids in ([(pgid, groups.get(pgid, []))] if pgid is not None else groups.items()):
        for pid in pids:
            env = environ_of(pid, RUN_KEYS)
            if belongs(env, run_id, run_dir):
                found.append(RunProcess(pid, grp, rank_of(env)))
    return found


def run_process(pid: int | None, run_id: str, run_dir: str | None = None) -> RunProcess | None:
    """``pid`` if it is a live process of ``run_id`` (the id, not the pid alone: PID reuse
    cannot fake it)."""
    if not pid:
        return None
    env = environ_of(pid, RUN_KEYS)
    if not belongs(env, run_id, run_dir):
        return None
    return RunProcess(pid, pgrp(pid), rank_of(env))
