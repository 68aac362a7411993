"""Run statuses and rank phases: one definition for trainer, agent, client, panel and CLI.

Two layers say "status": the trainer writes its own view into run.json (``starting``,
``running``, then ``finished`` | ``stopped`` | ``failed``), and the agent derives the
status a user sees by combining it with process liveness (``stopping``, ``crashed``,
``lost``, ``unknown``). Both are values of :class:`RunStatus`; :data:`TRAINER_STATUSES`
is the subset run.json may hold.
"""

from __future__ import annotations

from enum import Enum


class RunStatus(str, Enum):
    """A run's status. Order: unknown < queued < starting < running < stopping < every end status."""

    UNKNOWN = "unknown"  # started by hand, no run.json status yet: nothing to check against
    QUEUED = "queued"  # a batch job waiting in the cluster's queue (Slurm): not started, not stalled
    STARTING = "starting"  # boot: imports, process group, model, data
    RUNNING = "running"  # the first step has begun
    STOPPING = "stopping"  # the trainer wrote its end status but processes remain
    FINISHED = "finished"  # trained every step
    STOPPED = "stopped"  # stopped on request (a checkpoint was saved), or killed through the agent
    FAILED = "failed"  # the trainer recorded a failure (exit_reason says why)
    CRASHED = "crashed"  # processes gone without an end status (exit code and log tail say why)
    LOST = "lost"  # launched before the host's last reboot, no end status

    @property
    def order(self) -> int:
        """Position in the life cycle; every end status shares the last position."""
        return _ORDER[self]

    def is_terminal(self) -> bool:
        """The run has ended: nothing of it runs any more."""
        return self.order == _END

    def is_alive(self) -> bool:
        """Processes of the run are (or are about to be) up."""
        return self in LIVE_STATUSES

    def advance(self, new: RunStatus) -> RunStatus:
        """The status after an update to ``new``: never backwards (a late or racing report of an
        earlier state cannot undo a later one); one end status may refine another."""
        return new if new.order >= self.order else self


_END = 5
_ORDER = {
    RunStatus.UNKNOWN: 0,
    RunStatus.QUEUED: 1,
    RunStatus.STARTING: 2,
    RunStatus.RUNNING: 3,
    RunStatus.STOPPING: 4,
    RunStatus.FINISHED: _END,
    RunStatus.STOPPED: _END,
    RunStatus.FAILED: _END,
    RunStatus.CRASHED: _END,
    RunStatus.LOST: _END,
}

# The sets every side asks about; spelled here once, so the CLI's exit code, the alerts, the
# watchdog and the panel's colours cannot disagree about which runs went wrong.
LIVE_STATUSES: frozenset[RunStatus] = frozenset({RunStatus.STARTING, RunStatus.RUNNING, RunStatus.STOPPING})
TERMINAL_STATUSES: frozenset[RunStatus] = frozenset(s for s, o in _ORDER.items() if o == _END)
# Ended by a failure: the log tail and the evidence say why.
FAILED_STATUSES: frozenset[RunStatus] = frozenset({RunStatus.CRASHED, RunStatus.FAILED})
# A user must look (``nsa-tui status`` exits non-zero): a failure, or a run the host lost.
UNHEALTHY_STATUSES: frozenset[RunStatus] = FAILED_STATUSES | {RunStatus.LOST}

# What the trainer itself may write into run.json.
TRAINER_STATUSES = (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.FINISHED, RunStatus.STOPPED,
                    RunStatus.FAILED)


class Phase(str, Enum):
    """What a rank is doing, from its heartbeats (every phase visible: a slow start-up is no hang)."""

    BOOT = "boot"  # imports, process group, model build, checkpoint load
    DATA = "data"  # opening the data source, or a step waiting for the loader
    COMPILE = "compile"  # the first step with train.compile
    TRAIN = "train"
    EVAL = "eval"
    CHECKPOINT = "checkpoint"
    DONE = "done"  # last beat of a finished or stopped rank
    FAILED = "failed"  # last beat of a failed rank (carries ``error``)

    def is_final(self) -> bool:
        return self in (Phase.DONE, Phase.FAILED)
