"""Runs started by torchrun on this host (launcher.py, relaunch.py): the default backend.

It takes every launch request no other backend takes and owns every run no other backend
owns; its runs' liveness is judged from this host's process table (runs.py), so it has no
``job_view``. The watchdog's own relaunches of these runs (``on_failure`` restart and fallback,
policy.py) go to ``Launcher.relaunch`` directly (a Slurm job's watchdog relaunches through
slurm_backend.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from nsa.contract.replies import KillResult, LaunchResult
from nsa.contract.requests import FallbackArgs, LaunchArgs, ResumeArgs
from nsa_tui.agent.backend import RunBackend


class DirectBackend(RunBackend):
    """torchrun under the run's supervisor, on this host (or this host's part of a run over several)."""

    kind = "direct"

    @classmethod
    def owns(cls, run_dir: Path) -> bool:
        return True

    @classmethod
    def takes(cls, a: LaunchArgs) -> bool:
        return True

    async def launch(self, a: LaunchArgs, overrides: list[str]) -> LaunchResult:
        return await asyncio.to_thread(self.launcher.launch, a.config_path, config_text=a.config_text,
                                       nproc=a.nproc, overrides=overrides, name=a.name, check=not a.force,
                                       run_id=a.run_id, nodes=a.nodes)

    async def kill(self, run_id: str, grace_s: float) -> KillResult:
        return await self.launcher.kill(run_id, grace_s)

    async def fallback(self, run_id: str, a: FallbackArgs) -> LaunchResult:
        return await self.launcher.fallback(run_id, float(a.grace_s), a.nproc, a.checkpoint)

    async def resume(self, run_id: str, a: ResumeArgs) -> LaunchResult:
        return await asyncio.to_thread(self.launcher.resume, run_id, a.nproc, a.checkpoint, a.run_id, a.nodes)
