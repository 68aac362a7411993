"""Reaching a host's agent: ``local`` (a subprocess) or SSH (asyncssh), one interface."""

from __future__ import annotations

from nsa_tui.transport.base import (
    AgentMissing,
    AuthError,
    Channel,
    ConfirmHostKey,
    HostKeyError,
    Transport,
    TransportError,
)
from nsa_tui.transport.local import LocalTransport

__all__ = ["AgentMissing", "AuthError", "Channel", "ConfirmHostKey", "HostKeyError", "LocalTransport",
           "Transport", "TransportError", "make_transport"]


def make_transport(dest: str, *, runs_root: str | None = None,
                   confirm_host_key: ConfirmHostKey | None = None, **ssh_options: object) -> Transport:
    """``"local"`` -> LocalTransport; anything else is an SSH destination or alias."""
    if dest == "local":
        return LocalTransport(runs_root)
    from nsa_tui.transport.ssh import SshTransport

    return SshTransport(dest, runs_root=runs_root, confirm_host_key=confirm_host_key, **ssh_options)  # type: ignore[arg-type]
