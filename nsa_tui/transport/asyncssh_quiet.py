"""asyncssh, imported without the deprecation notices its import raises under newer
cryptography releases ("DSA is deprecated", from asyncssh's own modules): ten lines on every
SSH command, about a key type nsa-tui never asks for, and nothing the user can act on. Only
those are silenced; any other warning still shows."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")
    import asyncssh

__all__ = ["asyncssh"]
