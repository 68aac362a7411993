"""One run over two hosts: two real OpenSSH servers on 127.0.0.1 (own ports, HOMEs, runs
roots), gloo on CPU, one process per host: world size 2 across two nodes.

Launch across both and see both ranks in one run; dump, logs, kill (nothing left on either)
and resume over both (the checkpoint's shards gathered onto each host); kill -9 of
one host's torchrun makes the run crashed naming that host and its ranks while the other
rank stops, and each host's watchdog records its alerts (merged by `alerts H1,H2`); a host
whose sshd dies is shown as lost, not the run as crashed; a host that dies entirely is lost
until the other host's rank fails; fallback from 2 nodes to 1 keeps the global batch and
trains bit-identically to a 1-node run from the same checkpoint; bad input (an unreachable
host, a host without nsa-tui, another nsa version, a rendezvous port in use, a bad config)
is refused before anything starts, and a partial start is rolled back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from nsa.contract import RunStatus
from nsa_tui.agent.procs import run_processes
from nsa_tui.cli.multi import part_alerts
from nsa_tui.hosts import coordinator as co
from nsa_tui.hosts.client import HostClient
from nsa_tui.hosts.merge import MergedRun, merge
from tests.agent.e2e import SMOKE
from tests.sshd import SshNodes
from tests.train.trainrun import metrics, run_train
from tests.transport.nodes import cli, connected, merged, parts_report, stepped, until

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(300)]

# runs until stopped; checkpoints often; no eval pauses; 1 sequence x 2 micro-batches per rank
LONG = ["train.steps=100000", "train.save_every=5", "train.eval_every=100000", "train.batch_size=1",
        "train.grad_accum=2"]


@pytest.fixture
async def clients(sshd_nodes: SshNodes) -> AsyncIterator[dict[str, HostClient]]:
    async with connected(sshd_nodes) as c:
        yield c


async def cleanup(clients: dict[str, HostClient], *run_ids: str) -> None:
    """No process of these runs may outlive the test, on either host."""
    for rid in run_ids:
        if run_processes(rid):
            await co.kill(clients, rid, 5)
    # a host we could not reach: its processes are on this machine too. A killed process
    # is listed until it has died (on a loaded machine, a moment after the signal): wait
    deadline = time.monotonic() + 30
    while left := [p for r in run_ids for p in run_processes(r, fresh=True)]:
        assert time.monotonic() < deadline, left
        for p in left:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await asyncio.sleep(0.1)


def roots(nodes: SshNodes) -> list[Path]:
    return [s.runs_root for s in nodes.servers]


async def test_launch_across_two_hosts_see_one_run_kill_leaves_nothing(
        sshd_nodes: SshNodes, clients: dict[str, HostClient]) -> None:
    hosts = ",".join(sshd_nodes.aliases)
    r = cli(sshd_nodes, "launch", hosts, "--config", SMOKE, "--nproc-per-node", "1", "--set", *LONG, "--json")
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]
    resumed: list[str] = []
    try:
        for i, root in enumerate(roots(sshd_nodes)):  # a directory of its own on each host
            launch = json.loads((root / rid / "launch.json").read_text())
            assert launch["nodes"]["node_rank"] == i and launch["nodes"]["hosts"] == sshd_nodes.aliases
            nodes = launch["nodes"]
            assert nodes["nnodes"] == 2 and nodes["rdzv_endpoint"].startswith("127.0.0.1:")
            assert "--rdzv-backend=c10d" in launch["command"] and "--nnodes=2" in launch["command"]
        await until("3 steps on both ranks", stepped(3, clients, rid))
        # one host named is enough: the CLI finds the other from the run's node layout
        st = cli(sshd_nodes, "status", sshd_nodes.aliases[1], rid, "--json")
        assert st.returncode == 0, st.stdout + st.stderr
        doc = json.loads(st.stdout)
        assert doc["status"] == "running" and doc["hosts"] == sshd_nodes.aliases
        assert sorted((x["rank"], x["host"]) for x in doc["ranks"]) == sorted(
            zip((0, 1), sorted(sshd_nodes.aliases, key=lambda h: h != doc["rank0_host"])))
        assert all(x["step"] >= 3 for x in doc["ranks"])
        run_json = json.loads((roots(sshd_nodes)[sshd_nodes.aliases.index(doc["rank0_host"])] / rid /
                               "run.json").read_text())
        assert run_json["world_size"] == 2 and run_json["nnodes"] == 2 and run_json["global_batch"] == 4
        dump = cli(sshd_nodes, "dump", hosts, rid, "--json")
        assert dump.returncode == 0, dump.stderr + parts_report(sshd_nodes, rid)
        assert sorted(d["ranks"][0] for d in json.loads(dump.stdout).values()) == [0, 1]  # both hosts' ranks
        # a dump stops nothing: the kill finds the run running on both hosts, and it ends stopped
        k = cli(sshd_nodes, "kill", hosts, rid, "--json")
        assert k.returncode == 0, k.stdout + k.stderr
        killed = json.loads(k.stdout)
        assert all(v["was_running"] for v in killed.values()), (killed, parts_report(sshd_nodes, rid))
        assert not run_processes(rid, fresh=True)  # nothing left on either host
        m = await merged(clients, rid)
        assert m.status == RunStatus.STOPPED and not m.problem, (m.status, m.problem,
                                                                 parts_report(sshd_nodes, rid))
        names = [sorted(e.name for e in (await c.checkpoints(rid)).checkpoints) for c in clients.values()]
        assert names[0] == names[1] and names[0]  # every node committed the same checkpoints
        logs = cli(sshd_nodes, "logs", hosts, rid)
        assert logs.returncode == 0 and all(f"[{h}] " in logs.stdout for h in sshd_nodes.aliases)
        # resume over both hosts: the newest checkpoint's files gathered onto each, one new run
        res = cli(sshd_nodes, "resume", sshd_nodes.aliases[0], rid, "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        new = json.loads(res.stdout)["run_id"]
        resumed.append(new)
        step = max(int(n.split("-")[1]) for n in names[0])
        for root in roots(sshd_nodes):
            launch = json.loads((root / new / "launch.json").read_text())
            assert launch["parent_run"] == rid and launch["resume_from"] == str(root / rid / "checkpoints" /
                                                                                  f"step-{step}")
            assert sorted(p.name for p in Path(launch["resume_from"]).iterdir()) == [
                ".metadata", "__0_0.distcp", "__1_0.distcp", "meta.json"]
        await until("both ranks past the checkpoint", stepped(step + 2, clients, new))
        assert (await merged(clients, new)).status == RunStatus.RUNNING
    finally:
        await cleanup(clients, rid, *resumed)


def torchrun_of(root: Path, run_id: str) -> psutil.Process:
    pid = json.loads((root / run_id / "launch.json").read_text())["launcher_pid"]
    kids = psutil.Process(pid).children()
    return next(p for p in kids if "torch.distributed.run" in " ".join(p.cmdline()))


@pytest.mark.parametrize("victim_rank", [0, 1])
async def test_kill_9_of_one_hosts_torchrun_crashes_the_run_naming_host_and_rank(
        sshd_nodes: SshNodes, clients: dict[str, HostClient], victim_rank: int) -> None:
    """The host of rank 0 (run.json's host: its rank writes `stopped`) or the other one."""
    res = await co.launch(clients, SMOKE, nproc=1, overrides=LONG)
    rid = res.run_id
    try:
        m = await until("2 steps on both ranks", stepped(2, clients, rid))
        victim = next(h for h, b in m.ranks if b.rank == victim_rank)
        torchrun_of(roots(sshd_nodes)[sshd_nodes.aliases.index(victim)], rid).send_signal(signal.SIGKILL)

        async def crashed() -> MergedRun | None:
            m = await merged(clients, rid)
            return m if m.status == RunStatus.CRASHED else None
        m = await until("the run to be crashed", crashed)
        assert m.problem is not None and m.problem.startswith(f"{victim} (rank {victim_rank})"), m.problem
        assert "killed by signal 9" in m.problem
        other = next(p for p in m.parts if p.host != victim)
        alerts = [a for p in m.parts for a in part_alerts(p, rid, time.time())]
        crash = [a for a in alerts if a.kind == "crash" and a.severity == "critical"]
        # the victim's crash is there; the other host's torchrun may crash too by now (rank 0's
        # host held the rendezvous store: losing it is a real failure there), a consequence that
        # the merged problem above already puts after the victim
        assert victim in [a.host for a in crash], alerts

        async def other_rank_stopped() -> bool:
            ps = {p.host: p for p in await co.parts(clients, rid)}
            beats = ps[other.host].beats
            return bool(beats) and all(b.phase.value == "done" for b in beats)
        await until("the other host's rank to stop", other_rank_stopped)
        st = cli(sshd_nodes, "status", ",".join(sshd_nodes.aliases), rid)
        assert st.returncode == 6 and "crashed" in st.stdout and victim in st.stdout, st.stdout
        # the hosts' recorded alerts (each host's watchdog), merged; one host named finds the other

        async def crash_recorded() -> list[Any]:
            lst = await clients[victim].alerts(rid)
            return [s for s in lst.alerts if s.alert.kind == "crash" and s.alert.severity == "critical"]
        await until("the victim's watchdog to record the crash", crash_recorded, timeout=60)
        al = cli(sshd_nodes, "alerts", other.host, rid, "--json")
        assert al.returncode == 0, al.stdout + al.stderr
        recorded = {h: [(s["alert"]["kind"], s["alert"]["severity"]) for s in lst["alerts"]]
                    for h, lst in json.loads(al.stdout).items()}
        assert sorted(recorded) == sorted(sshd_nodes.aliases) and ("crash", "critical") in recorded[victim]
        text = cli(sshd_nodes, "alerts", ",".join(sshd_nodes.aliases), rid).stdout
        lines = text.splitlines()
        assert any(ln.startswith(f"[{victim}] ") and "CRITICAL] crash" in ln for ln in lines), text
    finally:
        await cleanup(clients, rid)  # the other torchrun may still wait in its exit barrier


async def test_a_host_whose_sshd_dies_is_lost_not_the_run_crashed(sshd_nodes: SshNodes,
                                                                  clients: dict[str, HostClient]) -> None:
    res = await co.launch(clients, SMOKE, nproc=1, overrides=LONG)
    rid = res.run_id
    try:
        await until("2 steps on both ranks", stepped(2, clients, rid))
        gone = sshd_nodes.servers[1]
        await asyncio.to_thread(gone.stop)  # the host drops off the network; its rank goes on
        st = cli(sshd_nodes, "status", ",".join(sshd_nodes.aliases), rid, "--json")
        doc = json.loads(st.stdout)
        assert st.returncode == 6, st.stdout + st.stderr
        assert doc["status"] == "running" and doc["problem"] is None  # not crashed
        assert list(doc["lost_hosts"]) == [sshd_nodes.aliases[1]]
        text = cli(sshd_nodes, "status", ",".join(sshd_nodes.aliases), rid).stdout
        assert f"host {sshd_nodes.aliases[1]}: LOST" in text, text
        al = cli(sshd_nodes, "alerts", ",".join(sshd_nodes.aliases), rid)  # the lost host's are not known
        assert al.returncode == 5 and f"[{sshd_nodes.aliases[1]}] unreachable: " in al.stdout, al.stdout
        await asyncio.to_thread(gone.start)
    finally:
        await cleanup(clients, rid)


async def test_a_host_that_dies_is_lost_until_the_other_ranks_fail(sshd_nodes: SshNodes,
                                                                  clients: dict[str, HostClient]) -> None:
    """The whole second host goes (its sshd and every process of its part, as in a power
    loss): it is shown as lost, and the run ends when the first host's ranks fail at their
    next collective, naming that host and its rank (no checkpoint in flight: the steady-state
    timeout bounds the wait)."""
    overrides = [*LONG, "train.save_every=100000", "train.pg_timeout_s=30"]
    res = await co.launch(clients, SMOKE, nproc=1, overrides=overrides)
    rid = res.run_id
    try:
        await until("2 steps on both ranks", stepped(2, clients, rid))
        gone, dead = sshd_nodes.servers[1], sshd_nodes.aliases[1]
        await asyncio.to_thread(gone.stop)
        part = str(gone.runs_root / rid)
        for p in run_processes(rid, fresh=True, run_dir=part):
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        first = sshd_nodes.aliases[0]

        async def ended() -> MergedRun | None:
            ps = await co.parts({first: clients[first]}, rid, {dead: "host down"}, sshd_nodes.aliases)
            m = merge(rid, ps)
            return m if m.status.is_terminal() else None
        m = await until("the first host's rank to fail", ended)
        assert m.status in (RunStatus.FAILED, RunStatus.CRASHED) and list(m.lost) == [dead], m
        assert m.problem is not None and m.problem.startswith(f"{first} (rank "), m.problem
        st = cli(sshd_nodes, "status", ",".join(sshd_nodes.aliases), rid, "--json")
        doc = json.loads(st.stdout)
        assert st.returncode == 6 and doc["status"] == m.status.value, doc
        assert list(doc["lost_hosts"]) == [dead], doc
        assert not run_processes(rid, fresh=True)  # the first host's part ended by itself
        await asyncio.to_thread(gone.start)
    finally:
        await cleanup({sshd_nodes.aliases[0]: clients[sshd_nodes.aliases[0]]}, rid)


async def test_fallback_two_nodes_to_one_keeps_the_global_batch_bit_identically(
        sshd_nodes: SshNodes, clients: dict[str, HostClient], tmp_path: Path) -> None:
    res = await co.launch(clients, SMOKE, nproc=1, overrides=LONG)
    rid, child = res.run_id, ""
    try:
        m = await until("3 steps on both ranks", stepped(3, clients, rid))
        fb = cli(sshd_nodes, "fallback", sshd_nodes.aliases[0], rid, "--grace", "60", "--json")
        assert fb.returncode == 0, fb.stdout + fb.stderr
        out = json.loads(fb.stdout)
        child, ckpt = out["run_id"], Path(out["resume_from"])
        assert out["parent_run"] == rid and out["nproc"] == 1
        target = roots(sshd_nodes)[sshd_nodes.aliases.index(m.primary)]  # rank 0's host
        assert ckpt.parent.parent == target / rid
        assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp",
                                                          "meta.json"]  # rank 1's shard gathered
        step = int(ckpt.name.split("-")[1])
        child_dir = target / child
        c0 = clients[m.primary]

        async def child_steps() -> bool:
            return bool(child_dir.joinpath("metrics.jsonl").exists()) and len(metrics(child_dir)) >= 3
        await until("3 steps of the 1-node run", child_steps)
        await c0.kill(child, 60)
        info = json.loads((child_dir / "run.json").read_text())
        assert (info["world_size"], info["grad_accum"], info["global_batch"]) == (1, 4, 4)  # was 2 x 2
        assert info["resumed_from"] == str(ckpt) and "keeps the global batch of 4" in info["resume_note"]
        got = {x["step"]: x["loss"] for x in metrics(child_dir)}
        launch = json.loads((child_dir / "launch.json").read_text())
        ref = run_train(tmp_path / "ref", [*launch["overrides"], f"debug.stop_at_step={step + 3}"], nproc=1,
                        config=child_dir / "config.yaml", resume=str(ckpt),
                        env={"NSA_THREADS": "1"})  # as on the test hosts (tests/sshd.py)
        assert ref.rc == 0, ref.output[-3000:]
        want = {x["step"]: x["loss"] for x in metrics(ref.run_dir)}
        assert sorted(want) == [step + 1, step + 2, step + 3]
        for s in want:
            assert got[s] == want[s], f"step {s}: fallback {got[s]!r} vs 1-node run {want[s]!r}"
    finally:
        await cleanup(clients, rid, *([child] if child else []))


