"""Runs on a real one-node Slurm, driven with the nsa-tui CLI over a real sshd as the login node:
submit, watch the queue state, release a held job, requeue a running one, cancel."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nsa.contract.rundir import METRICS_JSONL, SLURM_SCRIPT, TRAIN_LOG
from nsa_tui.agent.procs import run_processes
from nsa_tui.health.alerts import Thresholds
from tests.agent.e2e import SMOKE
from tests.slurmcluster import SlurmCluster
from tests.sshd import ALIAS, SshServer

pytestmark = [pytest.mark.slow, pytest.mark.ssh]
NO_HEARTBEAT_S = Thresholds().no_heartbeat_s
# goes on until stopped, a checkpoint every 5 steps, no eval pauses
LONG = ["train.steps=100000", "train.save_every=5", "train.eval_every=100000"]


def cli(login: SshServer, *args: str, timeout: float = 180) -> tuple[int, Any, str]:
    """(exit code, --json output, stderr) of ``nsa-tui ARGS --json`` against the login node."""
    res = subprocess.run(
        [sys.executable, "-m", "nsa_tui.cli", *args, "--json"],
        env=login.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    try:
        out = json.loads(res.stdout) if res.stdout.strip() else None
    except json.JSONDecodeError:
        out = res.stdout
    return res.returncode, out, res.stderr


def status(login: SshServer, rid: str) -> dict[str, Any]:
    code, out, err = cli(login, "status", ALIAS, rid)
    assert isinstance(out, dict), (code, out, err)
    return out


def train_steps(run_dir: Path) -> list[int]:
    try:
        lines = (run_dir / METRICS_JSONL).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(x)["step"] for x in lines if x.strip() and json.loads(x).get("kind") == "train"]


def wait_for(what: str, pred: Any, login: SshServer, rid: str, slurm: SlurmCluster, timeout: float) -> dict:
    """Poll ``status`` until ``pred(report)``; on giving up, say everything that explains why."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    rep: dict[str, Any] = {}
    while time.monotonic() < deadline:
        rep = status(login, rid)
        if pred(rep):
            print(f"MEASURE {what}: {time.monotonic() - t0:.1f} s")
            return rep
        time.sleep(0.5)
    run_dir = Path(rep.get("run", {}).get("dir", "."))
    log = (run_dir / TRAIN_LOG).read_text(errors="replace")[-3000:] if (run_dir / TRAIN_LOG).exists() else ""
    pytest.fail(
        f"{what}: not within {timeout:.0f} s\nstatus: {json.dumps(rep)[:3000]}\n"
        f"squeue: {slurm.run('squeue', check=False)}\ntrain.log: {log}\n{slurm.logs()[-3000:]}"
    )


def launch(login: SshServer, *extra: str, nproc: int = 1) -> dict[str, Any]:
    code, out, err = cli(
        login, "launch", ALIAS, "--slurm", "--nproc-per-node", str(nproc), "--config", SMOKE, "--set", *LONG,
        *extra
    )
    assert code == 0 and isinstance(out, dict), (code, out, err)
    return out


def killed_and_gone(login: SshServer, slurm: SlurmCluster, rid: str, job: str) -> None:
    code, out, err = cli(login, "kill", ALIAS, rid, "--grace", "30")
    assert code == 0 and out["was_running"], (code, out, err)
    assert job not in slurm.queue()
    deadline = time.monotonic() + 10  # Slurm reaps the step's processes as the job ends
    while run_processes(rid, fresh=True) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not run_processes(rid, fresh=True)
    rep = status(login, rid)
    assert rep["slurm"]["state"] == "CANCELLED" and rep["run"]["status"] == "stopped", rep


