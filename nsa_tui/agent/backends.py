"""Which backend runs a job: the one place the choice is made (backend.py says what one provides).

A launch request goes to the first backend that ``takes`` it; an existing run to the first
that ``owns`` its directory, so fallback, resume, kill and the run's view follow the way the
run was started. ``DirectBackend`` takes and owns everything and comes last; a new backend goes
before it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nsa.contract import RunStatus
from nsa.contract.requests import LaunchArgs
from nsa_tui.agent.backend import JobView, RunBackend
from nsa_tui.agent.direct_backend import DirectBackend
from nsa_tui.agent.slurm_backend import SlurmBackend

if TYPE_CHECKING:
    from nsa_tui.agent.launcher import Launcher

BACKENDS: tuple[type[RunBackend], ...] = (SlurmBackend, DirectBackend)


def backend_class(run_dir: Path) -> type[RunBackend]:
    """The backend that started the run in ``run_dir``."""
    return next(cls for cls in BACKENDS if cls.owns(run_dir))


def backend_for_run(launcher: Launcher, run_dir: Path) -> RunBackend:
    """The backend that stops and relaunches the run in ``run_dir``."""
    return backend_class(run_dir)(launcher)


def backend_for_launch(launcher: Launcher, a: LaunchArgs) -> RunBackend:
    """The backend that starts the run ``a`` asks for."""
    return next(cls for cls in BACKENDS if cls.takes(a))(launcher)


def job_view(run_dir: Path, trainer: RunStatus | None, stop_requested: bool) -> JobView | None:
    """The run's liveness as its backend knows it, or None: this host's processes say."""
    return backend_class(run_dir).job_view(run_dir, trainer, stop_requested)
