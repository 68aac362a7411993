"""Which host owns a run's processes, and how another host tells whether they are alive.

A runs root is often one shared filesystem on every node (a home on NFS, Lustre, GPFS), so an
agent sees run directories whose processes live on other machines. Its own process table says
nothing about those: "no process here" is not "dead". Rules kept here:

- every launch records its owner (:func:`this_node`: hostname and boot id);
- the owner judges its part from its process table, as for any run;
- any other host judges it from the owner's lease (``lease.json``, renewed by the run's
  supervisor every :data:`LEASE_EVERY_S`) and from the heartbeats of the owner's ranks: fresh
  means alive; an exit record means ended; neither fresh nor ended means the owner vanished
  (``expired``: the run is lost, its directory kept);
- a run whose hosts share the runs root has one directory and each host's per-node files
  under ``nodes/<node>/`` (:func:`own_part`), so every file has one writer.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from nsa.contract import Beat, ExitInfo, LaunchInfo, Lease, read_json, write_json_atomic
from nsa.contract.replies import Owner
from nsa.contract.rundir import EXIT_JSON, LAUNCH_JSON, LEASE_JSON, NODES, RunDir, node_name
from nsa_tui.agent.procs import boot_id

LEASE_EVERY_S = 3.0  # the supervisor renews its lease this often
LEASE_TTL_S = 20.0  # a lease (or a rank's newest beat) older than this: its host is gone


def this_node() -> str:
    """This host's node name during this boot (hostname and boot id)."""
    return node_name(socket.gethostname(), boot_id())


def node_parts(run_dir: Path) -> dict[str, Path]:
    """node -> its per-node directory, for a run whose hosts share the runs root; {} otherwise."""
    try:
        entries = list(os.scandir(run_dir / NODES))
    except OSError:
        return {}
    return {e.name: Path(e.path) for e in sorted(entries, key=lambda e: e.name) if e.is_dir()}


def own_part(run_dir: Path) -> Path:
    """Where this host's per-node files of the run are: ``nodes/<this node>/`` when the run's
    hosts share the runs root, else the run directory itself."""
    rd = RunDir(run_dir)
    if rd.nodes.is_dir():
        return rd.node(this_node())
    return rd.path


def write_lease(part: Path, ttl_s: float = LEASE_TTL_S, pid: int | None = None) -> None:
    """Renew this host's lease on its part of a run."""
    lease = Lease(node=this_node(), hostname=socket.gethostname(), ts=time.time(), ttl_s=ttl_s, pid=pid)
    write_json_atomic(part / LEASE_JSON, lease, durable=False)  # renewed every few s: no fsync each time


class LeaseKeeper:
    """The supervisor's thread that renews the lease while the run's processes live."""

    def __init__(self, part: Path, every_s: float = LEASE_EVERY_S, ttl_s: float = LEASE_TTL_S) -> None:
        self.part, self.every_s, self.ttl_s = part, every_s, ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nsa-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                write_lease(self.part, self.ttl_s, os.getpid())
            except OSError:
                pass  # a full or unreachable disk: the lease ages, other hosts then see it expire
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        """Stop renewing and release the lease (``ttl_s`` 0): this part has ended, say so at once
        rather than after the lease would have expired."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            write_lease(self.part, 0.0, os.getpid())
        except OSError:
            pass


def newest_beat_of(hostname: str, beats: list[Beat]) -> Beat | None:
    """The newest beat written by ranks on ``hostname``."""
    mine = [b for b in beats if b.host == hostname]
    return max(mine, key=lambda b: b.ts) if mine else None


def judge_remote(part: Path, launch: LaunchInfo | None, beats: list[Beat], now: float | None = None) -> Owner:
    """Another host's part of a run, judged without its process table: a fresh lease is alive; a
    released lease or an exit record is ended; else a fresh beat of its ranks (not a final one)
    is alive (no lease yet, or a supervisor killed while its ranks go on); else expired."""
    now = time.time() if now is None else now
    node = launch.node if launch is not None else part.name
    host = launch.hostname if launch is not None else ""
    lease = read_json(part / LEASE_JSON, Lease)
    lease_age = now - lease.ts if lease is not None else None
    if lease is not None and lease_age is not None and lease_age < lease.ttl_s:
        return Owner(node=node, hostname=host or lease.hostname, alive=True, how="lease",
                     age_s=max(0.0, lease_age))
    if (lease is not None and lease.ttl_s == 0) or read_json(part / EXIT_JSON, ExitInfo) is not None:
        return Owner(node=node, hostname=host, alive=False, how="exit")  # released, or torchrun ended
    beat = newest_beat_of(host, beats) if host else None
    if beat is not None and not beat.phase.is_final() and now - beat.ts < LEASE_TTL_S:
        return Owner(node=node, hostname=host, alive=True, how="beats", age_s=max(0.0, now - beat.ts))
    ages = [a for a in (lease_age, now - beat.ts if beat is not None else None) if a is not None]
    return Owner(node=node, hostname=host, alive=False, how="expired", age_s=min(ages) if ages else None)


def remote_parts(run_dir: Path, me: str) -> list[tuple[Path, LaunchInfo | None]]:
    """The per-node directories of other hosts of a shared run, with their launch records."""
    return [(p, read_json(p / LAUNCH_JSON, LaunchInfo)) for n, p in node_parts(run_dir).items() if n != me]


def owner_words(o: Owner) -> str:
    """How a person is told who owns a live run: ``gpu2 (lease renewed 2 s ago)``."""
    age = f" {o.age_s:.0f} s ago" if o.age_s is not None else ""
    why = {"lease": f"lease renewed{age}", "beats": f"heartbeat{age}"}.get(o.how, o.how)
    return f"{o.hostname or o.node} ({why})"


def launch_of(run_dir: Path) -> LaunchInfo | None:
    """The launch record of a run as this host acts on it: its own part's, else (a host without
    a part of a shared run) the rendezvous host's, else any part's."""
    own = read_json(own_part(run_dir) / LAUNCH_JSON, LaunchInfo)
    if own is not None:
        return own
    found = [read_json(p / LAUNCH_JSON, LaunchInfo) for p in node_parts(run_dir).values()]
    known = [x for x in found if x is not None]
    first = next((x for x in known if x.nodes is not None and x.nodes.node_rank == 0), None)
    return first or (known[0] if known else None)


def shown_part(run_dir: Path) -> Path:
    """The per-node directory whose log and alerts this host serves: its own part, else (a host
    without a part of a shared run) the rendezvous host's, else the run directory."""
    parts = node_parts(run_dir)
    if not parts:
        return run_dir
    mine = parts.get(this_node())
    if mine is not None:
        return mine
    for p in parts.values():
        launch = read_json(p / LAUNCH_JSON, LaunchInfo)
        if launch is not None and launch.nodes is not None and launch.nodes.node_rank == 0:
            return p
    return next(iter(parts.values()))


def owns_part(run_dir: Path) -> bool:
    """Whether this host owns processes of the run (a launch of its own; records of earlier
    versions, without an owner, count as this host's)."""
    launch = read_json(own_part(run_dir) / LAUNCH_JSON, LaunchInfo)
    return launch is not None and launch.node in ("", this_node())
