"""The error of an agent operation that cannot be done (its code goes to the client)."""

from __future__ import annotations


class OpError(Exception):
    """A request that cannot be done; ``code`` is machine-readable (see docs/agent-protocol.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
