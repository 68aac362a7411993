"""Steering one run over several hosts through their agents (docs/multi-node.md).

The agents know nothing of each other; this client-side module does what spans hosts:
- :func:`launch`: every host checked first (reachable, nsa-tui installed, the same nsa-tui,
  nsa and torch versions, the config valid there, the rendezvous port free on the first
  host), refused before anything starts, naming the host and the reason; then one torchrun
  per host with one run id and the c10d rendezvous on the first host; a partial start is
  rolled back (what started is stopped; nothing is left running anywhere);
- :func:`parts`: each host's part of a run, for :func:`nsa_tui.hosts.merge.merge`;
- :func:`kill`, :func:`dump`: on every host at once;
- :func:`shared_root`: whether the hosts share one runs root (a marker file probe);
- :func:`fallback`: stop everywhere, gather the newest checkpoint complete on every host
  onto rank 0's host (hosts with runs roots of their own; a shared root is read in place),
  relaunch there on one node (or one GPU) with the same global batch;
- :func:`resume`: the same checkpoint on every host, relaunch across all of them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nsa.contract import NodeLayout
from nsa.contract.replies import DumpResult, KillResult, LaunchResult, PreflightResult
from nsa.contract.rundir import new_run_id, relaunch_name
from nsa_tui.hosts.client import AgentError, HostClient, read_config_text
from nsa_tui.hosts.merge import Part, hosts_of, primary_of
from nsa_tui.transport import TransportError

ROLLBACK_GRACE_S = 10.0
CANNOT_RUN = "cannot run on this host"  # the preflight's word for describe's problems (agent/preflight.py)
CHUNK = 4 << 20


class MultiHostError(Exception):
    """A run over several hosts cannot be done as asked; ``host`` is the one to blame."""

    def __init__(self, host: str, message: str, code: str = "refused") -> None:
        super().__init__(f"{host}: {message}")
        self.host, self.message, self.code = host, message, code


@dataclass
class MultiLaunch:
    """A run started on several hosts: one LaunchResult per host, in node order."""

    run_id: str
    rdzv_endpoint: str
    results: dict[str, LaunchResult] = field(default_factory=dict)
    shared: bool = False  # the hosts share the runs root: one run directory


async def connect(dests: Sequence[str], make: Callable[[str], HostClient]) -> tuple[dict[str, HostClient],
                                                                                 dict[str, str]]:
    """Start a client per destination, all at once: (connected clients, dest -> why not)."""
    clients = {d: make(d) for d in dests}

    async def one(d: str) -> str | None:
        try:
            await clients[d].start()
        except TransportError as exc:
            return str(exc)
        return None

    errors = dict(zip(dests, await asyncio.gather(*(one(d) for d in dests))))
    bad = {d: e for d, e in errors.items() if e is not None}
    return {d: c for d, c in clients.items() if d not in bad}, bad


def _endpoint(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _layout(hosts: list[str], i: int, endpoint: str, addrs: list[str], shared: bool = False) -> NodeLayout:
    return NodeLayout(nnodes=len(hosts), node_rank=i, hosts=hosts, rdzv_endpoint=endpoint, node_addr=addrs[i],
                      shared_root=shared)


async def shared_root(clients: dict[str, HostClient], pre: list[PreflightResult]) -> bool:
    """Whether the hosts share one runs root: a marker written through the first host and looked
    for through the others (never guessed from paths: one path may be a different disk on each
    host, two paths one disk). All share: one run directory; none share: one per host; a mix is
    refused before anything starts, as is one machine named twice on a shared root."""
    hosts = list(clients)
    token = secrets.token_hex(8)
    first = await clients[hosts[0]].preflight(marker_write=token)
    try:
        if first.marker_error:
            raise MultiHostError(hosts[0], f"cannot probe whether the runs root is shared: "
                                 f"{first.marker_error}", "refused")
        looks = await asyncio.gather(*(clients[h].preflight(marker_look=token) for h in hosts[1:]))
    finally:
        await clients[hosts[0]].preflight(marker_remove=token)
    for h, r in zip(hosts[1:], looks):
        if r.marker_error:
            raise MultiHostError(h, f"cannot probe whether the runs root is shared: {r.marker_error}",
                                 "refused")
    seen = [bool(r.marker_seen) for r in looks]
    if any(seen) and not all(seen):
        with_first = [hosts[0]] + [h for h, s in zip(hosts[1:], seen) if s]
        apart = [h for h, s in zip(hosts[1:], seen) if not s]
        raise MultiHostError(apart[0], f"{', '.join(with_first)} share one runs root but {', '.join(apart)} "
                             "do not: a run over hosts that partly share a runs root is not supported; give "
                             "every host the shared runs root (or each its own)", "bad_request")
    if all(seen):
        nodes = [p.node for p in pre]
        twice = next((i for i in range(len(hosts)) if nodes[i] and nodes[i] in nodes[:i]), None)
        if twice is not None:
            same = hosts[nodes.index(nodes[twice])]
            raise MultiHostError(hosts[twice], f"is the same machine as {same} (node {nodes[twice]}) on one "
                                 "runs root: name each host once", "bad_request")
    return all(seen)


def _addr(c: HostClient) -> str:
    """How the other hosts reach this one: the address its SSH connection reached, else its name."""
    return c.peer_address() or c.hello.host or c.dest


async def _port(c: HostClient, host: str, port: int | None) -> int:
    pre = await c.preflight(port=port, want_port=True)
    if not pre.port_free or pre.port is None:
        raise MultiHostError(host, f"rendezvous port: {pre.port_message}", "port_in_use")
    return pre.port


def check_preflight(hosts: list[str], pre: list[PreflightResult], force: bool = False) -> PreflightResult:
    """Refuse, naming the host, what would fail once started: a host that cannot train, a
    config that does not validate there, other versions than the first host's, the first
    host's rendezvous port in use. Returns the first host's result."""
    first = pre[0]
    for host, p in zip(hosts, pre):
        if p.problems:
            raise MultiHostError(host, "; ".join(p.problems), "nsa_missing")
        if p.config_error and not (force and p.config_error.startswith(CANNOT_RUN)):
            raise MultiHostError(host, f"config: {p.config_error}", "bad_config")
        for what in ("nsa_tui", "nsa_version", "torch"):
            mine, theirs = getattr(p, what), getattr(first, what)
            if mine != theirs:
                raise MultiHostError(host, f"{what.replace('_', '-')} {mine} differs from {hosts[0]}'s "
                                     f"{theirs}: install the same version everywhere (nsa-tui setup {host})",
                                     "versions")
    if not first.port_free or first.port is None:
        raise MultiHostError(hosts[0], f"rendezvous port: {first.port_message}", "port_in_use")
    return first


async def launch(clients: dict[str, HostClient], config: str, *, nproc: int | None = None,
                 overrides: Sequence[str] = (), name: str | None = None, upload: bool = False,
                 rdzv_host: str | None = None, rdzv_port: int | None = None,
                 force: bool = False) -> MultiLaunch:
    """Check every host, then start one torchrun per host (node order = ``clients`` order);
    ``force``: start a config that a host says cannot run there (as ``launch --force``)."""
    hosts = list(clients)
    text = read_config_text(config) if upload else None
    pre = await asyncio.gather(*(clients[h].preflight(
        config_path=config, config_text=text, overrides=overrides, want_port=i == 0, nproc=nproc,
        port=rdzv_port if i == 0 else None) for i, h in enumerate(hosts)), return_exceptions=True)
    for host, p in zip(hosts, pre):
        if isinstance(p, AgentError) and p.code not in ("disconnected", "closed", "bad_reply"):
            # the host answered and refused (a runs root that is a file): its code, its exit status
            raise MultiHostError(host, f"refused before anything started: {p.message}", p.code)
        if isinstance(p, BaseException):
            raise MultiHostError(host, f"preflight failed: {p}", "unreachable")
    first = check_preflight(hosts, pre, force)  # type: ignore[arg-type]
    shared = await shared_root(clients, pre)  # type: ignore[arg-type]
    addrs = [rdzv_host if i == 0 and rdzv_host else _addr(clients[h]) for i, h in enumerate(hosts)]
    assert first.port is not None  # check_preflight refuses a first host without a free port
    endpoint = _endpoint(addrs[0], first.port)
    run_id = new_run_id(name or first.config_name or "run")
    out = MultiLaunch(run_id=run_id, rdzv_endpoint=endpoint, shared=shared)
    for i, host in enumerate(hosts):
        try:
            out.results[host] = await clients[host].launch(
                config, nproc=nproc, overrides=overrides, name=name, config_text=text, run_id=run_id,
                nodes=_layout(hosts, i, endpoint, addrs, shared), force=force)
        except (AgentError, TransportError) as exc:
            await _roll_back(clients, list(out.results), run_id)
            raise MultiHostError(host, f"launch failed: {exc}; stopped what had started on "
                                 f"{', '.join(out.results) or 'no host'}", "launch_failed") from exc
    return out


async def _roll_back(clients: dict[str, HostClient], hosts: list[str], run_id: str) -> None:
    await asyncio.gather(*(clients[h].kill(run_id, ROLLBACK_GRACE_S) for h in hosts), return_exceptions=True)


async def parts(clients: dict[str, HostClient], run_id: str, unreachable: dict[str, str] | None = None,
                order: Sequence[str] | None = None) -> list[Part]:
    """Each host's part of ``run_id`` (status report: view and newest beats), in node order."""
    unreachable = dict(unreachable or {})
    hosts = list(order or [*clients, *unreachable])

    async def one(host: str) -> Part:
        c = clients.get(host)
        if c is None:
            return Part(host=host, reachable=False, why=unreachable.get(host, "not connected"))
        try:
            rep = await c.status(run_id)
        except AgentError as exc:
            if exc.code == "no_such_run":
                return Part(host=host)
            return Part(host=host, reachable=False, why=exc.message)
        skew = time.time() - rep.ts if rep.ts else 0.0
        return Part(host=host, view=rep.run, beats=list(rep.beats), metrics=list(rep.recent_metrics),
                    skew=skew)

    return list(await asyncio.gather(*(one(h) for h in hosts)))


