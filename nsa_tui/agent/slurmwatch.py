"""The watchdog of a Slurm run, beside its job: ``python -m nsa_tui.agent.slurmwatch RUN_DIR JOB_ID``.

A run started with torchrun on a host has its watchdog in its supervisor (supervise.py); a batch
job has none of ours around srun, so its batch script (nsa_tui/slurm/script.py) starts this one
in the background on the allocation's first node, before srun. It is the same
:class:`~nsa_tui.agent.watchdog.Watchdog` (the alert rules, alerts.jsonl, notifications,
evidence) with the run's ``on_failure`` carried out the Slurm way (:class:`SlurmPolicy`). Why in
the job (docs/slurm.md, "The watchdog"): it needs no panel, CLI or SSH session, runs where the
ranks' processes and the job's Slurm commands are, and ends with the allocation.

- Its lease (lease.json, renewed every few seconds) tells the login node, which cannot see the
  node's processes, that the run's alerts are being recorded (``RunView.watchdog``).
- Ranks on this node are judged by its process table, ranks on other nodes by their heartbeats
  alone (their pids mean nothing here).
- srun's end comes from the script as exit.json (``jobside exit``); the watchdog writes the run's
  final alerts, rewrites exit.json with ``watchdog`` true, then applies the policy (a relaunch is
  a new job submitted from here) while the script waits for it, bounded.
- TERM comes from Slurm ending the job (scancel, the time limit, a requeue, a preemption): no
  failure of the run, so the policy stands down; the final alerts are still written.

Whatever goes wrong here is said in train.log (its stdout) and stays here: the training, in
srun, is no child of this process and never waits for it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nsa.contract import WATCHDOG_STOP, ExitInfo, StopInfo, read_json, write_json_atomic
from nsa.contract.rundir import EXIT_JSON, STOP_JSON
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.owners import LeaseKeeper
from nsa_tui.agent.policy import PolicyRunner
from nsa_tui.agent.supervise import after_run, finish_watchdog, log, start_watchdog

POLL_S = 0.5  # how often the hand-over (exit.json) and the batch shell are looked for
DRAIN_S = 30.0  # notifications still being delivered after the run: the script waits for them
KILL_WAIT_S = 15.0  # after the KILL, for srun's end


def _ignore(signum: int, frame: object) -> None:
    """INT, HUP, USR1 are the batch shell's (USR1: the time-limit warning), never this process's."""


class SlurmPolicy(PolicyRunner):
    """A Slurm job's ``on_failure``: the stop reaches every node through Slurm (``scancel
    --signal`` of the job's srun steps, not of the batch step where this process lives), a
    relaunch is a new job (sbatch from this node, slurm_backend.relaunch_from_job) whose backoff
    the queue waits (``--begin``) rather than the held allocation. ``ended``: Slurm is ending the
    job (TERM): nothing is stopped or relaunched any more."""

    def __init__(self, run_dir: Path, policy: Any, job_id: str, announce: Any,
                 ended: threading.Event) -> None:
        super().__init__(run_dir, policy, None, announce, sleep=self._defer)
        self.job_id = job_id
        self.ended = ended
        self.begin_s = 0.0

    def _defer(self, delay: float) -> None:
        self.begin_s = delay

    def on_hang(self, alerts: list[Any]) -> None:
        if not self.ended.is_set():
            super().on_hang(alerts)

    def after_exit(self, view: Any, alerts: list[Any]) -> None:
        if self.ended.is_set():
            if self.stopping is not None:
                self.stopping.join(timeout=self.p.grace_s + 60)
            return  # Slurm ended the job (a person's scancel, the time limit, a requeue): no failure
        super().after_exit(view, alerts)

    def _handed_over(self, wait_s: float) -> bool:
        """Whether srun has ended (the script's exit.json) within ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while not (self.run_dir / EXIT_JSON).exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def _stop_run(self) -> None:
        from nsa_tui.agent.runlock import run_lock
        from nsa_tui.agent.slurm_backend import signal_steps

        with run_lock(self.run_dir):
            write_json_atomic(self.run_dir / STOP_JSON,
                              StopInfo(ts=time.time(), by=f"{WATCHDOG_STOP} (on_failure={self.action})"))
            problem = signal_steps(self.job_id, "TERM")
            if problem:
                self.announce(f"on_failure={self.action}: TERM not sent: {problem}")
            if self._handed_over(self.p.grace_s):
                return
            problem = signal_steps(self.job_id, "KILL")
            if problem:
                self.announce(f"on_failure={self.action}: KILL not sent: {problem}")
            self._handed_over(KILL_WAIT_S)

    def _relaunch(self, op: str, nproc: int | None, why: str) -> None:
        from nsa_tui.agent.launcher import Launcher
        from nsa_tui.agent.runs import RunStore
        from nsa_tui.agent.slurm_backend import relaunch_from_job

        launcher = Launcher(RunStore(self.run_dir.parent), python=sys.executable)
        try:
            res = relaunch_from_job(launcher, self.run_dir, op, self.begin_s)
        except (OpError, KeyError) as exc:
            said = exc.message if isinstance(exc, OpError) else f"no run {exc}"
            self.announce(f"on_failure={self.action}: cannot relaunch after {why}: {said}")
            return
        self.started = res.run_id
        where = "on one node, one process" if op == "fallback" else f"with {res.nproc} process(es) per node"
        again = " (it had been started before)" if res.again else ""
        later = f", to start in {self.begin_s:.0f} s" if self.begin_s >= 1 and not res.again else ""
        self.announce(f"on_failure={self.action}: relaunched as job {res.slurm_job_id} {where} from "
                      f"{res.resume_from} as run {res.run_id}{again} after {why}{later}")


def wait_for_end(run_dir: Path, shell: int, started: float) -> ExitInfo:
    """srun's end as the batch script hands it over (exit.json); if the script is gone without it
    (killed), an end without an exit code."""
    while True:
        rec = read_json(run_dir / EXIT_JSON, ExitInfo)
        if rec is not None:
            return rec
        if os.getppid() != shell:
            log("nsa-tui watchdog: the batch script ended without srun's exit code")
            return ExitInfo(started_at=started, ended_at=time.time())
        time.sleep(POLL_S)


def watch(run_dir: Path, job_id: str, shell: int, ended: threading.Event) -> None:
    """Watch the run until srun's end is handed over, then its final alerts and policy."""
    started = time.time()

    def runner(policy: Any, announce: Any) -> SlurmPolicy:
        return SlurmPolicy(run_dir, policy, job_id, announce, ended)

    wd = start_watchdog(run_dir, runner, by_host=True)
    log(f"nsa-tui watchdog: watching job {job_id} from {socket.gethostname()} (pid {os.getpid()})")
    record = wait_for_end(run_dir, shell, started)
    final = finish_watchdog(run_dir, wd, record)
    write_json_atomic(run_dir / EXIT_JSON, record)
    after_run(wd, final, DRAIN_S)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m nsa_tui.agent.slurmwatch RUN_DIR JOB_ID", file=sys.stderr)
        return 2
    run_dir, job_id = Path(argv[0]), argv[1]
    ended = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: ended.set())
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, _ignore)
    shell = os.getppid()
    lease = LeaseKeeper(run_dir)  # the login node's word that this watchdog lives
    lease.start()
    try:
        watch(run_dir, job_id, shell, ended)
    except Exception as exc:  # noqa: BLE001 - the job goes on without its watchdog
        log(f"nsa-tui watchdog: stopped: {type(exc).__name__}: {exc}")
    finally:
        lease.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
