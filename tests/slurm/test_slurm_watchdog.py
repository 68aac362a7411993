"""The watchdog beside a Slurm job (nsa_tui/agent/slurmwatch.py) on a real one-node Slurm, with no
panel and no CLI running once the job is submitted: a hung rank reaches the settings' notify
command and the run's ``on_failure=stop`` ends the job on every node; a rank killed with
``kill -9`` is restarted once as a new job that redoes the lost steps with the same losses.
Faults come from outside (``debug.hang_at_step``, ``kill -9``); waits are on the run's files."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.watchdog_faults import events as alert_events
from bench.watchdog_faults import steps
from nsa.contract import Beat, ExitInfo, LaunchInfo, Lease, Relaunch, decode_lines, read_json
from nsa.contract.rundir import SLURM_JSON, TRAIN_LOG
from nsa.contract.slurm import SlurmJob
from nsa.train.checkpoint import find_latest
from nsa_tui.agent.policy import restarts_before
from nsa_tui.agent.procs import run_processes
from tests.agent.e2e import SMOKE
from tests.slurm.test_slurm_e2e import cli, status
from tests.slurmcluster import SlurmCluster
from tests.sshd import ALIAS, SshServer

pytestmark = [pytest.mark.slow, pytest.mark.ssh]
STALL_FLOOR_S = 4.0
STEPS = 60  # the restarted run's


def user_settings(login: SshServer, tmp_path: Path, **alerts: float) -> Path:
    """The settings file of the login node's user (its HOME: the job inherits it): these alert
    thresholds, and a notify command that appends ``<time> <event>`` to the returned file."""
    notified = tmp_path / "notified.txt"
    script = f"import sys, time; open({str(notified)!r}, 'a').write(f'{{time.time()}} ' + sys.stdin.read())"
    path = (login.home or Path.home()) / ".config" / "nsa-tui" / "settings.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"alerts": alerts, "notify": {"command": [sys.executable, "-c", script]}}))
    return notified


def submit(login: SshServer, *sets: str, nproc: int, on_failure: str) -> tuple[str, str, Path]:
    """``launch --slurm``, then the CLI is gone: (run id, job id, run directory)."""
    code, out, err = cli(login, "launch", ALIAS, "--slurm", "--nproc-per-node", str(nproc), "--config", SMOKE,
                         "--on-failure", on_failure, "--set", "train.eval_every=100000", *sets)
    assert code == 0 and isinstance(out, dict), (code, out, err)
    return out["run_id"], out["slurm_job_id"], Path(out["dir"])


def until(what: str, cond: Callable[[], Any], timeout: float, run_dir: Path, slurm: SlurmCluster) -> Any:
    """The first true value of ``cond()``; on giving up, what explains why."""
    t0 = time.monotonic()
    while time.monotonic() < t0 + timeout:
        value = cond()
        if value:
            print(f"MEASURE {what}: {time.monotonic() - t0:.1f} s")
            return value
        time.sleep(0.2)
    log = (run_dir / TRAIN_LOG).read_text(errors="replace")[-4000:] if (run_dir / TRAIN_LOG).exists() else ""
    said = [f"{e.action} {e.alert.kind}: {e.alert.message}" for e in alert_events(run_dir)]
    queue = slurm.run("squeue", check=False)
    pytest.fail(f"{what}: not within {timeout:.0f} s\nalerts: {said}\nsqueue: {queue}\ntrain.log: {log}")


def beats(run_dir: Path, rank: int) -> list[Beat]:
    try:
        return decode_lines((run_dir / "heartbeats" / f"rank-{rank}.jsonl").read_text().splitlines(), Beat)
    except FileNotFoundError:
        return []


def ended_and_gone(slurm: SlurmCluster, rid: str, job: str, run_dir: Path) -> None:
    """The job has left the queue, its watchdog wrote the run's end, nothing of it is left running."""
    until("the job has left the queue", lambda: job not in slurm.queue(), 90, run_dir, slurm)
    until("no process of the run left", lambda: not run_processes(rid, fresh=True), 15, run_dir, slurm)
    end = read_json(run_dir / "exit.json", ExitInfo)
    assert end is not None and end.watchdog, end
    lease = read_json(run_dir / "lease.json", Lease)
    assert lease is not None and lease.ttl_s == 0, lease  # released as the watchdog ended


