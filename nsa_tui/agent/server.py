"""The agent's request loop: newline-delimited JSON on stdin, replies and events on stdout.

One agent per connection, one long-lived channel (a local pipe or one SSH channel).
Requests run concurrently, so a long ``kill`` does not hold up a ``watch``. Every request
is validated against its argument record (nsa.contract.requests) before its handler
(ops.py) runs. When stdin closes (the client went away) the agent finishes what was asked
and exits; runs are detached and keep going. Several agents of one user may serve the same
runs root at once: every change of a run's state holds the run's lock (runlock.py).
"""

from __future__ import annotations

import asyncio
import io
import os
import platform
import re
import socket
import sys
import time
from importlib import metadata
from typing import Any

from nsa.contract import PROTOCOL, Hello
from nsa.contract.io import ContractError, convert, decode, encode
from nsa.contract.protocol import ErrorInfo, EventMsg, Reply, Request
from nsa_tui import __version__
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.housekeeping import Housekeeping
from nsa_tui.agent.launcher import Launcher
from nsa_tui.agent.ops import AgentOps
from nsa_tui.agent.procs import boot_id
from nsa_tui.agent.runs import RunStore
from nsa_tui.agent.sampler import HostSampler
from nsa_tui.agent.watch import (
    SummaryCache,
)
from nsa_tui.health.ledger import AlertBooks

ROOTLESS_OPS = frozenset({"ping", "watch_host", "unwatch"})  # the ops that do not touch the runs root
MAX_LINE = 16 << 20  # a request line longer than this is refused (and skipped), never fatal
_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*(\d+|"[^"]{0,64}")')


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _buffered_stdout() -> Any:
    """stdout as a buffered binary stream. Under ``python -u`` or PYTHONUNBUFFERED,
    ``sys.stdout.buffer`` is the raw file, and every line would be its own write(2) (and a
    wake-up of the client); :meth:`Agent.send` relies on a buffer to write once per loop turn."""
    buf = sys.stdout.buffer
    if isinstance(buf, io.RawIOBase):
        return open(buf.fileno(), "wb", buffering=1 << 16, closefd=False)  # noqa: SIM115 (lives as long as the agent)
    return buf


