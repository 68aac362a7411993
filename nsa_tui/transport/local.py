"""The local transport: the agent as a subprocess of the panel (no SSH needed)."""

from __future__ import annotations

import asyncio
import os
import sys

import nsa_tui
from nsa_tui.install.pkgpath import env_with_package_path
from nsa_tui.transport.base import Channel, StderrTail, Transport, TransportError

LINE_LIMIT = 64 << 20  # the agent's lines: a dump of many ranks' stacks is one reply


class ProcessChannel(Channel):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        assert proc.stderr is not None
        self.err = StderrTail(proc.stderr.read)

    async def readline(self) -> bytes:
        assert self.proc.stdout is not None
        try:
            return await self.proc.stdout.readline()
        except (ConnectionError, ValueError):
            return b""

    async def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (ConnectionError, BrokenPipeError) as exc:
            raise TransportError(f"local agent gone: {exc}") from exc

    async def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self.err.cancel()

    async def stderr_text(self) -> str:
        return await self.err.text()


class LocalTransport(Transport):
    """``python -m nsa_tui.agent`` with this interpreter."""

    name = "local"

    def __init__(self, runs_root: str | None = None, python: str = sys.executable) -> None:
        self.runs_root = runs_root
        self.python = python
        self.proc: asyncio.subprocess.Process | None = None

    async def connect(self) -> Channel:
        argv = [self.python, "-m", "nsa_tui.agent"]
        if self.runs_root:
            argv += ["--runs-root", self.runs_root]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, limit=LINE_LIMIT,
                env=env_with_package_path(dict(os.environ), nsa_tui.__file__),
            )
        except OSError as exc:
            raise TransportError(f"cannot start the local agent: {exc}") from exc
        self.proc = proc
        return ProcessChannel(proc)

    def abort(self) -> None:
        """Kill the agent at once, as a crash would (runs are detached and keep going)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