async def run_hosts(clients: dict[str, HostClient], run_id: str) -> list[str]:
    """The hosts of a run over several hosts, from the launch of any connected host's part."""
    for c in clients.values():
        try:
            view = await c.run(run_id)
        except AgentError:
            continue
        found = hosts_of(view)
        if found:
            return found
    return []


async def kill(clients: dict[str, HostClient], run_id: str, grace_s: float = 60.0
               ) -> dict[str, KillResult | Exception]:
    """TERM on every host at once (the ranks agree on the step to stop at, each host saves its
    shards), KILL after the grace; per host its result or error."""
    hosts = list(clients)
    res = await asyncio.gather(*(clients[h].kill(run_id, grace_s) for h in hosts), return_exceptions=True)
    return {h: r for h, r in zip(hosts, res)}  # type: ignore[misc]


async def dump(clients: dict[str, HostClient], run_id: str) -> dict[str, DumpResult | Exception]:
    hosts = list(clients)
    res = await asyncio.gather(*(clients[h].dump(run_id) for h in hosts), return_exceptions=True)
    return {h: r for h, r in zip(hosts, res)}  # type: ignore[misc]


async def newest_common_checkpoint(clients: dict[str, HostClient], run_id: str) -> str:
    """The newest checkpoint complete on every host (each node commits its own directory)."""
    lists = {h: await c.checkpoints(run_id) for h, c in clients.items()}
    common: set[str] | None = None
    steps: dict[str, int] = {}
    for cl in lists.values():
        names = {e.name for e in cl.checkpoints}
        steps.update({e.name: e.step for e in cl.checkpoints})
        common = names if common is None else common & names
    if not common:
        raise MultiHostError(next(iter(clients)), f"{run_id} has no checkpoint complete on every host "
                             f"({', '.join(clients)})", "no_checkpoint")
    return max(common, key=lambda n: steps[n])


