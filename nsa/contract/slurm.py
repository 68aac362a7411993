"""Slurm records: what a run submitted through a cluster's login node keeps and shows.

``SlurmRequest`` is what the user asked for (``launch --slurm``), ``SlurmJob`` is slurm.json
in the run directory (the job the agent submitted, its script, and the final state once the
agent saw one: squeue and scontrol forget a job minutes after it ends), ``SlurmState`` is the
queue state a run view carries. State names are Slurm's own (``squeue -o %T``).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from nsa.contract.records import Record

# Slurm's job states, grouped by what they mean for a run.
QUEUED_STATES = frozenset(
    {
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "CONFIGURING",
        "RESV_DEL_HOLD",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "RESIZING",
    }
)
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT"})
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
UNKNOWN_STATE = "UNKNOWN"  # the cluster no longer knows the job and none was recorded


class SlurmRequest(Record, kw_only=True):
    """The allocation asked for; ``sbatch_args`` pass through as separate arguments."""

    nodes: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1
    partition: str | None = None
    time: str | None = None  # [D-]HH:MM:SS
    account: str | None = None
    sbatch_args: list[str] = []
    requeue: bool = False  # requeue on preemption or near the time limit, resuming from a checkpoint
    signal_s: Annotated[int, msgspec.Meta(ge=10, le=86400)] = 120  # warning before the limit (requeue)


class SlurmState(Record, kw_only=True):
    """A job as the cluster reports it now (``source``: squeue, scontrol, sacct or recorded)."""

    job_id: str
    state: str
    reason: str | None = None  # why it is pending (Priority, Resources, JobHeldUser, ...)
    nodes: str | None = None  # Slurm's node list (``node[1-4]``)
    start_time: str | None = None  # expected start while pending, actual start once running
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0  # times it was requeued
    script: str = ""  # the batch script in the run directory
    source: str = ""


class SlurmJob(Record, kw_only=True):
    """slurm.json: the job a launch submitted (agent on the login node)."""

    job_id: str
    script: str  # its path (kept in the run directory)
    submitted: float
    sbatch: list[str]  # the argument list sbatch got
    slurm_version: str
    request: SlurmRequest
    nproc_per_node: int
    final: SlurmState | None = None  # written once the agent sees an end state