def test_bad_input_is_refused_before_anything_starts(sshd_nodes: SshNodes) -> None:
    hosts = ",".join(sshd_nodes.aliases)
    r = cli(sshd_nodes, "launch", f"{sshd_nodes.aliases[0]},nobody@127.0.0.1:1", "--config", SMOKE, "--json")
    assert r.returncode == 5 and "nobody@127.0.0.1:1" in json.loads(r.stdout)["error"]["message"], r.stdout
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = cli(sshd_nodes, "launch", hosts, "--config", SMOKE, "--rdzv-port", str(port), "--json")
    err = json.loads(r.stdout)["error"]
    assert r.returncode != 0 and err["code"] == "port_in_use", r.stdout
    assert err["message"].startswith(f"{sshd_nodes.aliases[0]}: rendezvous port: port {port} is in use")
    r = cli(sshd_nodes, "launch", hosts, "--config", SMOKE, "--set", "train.nonsense=1", "--json")
    assert r.returncode == 3 and "train.nonsense" in r.stdout
    assert not any(root.exists() and any(root.iterdir()) for root in roots(sshd_nodes))  # nothing started
    r = cli(sshd_nodes, "delete", hosts, "some-run", "--yes", "--json")  # one host's part: name one host
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["code"] == "bad_request", r.stdout


