"""Run directories under the runs root: records, liveness and derived status.

Liveness survives PID reuse and reboots (LESSONS 12): a run is alive only while a
process of its recorded process group carries ``NSA_RUN_ID=<run id>`` in its
environment, and a run whose launch recorded another boot id cannot be alive.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from nsa_tui.agent.tail import tail_text

TERMINAL = ("finished", "failed", "stopped")
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def boot_id() -> str:
    """This boot's id; it changes on every reboot, so a stale run is recognisable."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path`` or None (absent, half-written or not an object)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write atomically (temporary name, then rename), like the trainer does."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _pgrp(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may contain spaces and parentheses: fields follow the last ")"
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[2])
    except (IndexError, ValueError):
        return None


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


_GROUPS: tuple[float, dict[int, list[int]]] = (0.0, {})
GROUPS_MAX_AGE_S = 0.5


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
                grp = _pgrp(int(entry.name))
                if grp is not None:
                    groups.setdefault(grp, []).append(int(entry.name))
        _GROUPS = (now, groups)
    return _GROUPS[1]


def run_processes(run_id: str, pgid: int | None = None, fresh: bool = False) -> list[dict[str, Any]]:
    """Processes carrying ``NSA_RUN_ID=run_id`` (in group ``pgid`` when given).

    Each item: ``pid``, ``pgid``, ``rank`` (int or None: the launcher/supervisor).
    ``fresh`` rescans /proc now (kill's confirmation must not trust a cached scan).
    """
    groups = process_groups(0.0 if fresh or pgid is None else GROUPS_MAX_AGE_S)
    found = []
    for grp, pids in ([(pgid, groups.get(pgid, []))] if pgid is not None else groups.items()):
        for pid in pids:
            env = environ_of(pid)
            if env.get("NSA_RUN_ID") != run_id:
                continue
            rank = env.get("RANK")
            found.append({"pid": pid, "pgid": grp, "rank": int(rank) if rank and rank.isdigit() else None})
    return found


def _orphan_ranks(run_dir: Path, run_id: str) -> list[dict[str, Any]]:
    """Ranks that outlived the recorded group, found by the pid in their last heartbeat.

    Why: torchrun starts each rank in a session of its own, so when the launcher and
    torchrun die (KILL) a rank can live on outside the group, checkpointing after its
    PDEATHSIG or hung for good; the run is not dead (crashed) while it holds its GPU.
    """
    found: list[dict[str, Any]] = []
    try:
        entries = list(os.scandir(run_dir / "heartbeats"))
    except OSError:
        return found
    for e in entries:
        if not (e.name.startswith("rank-") and e.name.endswith(".jsonl")):
            continue
        try:
            pid = int(json.loads(tail_text(e.path, 1, 4096)[-1])["pid"])
        except (IndexError, KeyError, TypeError, ValueError):
            continue
        env = environ_of(pid)
        if env.get("NSA_RUN_ID") == run_id:  # the id, not the pid alone: PID reuse cannot fake it
            rank = env.get("RANK")
            found.append({"pid": pid, "pgid": _pgrp(pid),
                          "rank": int(rank) if rank and rank.isdigit() else None})
    return found


def _younger_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


class RunStore:
    """The runs root: one directory per run id, private to its user."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.expanduser(str(root))).resolve()

    def ensure(self) -> None:
        """Create the root (0700) if needed."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def run_dir(self, run_id: str) -> Path:
        """The directory of ``run_id``; refuses ids that could escape the root."""
        if not RUN_ID_RE.match(run_id or ""):
            raise KeyError(run_id)
        path = self.root / run_id
        if not path.is_dir():
            raise KeyError(run_id)
        return path

    def ids(self) -> list[str]:
        """Run ids, newest first (ids start with a UTC time stamp)."""
        try:
            names = [e.name for e in os.scandir(self.root) if e.is_dir() and RUN_ID_RE.match(e.name)]
        except OSError:
            return []
        return sorted(names, reverse=True)

    def record(self, run_id: str, with_tail: bool = True) -> dict[str, Any]:
        """run.json + launch.json + exit.json of a run, with a derived ``status``.

        Derived statuses: the trainer's own (starting/running/stopped/finished/failed)
        while consistent with the processes; ``crashed`` when the processes are gone
        without a final status (``exit_code`` and ``log_tail`` say why); ``lost`` when
        a running run was launched before the last reboot; ``stopping`` when a final
        status is written but processes remain.
        """
        d = self.run_dir(run_id)
        run = read_json(d / "run.json") or {}
        launch = read_json(d / "launch.json") or {}
        exited = read_json(d / "exit.json")
        rec: dict[str, Any] = {"run_id": run_id, "dir": str(d)}
        rec.update({k: v for k, v in run.items() if k != "config"})
        rec["config"] = run.get("config")
        rec["launch"] = launch or None
        rec["name"] = launch.get("name") or run.get("name") or run_id
        rec["trainer_status"] = run.get("status")
        pgid = launch.get("launcher_pgid")
        same_boot = not launch.get("boot_id") or launch.get("boot_id") == boot_id()
        procs = run_processes(run_id, pgid) if (same_boot and (pgid or launch)) else []
        if not procs and same_boot and pgid and _younger_than(d / "launch.json", 2 * GROUPS_MAX_AGE_S + 1.0):
            # the shared /proc scan may predate this launch: a run started a moment ago
            # would read as crashed (a false crash alert, `logs -f` ending at once)
            procs = run_processes(run_id, pgid, fresh=True)
        if not procs and same_boot and launch and run.get("status") not in TERMINAL:
            procs = _orphan_ranks(d, run_id)  # launcher and torchrun gone, ranks still up
        alive = bool(procs)
        rec["alive"] = alive
        rec["pids"] = [p["pid"] for p in procs]
        rec["exit_code"] = exited.get("exit_code") if exited else None
        status = run.get("status")
        rec["stop_requested"] = (d / "stop.json").exists()
        if alive:
            derived = "stopping" if status in TERMINAL else (status or "starting")
        elif status in TERMINAL:
            derived = status
        elif not launch:
            derived = status or "unknown"  # started by hand: nothing to check against
        elif not same_boot:
            derived = "lost"
        elif (d / "stop.json").exists():
            derived = "stopped"  # killed through the agent before it wrote a final status
        else:
            derived = "crashed"
        rec["status"] = derived
        failed = with_tail and derived in ("crashed", "failed")
        rec["log_tail"] = tail_text(str(d / "train.log"), 150, 65536) if failed else []
        return rec

    def records(self) -> list[dict[str, Any]]:
        """Every run's record, newest first; unreadable ones are skipped."""
        out = []
        for run_id in self.ids():
            try:
                out.append(self.record(run_id, with_tail=False))
            except (KeyError, OSError):
                continue
        return out

    def latest_checkpoint(self, run_id: str) -> str | None:
        """Path of the newest complete checkpoint (``checkpoints/latest``), or None."""
        ck = self.run_dir(run_id) / "checkpoints"
        try:
            name = (ck / "latest").read_text().strip()
        except OSError:
            return None
        path = ck / name
        if name and "/" not in name and path.is_dir():
            return str(path)
        return None
