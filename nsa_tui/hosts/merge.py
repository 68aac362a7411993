"""One run over several hosts, seen as one: the hosts' parts of a run merged (pure, no I/O).

Each host's agent knows only its own part of a run (its directory: its ranks' heartbeats and
log; rank 0's host also run.json and metrics). The CLI and the panel collect the parts by
run id and merge them here: every rank with its host, one status, the host that holds rank 0
(its metrics are the run's loss curve), and the hosts that cannot be reached.

Status of the merged run (docs/multi-node.md):
- a part that crashed or failed (or whose torchrun was killed by a signal nobody asked for)
  makes the run crashed/failed, naming that host and its ranks;
- otherwise, while a reachable part is alive, the run is alive (rank 0's host's status;
  with that host unreachable, running once a reachable rank has trained a step); an
  unreachable host is shown as lost, not the run as crashed: its ranks may well go on, and
  if they are gone the other ranks fail at their next collective, which then says so;
- when every reachable part has ended: rank 0's host's end status.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nsa.contract import UNHEALTHY_STATUSES, Beat, Metric, RunInfo, RunStatus, RunView

BAD = UNHEALTHY_STATUSES


@dataclass
class Part:
    """A run's part on one host: ``view`` None when the host has no such run or is unreachable."""

    host: str
    view: RunView | None = None
    beats: list[Beat] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)  # the last metric lines (stall thresholds)
    reachable: bool = True
    why: str = ""  # unreachable: the connection's reason
    skew: float = 0.0  # this clock - the host's, from its status report's time (transit included)

    def ranks(self) -> list[int]:
        return sorted({b.rank for b in self.beats})

    def heartbeat_age(self, b: Beat, now: float) -> float:
        """Seconds since ``b`` was written, ``now`` on this clock: what a hung rank shows."""
        return max(0.0, now - self.skew - b.ts)


@dataclass
class MergedRun:
    run_id: str
    name: str
    status: RunStatus
    hosts: list[str]  # node order (the first holds the rendezvous)
    primary: str  # the host of rank 0: run.json, metrics, the loss curve
    info: RunInfo | None  # rank 0's host's view of run.json
    ranks: list[tuple[str, Beat]]  # (host, newest beat), by rank
    lost: dict[str, str]  # host -> why it cannot be reached
    problem: str | None = None  # crashed/failed: which host, which ranks, why
    parts: list[Part] = field(default_factory=list)

    @property
    def multi(self) -> bool:
        return len(self.hosts) > 1


def hosts_of(view: RunView | None) -> list[str]:
    """The hosts of a run over several hosts (its launch's node layout), else []."""
    nodes = view.launch.nodes if view is not None and view.launch is not None else None
    return list(nodes.hosts) if nodes is not None else []


def primary_of(parts: list[Part]) -> Part:
    """The part with rank 0: its beats say so; before the first beat, the part whose run.json
    the trainer wrote (a pid); else the first host (the rendezvous host)."""
    for p in parts:
        if any(b.rank == 0 for b in p.beats):
            return p
    for p in parts:
        if p.view is not None and p.view.info.pid is not None:
            return p
    return parts[0]


def _killed(view: RunView) -> int | None:
    """The signal that killed this part's torchrun when nobody asked for a stop."""
    ex = view.exit
    if ex is None or view.alive or view.stop_requested or not ex.signal:
        return None
    return ex.signal


def _why(p: Part, status: RunStatus) -> str:
    v = p.view
    assert v is not None
    ranks = p.ranks()
    who = f"{p.host} (rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks)) or '?'})"
    sig = _killed(v)
    if sig:
        return f"{who}: torchrun was killed by signal {sig}"
    if status == RunStatus.FAILED and v.info.exit_reason:
        return f"{who}: {v.info.exit_reason.strip().splitlines()[0]}"
    if status == RunStatus.LOST:
        gone = [o for o in v.owners if o.how == "expired" and not o.mine]
        if gone:
            names = ", ".join(o.hostname or o.node for o in gone)
            return (f"{names}: its lease and heartbeats expired while the run was running (the host is "
                    "gone); the run directory is kept")
        return f"{who}: the host rebooted while the run was running"
    code = v.exit.exit_code if v.exit is not None else None
    last = next((ln.strip() for ln in reversed(v.log_tail) if ln.strip()), "")
    exited = f"processes exited{f' with code {code}' if code is not None else ''} without a final status"
    return f"{who}: {exited}" + (f": {last}" if last else "")


def merge(run_id: str, parts: list[Part]) -> MergedRun:
    """The parts of ``run_id`` (one per host, in node order) as one run."""
    known = [p for p in parts if p.view is not None]
    hosts = [p.host for p in parts]
    primary = primary_of(parts)
    pview = primary.view if primary.view is not None else (known[0].view if known else None)
    name = pview.name if pview is not None else run_id
    lost = {p.host: p.why or "unreachable" for p in parts if not p.reachable}
    ranks = sorted(((p.host, b) for p in parts for b in p.beats), key=lambda hb: hb[1].rank)
    info = pview.info if pview is not None else None
    out = MergedRun(run_id=run_id, name=name, status=RunStatus.UNKNOWN, hosts=hosts, primary=primary.host,
                    info=info, ranks=ranks, lost=lost, parts=parts)
    bad: list[tuple[Part, RunStatus]] = []
    for p in known:
        assert p.view is not None
        if p.view.status in BAD:
            bad.append((p, p.view.status))
        elif _killed(p.view):
            bad.append((p, RunStatus.CRASHED))
    if bad:
        # the trainer's own failure record (rank 0's host) names the first rank that failed
        p, status = next(((p, s) for p, s in bad if p is primary and s == RunStatus.FAILED), bad[0])
        out.status, out.problem = status, _why(p, status)
        return out
    alive = [p for p in known if p.view is not None and p.view.alive]
    if alive:
        main = primary if primary in alive else alive[0]
        assert main.view is not None
        out.status = main.view.status
        if out.status == RunStatus.STARTING and any(b.step > 0 for p in alive for b in p.beats):
            # rank 0's host cannot be reached (its run.json says how the run is): a host
            # without rank 0 writes none, so its part reads as starting; ranks that have
            # trained a step say it runs
            out.status = RunStatus.RUNNING
        return out
    if pview is not None:
        out.status = pview.status if pview.status.is_terminal() or not lost else RunStatus.UNKNOWN
    return out


def group_views(views: dict[str, list[RunView]]) -> list[tuple[str, list[Part]]]:
    """Runs of several hosts' lists, the parts of one run together: [(run id, parts in node
    order)], newest first. A single-host run is one part."""
    by_run: dict[str, dict[str, RunView]] = {}
    for host, vs in views.items():
        for v in vs:
            by_run.setdefault(v.run_id, {})[host] = v
    out = []
    for run_id, found in by_run.items():
        order = next((hosts_of(v) for v in found.values() if hosts_of(v)), [])
        order = [h for h in order if h in found] + [h for h in found if h not in order]
        out.append((run_id, [Part(host=h, view=found[h]) for h in order]))
    return sorted(out, key=lambda rp: -max(p.view.created for p in rp[1] if p.view is not None))
