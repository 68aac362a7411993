"""One interface for reaching a host's agent: a channel of newline-delimited JSON."""

from __future__ import annotations

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


class Transport(ABC):
    """Opens channels to the agent of one destination."""

    name: str = "?"

    @abstractmethod
    async def connect(self) -> Channel:
        """Start an agent and return its channel; raises TransportError."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections held by the transport."""
