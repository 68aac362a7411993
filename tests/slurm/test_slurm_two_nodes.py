"""A job over two Slurm nodes (tests/slurmtwonode.py: two slurmd, each a machine of its own with
its own address, hostname and process table, one shared filesystem), driven with the nsa-tui CLI
over a real sshd as the login node: one torch world across the nodes, one run, cancelled with
nothing left on either node."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsa.contract import RunStatus
from nsa.contract.rundir import TRAIN_LOG
from nsa_tui.agent.procs import environ_of
from tests.agent.e2e import SMOKE
from tests.slurm.test_slurm_e2e import cli, status, train_steps
from tests.slurmtwonode import Node, TwoNodeCluster, slurm2  # noqa: F401
from tests.sshd import ALIAS, SSHD, SshServer, make_server

pytestmark = [pytest.mark.slow, pytest.mark.ssh]
# goes on until stopped, a checkpoint every 5 steps, no eval pauses
LONG = ["train.steps=100000", "train.save_every=5", "train.eval_every=100000"]


@pytest.fixture
def login2(slurm2: TwoNodeCluster, tmp_path: Path) -> Iterator[SshServer]:  # noqa: F811
    """The cluster's login node: an sshd in the root namespace whose sessions reach it (SLURM_CONF)."""
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    server = make_server(tmp_path / "sshd", home=tmp_path / "home",
                         extra_env={"SLURM_CONF": str(slurm2.conf)})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def run_procs(cluster: TwoNodeCluster, rid: str) -> dict[str, list[str]]:
    """Each node's processes of run ``rid`` (NSA_RUN_ID in their environment): ``pid cmdline``."""
    out: dict[str, list[str]] = {}
    for n in cluster.nodes:
        found = []
        for pid in n.pids():
            if environ_of(pid).get("NSA_RUN_ID") == rid:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
                except OSError:
                    continue
                found.append(f"{pid} {cmd}")
        out[n.name] = found
    return out


def ranks_on(cluster: TwoNodeCluster, rid: str) -> dict[str, list[int]]:
    """Each node's ranks of run ``rid``: the RANK of its processes of the run (torchrun's workers)."""
    out: dict[str, list[int]] = {}
    for n in cluster.nodes:
        ranks = {environ_of(pid).get("RANK", "") for pid in n.pids()
                 if environ_of(pid).get("NSA_RUN_ID") == rid}
        out[n.name] = sorted(int(r) for r in ranks if r.isdigit())
    return out


def wait_for(what: str, pred: Any, login: SshServer, rid: str, cluster: TwoNodeCluster,
             timeout: float) -> dict[str, Any]:
    """Poll ``status`` until ``pred(report)``; on giving up, say everything that explains why."""
    t0 = time.monotonic()
    rep: dict[str, Any] = {}
    while time.monotonic() < t0 + timeout:
        rep = status(login, rid)
        if pred(rep):
            print(f"MEASURE {what}: {time.monotonic() - t0:.1f} s")
            return rep
        if RunStatus(rep["run"]["status"]).is_terminal():
            break  # it ended: what it waits for will not come
        time.sleep(0.5)
    run_dir = Path(rep.get("run", {}).get("dir", "."))
    log = (run_dir / TRAIN_LOG).read_text(errors="replace")[-4000:] if (run_dir / TRAIN_LOG).exists() else ""
    ended = bool(rep) and RunStatus(rep["run"]["status"]).is_terminal()
    why = f"the run ended ({rep['run']['status']})" if ended else f"not within {timeout:.0f} s"
    pytest.fail(f"{what}: {why}\nstatus: {json.dumps(rep)[:3000]}\n"
                f"squeue: {cluster.run('squeue', check=False)}\nprocesses: {run_procs(cluster, rid)}\n"
                f"train.log: {log}\n{cluster.logs()[-6000:]}")


def leftovers(node: Node) -> list[str]:
    """The processes on ``node`` other than its PID 1 and its slurmd: ``pid cmdline``."""
    out = []
    for pid in node.pids():
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        nspid = [x.split()[-1] for x in status if x.startswith("NSpid:")]  # its pid in its namespace
        if comm != "slurmd" and nspid != ["1"]:
            out.append(f"{pid} {cmd[:200]}")
    return out


