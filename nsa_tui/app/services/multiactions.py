"""The keys on a run over several hosts: launch, stop, fall back, resume, dump on every host of
the run at once (nsa_tui/hosts/coordinator.py), through the panel's own connections. Replies go
through the reducer like a single host's (the panel never invents a run's state)."""

from __future__ import annotations

import os
from typing import Any

from nsa_tui.app import reducer
from nsa_tui.app.state import PanelState, RunState
from nsa_tui.hosts import coordinator as co
from nsa_tui.hosts.client import AgentError, HostClient


def _clients(services: dict[str, Any], hosts: list[str]) -> dict[str, HostClient]:
    out = {}
    for h in hosts:
        svc = services.get(h)
        if svc is None or svc.client is None or svc.host.conn != "connected":
            raise AgentError("disconnected", f"not connected to {h}: a run over hosts needs every one")
        out[h] = svc.client
    return out


def launch_overrides(opts: dict[str, Any]) -> list[str]:
    """The dialog's choices as overrides (as HostActions.launch makes them)."""
    out = [f"train.strategy={opts['strategy']}"] if opts.get("strategy") else []
    if opts.get("data_source"):
        out.append(f"data.source={opts['data_source']}")
    return out + list(opts.get("overrides") or [])


async def launch(state: PanelState, services: dict[str, Any], hosts: list[str], opts: dict[str, Any]) -> str:
    """One run over ``hosts`` (the first serves the rendezvous); returns its run id."""
    config = str(opts["config"])
    nproc = opts.get("nproc")
    if not isinstance(nproc, int):
        raise AgentError("bad_request", f"processes must be a whole number, got {nproc!r}")
    try:
        res = await co.launch(_clients(services, hosts), config, nproc=nproc,
                              overrides=launch_overrides(opts), name=opts.get("name"),
                              upload=os.path.isfile(os.path.expanduser(config)))
    except co.MultiHostError as exc:
        raise AgentError(exc.code, str(exc)) from None
    for host, r in res.results.items():
        if r.view is not None:
            reducer.run_view(state, host, r.view)
    return res.run_id


async def act(op: str, state: PanelState, services: dict[str, Any], run: RunState) -> tuple[str, str]:
    """``op`` on every host of ``run``: (text for a toast or the new run's id, host to select)."""
    hosts = [p.host for p in state.parts_of(run)]
    clients = _clients(services, hosts)
    try:
        if op == "kill":
            done = await co.kill(clients, run.run_id)
            return "; ".join(f"{h}: {co.describe(r) if isinstance(r, Exception) else 'stopped'}"
                             for h, r in done.items()), run.host
        if op == "dump":
            parts = []
            for h, d in (await co.dump(clients, run.run_id)).items():
                if isinstance(d, Exception):
                    parts.append(f"===== {h}: {co.describe(d)} =====")
                    continue
                parts.append(f"{h}: ranks {d.ranks}" + "".join(f"\nnote: {n}" for n in d.notes))
                parts += [f"===== {h}/{f.name} =====\n{f.text}" for f in d.files]
            return "\n".join(parts), run.host
        if op == "fallback":
            target = state.main_part(run).host
            res = await co.fallback(clients, run.run_id)
            if res.view is not None:
                reducer.run_view(state, target, res.view)
            return res.run_id, target
        if op == "resume":
            mres = await co.resume(clients, run.run_id)
            for h, r in mres.results.items():
                if r.view is not None:
                    reducer.run_view(state, h, r.view)
            return mres.run_id, hosts[0]
    except co.MultiHostError as exc:
        raise AgentError(exc.code, str(exc)) from None
    raise AgentError("bad_request", f"unknown action {op!r}")
