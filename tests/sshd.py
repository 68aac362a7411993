"""A real OpenSSH server on 127.0.0.1 for tests (``pytest_plugins = ["tests.sshd"]``).

Fixture ``sshd`` yields an ``SshServer``: a fresh ``/usr/sbin/sshd -D`` on a free
port with temporary host and client keys, a ``known_hosts`` that trusts it, and an
``ssh_config`` with the alias ``nsa-test`` (HostName, Port, User, IdentityFile,
UserKnownHostsFile), so code under test can connect exactly as a user would. Tests
are skipped where the server binary is missing (scripts/test.sh installs it).

Fixture ``sshd_nodes`` yields two such servers as two hosts of one machine: each its own
port, its own ``HOME`` for its sessions (so its own ``~/nsa-runs``: a runs root of its
own) and one thread per rank (``SetEnv NSA_THREADS=1``: runs on a loaded 2-core machine stay
steady and comparable), with one ``ssh_config`` naming them ``nsa-node0`` and ``nsa-node1``.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SSHD = "/usr/sbin/sshd"
ALIAS = "nsa-test"
Cli = Callable[..., "subprocess.CompletedProcess[str]"]  # nsa-tui run against a test sshd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


@dataclass
class SshServer:
    """One sshd; ``dest`` is ``user@127.0.0.1:port``; ``ssh_options`` suit SshTransport."""

    dir: Path
    port: int
    user: str
    host_key: Path
    client_key: Path
    known_hosts: Path
    ssh_config: Path
    proc: subprocess.Popen[bytes] | None = None
    home: Path | None = None  # the HOME of its sessions (None: the user's own)
    machine: str | None = None  # run in PID and UTS namespaces of its own with this hostname
    pid_base: int = 100  # its namespace's pids start after this

    def vanish(self) -> None:
        """The whole machine goes at once (power loss): SIGKILL to ``unshare`` kills its init, and
        with it every process of the namespace (sshd, agents, runs)."""
        assert self.proc is not None and self.machine is not None
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None

    @property
    def dest(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    @property
    def ssh_options(self) -> dict[str, Any]:
        return {"known_hosts": str(self.known_hosts), "client_keys": [str(self.client_key)], "config": []}

    def env(self) -> dict[str, str]:
        """Environment for a CLI subprocess: the test ssh config and this Python on the host."""
        return dict(os.environ, NSA_TUI_SSH_CONFIG=str(self.ssh_config), NSA_TUI_REMOTE_PYTHON=sys.executable)

    @property
    def runs_root(self) -> Path:
        """The default runs root of its sessions (``~/nsa-runs`` under its HOME)."""
        return (self.home or Path.home()) / "nsa-runs"

    def start(self) -> None:
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "sshd.log", "ab")
        argv = [SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config")]
        if self.machine is not None:  # a machine of its own: process table and hostname
            hosts = self.dir / "hosts"  # its name resolves, as a real machine's does (its /etc/hosts)
            hosts.write_text(Path("/etc/hosts").read_text() + f"\n127.0.0.1 {self.machine}\n")
            argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts",
                    sys.executable, "-c", _INIT, self.machine, str(self.pid_base), str(hosts), *argv]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.dir / 'sshd.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def _children(self) -> list[int]:
        """Per-connection sshd processes (they outlive the listener otherwise).

        Only sshd itself: the commands of the sessions lose their connection as they
        would in a real outage; what they started detached keeps running.
        """
        import psutil

        if self.proc is None:
            return []
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for c in kids:
            try:
                if c.name().startswith("sshd"):
                    out.append(c.pid)
            except psutil.NoSuchProcess:
                continue
        return out

    def stop(self) -> None:
        """Stop the listener and every connection it serves, like a crash of sshd."""
        if self.proc is None:
            return
        kids = self._children()
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.kill()
        self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def change_host_key(self) -> None:
        """A new host key (as after a reinstall or an interception); restart needed."""
        for p in (self.host_key, Path(f"{self.host_key}.pub")):
            p.unlink()
        _keygen(self.host_key)


# PID 1 of a test machine: set its hostname, run sshd, reap every orphan (detached runs end up
# as its children), and end when sshd ends. Its pids start at a number of its own: torchrun's
# rendezvous tells nodes apart by address and pid, and on 127.0.0.1 two namespaces that start
# alike would give two torchruns one pid (real machines differ by address).
_INIT = """
import os, socket, subprocess, sys
socket.sethostname(sys.argv[1])
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(sys.argv[2])
subprocess.run(["mount", "--bind", sys.argv[3], "/etc/hosts"], check=True)
child = subprocess.Popen(sys.argv[4:])
while True:
    pid, status = os.wait()
    if pid == child.pid:
        sys.exit(1)