def beat_hosts(rep: dict[str, Any]) -> dict[int, str]:
    """{rank: the hostname its newest beat came from}."""
    return {b["rank"]: b["host"] for b in rep.get("beats") or []}


def test_two_node_job_is_one_world_and_is_cancelled_on_both_nodes(
    login2: SshServer, slurm2: TwoNodeCluster  # noqa: F811
) -> None:
    """``--nodes 2 --nproc-per-node 1``: a torchrun on each node meets the other at the c10d
    rendezvous on the first node's address; one world of two ranks, one on each machine, whose
    steps advance; one run in ``runs`` (world size 2); ``kill`` cancels the job and leaves no
    process of the run on either node."""
    t0 = time.monotonic()
    code, out, err = cli(login2, "launch", ALIAS, "--slurm", "--nodes", "2", "--nproc-per-node", "1",
                         "--config", SMOKE, "--set", *LONG)
    assert code == 0 and isinstance(out, dict), (code, out, err)
    rid, job = out["run_id"], out["slurm_job_id"]
    assert job and job in slurm2.queue()
    first, second = slurm2.node_names
    rep = wait_for("running on both nodes", lambda r: r["slurm"]["state"] == "RUNNING",
                   login2, rid, slurm2, 60)
    assert slurm2.run("scontrol", "show", "hostnames", rep["slurm"]["nodes"]).split() == [first, second], rep
    run_dir = Path(rep["run"]["dir"])
    # both ranks beat, each from its own machine: one world across the two nodes
    rep = wait_for("both ranks beat, one per node",
                   lambda r: set(beat_hosts(r)) == {0, 1} and set(beat_hosts(r).values()) == {first, second},
                   login2, rid, slurm2, 120)
    assert all(b["world_size"] == 2 for b in rep["beats"]), rep["beats"]
    # run.json (its status, its world) is rewritten every few seconds: the status follows the steps
    rep = wait_for("steps advance, the run running",
                   lambda r: len(train_steps(run_dir)) >= 4 and r["run"]["status"] == "running",
                   login2, rid, slurm2, 120)
    assert rep["run"]["info"]["world_size"] == 2 and rep["alerts"] == [], (rep["run"]["info"], rep["alerts"])
    log = (run_dir / TRAIN_LOG).read_text(errors="replace")
    assert f"nsa-tui: rendezvous at {first}:" in log, log[-2000:]
    # each machine runs its part in its own process table: a torchrun and the worker of the rank
    # whose beats name it
    on = ranks_on(slurm2, rid)
    assert {n: [h for r, h in beat_hosts(rep).items() if r in on[n]] for n in on} == {
        first: [first], second: [second]}, (on, beat_hosts(rep), run_procs(slurm2, rid))
    assert all(any("torch.distributed.run" in p for p in ps) for ps in run_procs(slurm2, rid).values())
    # one run, not one per node
    code, runs, err = cli(login2, "runs", ALIAS)
    assert code == 0 and isinstance(runs, list), (code, runs, err)
    assert [r["run_id"] for r in runs] == [rid], runs
    assert runs[0]["info"]["world_size"] == 2 and runs[0]["slurm"]["job_id"] == job, runs[0]
    # cancelled: the job leaves the queue and nothing of the run is left on either machine
    code, out, err = cli(login2, "kill", ALIAS, rid, "--grace", "30")
    assert code == 0 and out["was_running"], (code, out, err)
    assert job not in slurm2.queue()
    deadline = time.monotonic() + 20  # Slurm reaps the steps' processes as the job ends
    while (any(run_procs(slurm2, rid).values()) or any(leftovers(n) for n in slurm2.nodes)) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(run_procs(slurm2, rid).values()), run_procs(slurm2, rid)
    # nothing else either: only the machine's own PID 1 and its slurmd (no slurmstepd, no torchrun)
    assert not any(leftovers(n) for n in slurm2.nodes), {n.name: leftovers(n) for n in slurm2.nodes}
    rep = status(login2, rid)
    assert rep["slurm"]["state"] == "CANCELLED" and rep["run"]["status"] == "stopped", rep
    print(f"MEASURE two-node job, launch to gone: {time.monotonic() - t0:.1f} s")
