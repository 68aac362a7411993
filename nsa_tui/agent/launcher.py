"""Start, stop and dump runs on this host; fallback and resume (relaunch.py) start through here.

Every command is an argument list handed to ``subprocess.Popen`` (never a shell), so
run names, config paths and overrides cannot inject anything. Runs start detached:
own session and process group, stdin from /dev/null, output to ``train.log``. Stopping a
run holds its lock (runlock.py), as every change of a run's state does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nsa_tui
from nsa.contract import (
    LaunchInfo,
    NodeLayout,
    StopInfo,
    read_json,
    write_json_atomic,
)
from nsa.contract.replies import ConfigSummary, DumpResult, KillResult, LaunchResult
from nsa.contract.rundir import (
    CONFIG_YAML,
    LAUNCH_JSON,
    RUN_ID_RE,
    SHARED_ENV,
    STOP_JSON,
    TRAIN_LOG,
    new_run_id,
)
from nsa_tui.agent.describe import check_nproc, validate_config
from nsa_tui.agent.diskroom import MIN_FREE_BYTES, creating, dir_size, launch_safely, need_room, no_space
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.owners import (
    own_part,
    this_node,
    write_lease,
)
from nsa_tui.agent.procs import RunProcess, boot_id, run_processes
from nsa_tui.agent.relaunch import RelaunchOps, in_the_way
from nsa_tui.agent.runlock import run_lock_async
from nsa_tui.agent.runs import RunStore
from nsa_tui.agent.shared import (
    make_shared_part,
    refuse_live_elsewhere,
    write_config_once,
)
from nsa_tui.install.pkgpath import env_with_package_path

# How long torchrun and the supervisor get to exit on their own once every rank is gone.
LAUNCHER_EXIT_S = 5.0


def torchrun_command(python: str, nproc: int, run_id: str, nodes: NodeLayout | None,
                     join_timeout_s: float) -> list[str]:
    """torchrun's argv up to the script: one host (``--standalone``), or one node of several
    meeting at the c10d rendezvous on the first host (docs/multi-node.md)."""
    cmd = [python, "-m", "torch.distributed.run"]
    if nodes is None:
        return [*cmd, "--standalone", f"--nproc_per_node={nproc}"]
    # is_host: only the first host serves the rendezvous store (on one machine, as in the
    # tests, every node would otherwise think the endpoint is its own)
    conf = f"is_host={'true' if nodes.node_rank == 0 else 'false'},join_timeout={int(join_timeout_s)}"
    cmd += [f"--nnodes={nodes.nnodes}", f"--nproc_per_node={nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={nodes.rdzv_endpoint}", f"--rdzv-id={run_id}", f"--rdzv-conf={conf}",
            "--max-restarts=0"]
    if nodes.node_addr:
        cmd.append(f"--local-addr={nodes.node_addr}")
    return cmd


def check_policy_over_hosts(cfg: Any) -> None:
    """A run over several hosts: each host's watchdog sees only its part, so it may alert and
    stop, never relaunch (``restart``/``fallback`` are done with every host: the CLI, the panel)."""
    action = cfg.on_failure.action
    if action in ("restart", "fallback"):
        raise OpError("bad_config", f"on_failure.action={action} relaunches on one host: a run over several "
                      "hosts supports none or stop (fall back or resume it with nsa-tui and all its hosts)")


def validate_nodes(nodes: NodeLayout | None) -> None:
    if nodes is None:
        return
    if nodes.nnodes < 2 or len(nodes.hosts) != nodes.nnodes or not 0 <= nodes.node_rank < nodes.nnodes:
        raise OpError("bad_request", f"inconsistent node layout: {nodes}")
    host, _, port = nodes.rdzv_endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise OpError("bad_request", f"rdzv_endpoint must be ADDR:PORT, got {nodes.rdzv_endpoint!r}")


class Launcher(RelaunchOps):
    """Operations that start or signal runs. ``python`` runs torchrun and the supervisor."""

    def __init__(self, store: RunStore, python: str = sys.executable, gpu_count: int = 0,
                 read_gpus: Any = None) -> None:
        self.store = store
        self.python = python
        self.gpu_count = gpu_count
        self.read_gpus = read_gpus  # () -> (gpus or None, message), for the fallback's GPU choice
        self.children: list[subprocess.Popen[bytes]] = []

    def freest_gpu(self) -> int | None:
        """The GPU with the most free memory (the fallback's one GPU), None without NVML."""
        gpus = self.read_gpus()[0] if self.read_gpus else None
        ok = [g for g in gpus or [] if g.mem_total_bytes and g.mem_used_bytes is not None]
        if not ok:
            return None
        return max(ok, key=lambda g: g.mem_total_bytes - g.mem_used_bytes).index

    def reap(self) -> None:
        """Collect exited supervisors so they do not linger as zombies."""
        self.children = [p for p in self.children if p.poll() is None]

    @contextlib.contextmanager
    def _config_file(self, config_path: str | None, config_text: str | None) -> Iterator[tuple[str, str]]:
        """(a file to read the config from, the name to show for it): an upload is written to a
        private temporary file for the duration, shown by the path the user gave."""
        if config_text is not None:
            self.store.ensure()
            fd, tmp = _private_temp(self.store.root)
            try:
                try:
                    with os.fdopen(fd, "w") as fh:
                        fh.write(config_text)
                except OSError as exc:  # a full disk: said as such (diskroom.no_space)
                    raise no_space(exc, self.store.root) from exc
                yield tmp, config_path or "<uploaded>"
            finally:
                os.unlink(tmp)
        elif config_path:
            yield os.path.expanduser(config_path), config_path
        else:
            raise OpError("bad_request", "needs config_path or config_text")

    def validated(self, config_path: str | None, config_text: str | None, overrides: list[str]) -> Any:
        """The config, validated on this host as ``launch`` would; nothing created."""
        with self._config_file(config_path, config_text) as (path, shown):
            return validate_config(path, [str(o) for o in overrides], shown_as=shown)

    def _gpu_message(self) -> str:
        return self.read_gpus()[1] if self.read_gpus else ""

    def describe(self, config_path: str | None = None, *, config_text: str | None = None,
                 nproc: int | None = None, overrides: list[str] | None = None) -> ConfigSummary:
        """What the config is and whether it can run here (nothing is started)."""
        from nsa_tui.agent.describe import describe

        check_nproc(nproc)
        with self._config_file(config_path, config_text) as (path, shown):
            cfg = validate_config(path, [str(o) for o in overrides or []], shown_as=shown)
        return describe(cfg, shown, nproc, self.gpu_count, self._gpu_message())

    @launch_safely
    def launch(
        self,
        config_path: str | None = None,
        *,
        config_text: str | None = None,
        nproc: int | None = None,
        overrides: list[str] | None = None,
        name: str | None = None,
        parent_run: str | None = None,
        resume_from: str | None = None,
        gpu: int | None = None,
        check: bool = True,
        run_id: str | None = None,
        nodes: NodeLayout | None = None,
    ) -> LaunchResult:
        """Validate, refuse what cannot run here (``check``; relaunches of a run that ran here
        skip it; a host without the training side refuses even then), create the run directory
        (0700), copy the config, start detached. On a full disk nothing is left behind: no run
        directory, no temporary file. Several hosts: the client gives every host the same
        ``run_id`` and its ``nodes``."""
        from nsa_tui.agent.describe import describe, training_side_missing

        overrides = [str(o) for o in (overrides or [])]
        check_nproc(nproc)
        if run_id is not None and not RUN_ID_RE.match(run_id):
            raise OpError("bad_request", f"bad run id {run_id!r}")
        validate_nodes(nodes)
        self.store.ensure()
        need_room(self.store.root, MIN_FREE_BYTES + (dir_size(Path(resume_from)) if resume_from else 0),
                  f"the checkpoint {resume_from}" if resume_from else "a new run")
        with self._config_file(config_path, config_text) as (path, shown):
            cfg = validate_config(path, overrides, shown_as=shown)
            missing = training_side_missing(cfg)
            if missing:  # no force overrides it: such a run could only die at once
                raise OpError("cannot_run", f"{shown} cannot run on this host: {missing}")
            if check:
                summary = describe(cfg, shown, nproc, self.gpu_count, self._gpu_message())
                if summary.problems:
                    raise OpError("cannot_run", f"{shown} cannot run on this host: "
                                  + "; ".join(summary.problems))
            if nodes is not None:
                check_policy_over_hosts(cfg)
            run_id = run_id or new_run_id(name or cfg.name)
            run_dir = self.store.root / run_id
            text = Path(path).read_text()
            if nodes is not None and nodes.shared_root:
                part = make_shared_part(run_dir, this_node())
            else:
                try:
                    run_dir.mkdir(mode=0o700)
                except FileExistsError:
                    raise OpError("run_exists", f"{run_dir} already exists on this host") from None
                creating.dir = run_dir  # removed again if the launch fails (a full disk): see launch_safely
                os.chmod(run_dir, 0o700)
                part = run_dir
        source = shown if config_text is not None else path  # recorded: the user's path, ~ expanded here
        cfg_copy = run_dir / CONFIG_YAML
        write_config_once(cfg_copy, text)
        n = nproc or max(1, self.gpu_count)
        command = torchrun_command(self.python, n, run_id, nodes, cfg.train.pg_timeout_start_s)
        command += ["-m", "nsa.train", "--config", str(cfg_copy), "--run-dir", str(run_dir)]
        if overrides:
            command += ["--set", *overrides]
        if parent_run:
            command += ["--parent-run", parent_run]
        if resume_from:
            command += ["--resume", resume_from]
        pin = gpu is not None and "CUDA_VISIBLE_DEVICES" not in os.environ
        launch = LaunchInfo(
            run_id=run_id, name=name or cfg.name, created=time.time(), command=command, nproc=n,
            overrides=overrides, boot_id=boot_id(), parent_run=parent_run, resume_from=resume_from,
            config_file=source,
            # applied only when the agent's own environment does not already pin GPUs
            cuda_visible_devices=str(gpu) if pin else os.environ.get("CUDA_VISIBLE_DEVICES"), nodes=nodes,
            node=this_node(), hostname=socket.gethostname())
        write_lease(part)  # alive to other hosts from now on; the supervisor renews it
        write_json_atomic(part / LAUNCH_JSON, launch)
        import nsa

        # NSA_RUN_DIR marks the processes of this host's part (procs.belongs)
        env = dict(os.environ, NSA_RUN_ID=run_id, NSA_RUN_DIR=str(part), PYTHONUNBUFFERED="1")
        if part != run_dir:
            env[SHARED_ENV] = "1"  # the trainer: one directory written by every node
        # RANK in a process's environment is what marks a rank (kill TERMs ranks first, dump
        # sends them SIGUSR1, fatal to torchrun): an agent started where RANK is set (a
        # PyTorchJob pod) must not hand it to the supervisor and torchrun. torchrun sets it
        # for its workers.
        env.pop("RANK", None)
        env = env_with_package_path(env, nsa.__file__)
        env = env_with_package_path(env, nsa_tui.__file__)  # the supervisor
        if pin:
            # NVML numbers GPUs in PCI bus order; CUDA's default order may differ on mixed hosts
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        argv = [self.python, "-m", "nsa_tui.agent.supervise", str(run_dir), "--", *command]
        log_fd = os.open(part / TRAIN_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=str(run_dir), env=env, close_fds=True,
            )
        finally:
            os.close(log_fd)
        self.children.append(proc)
        launch.launcher_pid = proc.pid
        launch.launcher_pgid = proc.pid  # a new session's leader leads its group
        write_json_atomic(part / LAUNCH_JSON, launch)
        return LaunchResult(run_id=run_id, dir=str(run_dir), nproc=n, command=command, launcher_pid=proc.pid,
                            view=self.store.view(run_id, with_tail=False), parent_run=parent_run,
                            resume_from=resume_from)

    async def kill(self, run_id: str, grace_s: float = 60.0) -> KillResult:
        """Stop a run: the whole of it, confirmed (under the run's lock)."""
        run_dir = self.store.run_dir(run_id)
        async with run_lock_async(run_dir):
            return await self._kill(run_id, run_dir, grace_s)

    async def _kill(self, run_id: str, run_dir: Path, grace_s: float) -> KillResult:
        """TERM (the trainer checkpoints and exits), KILL after the grace, confirm.

        The ranks get TERM first: they save and exit 0, and torchrun, seeing every worker
        succeed, exits 0 by itself instead of logging a SignalException traceback. Whatever
        of the run is still there a few seconds after the ranks are gone (or when no rank
        is up yet) gets TERM through the whole group. Once torchrun has ended, the supervisor
        is left to finish the run's last alerts and their deliveries (``in_the_way``): it gets
        a few seconds to exit before the stop returns, never a signal.
        """
        part = own_part(run_dir)
        mark = str(part)
        launch = read_json(part / LAUNCH_JSON, LaunchInfo)
        pgid = launch.launcher_pgid if launch else None

        async def scan() -> list[RunProcess]:
            return in_the_way(await asyncio.to_thread(run_processes, run_id, None, False, mark), run_dir)

        procs = await scan()
        if not procs:
            if launch is None or (launch.node and launch.node != this_node()):  # no part of it is this host's
                refuse_live_elsewhere(self.store, run_id, "stop")
            return KillResult(run_id=run_id, was_running=False)
        write_json_atomic(part / STOP_JSON, StopInfo(ts=time.time()))
        ranks = [p for p in procs if p.rank is not None]
        if ranks:
            _signal_all(None, ranks, signal.SIGTERM)
        else:
            _signal_all(pgid, procs, signal.SIGTERM)
        group_termed = not ranks
        ranks_gone_at: float | None = None
        deadline = time.monotonic() + grace_s
        while procs and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            self.reap()
            procs = await scan()
            if group_termed or not procs:
                continue
            if any(p.rank is not None for p in procs):
                ranks_gone_at = None
                continue
            ranks_gone_at = ranks_gone_at or time.monotonic()
            if time.monotonic() - ranks_gone_at > LAUNCHER_EXIT_S:
                _signal_all(pgid, procs, signal.SIGTERM)
                group_termed = True
        forced = bool(procs)
        if procs:
            _signal_all(pgid, procs, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while procs and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                self.reap()
                procs = await scan()
        if procs:
            raise OpError("kill_incomplete", f"processes of {run_id} remain: {[p.pid for p in procs]}")
        deadline = time.monotonic() + LAUNCHER_EXIT_S  # the supervisor, finishing on its own
        while time.monotonic() < deadline:
            if not await asyncio.to_thread(run_processes, run_id, None, False, mark):
                break
            await asyncio.sleep(0.1)
            self.reap()
        return KillResult(run_id=run_id, was_running=True, forced=forced)

    async def dump(self, run_id: str, wait_s: float = 3.0) -> DumpResult:
        """SIGUSR1 to every rank (faulthandler stacks), plus py-spy where installed."""
        from nsa_tui.agent.dump import dump

        return await dump(self.store.run_dir(run_id), run_id, wait_s)


def _signal_all(pgid: int | None, procs: list[RunProcess], sig: int) -> None:
    """The recorded group first, then any process of the run that left it.

    The group is signalled only while a process of the run is still in it, so a
    reused group id of an unrelated program is never hit.
    """
    if pgid and any(p.pgid == pgid for p in procs):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        if p.pgid != pgid:
            try:
                os.kill(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _private_temp(root: Path) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix=".upload-", suffix=".yaml", dir=root)