class Agent(AgentOps):
    """Dispatches requests to ``op_<name>`` handlers, each with its argument record."""

    def __init__(self, runs_root: str, out: Any = None, sampler: HostSampler | None = None) -> None:
        self.store = RunStore(runs_root)
        self.out = out if out is not None else _buffered_stdout()
        self.sampler = sampler or HostSampler(str(self.store.root))
        gpu = self.sampler.gpu
        self.launcher = Launcher(self.store, gpu_count=gpu.count(), read_gpus=gpu.read)
        self.housekeeping = Housekeeping(self.store)
        self.summaries = SummaryCache()
        self.books = AlertBooks()
        self.subs: dict[Any, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.gone = False
        self._flush_due = False
        self.ops = self.op_table()

    def send(self, msg: Any) -> None:
        """Write one line. A closed pipe means the client is gone: streams stop, but
        requests in flight (a kill) run to their end; stdin's EOF then ends the agent.

        Lines sent in one turn of the event loop (a poll's events of every watched stream)
        go out in one write: flushed once the turn ends, not once per line."""
        if self.gone:
            return
        try:
            self.out.write(encode(msg) + b"\n")
        except (BrokenPipeError, ConnectionResetError, ValueError):
            self._lost()
            return
        if self._flush_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (hello before serving, tests): at once
            self.flush()
            return
        self._flush_due = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send what :meth:`send` wrote."""
        self._flush_due = False
        if self.gone:
            return
        try:
            self.out.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError):
            self._lost()

    def _lost(self) -> None:
        self.gone = True
        for t in self.subs.values():
            t.cancel()

    def hello(self) -> Hello:
        """What the client needs to know first: versions, host, GPUs, runs root, problems."""
        problems = []
        try:
            import nsa

            nsa_version: str | None = getattr(nsa, "__version__", None)
        except ImportError as exc:
            nsa_version = None
            problems.append(f"nsa not importable: {exc}")
        torch_version = _version("torch")
        if torch_version is None:
            problems.append("torch not installed: this host cannot train (pip install 'nsa-tui[host]')")
        problems += getattr(self.sampler, "problems", [])
        gpus, gpu_message = self.sampler.gpu.read()
        return Hello(
            agent=PROTOCOL, nsa_tui=__version__, nsa_version=nsa_version, host=socket.gethostname(),
            python=platform.python_version(), python_exe=sys.executable, torch=torch_version,
            runs_root=str(self.store.root), gpus=len(gpus or []),
            gpu_names=[g.name for g in gpus or []], gpu_message=gpu_message, boot_id=boot_id(),
            pid=os.getpid(), time=time.time(), problems=problems)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """Read requests until EOF; cancel subscriptions on exit."""
        self.send({"hello": self.hello()})
        try:
            while True:
                line = await self._readline(reader)
                if line is None:
                    break
                if not line.strip():
                    continue
                try:
                    req = decode(line, Request, "request")
                except ContractError as exc:
                    self.send(Reply(ok=False, error=ErrorInfo(code="bad_request", message=str(exc))))
                    continue
                task = asyncio.create_task(self.handle(req))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        finally:
            for t in self.subs.values():
                t.cancel()
            if self.tasks:  # finish what was asked (a kill must not stop half-way)
                await asyncio.wait(list(self.tasks), timeout=120)
            self.flush()

    async def _readline(self, reader: asyncio.StreamReader) -> bytes | None:
        """One line, or None at EOF. A line over the reader's limit is skipped with an error
        reply (a 17 MiB upload must not end the agent and every watch with it); the reply
        carries the request's id when the line starts with it (our client's always does)."""
        try:
            return await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None
        except asyncio.LimitOverrunError as exc:
            head = b""
            while True:  # drop the rest of the long line
                try:
                    chunk = await reader.readexactly(exc.consumed)
                    head = head or chunk[:200]
                    await reader.readuntil(b"\n")
                    break
                except asyncio.LimitOverrunError as again:
                    exc = again
                except asyncio.IncompleteReadError:
                    return None
            m = _LEADING_ID.match(head)
            rid: int | str | None = None
            if m:
                g = m.group(1).decode()
                rid = int(g) if g.isdigit() else g.strip('"')
            self.send(Reply(id=rid, ok=False, error=ErrorInfo(
                code="bad_request", message=f"request line over {MAX_LINE >> 20} MiB refused "
                                            f"(a config to upload must be smaller)")))
            return b""

    async def handle(self, req: Request) -> None:
        rid = req.id
        op = self.ops.get(req.op)
        try:
            if op is None:
                raise OpError("unknown_op", f"unknown op {req.op!r}")
            why = None if req.op in ROOTLESS_OPS else self.store.root_problem()
            if why:  # every client (the CLI, the panel) says the same
                raise OpError("bad_request", why)
            try:
                args = convert(req.args, op[0], f"{req.op} arguments")
            except ContractError as exc:
                raise OpError("bad_request", str(exc)) from None
            result = await op[1](rid, args)
        except OpError as exc:
            self.send(Reply(id=rid, ok=False, error=ErrorInfo(code=exc.code, message=exc.message)))
        except KeyError as exc:
            self.send(Reply(id=rid, ok=False, error=ErrorInfo(code="no_such_run", message=f"no run {exc}")))
        except Exception as exc:  # noqa: BLE001 - report, never die on one request
            self.send(Reply(id=rid, ok=False, error=ErrorInfo(code="internal",
                                                              message=f"{type(exc).__name__}: {exc}")))
        else:
            self.send(Reply(id=rid, ok=True, result=result))
        finally:
            self.launcher.reap()

    def _subscribe(self, rid: Any, coro: Any) -> None:
        if rid in self.subs:
            coro.close()
            raise OpError("bad_request", f"id {rid!r} already has a subscription")

        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except KeyError as exc:
                self.send(EventMsg(id=rid, event="error", stream="error",
                                   data=ErrorInfo(code="no_such_run", message=f"no run {exc}")))
            except Exception as exc:  # noqa: BLE001 - tell the client why the stream ended
                self.send(EventMsg(id=rid, event="error", stream="error",
                                   data=ErrorInfo(code="internal", message=f"{type(exc).__name__}: {exc}")))

        self.subs[rid] = asyncio.get_running_loop().create_task(guarded())

