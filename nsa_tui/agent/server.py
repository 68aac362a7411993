"""The agent's request loop: newline-delimited JSON on stdin, replies and events on stdout.

One agent per host, one long-lived channel (a local pipe or one SSH channel). Requests
run concurrently, so a long ``kill`` does not hold up a ``watch``. When stdin closes
(the client went away) the agent exits; runs are detached and keep going.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import socket
import sys
import time
from importlib import metadata
from typing import Any

from nsa_tui import __version__
from nsa_tui.agent.launcher import Launcher, OpError
from nsa_tui.agent.runs import RunStore, boot_id
from nsa_tui.agent.sampler import HostSampler
from nsa_tui.agent.watch import watch_host, watch_run

PROTOCOL = 1


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _error(rid: Any, code: str, message: str) -> dict[str, Any]:
    return {"id": rid, "ok": False, "error": {"code": code, "message": message}}


class Agent:
    """Dispatches requests to handlers named ``op_<op>``; each returns the reply's result."""

    def __init__(self, runs_root: str, out: Any = None, sampler: HostSampler | None = None) -> None:
        self.store = RunStore(runs_root)
        self.out = out if out is not None else sys.stdout.buffer
        self.sampler = sampler or HostSampler(str(self.store.root))
        gpu = self.sampler.gpu
        self.launcher = Launcher(self.store, gpu_count=gpu.count(), read_gpus=gpu.read)
        self.subs: dict[Any, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.gone = False

    def send(self, obj: dict[str, Any]) -> None:
        """Write one line. A closed pipe means the client is gone: streams stop, but
        requests in flight (a kill) run to their end; stdin's EOF then ends the agent."""
        if self.gone:
            return
        try:
            self.out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
            self.out.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError):
            self.gone = True
            for t in self.subs.values():
                t.cancel()

    def hello(self) -> dict[str, Any]:
        """What the client needs to know first: versions, host, GPUs, runs root."""
        problems = []
        try:
            import nsa

            nsa_version = getattr(nsa, "__version__", None)
        except ImportError as exc:
            nsa_version = None
            problems.append(f"nsa not importable: {exc}")
        torch_version = _version("torch")
        if torch_version is None:
            problems.append("torch not installed: this host cannot train (pip install 'nsa-tui[host]')")
        problems += getattr(self.sampler, "problems", [])
        gpus, gpu_message = self.sampler.gpu.read()
        return {
            "agent": PROTOCOL, "nsa_tui": __version__, "nsa_version": nsa_version,
            "host": socket.gethostname(), "python": platform.python_version(), "python_exe": sys.executable,
            "torch": torch_version, "runs_root": str(self.store.root), "gpus": len(gpus or []),
            "gpu_names": [g.get("name") for g in gpus or []], "gpu_message": gpu_message,
            "boot_id": boot_id(), "pid": os.getpid(), "time": time.time(), "problems": problems,
        }

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """Read requests until EOF; cancel subscriptions on exit."""
        self.send({"hello": self.hello()})
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise ValueError("not an object")
                except ValueError as exc:
                    self.send(_error(None, "bad_request", str(exc)))
                    continue
                task = asyncio.create_task(self.handle(req))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        finally:
            for t in self.subs.values():
                t.cancel()
            if self.tasks:  # finish what was asked (a kill must not stop half-way)
                await asyncio.wait(list(self.tasks), timeout=120)

    async def handle(self, req: dict[str, Any]) -> None:
        rid = req.get("id")
        op = req.get("op")
        args = req.get("args") or {}
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) and op.isidentifier() else None
        try:
            if fn is None:
                raise OpError("unknown_op", f"unknown op {op!r}")
            if not isinstance(args, dict):
                raise OpError("bad_request", "args must be an object")
            result = await fn(rid, **args)
        except OpError as exc:
            self.send(_error(rid, exc.code, exc.message))
        except KeyError as exc:
            self.send(_error(rid, "no_such_run", f"no run {exc}"))
        except TypeError as exc:
            self.send(_error(rid, "bad_request", str(exc)))
        except Exception as exc:  # noqa: BLE001 - report, never die on one request
            self.send(_error(rid, "internal", f"{type(exc).__name__}: {exc}"))
        else:
            self.send({"id": rid, "ok": True, "result": result})
        finally:
            self.launcher.reap()

    # -- operations: arguments are keyword arguments of the request's "args" ---------
    async def op_ping(self, rid: Any) -> dict[str, Any]:
        """-> {"time": agent's clock}."""
        return {"time": time.time()}

    async def op_runs(self, rid: Any) -> dict[str, Any]:
        """-> {"runs": [record, ...]} newest first (see RunStore.record)."""
        return {"runs": await asyncio.to_thread(self.store.records)}

    async def op_run(self, rid: Any, run: str) -> dict[str, Any]:
        """{run} -> one record with ``log_tail`` for crashed/failed runs."""
        return await asyncio.to_thread(self.store.record, run)

    async def op_launch(self, rid: Any, config_path: str | None = None, config_text: str | None = None,
                        nproc: int | None = None, overrides: list[str] | None = None,
                        name: str | None = None) -> dict[str, Any]:
        """{config_path | config_text, nproc?, overrides?, name?} -> {run_id, dir, nproc, command, ...}."""
        return await asyncio.to_thread(self.launcher.launch, config_path, config_text=config_text,
                                       nproc=nproc, overrides=overrides, name=name)

    async def op_kill(self, rid: Any, run: str, grace_s: float = 60.0) -> dict[str, Any]:
        """{run, grace_s?} -> {run_id, was_running, forced, remaining: []}."""
        return await self.launcher.kill(run, float(grace_s))

    async def op_fallback(self, rid: Any, run: str, grace_s: float = 60.0) -> dict[str, Any]:
        """{run, grace_s?} -> the new run's launch result + parent_run, resume_from, killed."""
        return await self.launcher.fallback(run, float(grace_s))

    async def op_resume(self, rid: Any, run: str, nproc: int | None = None) -> dict[str, Any]:
        """{run, nproc?} -> the new run's launch result + parent_run, resume_from."""
        return await asyncio.to_thread(self.launcher.resume, run, nproc)

    async def op_dump(self, rid: Any, run: str) -> dict[str, Any]:
        """{run} -> {run_id, ranks, notes, files: [{name, text}]}."""
        return await self.launcher.dump(run)

    async def op_read_log(
        self, rid: Any, run: str, offset: int = 0, max_bytes: int = 1 << 20
    ) -> dict[str, Any]:
        """{run, offset?, max_bytes?} -> {text, offset (to continue from), size}."""
        path = self.store.run_dir(run) / "train.log"

        def read() -> dict[str, Any]:
            try:
                with open(path, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    fh.seek(max(0, min(int(offset), size)))
                    data = fh.read(max(0, min(int(max_bytes), 16 << 20)))
                    return {"text": data.decode("utf-8", "replace"), "offset": fh.tell(), "size": size}
            except FileNotFoundError:
                return {"text": "", "offset": 0, "size": 0}

        return await asyncio.to_thread(read)

    async def op_watch(self, rid: Any, run: str, offsets: dict[str, int] | None = None,
                       streams: list[str] | None = None) -> dict[str, Any]:
        """{run, offsets?, streams?} -> {"watching": run} now; events with this id follow."""
        self.store.run_dir(run)
        self._subscribe(rid, watch_run(self.store, run, rid, self.send, offsets or {}, streams))
        return {"watching": run}

    async def op_watch_host(self, rid: Any, interval_s: float = 1.0) -> dict[str, Any]:
        """{interval_s?} -> {"watching": "host"}; ``host`` events with this id follow."""
        self._subscribe(rid, watch_host(self.sampler, rid, self.send, max(0.2, float(interval_s))))
        return {"watching": "host"}

    async def op_unwatch(self, rid: Any, sub: Any) -> dict[str, Any]:
        """{sub: the watch request's id} -> {"stopped": bool}."""
        task = self.subs.pop(sub, None)
        if task:
            task.cancel()
        return {"stopped": task is not None}

    def _subscribe(self, rid: Any, coro: Any) -> None:
        if rid in self.subs:
            coro.close()
            raise OpError("bad_request", f"id {rid!r} already has a subscription")

        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - tell the client why the stream ended
                self.send({"id": rid, "event": "error", "run": None, "stream": "error", "offset": 0,
                           "data": {"code": "internal", "message": f"{type(exc).__name__}: {exc}"}})

        self.subs[rid] = asyncio.get_running_loop().create_task(guarded())