def test_a_host_without_nsa_tui_is_refused_before_anything_starts(sshd_nodes: SshNodes) -> None:
    """The agent command users get (no NSA_TUI_REMOTE_PYTHON): the setup venv's python where it
    exists, else the system's python3. The first host has the venv (this Python), the second
    has none, and its python3 has no nsa_tui: refused naming it, nothing started on the first."""
    home0 = sshd_nodes.servers[0].home
    assert home0 is not None
    venv = home0 / ".nsa-tui" / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / "python").chmod(0o755)
    env = {k: v for k, v in sshd_nodes.env().items() if k != "NSA_TUI_REMOTE_PYTHON"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], env=env, capture_output=True,
                              text=True, timeout=120)
    ok = run("runs", sshd_nodes.aliases[0], "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr  # the first host's agent does start this way
    r = run("launch", ",".join(sshd_nodes.aliases), "--config", SMOKE, "--set", *LONG, "--json")
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 5 and err["code"] == "unreachable", r.stdout
    assert err["message"].startswith(f"{sshd_nodes.aliases[1]}: "), err
    assert "no nsa_tui agent" in err["message"], err
    assert "nsa-tui setup" in r.stdout  # how to fix it
    assert not any(root.exists() and any(root.iterdir()) for root in roots(sshd_nodes))  # nothing started


def test_a_partial_start_is_rolled_back(sshd_nodes: SshNodes, tmp_path: Path) -> None:
    """The second host cannot create the run's directory (its runs root made immutable, which
    even root cannot write into): its launch fails after the first host started; the first is
    stopped again, nothing is left running. A runs root that is a file, and both hosts given one
    runs root on one machine (the same machine named twice), are refused before anything starts."""
    a, b = sshd_nodes.aliases
    shared = tmp_path / "shared-runs"
    r = cli(sshd_nodes, "launch", f"{a},{b}", "--config", SMOKE, "--set", *LONG, "--runs-root", str(shared),
            "--json")
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 2 and "is the same machine as" in err["message"], r.stdout
    assert not list(shared.iterdir())  # no run directory, the probe's marker removed

    first, file_root = tmp_path / "first-runs", tmp_path / "not-a-directory"
    file_root.write_text("")
    r = cli(sshd_nodes, "launch", f"{a}:{first},{b}:{file_root}", "--config", SMOKE, "--set", *LONG, "--json")
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 2 and err["code"] == "bad_request", r.stdout  # bad input, not an unreachable host
    assert err["message"] == (f"{b}:{file_root}: refused before anything started: runs root {file_root} "
                              "is not a directory"), err["message"]
    assert not first.exists() or not any(p.is_dir() for p in first.iterdir())  # nothing started

    frozen = tmp_path / "frozen-runs"
    frozen.mkdir()
    if subprocess.run(["chattr", "+i", str(frozen)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not allowed here (needs CAP_LINUX_IMMUTABLE on ext4 or xfs)")
    try:
        r = cli(sshd_nodes, "launch", f"{a}:{first},{b}:{frozen}", "--config", SMOKE, "--set", *LONG,
                "--json")
    finally:
        subprocess.run(["chattr", "-i", str(frozen)], check=True)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 1 and err["code"] == "launch_failed", r.stdout
    assert err["message"].startswith(f"{b}:{frozen}: launch failed"), err["message"]
    assert f"stopped what had started on {a}:{first}" in err["message"]
    (rid,) = [p.name for p in first.iterdir() if p.is_dir()]
    assert not run_processes(rid, fresh=True)
    assert (first / rid / "stop.json").is_file()
    assert not list(frozen.iterdir())


def test_a_host_with_another_nsa_version_is_refused_before_anything_starts(sshd_nodes: SshNodes,
                                                                             tmp_path: Path) -> None:
    """The second host's sessions import another copy of nsa (an older checkout first on its
    PYTHONPATH): its agent reports that version, and launch refuses naming the host."""
    import shutil

    import nsa

    old = tmp_path / "old-checkout"
    shutil.copytree(Path(nsa.__file__).parent, old / "nsa", ignore=shutil.ignore_patterns("__pycache__"))
    init = old / "nsa" / "__init__.py"
    text = init.read_text()
    assert f'__version__ = "{nsa.__version__}"' in text
    init.write_text(text.replace(f'__version__ = "{nsa.__version__}"', '__version__ = "0.0.1-old"'))
    server = sshd_nodes.servers[1]
    cfg = server.dir / "sshd_config"
    cfg.write_text(cfg.read_text().replace("SetEnv HOME=", f"SetEnv PYTHONPATH={old} HOME="))
    server.restart()
    r = cli(sshd_nodes, "launch", ",".join(sshd_nodes.aliases), "--config", SMOKE, "--set", *LONG, "--json")
    err = json.loads(r.stdout)["error"]
    assert r.returncode != 0 and err["code"] == "versions", r.stdout
    assert err["message"].startswith(f"{sshd_nodes.aliases[1]}: nsa-version 0.0.1-old differs from "
                                     f"{sshd_nodes.aliases[0]}'s {nsa.__version__}"), err
    assert not any(root.exists() and any(root.iterdir()) for root in roots(sshd_nodes))  # nothing started


def test_hosts_must_run_the_same_versions() -> None:
    from nsa.contract.replies import PreflightResult

    ok = PreflightResult(host="a", nsa_tui="0.1.0", nsa_version="0.1.0", torch="2.13.0", port=29400,
                         port_free=True, config_name="x")
    other = PreflightResult(host="b", nsa_tui="0.1.0", nsa_version="0.1.0", torch="2.11.0+cu130",
                            config_name="x")
    co.check_preflight(["a", "b"], [ok, ok])
    with pytest.raises(co.MultiHostError, match=r"^b: torch 2.11.0\+cu130 differs from a's 2.13.0"):
        co.check_preflight(["a", "b"], [ok, other])
    missing = PreflightResult(host="b", nsa_tui="0.1.0",
                              problems=["nsa not importable: No module named 'nsa'"])
    with pytest.raises(co.MultiHostError, match="^b: nsa not importable"):
        co.check_preflight(["a", "b"], [ok, missing])
