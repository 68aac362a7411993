"""The SSH transport: one asyncssh connection per host, the agent as one channel's command.

Host keys are verified against known_hosts by default. An unknown host's key is shown
(SHA256 fingerprint) to a ``confirm_host_key`` callback and remembered only on a yes; a
key that differs from the known one is refused with a clear message, never asked about.
``~/.ssh/config`` aliases, keys and ssh-agent work as with OpenSSH (asyncssh reads them).
The remote command is built with ``shlex``; user input only ever travels as JSON.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
from pathlib import Path
from typing import Any

from nsa_tui.transport.asyncssh_quiet import asyncssh
from nsa_tui.transport.base import (
    AuthError,
    Channel,
    ConfirmHostKey,
    HostKeyError,
    StderrTail,
    Transport,
    TransportError,
)

VENV_PYTHON = "~/.nsa-tui/venv/bin/python"


def parse_dest(dest: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` -> (user, host, port); a bare alias is resolved by ssh config."""
    user, _, rest = dest.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):  # [v6addr]:port
        addr, _, tail = rest[1:].partition("]")
        host = addr
        if tail.startswith(":") and tail[1:].isdigit():
            port = int(tail[1:])
    elif rest.count(":") == 1:
        h, _, p = rest.partition(":")
        if p.isdigit():
            host, port = h, int(p)
    if not host:
        raise ValueError(f"bad SSH destination {dest!r}: expected [user@]host[:port]")
    return (user or None), host, port


def agent_command(runs_root: str | None, remote_python: str | None) -> str:
    """The remote shell command: the setup venv's python if present, else python3.

    ``remote_python`` is a command prefix (``"/opt/py/bin/python3 -X utf8"``); every
    word is quoted again, so nothing in it or in ``runs_root`` reaches the shell raw.
    """
    args = ["-m", "nsa_tui.agent"] + (["--runs-root", runs_root] if runs_root else [])
    if remote_python:
        return shlex.join([*shlex.split(remote_python), *args])
    return (
        f'if [ -x {VENV_PYTHON} ]; then P={VENV_PYTHON}; else P=python3; fi; '
        f'exec "$P" {shlex.join(args)}'
    )


