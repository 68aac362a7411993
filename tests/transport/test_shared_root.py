"""Hosts that share one runs root, as a cluster's NFS home is: two real OpenSSH servers on
127.0.0.1, each in PID and UTS namespaces of its own with its own hostname (two machines: neither
sees the other's processes), one home and so one ``~/nsa-runs`` (tests/sshd.py ``machines``).

- a run over both hosts has one directory, each host's per-node files under ``nodes/<node>/``,
  world size 2, steps advancing; its checkpoints are written once (every rank's shard in one
  directory); delete and archive through either host are refused while it runs and remove
  nothing; kill stops every rank on both machines; a resume over both and then a fallback to
  one process read the checkpoint in place (no copy), and the fallback redoes its steps with
  bit-identical losses;
- a run of one host is never judged dead by the other: seen alive there by its lease, delete,
  archive and kill through the other host are refused naming the owner; when the owner's
  machine vanishes, the other host shows the run lost once the lease and heartbeats expire,
  and its directory is intact.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nsa.contract import RunStatus
from nsa.contract.rundir import node_name
from nsa_tui.agent.owners import LEASE_TTL_S
from nsa_tui.agent.procs import boot_id, run_processes
from nsa_tui.hosts import coordinator as co
from nsa_tui.hosts.client import HostClient
from nsa_tui.hosts.merge import MergedRun, merge
from tests.agent.e2e import SMOKE
from tests.sshd import SshNodes
from tests.train.trainrun import metrics, run_train
from tests.transport.nodes import cli, connected, stepped, until

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(300)]

LONG = ["train.steps=100000", "train.save_every=4", "train.eval_every=100000", "train.batch_size=1",
        "train.grad_accum=2"]


def logs(d: Path) -> str:
    """Each node's train.log, last lines: what a failure needs to be understood."""
    return "\n".join(f"== {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                     for p in sorted(d.glob("nodes/*/train.log")))


def snapshot(d: Path) -> dict[str, list[tuple[str, int]]]:
    """Each checkpoint of a stopped run: its files and their modification times."""
    return {p.name: sorted((f.name, f.stat().st_mtime_ns) for f in p.iterdir())
            for p in (d / "checkpoints").glob("step-*")}


def files_under(d: Path) -> list[str]:
    """The run's lasting files: not its checkpoints (the trainer prunes old ones as it goes, so a
    walk into them can lose a race) nor a record's passing temporary file (``.name.*.tmp``)."""
    found = []
    for top, dirs, files in os.walk(d):  # a directory that vanishes mid-walk is skipped, not raised
        if Path(top) == d:
            dirs[:] = [x for x in dirs if x != "checkpoints"]
        found += [str((Path(top) / f).relative_to(d)) for f in [*dirs, *files]
                  if not (f.startswith(".") and f.endswith(".tmp"))]
    return sorted(found)


@pytest.fixture
async def clients(machines: SshNodes) -> AsyncIterator[dict[str, HostClient]]:
    async with connected(machines) as c:
        yield c


def root_of(machines: SshNodes) -> Path:
    roots = {s.runs_root for s in machines.servers}
    assert len(roots) == 1
    return roots.pop()


def nodes_of(machines: SshNodes) -> list[str]:
    """The node names of the two machines (their hostnames; one kernel, so one boot id)."""
    return [node_name(s.machine or "", boot_id()) for s in machines.servers]


def kill_leftovers(*run_ids: str) -> None:
    """No process of these runs may outlive the test (this namespace sees both machines')."""
    import os
    import signal

    for rid in run_ids:
        for p in run_processes(rid, fresh=True):
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def test_one_directory_for_a_run_over_hosts_sharing_the_runs_root(
        machines: SshNodes, clients: dict[str, HostClient], tmp_path: Path) -> None:
    hosts = ",".join(machines.aliases)
    root = root_of(machines)
    r = cli(machines, "launch", hosts, "--config", SMOKE, "--nproc-per-node", "1", "--set", *LONG, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rid = json.loads(r.stdout)["run_id"]
    child = resumed = ""
    try:
        d = root / rid
        assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == [rid]  # one directory
        nodes = nodes_of(machines)
        assert sorted(p.name for p in (d / "nodes").iterdir()) == sorted(nodes)
        assert not (d / "launch.json").exists()  # per-node records are per node
        for i, n in enumerate(nodes):
            launch = json.loads((d / "nodes" / n / "launch.json").read_text())
            assert launch["node"] == n and launch["hostname"] == f"nsa-m{i}"
            assert launch["nodes"]["shared_root"] and launch["nodes"]["node_rank"] == i
            assert (d / "nodes" / n / "lease.json").is_file() and (d / "nodes" / n / "train.log").is_file()
        m = await until("4 steps on both ranks", stepped(4, clients, rid))
        assert m.status == RunStatus.RUNNING and sorted(h for h, _ in m.ranks) == sorted(machines.aliases), m
        info = json.loads((d / "run.json").read_text())
        assert info["world_size"] == 2 and info["nnodes"] == 2

        async def saved() -> list[str] | None:
            try:  # the trainer prunes old checkpoints as it goes: a listing may lose a race
                latest = d / "checkpoints" / (d / "checkpoints" / "latest").read_text().strip()
                return sorted(p.name for p in latest.iterdir())
            except OSError:
                return None
        # written once: every rank's shard and the metadata in the one directory
        want = [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.json"]
        assert await until("a checkpoint", saved) == want

        # the live run through either host: delete and archive refused, nothing removed
        before = files_under(d)
        for h in machines.aliases:
            for args in (["delete", h, rid, "--yes"], ["archive", h, rid]):
                res = cli(machines, *args, "--json")
                assert res.returncode != 0, (args, res.stdout, res.stderr)
                assert "stop it" in res.stdout + res.stderr, res.stdout + res.stderr
        assert d.is_dir() and not (d / "archived.json").exists()
        assert set(before) <= set(files_under(d))
        # no crash or lost alert from either host's watchdog for the other's ranks
        al = cli(machines, "alerts", hosts, rid, "--json")
        assert al.returncode in (0, 6), al.stdout + al.stderr
        doc = json.loads(al.stdout)
        assert not [a for h in machines.aliases for a in doc[h]["alerts"]
                    if a["alert"]["kind"] in ("crash", "lost")], al.stdout

        k = cli(machines, "kill", hosts, rid, "--json")
        assert k.returncode == 0, k.stdout + k.stderr
        assert any(v["was_running"] for v in json.loads(k.stdout).values()), (k.stdout, logs(d))
        assert not run_processes(rid, fresh=True)  # no rank left on either machine

        # resume over both: every host reads the one checkpoint where it is, nothing is copied
        ckpts = snapshot(d)
        res = cli(machines, "resume", machines.aliases[0], rid, "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        resumed = json.loads(res.stdout)["run_id"]
        rd = root / resumed
        latest = (d / "checkpoints" / "latest").read_text().strip()
        for n in nodes:
            launch = json.loads((rd / "nodes" / n / "launch.json").read_text())
            assert launch["parent_run"] == rid and launch["resume_from"] == str(d / "checkpoints" / latest)
        m = await until("both ranks past the checkpoint", stepped(int(latest[5:]) + 2, clients, resumed))
        assert snapshot(d) == ckpts  # the parent's checkpoints untouched: read in place
        k = cli(machines, "kill", hosts, resumed, "--json")
        assert k.returncode == 0, k.stdout + k.stderr

        # fall back to one process: the checkpoint read where it is, nothing copied
        ckpts = snapshot(rd)
        fb = cli(machines, "fallback", machines.aliases[1], resumed, "--grace", "60", "--json")
        assert fb.returncode == 0, fb.stdout + fb.stderr
        out = json.loads(fb.stdout)
        child, ckpt = out["run_id"], Path(out["resume_from"])
        assert ckpt.parent.parent == rd and out["nproc"] == 1
        assert snapshot(rd) == ckpts
        step = int(ckpt.name.split("-")[1])
        cd = root / child

        async def child_steps() -> bool:
            return (cd / "metrics.jsonl").exists() and len(metrics(cd)) >= 3
        await until("3 steps of the 1-process run", child_steps)
        kc = cli(machines, "kill", m.primary, child, "--json")
        assert kc.returncode == 0, kc.stdout + kc.stderr
        launch = json.loads((cd / "launch.json").read_text())
        ref = run_train(tmp_path / "ref", [*launch["overrides"], f"debug.stop_at_step={step + 3}"], nproc=1,
                        config=cd / "config.yaml", resume=str(ckpt), env={"NSA_THREADS": "1"})
        assert ref.rc == 0, ref.output[-3000:]
        got = {x["step"]: x["loss"] for x in metrics(cd)}
        want = {x["step"]: x["loss"] for x in metrics(ref.run_dir)}
        assert sorted(want) == [step + 1, step + 2, step + 3]
        for s in want:
            assert got[s] == want[s], f"step {s}: fallback {got[s]!r} vs 1-process run {want[s]!r}"
    finally:
        kill_leftovers(rid, *([resumed] if resumed else []), *([child] if child else []))


async def test_a_run_of_one_host_is_never_judged_dead_by_another(
        machines: SshNodes, clients: dict[str, HostClient]) -> None:
    owner, other = machines.aliases
    root = root_of(machines)
    r = cli(machines, "launch", owner, "--config", SMOKE, "--nproc", "1", "--set", *LONG, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rid = json.loads(r.stdout)["run_id"]
    d = root / rid
    # and a run over both machines, which loses the one that vanishes below
    both = (await co.launch(clients, SMOKE, nproc=1, overrides=[*LONG, "train.pg_timeout_s=30"])).run_id
    try:
        await until("2 steps on both ranks", stepped(2, clients, both))
        async def steps() -> bool:
            return (d / "metrics.jsonl").exists() and len(metrics(d)) >= 2
        await until("2 steps", steps)
        # the other host cannot see its processes, yet knows it is alive: the owner's lease
        view = await clients[other].run(rid)
        assert view.alive and view.status == RunStatus.RUNNING, view
        assert [(o.hostname, o.alive, o.how) for o in view.owners] == [("nsa-m0", True, "lease")], view.owners
        before = files_under(d)
        for args in (["delete", other, rid, "--yes"], ["archive", other, rid], ["kill", other, rid]):
            res = cli(machines, *args, "--json")
            assert res.returncode != 0, (args, res.stdout, res.stderr)
            assert "alive on nsa-m0" in res.stdout, res.stdout + res.stderr  # names the owner
        assert set(before) <= set(files_under(d)) and not (d / "archived.json").exists()
        assert run_processes(rid, fresh=True)  # still training

        # the owner's machine vanishes: through the other host the run is lost once the lease and
        # heartbeats have expired, and nothing of it is removed
        machines.servers[0].vanish()
        t0 = time.monotonic()

        async def lost() -> Any:
            v = await clients[other].run(rid)
            return v if v.status == RunStatus.LOST else None
        v = await until("the run to be lost", lost, timeout=LEASE_TTL_S + 60)
        assert time.monotonic() - t0 >= LEASE_TTL_S - 5 and not v.alive, v  # not before the lease expired
        assert [(o.hostname, o.how) for o in v.owners] == [("nsa-m0", "expired")], v.owners
        assert set(before) <= set(files_under(d))
        st = cli(machines, "status", other, rid, "--json")
        assert st.returncode == 6 and json.loads(st.stdout)["run"]["status"] == "lost", st.stdout + st.stderr

        # the run over both: lost (its first host's lease expired) or crashed (the other host's
        # ranks failed without it), through the host that is left; its directory intact
        bd = root / both
        kept = files_under(bd)

        async def ended() -> MergedRun | None:
            m = merge(both, await co.parts({other: clients[other]}, both, {owner: "gone"}, machines.aliases))
            return m if m.status in (RunStatus.LOST, RunStatus.CRASHED, RunStatus.FAILED) else None
        m = await until("the run over both to be lost or crashed", ended, timeout=LEASE_TTL_S + 60)
        assert m.problem, m
        assert set(kept) <= set(files_under(bd)) and len(list((bd / "nodes").iterdir())) == 2
    finally:
        kill_leftovers(rid, both)


def test_hosts_that_partly_share_a_runs_root_are_refused_before_anything_starts(
        machines: SshNodes, tmp_path: Path) -> None:
    """``HOST:/path`` gives a host its own runs root: here the second machine once with the shared
    root and once with one of its own, a mix that is refused naming both sides."""
    own = tmp_path / "own-runs"
    hosts = f"{machines.aliases[0]},{machines.aliases[1]},{machines.aliases[1]}:{own}"
    r = cli(machines, "launch", hosts, "--config", SMOKE, "--nproc-per-node", "1", "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    msg = json.loads(r.stdout)["error"]["message"]
    a, b = machines.aliases
    assert f"{a}, {b} share one runs root but {b}:{own}" in msg, msg
    root = root_of(machines)
    assert not [p for p in root.iterdir()], list(root.iterdir())  # no run directory, no marker left
    assert not own.exists() or not [p for p in own.iterdir()]
