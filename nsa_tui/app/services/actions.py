"""What the keys do on a host: launch, stop, fall back, resume, dump, archive, delete.

Each returns a short text for a toast (or raises with the host's message). A new run's
record is the agent's own view from its reply, applied through the reducer: the panel
never invents a run's state.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from nsa.contract.replies import ActionPlan, ConfigSummary, DeleteResult, LaunchResult
from nsa_tui.app import reducer
from nsa_tui.app.state import PanelState
from nsa_tui.fmt import fmt_bytes
from nsa_tui.hosts.client import AgentError, HostClient


class HostActions:
    def __init__(self, state: PanelState, dest: str, client: Callable[[], HostClient | None]) -> None:
        self.state = state
        self.dest = dest
        self._client = client

    @property
    def client(self) -> HostClient:
        c = self._client()
        if c is None:
            raise AgentError("disconnected", f"not connected to {self.dest}")
        return c

    @staticmethod
    def _config_opts(opts: dict[str, Any]) -> tuple[str, int, list[str], bool]:
        """(config, nproc, overrides, upload) from the dialog's options."""
        config = str(opts["config"])
        nproc = opts.get("nproc")
        if not isinstance(nproc, int):
            raise AgentError("bad_request", f"processes must be a whole number, got {nproc!r}")
        overrides = []
        if opts.get("strategy"):
            overrides.append(f"train.strategy={opts['strategy']}")
        if opts.get("data_source"):
            overrides.append(f"data.source={opts['data_source']}")
        overrides += list(opts.get("overrides") or [])
        return config, nproc, overrides, os.path.isfile(os.path.expanduser(config))

    async def launch(self, opts: dict[str, Any]) -> str:
        """Launch from the dialog's options; returns the new run id or raises AgentError."""
        config, nproc, overrides, upload = self._config_opts(opts)
        res = await self.client.launch(config, nproc=nproc, overrides=overrides, name=opts.get("name"),
                                       upload=upload, slurm=opts.get("slurm"))
        return self._started(res)

    async def describe(self, opts: dict[str, Any]) -> ConfigSummary:
        """What the dialog's config is and whether it can run on this host (nothing starts)."""
        config, nproc, overrides, upload = self._config_opts(opts)
        return await self.client.describe(config, nproc=nproc, overrides=overrides, upload=upload)

    async def plan(self, run_id: str, op: str) -> ActionPlan:
        return await self.client.plan(run_id, op)

    async def kill(self, run_id: str) -> str:
        res = await self.client.kill(run_id)
        if not res.was_running:
            return "was not running"
        forced = " (KILL after the grace period)" if res.forced else ""
        return f"stopped{forced}" + (f"; {len(res.remaining)} process(es) remain!" if res.remaining else "")

    async def fallback(self, run_id: str) -> str:
        return self._started(await self.client.fallback(run_id))

    async def resume(self, run_id: str) -> str:
        return self._started(await self.client.resume(run_id))

    def _started(self, res: LaunchResult) -> str:
        if res.view is not None:
            reducer.run_view(self.state, self.dest, res.view)
        return res.run_id

    async def ack(self, run_id: str, alert_id: str) -> str:
        st = await self.client.ack(run_id, alert_id)
        reducer.recorded_alert(self.state, self.dest, st)
        return f"{st.id} acknowledged"

    async def evidence(self, run_id: str, alert_id: str) -> str:
        """The files the host's watchdog captured for an alert, as one text."""
        res = await self.client.evidence(run_id, alert_id)
        parts = [f"evidence of alert {res.alert} of {run_id}"] + [f"note: {n}" for n in res.notes]
        for f in res.files:
            parts.append(f"===== {f.name} =====\n{f.text}")
        return "\n".join(parts)

    async def dump(self, run_id: str) -> str:
        from nsa_tui.health.stacks import dump_text

        return dump_text(await self.client.dump(run_id))

    async def archive(self, run_id: str, archived: bool = True) -> str:
        view = await self.client.archive(run_id, archived)
        reducer.run_view(self.state, self.dest, view)
        return "archived (the filter word 'archived' shows it)" if view.archived else "no longer archived"

    async def delete_plan(self, run_id: str) -> DeleteResult:
        """What deleting would free (nothing is deleted)."""
        return await self.client.delete(run_id, dry_run=True)

    async def delete(self, run_id: str) -> str:
        res = await self.client.delete(run_id)
        if res.deleted:
            reducer.run_removed(self.state, self.dest, run_id)
            return f"deleted: freed {fmt_bytes(res.bytes)}"
        return "gone from the list, but part of it could not be removed (.deleting-* in the runs root)"
