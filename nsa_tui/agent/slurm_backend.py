"""Slurm as a launch backend: the agent's side, on the login node.

Submits a run as a batch job, reads its queue state into the run's view, cancels it, and
relaunches it (fallback, resume; restart and fallback by the watchdog beside the job,
nsa_tui/agent/slurmwatch.py, through :func:`relaunch_from_job`) as a new job. The pure parts (the
batch script, parsing the queue, the statuses) are in nsa_tui/slurm, which imports nothing of the
agent.

The run directory is the same contract as a run on one host (nsa/contract/rundir.py): the
agent writes config.yaml, launch.json, the batch script and slurm.json; the ranks, on the
allocation's nodes, write run.json, heartbeats, metrics, checkpoints and train.log into it
through the shared filesystem. The job's processes are not on this machine, so the queue,
not /proc, says whether the run is alive (``nsa_tui.slurm.runstate.run_status``).
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

import nsa
import nsa_tui
from nsa.contract import LaunchInfo, Lease, Relaunch, RunStatus, StopInfo, read_json, write_json_atomic
from nsa.contract.replies import KillResult, LaunchResult
from nsa.contract.requests import FallbackArgs, LaunchArgs, ResumeArgs
from nsa.contract.rundir import (
    CONFIG_YAML,
    LAUNCH_JSON,
    LEASE_JSON,
    RELAUNCH_JSON,
    RUN_ID_RE,
    SHARED_ENV,
    SLURM_JSON,
    SLURM_SCRIPT,
    STOP_JSON,
    TRAIN_LOG,
    new_run_id,
)
from nsa.contract.slurm import FINAL_STATES, SlurmJob, SlurmRequest
from nsa_tui.agent.backend import JobView, RunBackend
from nsa_tui.agent.describe import check_nproc, validate_config
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.runlock import run_lock_async
from nsa_tui.install.pkgpath import env_with_package_path
from nsa_tui.slurm import script as S
from nsa_tui.slurm.queue import parse_steps, run_command
from nsa_tui.slurm.version import SlurmVersionError, check_supported, parse_version
from nsa_tui.slurm.view import QUEUE, read_job, view_state

if TYPE_CHECKING:
    from nsa_tui.agent.launcher import Launcher


class SlurmBackend(RunBackend):
    """A batch job submitted from this login node; its job record is the run's slurm.json."""

    kind = "slurm"

    @classmethod
    def owns(cls, run_dir: Path) -> bool:
        return read_job(run_dir) is not None

    @classmethod
    def takes(cls, a: LaunchArgs) -> bool:
        return a.slurm is not None

    @classmethod
    def job_view(cls, run_dir: Path, trainer: RunStatus | None, stop_requested: bool) -> JobView | None:
        """The queue says whether the run is alive: its processes are on other machines."""
        job = read_job(run_dir)
        if job is None:
            return None
        status, alive, state = view_state(run_dir, job, trainer, stop_requested)
        return JobView(status=status, alive=alive, slurm=state, watchdog=alive and watch_alive(run_dir))

    def _job(self, run_id: str) -> tuple[Path, SlurmJob]:
        run_dir = self.launcher.store.run_dir(run_id)
        job = read_job(run_dir)
        if job is None:  # chosen by its record a moment ago: unreadable since
            raise OpError("bad_request", f"{run_id}: its Slurm job record ({SLURM_JSON}) cannot be read")
        return run_dir, job

    async def launch(self, a: LaunchArgs, overrides: list[str]) -> LaunchResult:
        if a.slurm is None:  # takes() chose this backend for it: only a caller skipping that
            raise OpError("bad_request", "a Slurm launch needs its request (slurm)")
        return await asyncio.to_thread(submit, self.launcher, a.slurm, a.config_path, a.config_text,
                                       a.nproc, overrides, a.name)

    async def kill(self, run_id: str, grace_s: float) -> KillResult:
        """scancel, confirmed by the queue, under the run's lock."""
        run_dir, job = self._job(run_id)
        async with run_lock_async(run_dir):
            return await cancel(run_id, run_dir, job, grace_s)

    async def fallback(self, run_id: str, a: FallbackArgs) -> LaunchResult:
        """A new job: one node, one process, the same global batch (``nproc`` and ``checkpoint``
        are not used: the newest checkpoint, the one the cancelled ranks saved)."""
        return await relaunch(self.launcher, run_id, self._job(run_id)[1], "fallback", float(a.grace_s))

    async def resume(self, run_id: str, a: ResumeArgs) -> LaunchResult:
        """A new job on the same request, from the newest checkpoint."""
        return await relaunch(self.launcher, run_id, self._job(run_id)[1], "resume")


