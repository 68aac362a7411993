"""The status a user sees of a Slurm run: the queue's state combined with what the trainer wrote.

Why its own rule: on a login node the run's processes are on other machines, so liveness comes
from the queue, not from /proc. A pending job is ``queued`` (not alive: no heartbeat is owed,
no stall alert); a running one is alive with the trainer's status; an ended one keeps the
trainer's end status (a job cancelled near its limit still saved and said ``stopped``), else
``stopped`` when a stop was asked for, else ``crashed`` (the exit code says how).
"""

from __future__ import annotations

from nsa.contract import RunStatus
from nsa.contract.slurm import FINAL_STATES, QUEUED_STATES, RUNNING_STATES, SlurmState


def run_status(
    state: SlurmState | None, trainer: RunStatus | None, stop_requested: bool
) -> tuple[RunStatus, bool]:
    """(status, alive) of the run."""
    if state is not None and state.state in QUEUED_STATES:
        return RunStatus.QUEUED, False
    if state is not None and state.state in RUNNING_STATES:
        if trainer is None:
            return RunStatus.STARTING, True
        if trainer.is_terminal():
            return RunStatus.STOPPING, True
        return trainer, True
    if trainer is not None and trainer.is_terminal():
        return trainer, False
    if stop_requested:
        return RunStatus.STOPPED, False
    if state is None:
        return RunStatus.LOST, False  # the cluster forgot the job and no end was recorded
    if state.state in FINAL_STATES or state.state:
        return RunStatus.CRASHED, False
    return RunStatus.UNKNOWN, False