def test_held_job_is_queued_not_stalled_then_runs_and_is_cancelled(
    login: SshServer, slurm: SlurmCluster
) -> None:
    """Submitted held: PENDING with its reason, status ``queued``, no alert; released: it runs and
    its steps advance; the time-limit warning (USR1 to the batch shell): the job requeues itself
    and continues from the checkpoint its ranks saved; kill: scancel, the job leaves the queue, no
    process of it is left; resume: a new job continues from the checkpoint the kill saved."""
    res = launch(login, "--sbatch-arg=--hold", "--time", "00:30:00", "--requeue")
    rid, job = res["run_id"], res["slurm_job_id"]
    assert job and job in slurm.queue()
    rep = wait_for("held job pending", lambda r: r["slurm"]["state"] == "PENDING", login, rid, slurm, 30)
    assert rep["run"]["status"] == "queued" and rep["slurm"]["job_id"] == job
    assert rep["slurm"]["reason"] == "JobHeldUser", rep["slurm"]
    assert rep["alerts"] == [], rep["alerts"]
    script = Path(rep["slurm"]["script"])
    assert (
        script.name == SLURM_SCRIPT
        and "srun " in script.read_text()
        and "torch.distributed.run" in script.read_text()
    )
    slurm.run("scontrol", "release", job)
    rep = wait_for("running with its node", lambda r: r["slurm"]["state"] == "RUNNING", login, rid, slurm, 60)
    assert rep["slurm"]["nodes"] == slurm.node
    run_dir = Path(rep["run"]["dir"])
    wait_for("steps advance", lambda r: len(train_steps(run_dir)) >= 6, login, rid, slurm, 240)
    # the warning Slurm sends the batch shell before the time limit (--signal=B:USR1@S), sent
    # now: the script requeues the job, the ranks save, the requeued job continues from there
    slurm.run("scancel", "--batch", "--signal=USR1", job)
    wait_for(
        "requeued by the script",
        lambda r: r["slurm"]["restarts"] >= 1 and r["slurm"]["state"] == "PENDING",
        login,
        rid,
        slurm,
        90,
    )
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")  # skip Slurm's requeue delay
    before = len(train_steps(run_dir))
    wait_for(
        "steps advance after the time-limit requeue",
        lambda r: r["slurm"]["state"] == "RUNNING" and len(train_steps(run_dir)) >= before + 3,
        login,
        rid,
        slurm,
        240,
    )
    assert "time limit near: requeueing" in (run_dir / TRAIN_LOG).read_text()
    killed_and_gone(login, slurm, rid, job)
    steps = train_steps(run_dir)
    assert steps == list(range(1, len(steps) + 1)), steps  # no gap, no duplicate across the requeue
    # resume: a new job, a new run linked to this one, from its newest checkpoint
    last = train_steps(run_dir)[-1]
    code, out, err = cli(login, "resume", ALIAS, rid)
    assert code == 0 and out["slurm_job_id"] and out["slurm_job_id"] != job, (code, out, err)
    child, child_job = out["run_id"], out["slurm_job_id"]
    assert out["parent_run"] == rid and out["resume_from"].endswith(f"step-{last}"), out
    child_dir = Path(out["dir"])
    wait_for("the resumed run's steps", lambda r: len(train_steps(child_dir)) >= 2, login, child, slurm, 240)
    assert train_steps(child_dir)[0] == last + 1
    killed_and_gone(login, slurm, child, child_job)


def test_unknown_partition_is_refused_and_leaves_nothing(login: SshServer, slurm: SlurmCluster) -> None:
    root = login.runs_root
    before = sorted(p.name for p in root.iterdir()) if root.exists() else []
    code, out, err = cli(
        login, "launch", ALIAS, "--slurm", "--partition", "nosuchpartition", "--config", SMOKE
    )
    assert code != 0
    assert "partition" in (err + json.dumps(out)).lower(), (out, err)
    after = sorted(p.name for p in root.iterdir()) if root.exists() else []
    assert after == before
    assert slurm.queue() == []