async def gather(clients: dict[str, HostClient], run_id: str, checkpoint: str, into: Sequence[str],
                 log: Callable[[str], None] | None = None) -> int:
    """Copy the files of ``checkpoint`` that hosts ``into`` lack from the hosts that have them
    (through the agents, in chunks); returns the bytes copied."""
    entries = {}
    for h, c in clients.items():
        found = [e for e in (await c.checkpoints(run_id)).checkpoints if e.name == checkpoint]
        if found:
            entries[h] = found[0]
    needs = sorted({f for e in entries.values() for f in e.needs})
    have = {h: {f.name for f in e.files} for h, e in entries.items()}
    copied = 0
    for target in into:
        if target not in have:
            raise MultiHostError(target, f"{run_id} has no complete {checkpoint} there", "no_checkpoint")
        for name in needs:
            if name in have[target]:
                continue
            src = next((h for h in have if name in have[h]), None)
            if src is None:
                raise MultiHostError(target, f"{checkpoint}/{name} is on no reachable host: the checkpoint "
                                     "cannot be loaded", "no_checkpoint")
            if log:
                log(f"copying {checkpoint}/{name} from {src} to {target}")
            copied += await _copy(clients[src], clients[target], run_id, checkpoint, name)
            have[target].add(name)
    return copied


