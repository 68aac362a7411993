"""Start, stop, fall back, resume and dump runs on this host.

Every command is an argument list handed to ``subprocess.Popen`` (never a shell), so
run names, config paths and overrides cannot inject anything. Runs start detached:
own session and process group, stdin from /dev/null, output to ``train.log``.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nsa_tui
from nsa_tui.agent.runs import RunStore, boot_id, read_json, run_processes, write_json
from nsa_tui.transport.base import env_with_package_path

# How long torchrun and the supervisor get to exit on their own once every rank is gone.
LAUNCHER_EXIT_S = 5.0


class OpError(Exception):
    """A request that cannot be done; ``code`` is machine-readable (see docs/agent-protocol.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return (s or "run")[:40]


def new_run_id(name: str) -> str:
    """UTC time first so ids sort by age; a random suffix so two launches never clash."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{_slug(name)}-{secrets.token_hex(2)}"


def validate_config(path: str, overrides: list[str]) -> Any:
    """Load and validate on the host; a bad config starts nothing (LESSONS 1-2)."""
    try:
        from nsa.config import ConfigError, load_config
    except ImportError as exc:
        raise OpError("nsa_missing", f"cannot import nsa on this host: {exc}") from exc
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        raise OpError("bad_config", str(exc)) from exc


class Launcher:
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
        ok = [g for g in gpus or [] if g.get("mem_total_bytes") and g.get("mem_used_bytes") is not None]
        if not ok:
            return None
        return max(ok, key=lambda g: g["mem_total_bytes"] - g["mem_used_bytes"])["index"]

    def reap(self) -> None:
        """Collect exited supervisors so they do not linger as zombies."""
        self.children = [p for p in self.children if p.poll() is None]

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
    ) -> dict[str, Any]:
        """Validate, create the run directory (0700), copy the config, start detached."""
        overrides = [str(o) for o in (overrides or [])]
        if nproc is not None and (not isinstance(nproc, int) or nproc < 1):
            raise OpError("bad_request", f"nproc must be a positive integer, got {nproc!r}")
        self.store.ensure()
        if config_text is not None:
            fd, tmp = _private_temp(self.store.root)
            with os.fdopen(fd, "w") as fh:
                fh.write(config_text)
            source = config_path or "<uploaded>"
        elif config_path:
            tmp, source = None, os.path.expanduser(config_path)
        else:
            raise OpError("bad_request", "launch needs config_path or config_text")
        try:
            cfg = validate_config(tmp or source, overrides)
            run_id = new_run_id(name or cfg.name)
            run_dir = self.store.root / run_id
            run_dir.mkdir(mode=0o700)
            os.chmod(run_dir, 0o700)
            text = Path(tmp or source).read_text()
        finally:
            if tmp:
                os.unlink(tmp)
        cfg_copy = run_dir / "config.yaml"
        cfg_copy.write_text(text)
        n = nproc or max(1, self.gpu_count)
        command = [self.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
        command += ["-m", "nsa.train", "--config", str(cfg_copy), "--run-dir", str(run_dir)]
        if overrides:
            command += ["--set", *overrides]
        if resume_from:
            command += ["--resume", resume_from]
        launch = {
            "run_id": run_id,
            "name": name or cfg.name,
            "created": time.time(),
            "command": command,
            "nproc": n,
            "overrides": overrides,
            "launcher_pid": None,
            "launcher_pgid": None,
            "boot_id": boot_id(),
            "parent_run": parent_run,
            "resume_from": resume_from,
            "config_file": source,
            # applied only when the agent's own environment does not already pin GPUs
            "cuda_visible_devices": str(gpu) if gpu is not None and "CUDA_VISIBLE_DEVICES" not in os.environ
            else os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
        write_json(run_dir / "launch.json", launch)
        import nsa

        env = dict(os.environ, NSA_RUN_ID=run_id, PYTHONUNBUFFERED="1")
        # RANK in a process's environment is what marks a rank (kill TERMs ranks first, dump
        # sends them SIGUSR1, fatal to torchrun): an agent started where RANK is set (a
        # PyTorchJob pod) must not hand it to the supervisor and torchrun. torchrun sets it
        # for its workers.
        env.pop("RANK", None)
        env = env_with_package_path(env, nsa.__file__)
        env = env_with_package_path(env, nsa_tui.__file__)  # the supervisor
        if gpu is not None and "CUDA_VISIBLE_DEVICES" not in os.environ:
            # NVML numbers GPUs in PCI bus order; CUDA's default order may differ on mixed hosts
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        argv = [self.python, "-m", "nsa_tui.agent.supervise", str(run_dir), "--", *command]
        log = open(run_dir / "train.log", "ab", buffering=0)
        os.chmod(run_dir / "train.log", 0o600)
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=str(run_dir), env=env, close_fds=True,
            )
        finally:
            log.close()
        self.children.append(proc)
        launch["launcher_pid"] = proc.pid
        launch["launcher_pgid"] = proc.pid  # a new session's leader leads its group
        write_json(run_dir / "launch.json", launch)
        return {"run_id": run_id, "dir": str(run_dir), "nproc": n, "command": command,
                "launcher_pid": proc.pid, "launcher_pgid": proc.pid}

    async def kill(self, run_id: str, grace_s: float = 60.0) -> dict[str, Any]:
        """TERM (the trainer checkpoints and exits), KILL after the grace, confirm.

        The ranks get TERM first: they save and exit 0, and torchrun, seeing every worker
        succeed, exits 0 by itself instead of logging a SignalException traceback. Whatever
        of the run is still there a few seconds after the ranks are gone (or when no rank
        is up yet) gets TERM through the whole group.
        """
        run_dir = self.store.run_dir(run_id)
        launch = read_json(run_dir / "launch.json") or {}
        pgid = launch.get("launcher_pgid")
        procs = await asyncio.to_thread(run_processes, run_id)
        if not procs:
            return {"run_id": run_id, "was_running": False, "forced": False, "remaining": []}
        write_json(run_dir / "stop.json", {"ts": time.time(), "by": "nsa-tui agent"})
        ranks = [p for p in procs if p["rank"] is not None]
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
            procs = await asyncio.to_thread(run_processes, run_id)
            if group_termed or not procs:
                continue
            if any(p["rank"] is not None for p in procs):
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
                procs = await asyncio.to_thread(run_processes, run_id)
        if procs:
            raise OpError("kill_incomplete", f"processes of {run_id} remain: {[p['pid'] for p in procs]}")
        return {"run_id": run_id, "was_running": True, "forced": forced, "remaining": []}

    def _relaunch(self, run_id: str, nproc: int | None, suffix: str, fallback: bool) -> dict[str, Any]:
        run_dir = self.store.run_dir(run_id)
        ckpt = self.store.latest_checkpoint(run_id)
        if ckpt is None:
            raise OpError("no_checkpoint", f"{run_id} has no complete checkpoint (checkpoints/latest)")
        launch = read_json(run_dir / "launch.json") or {}
        run = read_json(run_dir / "run.json") or {}
        overrides = [o for o in launch.get("overrides", []) if not o.startswith("train.grad_accum=")]
        world = int(run.get("world_size") or launch.get("nproc") or 1)
        if fallback:
            cfg = validate_config(str(run_dir / "config.yaml"), launch.get("overrides", []))
            accum = int(run.get("grad_accum") or cfg.train.grad_accum)
            overrides.append(f"train.grad_accum={accum * world}")  # same global batch on 1 rank
        else:
            nproc = nproc or world
            accum = run.get("grad_accum")
            if accum:
                overrides.append(f"train.grad_accum={accum}")
        name = str(launch.get("name") or run.get("name") or run_id)
        res = self.launch(
            str(run_dir / "config.yaml"), nproc=nproc, overrides=overrides, name=f"{name}{suffix}",
            parent_run=run_id, resume_from=ckpt, gpu=self.freest_gpu() if fallback else None,
        )
        res.update({"parent_run": run_id, "resume_from": ckpt})
        return res

    async def fallback(self, run_id: str, grace_s: float = 60.0) -> dict[str, Any]:
        """Stop the run, relaunch on one GPU from its newest checkpoint, same global batch."""
        killed = await self.kill(run_id, grace_s)
        res = self._relaunch(run_id, 1, "-fallback", fallback=True)
        res["killed"] = killed
        return res

    def resume(self, run_id: str, nproc: int | None = None) -> dict[str, Any]:
        """Relaunch a stopped run from its newest checkpoint as a new run linked to it."""
        if run_processes(run_id):
            raise OpError("running", f"{run_id} is still running: kill it first")
        return self._relaunch(run_id, nproc, "-resume", fallback=False)

    async def dump(self, run_id: str, wait_s: float = 3.0) -> dict[str, Any]:
        """SIGUSR1 to every rank (faulthandler stacks), plus py-spy where installed."""
        run_dir = self.store.run_dir(run_id)
        ranks = [p for p in await asyncio.to_thread(run_processes, run_id) if p["rank"] is not None]
        if not ranks:
            raise OpError("not_running", f"{run_id} has no live rank to dump")
        stacks = run_dir / "stacks"
        t0 = time.time()
        for p in ranks:
            try:
                os.kill(p["pid"], signal.SIGUSR1)
            except ProcessLookupError:
                pass
        files: dict[str, str] = {}
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            files = _new_files(stacks, t0)
            if len(files) >= len(ranks):
                await asyncio.sleep(0.2)  # let the last writer finish
                files = _new_files(stacks, t0)
                break
        notes = []
        spy = shutil.which("py-spy")
        if spy:
            stacks.mkdir(mode=0o700, exist_ok=True)
            for p in ranks:
                res = await asyncio.to_thread(
                    subprocess.run, [spy, "dump", "--pid", str(p["pid"])],
                    capture_output=True, text=True, timeout=20,
                )
                name = f"stacks/py-spy-rank-{p['rank']}-{int(time.time() * 1000)}.txt"
                text = res.stdout + res.stderr
                (run_dir / name).write_text(text)
                files[name] = text
        else:
            notes.append("py-spy not installed: faulthandler stacks only")
        return {"run_id": run_id, "ranks": [p["rank"] for p in ranks], "notes": notes,
                "files": [{"name": k, "text": v} for k, v in sorted(files.items())]}


def _new_files(stacks: Path, since: float) -> dict[str, str]:
    out = {}
    try:
        entries = list(os.scandir(stacks))
    except OSError:
        return out
    for e in entries:
        if e.name.startswith("rank-") and e.stat().st_mtime >= since - 0.5:
            try:
                out[f"stacks/{e.name}"] = Path(e.path).read_text(errors="replace")
            except OSError:
                continue
    return out


def _signal_all(pgid: int | None, procs: list[dict[str, Any]], sig: int) -> None:
    """The recorded group first, then any process of the run that left it.

    The group is signalled only while a process of the run is still in it, so a
    reused group id of an unrelated program is never hit.
    """
    if pgid and any(p["pgid"] == pgid for p in procs):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        if p["pgid"] != pgid:
            try:
                os.kill(p["pid"], sig)
            except (ProcessLookupError, PermissionError):
                pass


def _private_temp(root: Path) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix=".upload-", suffix=".yaml", dir=root)