"""


def make_server(base: Path, home: Path | None = None, alias: str = ALIAS,
                client_key: Path | None = None, extra_env: dict[str, str] | None = None) -> SshServer:
    """One server's files; ``home``: its sessions' HOME (and one thread per process);
    ``extra_env``: more variables for its sessions (a Slurm login node's SLURM_CONF)."""
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)
    port = _free_port()
    host_key = base / "host_ed25519"
    _keygen(host_key)
    if client_key is None:
        client_key = base / "client_ed25519"
        client_pub = _keygen(client_key)
    else:
        client_pub = Path(f"{client_key}.pub").read_text().strip()
    (base / "authorized_keys").write_text(client_pub + "\n")
    algo, blob = Path(f"{host_key}.pub").read_text().split()[:2]
    known = base / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {algo} {blob}\n")
    (base / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {base / 'authorized_keys'}\nPidFile {base / 'sshd.pid'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "PermitRootLogin prohibit-password\nLogLevel ERROR\nSubsystem sftp internal-sftp\n"
        + _set_env(home, extra_env))
    if home is not None:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    user = getpass.getuser()
    cfg = base / "ssh_config"
    cfg.write_text(config_entry(alias, port, user, client_key, known))
    return SshServer(base, port, user, host_key, client_key, known, cfg, home=home)


def _set_env(home: Path | None, extra: dict[str, str] | None = None) -> str:
    """The sshd's SetEnv line: the test home and one thread per rank, and this process's
    PYTHONPATH, so the agent on the "remote" end runs the same checkout as the test."""
    pairs = [f"HOME={home}", "NSA_THREADS=1"] if home is not None else []
    if os.environ.get("PYTHONPATH"):
        pairs.append(f"PYTHONPATH={os.environ['PYTHONPATH']}")
    pairs += [f"{k}={v}" for k, v in (extra or {}).items()]
    return f"SetEnv {' '.join(pairs)}\n" if pairs else ""


def config_entry(alias: str, port: int, user: str, key: Path, known: Path) -> str:
    return (f"Host {alias}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {key}\n"
            f"  UserKnownHostsFile {known}\n  IdentitiesOnly yes\n")


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshServer]:
    """A running sshd for one test; stopped (with its sessions) afterwards."""
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    server = make_server(tmp_path / "sshd")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class SshNodes:
    """Two sshd on 127.0.0.1 as two hosts: ``aliases`` in ``ssh_config`` (one file for both)."""

    servers: list[SshServer]
    aliases: list[str]
    ssh_config: Path

    def env(self) -> dict[str, str]:
        return dict(os.environ, NSA_TUI_SSH_CONFIG=str(self.ssh_config), NSA_TUI_REMOTE_PYTHON=sys.executable)


@contextlib.contextmanager
def _two_hosts(tmp_path: Path, *, machines: bool) -> Iterator[SshNodes]:
    """Two running sshd as hosts ``nsa-node0`` and ``nsa-node1`` of one ssh_config. Without
    ``machines``: each with its own HOME (so its own runs root), stopped afterwards. With it:
    one shared HOME and each in PID and UTS namespaces of its own (hostnames ``nsa-m0``,
    ``nsa-m1``), made to vanish afterwards with everything still running on them."""
    key = tmp_path / "client_ed25519"
    _keygen(key)
    aliases = ["nsa-node0", "nsa-node1"]
    homes = [tmp_path / "home"] * 2 if machines else [tmp_path / f"home{i}" for i in range(2)]
    servers = [make_server(tmp_path / f"sshd{i}", home=homes[i], alias=a, client_key=key)
               for i, a in enumerate(aliases)]
    if machines:
        for i, s in enumerate(servers):
            s.machine, s.pid_base = f"nsa-m{i}", 100 + 20000 * i
    cfg = tmp_path / "ssh_config"
    cfg.write_text("".join(config_entry(a, s.port, s.user, key, s.known_hosts)
                           for a, s in zip(aliases, servers)))
    started = []
    try:
        for s in servers:
            s.start()
            started.append(s)
        yield SshNodes(servers, aliases, cfg)
    finally:
        for s in started:
            if not machines:
                s.stop()
            elif s.proc is not None:
                s.vanish()  # the machine and everything still running on it


@pytest.fixture
def sshd_nodes(tmp_path: Path) -> Iterator[SshNodes]:
    """Two running sshd with their own ports, HOMEs and runs roots; stopped afterwards."""
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    with _two_hosts(tmp_path, machines=False) as nodes:
        yield nodes


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[SshNodes]:
    """Two machines sharing one home (so one runs root, as a cluster's NFS home is): each sshd in
    PID and UTS namespaces of its own with its own hostname (``nsa-m0``, ``nsa-m1``), so neither
    sees the other's processes; aliases ``nsa-node0`` and ``nsa-node1``. Needs root (unshare)."""
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("two machines on one box need root and unshare (PID and UTS namespaces)")
    with _two_hosts(tmp_path, machines=True) as nodes:
        yield nodes