async def _copy(src: HostClient, dst: HostClient, run_id: str, checkpoint: str, name: str) -> int:
    offset = 0
    while True:
        chunk = await src.read_checkpoint_file(run_id, checkpoint, name, offset, CHUNK)
        final = chunk.offset + len(chunk.data) >= chunk.size
        await dst.write_checkpoint_file(run_id, checkpoint, name, offset, chunk.data, final=final)
        offset += len(chunk.data)
        if final:
            return offset


async def fallback(clients: dict[str, HostClient], run_id: str, *, nproc: int | None = None,
                   grace_s: float = 60.0, log: Callable[[str], None] | None = None) -> LaunchResult:
    """Stop every host's part, then relaunch on rank 0's host alone (``nproc`` processes, default 1:
    one GPU) from the newest checkpoint complete everywhere, with the same global batch."""
    found = await parts(clients, run_id)
    known = [p for p in found if p.view is not None]
    if not known:
        raise MultiHostError(next(iter(clients)), f"no run {run_id}", "no_such_run")
    target = primary_of(known).host
    info = next((p.view.info for p in known if p.host == target and p.view is not None), None)
    world = nproc or 1
    g, b = (info.global_batch, info.batch_size) if info is not None else (None, None)
    if g and b and g % (b * world):
        raise MultiHostError(target, f"global batch {g} is not a multiple of batch_size "
                             f"{b} x {world} rank(s): it cannot be kept", "bad_request")
    killed = await kill(clients, run_id, grace_s)
    for h, r in killed.items():
        if isinstance(r, Exception) and not (isinstance(r, AgentError) and r.code == "no_such_run"):
            raise MultiHostError(h, f"could not stop its part: {r}", "kill_incomplete")
    parts_at = {p.host: p for p in known}
    live = {h: c for h, c in clients.items() if h in parts_at}
    ckpt = await newest_common_checkpoint(live, run_id)
    if not any(p.view is not None and p.view.shared for p in known):  # shared: read in place
        await gather(live, run_id, ckpt, [target], log)
    return await clients[target].fallback(run_id, grace_s, nproc=nproc or 1, checkpoint=ckpt)


async def resume(clients: dict[str, HostClient], run_id: str, *, rdzv_host: str | None = None,
                 rdzv_port: int | None = None, log: Callable[[str], None] | None = None) -> MultiLaunch:
    """Relaunch a stopped run over the same hosts from the newest checkpoint complete on all of
    them (its files gathered onto every host first), as a new run linked to it."""
    found = await parts(clients, run_id)
    hosts = [p.host for p in found if p.view is not None]
    if len(hosts) != len(clients):
        missing = next(h for h in clients if h not in hosts)
        raise MultiHostError(missing, f"no part of {run_id} there", "no_such_run")
    for p in found:
        if p.view is not None and p.view.alive:
            raise MultiHostError(p.host, f"{run_id} is still running there: kill it first", "running")
    first = found[0].view
    assert first is not None
    nproc = first.launch.nproc if first.launch is not None else 1
    ckpt = await newest_common_checkpoint(clients, run_id)
    shared = first.shared  # one directory on every host: the checkpoint is read in place
    if not shared:
        await gather(clients, run_id, ckpt, hosts, log)
    port = await _port(clients[hosts[0]], hosts[0], rdzv_port)
    addrs = [rdzv_host if i == 0 and rdzv_host else _addr(clients[h]) for i, h in enumerate(hosts)]
    endpoint = _endpoint(addrs[0], port)
    new_id = new_run_id(relaunch_name(first.name, "resume"))
    out = MultiLaunch(run_id=new_id, rdzv_endpoint=endpoint)
    for i, host in enumerate(hosts):
        try:
            res = await clients[host].resume(run_id, nproc=nproc, checkpoint=ckpt, new_run_id=new_id,
                                             nodes=_layout(hosts, i, endpoint, addrs, shared))
        except (AgentError, TransportError) as exc:
            await _roll_back(clients, list(out.results), new_id)
            raise MultiHostError(host, f"resume failed: {exc}; stopped what had started",
                                 "launch_failed") from exc
        out.results[host] = res
        if res.again:
            out.run_id = res.run_id  # resumed before: the run that resume started
    return out


def describe(x: Any) -> str:
    """An exception or result as one line for a person."""
    if isinstance(x, AgentError):
        return f"{x.code}: {x.message}"
    return str(x)