def test_requeued_job_resumes_from_its_checkpoint(login: SshServer, slurm: SlurmCluster) -> None:
    """scontrol requeue of a running job: the ranks save on TERM; held in the queue (scontrol hold)
    it is ``queued`` with its reason and no stall alert however old its beats; released, it runs
    again from that checkpoint, and the run's steps go on with no gap and no duplicate; fallback:
    a new job from the checkpoint its cancellation saved (two processes: a run on one has nothing to
    fall back from)."""
    res = launch(login, "--requeue", nproc=2)
    rid, job = res["run_id"], res["slurm_job_id"]
    rep = wait_for("running", lambda r: r["slurm"]["state"] == "RUNNING", login, rid, slurm, 60)
    run_dir = Path(rep["run"]["dir"])
    wait_for("steps advance", lambda r: len(train_steps(run_dir)) >= 3, login, rid, slurm, 240)
    slurm.run("scontrol", "requeue", job)
    wait_for(
        "requeued",
        lambda r: r["slurm"]["restarts"] >= 1 and r["slurm"]["state"] == "PENDING",
        login,
        rid,
        slurm,
        60,
    )
    # held while it waits, until its last heartbeats are older than the no-heartbeat threshold:
    # a job in the queue owes none, so no stall alert
    slurm.run("scontrol", "hold", job)
    rep = wait_for(
        "held, beats older than the no-heartbeat threshold",
        lambda r: (
            (r["slurm"]["reason"] or "").startswith("JobHeld")
            and r["beats"]
            and min(r["heartbeat_age_s"].values()) > NO_HEARTBEAT_S + 2
        ),
        login,
        rid,
        slurm,
        120,
    )
    assert rep["run"]["status"] == "queued" and rep["alerts"] == [], rep["alerts"]
    code, _, _ = cli(login, "status", ALIAS, rid)
    assert code == 0  # healthy: nothing to look at
    # released: Slurm would hold a requeued job back ~2 min (BeginTime); start it now
    slurm.run("scontrol", "release", job)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    before = len(train_steps(run_dir))
    rep = wait_for(
        "steps advance after the requeue",
        lambda r: r["slurm"]["state"] == "RUNNING" and len(train_steps(run_dir)) >= before + 3,
        login,
        rid,
        slurm,
        300,
    )
    # fallback: the job is cancelled (its ranks save), a new job of one node and one process
    # continues from that checkpoint as a run linked to this one
    code, out, err = cli(login, "fallback", ALIAS, rid, "--grace", "30")
    assert code == 0 and out["killed"]["was_running"] and out["parent_run"] == rid, (code, out, err)
    assert job not in slurm.queue() and status(login, rid)["slurm"]["state"] == "CANCELLED"
    steps = train_steps(run_dir)
    assert steps == list(range(1, len(steps) + 1)), steps  # no gap, no duplicate across the requeue
    log = (run_dir / TRAIN_LOG).read_text()
    assert "restart 1" in log and "resume from" in log
    child, child_job, child_dir = out["run_id"], out["slurm_job_id"], Path(out["dir"])
    assert out["resume_from"].endswith(f"step-{steps[-1]}") and out["nproc"] == 1, out
    wait_for("the fallback's steps", lambda r: len(train_steps(child_dir)) >= 2, login, child, slurm, 240)
    assert train_steps(child_dir)[0] == steps[-1] + 1
    killed_and_gone(login, slurm, child, child_job)


def rendezvous(run_dir: Path) -> str | None:
    """The endpoint the job's batch script chose (its line in train.log), the newest."""
    log = run_dir / TRAIN_LOG
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    mark = "nsa-tui: rendezvous at "
    found = [x[len(mark):].strip() for x in lines if x.startswith(mark)]
    return found[-1] if found else None


def test_two_jobs_on_one_node_each_get_their_own_rendezvous_port(
    login: SshServer, slurm: SlurmCluster
) -> None:
    """Two jobs at once on the one node, their ids 1000 apart (the old ``29400 + id % 1000`` gave
    both one port): each serves its rendezvous on a port of its own and both advance; the second
    goes on after the first is cancelled (on the first's store it would die with it)."""
    first = launch(login)
    rid_a, job_a = first["run_id"], first["slurm_job_id"]
    # the next job id is 1000 on: the cluster's first id raised (sbatch has no --jobid here)
    slurm.conf.write_text(slurm.conf.read_text() + f"FirstJobId={int(job_a) + 1000}\n")
    slurm.run("scontrol", "reconfigure")
    second = launch(login)
    rid_b, job_b = second["run_id"], second["slurm_job_id"]
    assert int(job_b) == int(job_a) + 1000, (job_a, job_b)
    dirs = {}
    for rid in (rid_a, rid_b):
        rep = wait_for(f"{rid} running", lambda r: r["slurm"]["state"] == "RUNNING", login, rid, slurm, 120)
        dirs[rid] = Path(rep["run"]["dir"])
    for rid, d in dirs.items():
        wait_for(f"{rid}'s steps advance", lambda r, d=d: len(train_steps(d)) >= 3, login, rid, slurm, 300)
    ports = {rid: rendezvous(d) for rid, d in dirs.items()}
    assert None not in ports.values() and ports[rid_a] != ports[rid_b], ports
    assert {p.rpartition(":")[0] for p in ports.values() if p} == {slurm.node}, ports
    killed_and_gone(login, slurm, rid_a, job_a)
    before = len(train_steps(dirs[rid_b]))
    wait_for(
        "the second job goes on alone",
        lambda r: r["slurm"]["state"] == "RUNNING" and len(train_steps(dirs[rid_b])) >= before + 3,
        login,
        rid_b,
        slurm,
        240,
    )
    killed_and_gone(login, slurm, rid_b, job_b)