def slurm_version() -> str:
    """``sinfo --version``, checked: a login node without Slurm, or too old a one, is refused."""
    rc, out, err = run_command(["sinfo", "--version"])
    if rc == 127:
        raise OpError("no_slurm", "sinfo not found: this host is not a Slurm login node (no Slurm client)")
    if rc != 0:
        raise OpError("no_slurm", f"sinfo --version failed: {(err or out).strip()[:300]}")
    try:
        check_supported(parse_version(out))
    except SlurmVersionError as exc:
        raise OpError("no_slurm", str(exc)) from None
    return out.strip()


def _remove(run_dir: Path) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)


def submit(
    launcher: Launcher,
    req: SlurmRequest,
    config_path: str | None,
    config_text: str | None,
    nproc: int | None,
    overrides: list[str],
    name: str | None,
    parent_run: str | None = None,
    resume_from: str | None = None,
) -> LaunchResult:
    """Validate, create the run directory, write the script and submit it. sbatch refusing the
    job (an unknown partition, a request no node satisfies) leaves nothing behind."""
    try:
        S.check_request(req)
    except ValueError as exc:
        raise OpError("bad_request", str(exc)) from None
    check_nproc(nproc)
    version = slurm_version()
    store = launcher.store
    store.ensure()
    with launcher._config_file(config_path, config_text) as (path, shown):
        cfg = validate_config(path, overrides, shown_as=shown)
        run_id = new_run_id(name or cfg.name)
        if not RUN_ID_RE.match(run_id):
            raise OpError("bad_request", f"bad run id {run_id!r}")
        run_dir = store.root / run_id
        run_dir.mkdir(mode=0o700)
        text = Path(path).read_text()
    try:
        return _write_and_submit(
            launcher,
            req,
            run_id,
            run_dir,
            text,
            cfg,
            nproc or 1,
            overrides,
            name or cfg.name,
            version,
            config_path if config_text is not None else path,
            parent_run,
            resume_from,
        )
    except BaseException:
        _remove(run_dir)
        raise


