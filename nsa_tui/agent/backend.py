"""How the agent starts, stops and relaunches a run's processes: one interface, one class a way.

Why: a run is either torchrun started on this host (``DirectBackend``) or a batch job the
cluster's queue starts elsewhere (``SlurmBackend``); the agent's handlers (ops.py) should not
know which. Each backend says which runs are its own (from the run directory: a Slurm run has
its job record), which launch requests it takes, and, where the run's processes are not this
host's to judge, the run's status for its view. ``backends.py`` holds the list and chooses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from nsa.contract import RunStatus
from nsa.contract.replies import KillResult, LaunchResult
from nsa.contract.requests import FallbackArgs, LaunchArgs, ResumeArgs
from nsa.contract.slurm import SlurmState

if TYPE_CHECKING:
    from nsa_tui.agent.launcher import Launcher


@dataclass
class JobView:
    """What a backend says of a run's liveness when something other than this host's process
    table knows it (a queue); ``slurm`` is what the run's view shows as its batch job;
    ``watchdog``: a watchdog beside the job records the run's alerts now (RunView.watchdog)."""

    status: RunStatus
    alive: bool
    slurm: SlurmState | None = None
    watchdog: bool = False


class RunBackend(ABC):
    """One way of running a job. A backend is built per request around the agent's launcher
    (its run store, python, config handling and relaunch planning, shared by every backend)."""

    kind: ClassVar[str]

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher

    @classmethod
    @abstractmethod
    def owns(cls, run_dir: Path) -> bool:
        """Whether the run in ``run_dir`` was started by this backend (its own record there)."""

    @classmethod
    @abstractmethod
    def takes(cls, a: LaunchArgs) -> bool:
        """Whether a launch request is for this backend."""

    @classmethod
    def job_view(cls, run_dir: Path, trainer: RunStatus | None, stop_requested: bool) -> JobView | None:
        """The run's status when this backend knows it better than the processes here do; None:
        judged from this host's processes (and the leases of the hosts sharing the runs root)."""
        return None

    @abstractmethod
    async def launch(self, a: LaunchArgs, overrides: list[str]) -> LaunchResult:
        """Start a new run; ``overrides`` are the request's with its ``on_failure`` added."""

    @abstractmethod
    async def kill(self, run_id: str, grace_s: float) -> KillResult:
        """Stop the run, confirmed: TERM (the ranks save a checkpoint), forced after the grace."""

    @abstractmethod
    async def fallback(self, run_id: str, a: FallbackArgs) -> LaunchResult:
        """Stop the run and start it again smaller from its newest checkpoint, the same global
        batch: a new run linked to it. Idempotent, under the run's lock."""

    @abstractmethod
    async def resume(self, run_id: str, a: ResumeArgs) -> LaunchResult:
        """Start a stopped run again from its checkpoint as a new run linked to it. Idempotent."""
