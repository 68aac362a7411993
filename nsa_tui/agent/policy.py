"""A run's ``on_failure`` policy, carried out by its watchdog (docs/host-agent.md, "Policies").

- ``stop``: after a hang (stall, no heartbeat, NCCL-hang signature) stop the run so its GPUs
  are free: TERM to every rank, KILL after ``grace_s``, then torchrun if it lingers.
- ``fallback``: after a hang (stopped as above) or a rank crash, relaunch on one GPU from
  the newest complete checkpoint with the same global batch (the ``f`` key's relaunch).
- ``restart``: after a crash or failure (a hang is stopped first), relaunch with the same
  world size from the newest complete checkpoint, at most ``max_restarts`` times in a row,
  after ``backoff_s`` doubled per earlier restart. Not after a NaN (it would come back at the
  same step) or a full disk (it would fail again).

Every action is an alert of kind ``policy`` (in alerts.jsonl, delivered like any other) and a
line in train.log saying what was done and why. Relaunches go through the launcher's
idempotent relaunch (``relaunch.json``), so a person's ``f`` at the same moment and the
policy start one run, not two.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsa.contract import (
    FAILED_STATUSES,
    WATCHDOG_STOP,
    Alert,
    LaunchInfo,
    Relaunch,
    RunView,
    StopInfo,
    read_json,
    write_json_atomic,
)
from nsa.contract.rundir import LAUNCH_JSON, RELAUNCH_JSON, STOP_JSON
from nsa_tui.agent.owners import own_part
from nsa_tui.agent.procs import run_processes

NO_RESTART_KINDS = ("nan", "disk_full", "config_size", "config_seq")


def restarts_before(runs_root: Path, run_id: str, limit: int = 1000) -> int:
    """How many ``restart`` relaunches in a row led to ``run_id`` (its ancestors, newest first)."""
    n, cur = 0, run_id
    while n < limit:
        launch = read_json(runs_root / cur / LAUNCH_JSON, LaunchInfo)
        parent = launch.parent_run if launch else None
        if not parent:
            break
        rel = read_json(runs_root / parent / RELAUNCH_JSON, Relaunch)
        if rel is None or rel.op != "restart" or rel.child_run != cur:
            break
        n, cur = n + 1, parent
    return n


class PolicyRunner:
    """Carries out one run's policy; ``announce(message)`` makes it an alert and a log line."""

    def __init__(self, run_dir: Path, policy: Any, child: subprocess.Popen[bytes] | Any,
                 announce: Callable[[str], None], sleep: Callable[[float], None] = time.sleep) -> None:
        self.run_dir = Path(run_dir)
        self.run_id = self.run_dir.name
        self.p = policy
        self.child = child
        self.announce = announce
        self.sleep = sleep
        self.hang: Alert | None = None  # the hang that made the watchdog stop the run
        self.stopping: threading.Thread | None = None
        self.started: str | None = None  # the run a relaunch started

    @property
    def action(self) -> str:
        return self.p.action if self.p is not None else "none"

    def on_hang(self, alerts: list[Alert]) -> None:
        """Hangs were raised (all those of one look): stop the run (stop, fallback, restart),
        once, without blocking."""
        if self.action == "none" or self.stopping is not None or not alerts:
            return
        self.hang = alerts[0]
        whats = sorted({a.kind for a in alerts})
        ranks = sorted({a.rank for a in alerts if a.rank is not None})
        who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else "the run"
        self.announce(f"on_failure={self.action}: stopping the run after a {' and '.join(whats)} of {who} "
                      f"({alerts[0].message}); TERM to every rank, KILL after {self.p.grace_s:.0f} s"
                      + ("; then a relaunch" if self.action in ("fallback", "restart") else ""))
        self.stopping = threading.Thread(target=self._stop_run, name="nsa-policy-stop", daemon=True)
        self.stopping.start()

    def _ranks(self) -> list[int]:
        return [p.pid for p in run_processes(self.run_id, fresh=True, run_dir=str(own_part(self.run_dir)))
                if p.rank is not None]

    def _stop_run(self) -> None:
        from nsa_tui.agent.runlock import run_lock

        with run_lock(self.run_dir):
            write_json_atomic(own_part(self.run_dir) / STOP_JSON,
                              StopInfo(ts=time.time(), by=f"{WATCHDOG_STOP} (on_failure={self.action})"))
            ranks = self._ranks()
            _signal(ranks, signal.SIGTERM)
            deadline = time.monotonic() + self.p.grace_s
            while ranks and time.monotonic() < deadline:
                time.sleep(0.5)
                ranks = self._ranks()
            if ranks:
                _signal(ranks, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while self.child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.child.poll() is None:  # torchrun did not notice: end it too
                self.child.terminate()
                try:
                    self.child.wait(5)
                except subprocess.TimeoutExpired:
                    self.child.kill()

    def after_exit(self, view: RunView, alerts: list[Alert]) -> None:
        """torchrun has exited (exit.json is written): relaunch if the policy says so."""
        if self.stopping is not None:
            self.stopping.join(timeout=self.p.grace_s + 60)
        if self.action not in ("restart", "fallback"):
            return
        ended = next((a for a in alerts if a.kind in ("crash", "nan", "disk_full")), None)
        status = view.status
        hang = self.hang is not None
        crashed = status in FAILED_STATUSES and ended is not None
        if view.stop_requested and not hang:
            return  # a person stopped it: nothing failed
        if not (hang or crashed):
            return
        why = f"a {self.hang.kind}" if self.hang is not None else f"a {ended.kind if ended else 'failure'}"
        if ended is not None and ended.kind in NO_RESTART_KINDS:
            self.announce(f"on_failure={self.action}: no relaunch after {why} ({ended.message[:200]}): "
                          "it would fail the same way")
            return
        root = self.run_dir.parent
        op, nproc = ("fallback", 1) if self.action == "fallback" else ("restart", None)
        if op == "restart":
            n = restarts_before(root, self.run_id)
            if n >= self.p.max_restarts:
                self.announce(f"on_failure=restart: not restarting after {why}: {n} restarts in a row "
                              f"already (on_failure.max_restarts={self.p.max_restarts})")
                return
            delay = self.p.backoff_s * 2 ** n
            self.announce(f"on_failure=restart: restart {n + 1} of at most {self.p.max_restarts} after "
                          f"{why}, in {delay:.0f} s, from the newest complete checkpoint")
            self.sleep(delay)
        self._relaunch(op, nproc, why)

    def _relaunch(self, op: str, nproc: int | None, why: str) -> None:
        from nsa_tui.agent.launcher import Launcher, OpError
        from nsa_tui.agent.runs import RunStore

        gpu = _gpu_reader()
        launcher = Launcher(RunStore(self.run_dir.parent), python=sys.executable,
                            gpu_count=gpu.count() if gpu else 0, read_gpus=gpu.read if gpu else None)
        try:
            res = launcher.relaunch(self.run_id, op, nproc)
        except OpError as exc:
            self.announce(f"on_failure={self.action}: cannot relaunch after {why}: {exc.message}")
            return
        except KeyError as exc:
            self.announce(f"on_failure={self.action}: cannot relaunch after {why}: no run {exc}")
            return
        self.started = res.run_id
        where = f"on one GPU ({res.nproc} process)" if op == "fallback" else f"with {res.nproc} process(es)"
        again = " (it had been started before)" if res.again else ""
        self.announce(f"on_failure={self.action}: relaunched {where} from {res.resume_from} as run "
                      f"{res.run_id}{again} after {why}")


def _gpu_reader() -> Any:
    try:
        from nsa_tui.agent.sampler import NvmlSource

        src = NvmlSource()
        return src if src.ok else None
    except Exception:  # noqa: BLE001 - no NVML: the launcher's defaults (no GPU pinning)
        return None


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
