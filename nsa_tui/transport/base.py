"""One interface for reaching a host's agent: a channel of newline-delimited JSON."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

# (host description, fingerprint) -> True to trust and remember the key
ConfirmHostKey = Callable[[str, str], Awaitable[bool]]


class TransportError(Exception):
    """Cannot reach the agent. ``fatal`` errors are not retried (a retry cannot fix them)."""

    fatal = False

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message + (f"\n{hint}" if hint else ""))
        self.message = message
        self.hint = hint


class HostKeyError(TransportError):
    """The host key is unknown and was not accepted, or it changed: refused."""

    fatal = True


class AuthError(TransportError):
    """The server refused our keys."""

    fatal = True


class AgentMissing(TransportError):
    """The host has no compatible ``nsa_tui``; the hint says how to install it."""

    fatal = True


class Channel(ABC):
    """A bidirectional line channel to one agent process."""

    @abstractmethod
    async def readline(self) -> bytes:
        """The next line including its newline; b"" when the channel closed."""

    @abstractmethod
    async def write(self, data: bytes) -> None:
        """Send bytes (whole lines)."""

    @abstractmethod
    async def close(self) -> None:
        """Close the channel; the agent sees EOF and exits, runs keep going."""

    async def stderr_text(self) -> str:
        """What the agent wrote on stderr (for error messages), best effort."""
        return ""


class StderrTail:
    """Keeps reading an agent's stderr (a full pipe or SSH window would stall stdout too)
    and remembers the last 64 KiB for error messages."""

    def __init__(self, read: Callable[[int], Awaitable[bytes | str]]) -> None:
        self.data = b""
        self.task = asyncio.ensure_future(self._drain(read))

    async def _drain(self, read: Callable[[int], Awaitable[bytes | str]]) -> None:
        try:
            while True:
                chunk = await read(65536)
                if not chunk:
                    return
                self.data = (self.data + (chunk.encode() if isinstance(chunk, str) else chunk))[-65536:]
        except Exception:  # noqa: BLE001 - the channel is gone; what we have is all there is
            return

    async def text(self, wait_s: float = 3.0) -> str:
        """The tail so far, after waiting up to ``wait_s`` for the stream to end."""
        try:
            await asyncio.wait_for(asyncio.shield(self.task), wait_s)
        except asyncio.TimeoutError:
            pass
        return self.data.decode("utf-8", "replace")

    def cancel(self) -> None:
        self.task.cancel()


class Transport(ABC):
    """Opens channels to the agent of one destination."""

    name: str = "?"

    @abstractmethod
    async def connect(self) -> Channel:
        """Start an agent and return its channel; raises TransportError."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections held by the transport."""