def test_a_hung_rank_is_notified_and_stopped_on_every_node_with_no_panel(
    login: SshServer, slurm: SlurmCluster, tmp_path: Path
) -> None:
    """``debug.hang_at_step``: the watchdog beside the job raises a stall within the threshold and
    the notify command runs; ``on_failure=stop`` TERMs the job's step, KILLs it after the grace
    (a hung rank ignores TERM), and the job ends with its final alerts recorded; ``status`` says
    the run's alerts are the watchdog's."""
    notified = user_settings(login, tmp_path, stall_floor_s=STALL_FLOOR_S, stall_factor=3.0,
                             no_heartbeat_s=30.0)
    hang = 8
    rid, job, d = submit(login, "train.steps=100000", "train.save_every=100000", f"debug.hang_at_step={hang}",
                         "on_failure.grace_s=2", nproc=1, on_failure="stop")
    frozen = until("the rank at its hang step", lambda: next(
        (b.ts for b in beats(d, 0) if b.step >= hang), None), 180, d, slurm)
    line = until("the notification", lambda: notified.exists() and notified.read_text(), 60, d, slurm)
    when, _, sent = line.splitlines()[0].partition(" ")
    event = json.loads(sent)
    latency = float(when) - frozen
    print(f"MEASURE last step -> notify command ran: {latency:.2f} s (stall floor {STALL_FLOOR_S} s)")
    assert event["alert"]["kind"] == "stall" and event["alert"]["rank"] == 0, event
    assert latency <= STALL_FLOOR_S + 5.0
    raised = next(e for e in alert_events(d) if e.action == "raised" and e.alert.kind == "stall")
    assert raised.id == event["id"]
    # the login node's view: the watchdog beside the job records the run's alerts (the panel and
    # status show those and detect nothing themselves)
    rep = status(login, rid)
    assert rep["run"]["watchdog"], rep["run"]
    ended_and_gone(slurm, rid, job, d)
    said = [e.alert.message for e in alert_events(d) if e.alert.kind == "policy"]
    assert any("on_failure=stop: stopping the run after a stall of rank 0" in m for m in said), said
    log = (d / TRAIN_LOG).read_text()
    assert f"nsa-tui watchdog: watching job {job}" in log and "nsa-tui: srun exited with" in log
    rep = status(login, rid)
    assert rep["run"]["status"] == "stopped" and rep["run"]["watchdog"], rep["run"]


def test_a_killed_rank_is_restarted_once_as_a_new_job_with_the_same_losses(
    login: SshServer, slurm: SlurmCluster, tmp_path: Path
) -> None:
    """``kill -9`` of rank 1 (its pid from its heartbeat): the watchdog names the crash, the policy
    submits one new job from inside the old one (``on_failure.max_restarts=1``), a run linked to
    the first, which redoes the lost steps with bit-identical losses and ends; nothing more."""
    # a crash, not a hang: on a loaded machine a slow step must not pass for a stall
    user_settings(login, tmp_path, stall_floor_s=120.0, no_heartbeat_s=120.0)
    # steps of at least 0.15 s (a slow data source): a kill between two saves is not a race
    rid, job, d = submit(login, f"train.steps={STEPS}", "train.save_every=10", "debug.slow_data_s=0.15",
                         "on_failure.max_restarts=1", "on_failure.backoff_s=0", nproc=2, on_failure="restart")
    # the login node's view while the job runs: its watchdog's lease is fresh
    until("the watchdog's lease", lambda: read_json(d / "lease.json", Lease), 120, d, slurm)
    rep = status(login, rid)
    assert rep["run"]["watchdog"] and rep["slurm"]["state"] == "RUNNING", rep

    def past_a_complete_checkpoint() -> bool:  # lost steps to redo, not at a save step
        latest = find_latest(d / "checkpoints")
        step = max(steps(d), default=0)
        return latest is not None and step > int(latest.name.split("-")[1]) and step % 10 != 0

    until("a step past a complete checkpoint", past_a_complete_checkpoint, 180, d, slurm)
    pid = beats(d, 1)[-1].pid
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    crash = until("the crash alert", lambda: next(
        (e for e in alert_events(d) if e.alert.kind == "crash"), None), 60, d, slurm)
    print(f"MEASURE kill -9 of rank 1 -> crash alert: {crash.ts - killed:.2f} s")
    assert crash.alert.rank == 1
    rel = until("the restart", lambda: read_json(d / "relaunch.json", Relaunch), 90, d, slurm)
    assert rel.op == "restart" and rel.child_run
    child = d.parent / rel.child_run
    child_job = read_json(child / SLURM_JSON, SlurmJob)
    assert child_job is not None and child_job.job_id != job and child_job.nproc_per_node == 2
    assert read_json(child / "launch.json", LaunchInfo).parent_run == rid  # type: ignore[union-attr]
    ended_and_gone(slurm, rid, job, d)
    ck = int(Path(rel.resume_from).name.split("-")[1])
    parent = steps(d)
    crashed_at = max(parent)
    until("the restarted run's end", lambda: max(steps(child), default=0) >= STEPS, 240, child, slurm)
    redone = {s: loss for s, loss in steps(child).items() if ck < s <= crashed_at}
    assert ck < crashed_at and min(steps(child)) == ck + 1, (ck, crashed_at)
    assert redone and all(redone[s] == parent[s] for s in redone), (redone, parent)  # bit-identical
    print(f"MEASURE restart: steps {ck + 1}..{crashed_at} redone, bit-identical losses ({len(redone)} steps)")
    said = [e.alert.message for e in alert_events(d) if e.alert.kind == "policy"]
    assert any(f"as run {rel.child_run}" in m and f"job {child_job.job_id}" in m for m in said), said
    ended_and_gone(slurm, rel.child_run, child_job.job_id, child)
    # exactly one restart: the child ended well, started nothing, and is the lineage's first restart
    assert sorted(p.name for p in d.parent.iterdir() if p.is_dir()) == sorted([rid, rel.child_run])
    assert not (child / "relaunch.json").exists() and restarts_before(d.parent, rel.child_run) == 1