class SshChannel(Channel):
    def __init__(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self.proc = proc
        self.err = StderrTail(proc.stderr.read)

    async def readline(self) -> bytes:
        try:
            return await self.proc.stdout.readline()
        except (asyncssh.Error, OSError, asyncio.IncompleteReadError):
            return b""

    async def write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (asyncssh.Error, OSError, BrokenPipeError) as exc:
            raise TransportError(f"SSH channel closed: {exc}") from exc

    async def close(self) -> None:
        try:
            self.proc.stdin.write_eof()
        except (asyncssh.Error, OSError):
            pass
        self.proc.close()
        self.err.cancel()

    async def stderr_text(self) -> str:
        return await self.err.text()


def accept_hint(host: str, port: int | None, user: str | None, algorithm: str, known_hosts: str) -> str:
    """What to do about an unknown host key, with the exact commands."""
    p = f"-p {port} " if port and port != 22 else ""
    who = f"{user}@{host}" if user else host
    return ("To trust it, first compare that fingerprint with the host's own (run on the host: "
            f"ssh-keygen -lf /etc/ssh/ssh_host_{algorithm.removeprefix('ssh-').split('-')[0]}_key.pub), then "
            f"either add it: ssh-keyscan {p}-t {algorithm} {host} >> {known_hosts}\n"
            f"or connect once with plain ssh and answer yes: ssh {p}{who}\n"
            "(the panel asks, and remembers the key when you answer Trust)")


class SshTransport(Transport):
    """Connects to ``dest`` and starts ``python -m nsa_tui.agent`` there per channel."""

    def __init__(
        self, dest: str, *, runs_root: str | None = None, confirm_host_key: ConfirmHostKey | None = None,
        known_hosts: Any = (), client_keys: Any = (), config: Any = (), remote_python: str | None = None,
        keepalive_interval: float = 5.0, keepalive_count_max: int = 3, connect_timeout: float = 15.0,
    ) -> None:
        self.dest = dest
        self.name = dest
        self.user, self.host, self.port = parse_dest(dest)
        self.runs_root = runs_root
        self.confirm_host_key = confirm_host_key
        self.known_hosts = known_hosts
        self.client_keys = client_keys
        if config == () and os.environ.get("NSA_TUI_SSH_CONFIG"):
            config = [os.environ["NSA_TUI_SSH_CONFIG"]]
        self.config = config
        self.remote_python = remote_python or os.environ.get("NSA_TUI_REMOTE_PYTHON") or None
        self.opts = {"keepalive_interval": keepalive_interval, "keepalive_count_max": keepalive_count_max,
                     "connect_timeout": connect_timeout}
        self.conn: asyncssh.SSHClientConnection | None = None

    def _kwargs(self) -> dict[str, Any]:
        if isinstance(self.known_hosts, str) and not os.path.exists(self.known_hosts):
            # an explicit file that does not exist yet: every host is unknown (then asked)
            Path(self.known_hosts).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            Path(self.known_hosts).touch(mode=0o600)
        kw: dict[str, Any] = dict(self.opts, known_hosts=self.known_hosts, config=self.config)
        if self.user:
            kw["username"] = self.user
        if self.port:
            kw["port"] = self.port
        if self.client_keys != ():
            kw["client_keys"] = self.client_keys
        return kw

    async def open_connection(self) -> asyncssh.SSHClientConnection:
        """A live connection, making one if needed (also used by ``nsa-tui setup``)."""
        if self.conn is not None and not self.conn.is_closed():
            return self.conn
        try:
            try:
                self.conn = await asyncssh.connect(self.host, **self._kwargs())
            except asyncssh.HostKeyNotVerifiable as exc:
                await self._unverified(exc)
                self.conn = await asyncssh.connect(self.host, **self._kwargs())
        except asyncssh.HostKeyNotVerifiable as exc:
            raise HostKeyError(f"{self.dest}: host key not verifiable: {exc}") from exc
        except asyncssh.PermissionDenied as exc:
            raise AuthError(f"{self.dest}: authentication refused ({exc.reason})",
                            "check your key, ssh-agent or the user name") from exc
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            raise TransportError(f"{self.dest}: cannot connect: {_why(exc)}") from exc
        return self.conn

    async def _unverified(self, exc: Exception) -> None:
        """Unknown host: ask; changed key: refuse. Returns only when the key was accepted."""
        options = asyncssh.SSHClientConnectionOptions(
            host=self.host, port=self.port or (), config=self.config, known_hosts=self.known_hosts)
        lookup = options.host_key_alias or options.host
        port = options.port
        known = options.known_hosts
        if known == ():
            known = [str(Path("~/.ssh/known_hosts").expanduser())]
        if isinstance(known, str):
            known = [known]
        if not isinstance(known, list) or not known:
            raise HostKeyError(f"{self.dest}: host key not verifiable: {exc}")
        files: list[str] = [os.path.expanduser(f) for f in known]
        try:
            key = await asyncssh.get_server_host_key(options.host, port, config=self.config)
        except (OSError, asyncssh.Error) as e:
            raise TransportError(f"{self.dest}: cannot read the host key: {e}") from e
        if key is None:
            raise HostKeyError(f"{self.dest}: the server presented no host key")
        fingerprint = key.get_fingerprint("sha256")
        try:
            addr = socket.gethostbyname(options.host)
        except OSError:
            addr = options.host
        existing = [f for f in files if os.path.exists(f)]
        trusted = asyncssh.match_known_hosts(existing, lookup, addr, port)[0] if existing else []
        shown = lookup if port == 22 else f"[{lookup}]:{port}"
        if trusted:
            raise HostKeyError(
                f"REFUSED: the host key of {shown} has CHANGED (now {key.get_algorithm()} {fingerprint}). "
                "Someone may be intercepting the connection, or the host was reinstalled.",
                f"If you know why it changed, remove the old key with: ssh-keygen -R '{shown}'"
                + (f" -f {existing[0]}" if existing else ""),
            )
        algo_fp = f"{key.get_algorithm()} {fingerprint}"
        how = accept_hint(options.host, port, options.username or self.user, key.get_algorithm(), files[0])
        if self.confirm_host_key is None:
            raise HostKeyError(f"{shown} is not in known_hosts (its key: {algo_fp})", how)
        if not await self.confirm_host_key(shown, algo_fp):
            raise HostKeyError(
                f"{shown} is not in known_hosts and its key was not accepted (its key: {algo_fp})", how)
        algo, blob = key.export_public_key("openssh").decode().split()[:2]
        line = f"{shown} {algo} {blob}\n"
        path = Path(files[0])
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(line)

    async def connect(self) -> Channel:
        conn = await self.open_connection()
        cmd = agent_command(self.runs_root, self.remote_python)
        try:
            proc = await conn.create_process(cmd, encoding=None)
        except (asyncssh.Error, OSError) as exc:
            conn.close()
            self.conn = None
            raise TransportError(f"{self.dest}: cannot start the agent: {exc}") from exc
        return SshChannel(proc)

    def peer_address(self) -> str | None:
        """The IP address the SSH connection reached (a destination's alias resolved)."""
        if self.conn is None:
            return None
        peer = self.conn.get_extra_info("peername")
        return str(peer[0]) if peer else None

    def abort(self) -> None:
        """Drop the connection at once, as a network failure would."""
        if self.conn is not None:
            self.conn.abort()
            self.conn = None

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            await self.conn.wait_closed()
            self.conn = None


def _why(exc: BaseException) -> str:
    """A connect failure in words: "Connection refused (errno 111)", not asyncio's
    "[Errno 111] Connect call failed ('10.0.0.5', 22)" (the panel shows this beside the host)."""
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    errno = getattr(exc, "errno", None)
    if isinstance(exc, OSError) and isinstance(errno, int) and errno > 0:
        import os

        return f"{os.strerror(errno)} (errno {errno})"
    return str(exc) or type(exc).__name__
