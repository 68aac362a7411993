"""A Slurm run's view on the login node: the queue, not /proc, says whether it is alive.

The agent's Slurm backend (nsa_tui/agent/slurm_backend.py) reads a run's view through this
module; it needs the queue and the run directory alone, nothing of the agent.
"""

from __future__ import annotations

from pathlib import Path

from nsa.contract import RunStatus, read_json, write_json_atomic
from nsa.contract.rundir import SLURM_JSON
from nsa.contract.slurm import FINAL_STATES, SlurmJob, SlurmState
from nsa_tui.slurm.queue import SlurmQueue
from nsa_tui.slurm.runstate import run_status

QUEUE = SlurmQueue()  # one per agent process: its cache serves every view


def read_job(run_dir: Path) -> SlurmJob | None:
    return read_json(run_dir / SLURM_JSON, SlurmJob)


def view_state(
    run_dir: Path, job: SlurmJob, trainer: RunStatus | None, stop_requested: bool
) -> tuple[RunStatus, bool, SlurmState]:
    """(status, alive, queue state) of a Slurm run; the first end state seen is recorded in
    slurm.json (squeue and scontrol forget an ended job after a few minutes)."""
    state = job.final or QUEUE.state(job.job_id)
    if state is not None and job.final is None and state.state in FINAL_STATES:
        job.final = state
        try:
            write_json_atomic(run_dir / SLURM_JSON, job)
        except OSError:
            pass  # shown anyway; recorded by the next view
    status, alive = run_status(state, trainer, stop_requested)
    shown = state or SlurmState(job_id=job.job_id, state="UNKNOWN", source="")
    shown.script = job.script
    return status, alive, shown