def _write_and_submit(
    launcher: Launcher,
    req: SlurmRequest,
    run_id: str,
    run_dir: Path,
    text: str,
    cfg: Any,
    nproc: int,
    overrides: list[str],
    name: str,
    version: str,
    source: str | None,
    parent_run: str | None,
    resume_from: str | None,
) -> LaunchResult:
    os.chmod(run_dir, 0o700)
    cfg_copy = run_dir / CONFIG_YAML
    fd = os.open(cfg_copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    train_args = ["--config", str(cfg_copy), "--run-dir", str(run_dir)]
    if overrides:
        train_args += ["--set", *overrides]
    if parent_run:
        train_args += ["--parent-run", parent_run]
    env: dict[str, str] = {"NSA_RUN_ID": run_id, "NSA_RUN_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"}
    env[SHARED_ENV] = "1"  # every node writes this one directory: rank 0 alone commits checkpoints
    paths = env_with_package_path(env_with_package_path({}, nsa.__file__), nsa_tui.__file__)
    if paths.get("PYTHONPATH"):
        parts = [paths["PYTHONPATH"]] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        env["PYTHONPATH"] = os.pathsep.join(
            dict.fromkeys(p for part in parts for p in part.split(os.pathsep))
        )
    spec = S.JobSpec(
        run_id=run_id,
        run_dir=str(run_dir),
        name=name,
        python=launcher.python,
        nproc_per_node=nproc,
        train_args=train_args,
        resume_from=resume_from,
        env=env,
        log=str(run_dir / TRAIN_LOG),
    )
    script_path = run_dir / SLURM_SCRIPT
    argv = S.sbatch_argv(req, spec, str(script_path))
    body = S.build_script(req, spec, argv)
    fd = os.open(script_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    with os.fdopen(fd, "w") as fh:
        fh.write(body)
    command = ["srun", *S.torchrun_argv(spec, req.nodes), "-m", "nsa.train", *train_args]
    launch = LaunchInfo(
        run_id=run_id,
        name=name,
        created=time.time(),
        command=command,
        nproc=nproc,
        overrides=overrides,
        parent_run=parent_run,
        resume_from=resume_from,
        config_file=source,
    )
    write_json_atomic(run_dir / LAUNCH_JSON, launch)
    rc, out, err = run_command(argv)
    if rc != 0:
        raise OpError("slurm_refused", f"sbatch refused the job: {(err or out).strip()[:500]}")
    job_id = out.strip().split(";")[0]  # --parsable: ID or ID;CLUSTER
    if not job_id.isdigit():
        raise OpError("slurm_refused", f"sbatch gave no job id: {out.strip()[:200]!r}")
    write_json_atomic(
        run_dir / SLURM_JSON,
        SlurmJob(
            job_id=job_id,
            script=str(script_path),
            submitted=time.time(),
            sbatch=argv,
            slurm_version=version,
            request=req,
            nproc_per_node=nproc,
        ),
    )
    QUEUE.invalidate()
    return LaunchResult(
        run_id=run_id,
        dir=str(run_dir),
        nproc=nproc,
        command=command,
        view=launcher.store.view(run_id, with_tail=False),
        parent_run=parent_run,
        resume_from=resume_from,
        slurm_job_id=job_id,
    )


async def cancel(run_id: str, run_dir: Path, job: SlurmJob, grace_s: float) -> KillResult:
    """scancel, then wait until the job has left the queue (its processes are gone with it)."""
    QUEUE.invalidate()
    state = QUEUE.state(job.job_id)
    if state is None or state.state in FINAL_STATES:
        return KillResult(run_id=run_id, was_running=False)
    write_json_atomic(run_dir / STOP_JSON, StopInfo(ts=time.time()))
    rc, out, err = await asyncio.to_thread(run_command, ["scancel", job.job_id])
    if rc != 0:
        raise OpError("kill_incomplete", f"scancel {job.job_id} failed: {(err or out).strip()[:300]}")
    # TERM now (the ranks save a checkpoint), KILL after the cluster's KillWait: wait for that
    deadline = time.monotonic() + max(grace_s, 0.0) + 120.0
    forced = False
    while time.monotonic() < deadline:
        QUEUE.invalidate()
        state = await asyncio.to_thread(QUEUE.state, job.job_id)
        if state is None or state.state in FINAL_STATES:
            QUEUE.invalidate()
            return KillResult(run_id=run_id, was_running=True, forced=forced)
        if not forced and time.monotonic() > deadline - 120.0:
            await asyncio.to_thread(run_command, ["scancel", "--signal=KILL", "--full", job.job_id])
            forced = True
        await asyncio.sleep(0.5)
    raise OpError(
        "kill_incomplete",
        f"job {job.job_id} of {run_id} is still in the queue ({state.state if state else '?'}) after scancel",
    )


async def relaunch(
    launcher: Launcher, run_id: str, job: SlurmJob, op: str, grace_s: float = 60.0,
    from_job: bool = False, begin_s: float = 0.0,
) -> LaunchResult:
    """``fallback`` (one node, one process), ``resume`` or ``restart`` (the same allocation) of a
    Slurm run: a new job, a new run linked to this one, from its newest complete checkpoint with
    the gradient accumulation that keeps the global batch. Idempotent, under the run's lock.

    ``from_job``: asked by the run's own watchdog inside the job, once srun has ended (its
    ``on_failure`` policy): the job still runs (its watchdog's last moments), so it is neither
    refused as running nor cancelled, and a relaunch of another kind done before (a person's)
    is not doubled. ``begin_s``: the new job may start that long after its submission (the
    policy's backoff, waited by the queue rather than by a held allocation)."""
    run_dir = launcher.store.run_dir(run_id)
    async with run_lock_async(run_dir):
        done = launcher._done_before(run_dir, op)
        if done is not None:
            return done
        before = read_json(run_dir / RELAUNCH_JSON, Relaunch) if from_job else None
        if before is not None:
            raise OpError("bad_request", f"{run_id} was relaunched already ({before.op}: {before.child_run})")
        nproc = 1 if op == "fallback" else job.nproc_per_node
        nodes = 1 if op == "fallback" else job.request.nodes
        plan, overrides = launcher._relaunch_args(run_id, nproc * nodes, op)
        if plan.checkpoint is None:
            raise OpError("no_checkpoint", f"{run_id} has no complete checkpoint: nothing to start from")
        if plan.problem:
            raise OpError("bad_request", plan.problem)
        QUEUE.invalidate()
        state = None if from_job else QUEUE.state(job.job_id)
        killed = None
        if state is not None and state.state not in FINAL_STATES:
            if op == "resume":
                raise OpError("running", f"{run_id} is still in the queue ({state.state}): kill it first")
            killed = await cancel(run_id, run_dir, job, grace_s)
            # the ranks saved as they stopped: start from that checkpoint, not the one before
            plan, overrides = launcher._relaunch_args(run_id, nproc * nodes, op)
        # the new job starts when it can: a hold or start time the first submission asked for is
        # not repeated (a backoff is the relaunch's own)
        args = [a for a in job.request.sbatch_args
                if a not in ("--hold", "-H") and not a.startswith(("--begin", "-b"))]
        if begin_s >= 1:
            args.append(f"--begin=now+{math.ceil(begin_s)}")
        req = msgspec_replace(job.request, nodes=nodes, sbatch_args=args)
        ckpt = plan.checkpoint
        if ckpt is None:  # had one a moment ago: removed while the job was cancelled
            raise OpError("no_checkpoint", f"{run_id} has no complete checkpoint: nothing to start from")
        res = await asyncio.to_thread(
            submit, launcher, req, str(run_dir / CONFIG_YAML), None, nproc, overrides, plan.name,
            run_id, ckpt)
        write_json_atomic(run_dir / RELAUNCH_JSON, Relaunch(op=op, child_run=res.run_id,  # type: ignore[arg-type]
                                                            resume_from=ckpt, ts=time.time()))
        res.killed = killed
        return res


def msgspec_replace(req: SlurmRequest, **changes: Any) -> SlurmRequest:
    return msgspec.structs.replace(req, **changes)


def watch_alive(run_dir: Path, now: float | None = None) -> bool:
    """Whether the watchdog beside the run's job (nsa_tui/agent/slurmwatch.py) is alive: its lease,
    renewed every few seconds on the job's first node, is fresh. A file on the shared filesystem,
    not a pid: the login node cannot see the node's processes."""
    lease = read_json(run_dir / LEASE_JSON, Lease)
    if lease is None or lease.ttl_s <= 0:
        return False
    return (time.time() if now is None else now) - lease.ts < lease.ttl_s


def signal_steps(job_id: str, sig: str) -> str:
    """``sig`` (TERM, KILL) to the job's srun steps on every node, never to its batch step (the
    script and the watchdog); "" when sent, else what went wrong. Without the step list, TERM goes
    to the job's steps at large (``scancel --signal`` spares the batch step except for KILL)."""
    rc, out, err = run_command(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"])
    steps = parse_steps(out, job_id) if rc == 0 else []
    if not steps:
        if sig == "KILL":
            return f"no step of job {job_id} to KILL ({(err or out).strip()[:200] or 'none in the queue'})"
        steps = [job_id]
    rc, out, err = run_command(["scancel", f"--signal={sig}", *steps])
    return "" if rc == 0 else f"scancel --signal={sig} {' '.join(steps)}: {(err or out).strip()[:300]}"


def relaunch_from_job(launcher: Launcher, run_dir: Path, op: str, begin_s: float = 0.0) -> LaunchResult:
    """The relaunch the run's watchdog asks for from inside its job (``on_failure`` restart or
    fallback): :func:`relaunch` with ``from_job``, submitted with sbatch from this node."""
    job = read_job(run_dir)
    if job is None:
        raise OpError("bad_request", f"{run_dir.name}: its Slurm job record ({SLURM_JSON}) cannot be read")
    # the job's own variables (its id, nodes, tasks; the run it is) would be the new job's: its
    # srun would take them as options, its batch shell would count as this run's process. Dropped
    # from this process (the job's last act), the cluster's config kept: the new job gets the
    # environment the first submission had
    for key in [k for k in os.environ if (k.startswith("SLURM_") and k != "SLURM_CONF")
                or k in ("NSA_RUN_ID", "NSA_RUN_DIR")]:
        del os.environ[key]
    return asyncio.run(relaunch(launcher, run_dir.name, job, op, from_job=True, begin_s=begin_s))
