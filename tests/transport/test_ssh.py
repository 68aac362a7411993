"""The SSH transport against a real OpenSSH server on 127.0.0.1 (tests/sshd.py)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from nsa_tui.hosts.client import HostClient
from nsa_tui.transport import AgentMissing, HostKeyError
from nsa_tui.transport.ssh import SshTransport, agent_command, parse_dest
from tests.sshd import ALIAS, SshServer

pytestmark = pytest.mark.ssh
PY = sys.executable


def client(server: SshServer, runs_root: Path, **kw: object) -> HostClient:
    opts = dict(server.ssh_options)
    opts.update(kw)
    tr = SshTransport(server.dest, runs_root=str(runs_root), remote_python=PY, **opts)  # type: ignore[arg-type]
    return HostClient(server.dest, transport=tr)


def test_parse_dest() -> None:
    assert parse_dest("gpu1") == (None, "gpu1", None)
    assert parse_dest("me@gpu1:2222") == ("me", "gpu1", 2222)
    assert parse_dest("[::1]:22") == (None, "::1", 22)
    with pytest.raises(ValueError):
        parse_dest("me@")


def test_agent_command_quotes_everything() -> None:
    root = "/tmp/a b; touch /tmp/x '\" $(id)"
    cmd = agent_command(root, None)
    assert shlex.split(cmd.split("exec ", 1)[1]) == ["$P", "-m", "nsa_tui.agent", "--runs-root", root]
    assert agent_command(None, "'/opt/py 3/python' -S") == "'/opt/py 3/python' -S -m nsa_tui.agent"


async def test_connect_runs_and_hello(sshd: SshServer, tmp_path: Path) -> None:
    c = client(sshd, tmp_path / "runs")
    await c.start()
    try:
        assert c.state.status == "connected"
        assert c.hello.runs_root == str(tmp_path / "runs")
        assert c.hello.gpus == 0 and "NVML" in c.hello.gpu_message
        assert await c.runs() == []
    finally:
        await c.close()


async def test_ssh_config_alias_with_its_key_and_known_hosts(sshd: SshServer, tmp_path: Path) -> None:
    tr = SshTransport(ALIAS, runs_root=str(tmp_path / "r"), remote_python=PY, config=[str(sshd.ssh_config)])
    c = HostClient(ALIAS, transport=tr)
    await c.start()
    try:
        assert (await c.ping())["time"] > 0
    finally:
        await c.close()


async def test_unknown_host_asks_and_remembers(sshd: SshServer, tmp_path: Path) -> None:
    kh = tmp_path / "kh" / "known_hosts"
    asked: list[tuple[str, str]] = []

    async def no(host: str, fp: str) -> bool:
        asked.append((host, fp))
        return False

    async def yes(host: str, fp: str) -> bool:
        asked.append((host, fp))
        return True

    with pytest.raises(HostKeyError, match="not accepted"):
        await client(sshd, tmp_path / "r", known_hosts=str(kh), confirm_host_key=no).start()
    assert asked[0][0] == f"[127.0.0.1]:{sshd.port}" and "SHA256:" in asked[0][1]
    assert kh.read_text() == ""  # nothing remembered
    with pytest.raises(HostKeyError, match="not in known_hosts"):
        await client(sshd, tmp_path / "r", known_hosts=str(kh)).start()  # no callback: refuse
    c = client(sshd, tmp_path / "r", known_hosts=str(kh), confirm_host_key=yes)
    await c.start()
    await c.close()
    assert f"[127.0.0.1]:{sshd.port} ssh-ed25519 " in kh.read_text()
    asked.clear()
    c = client(sshd, tmp_path / "r", known_hosts=str(kh), confirm_host_key=yes)
    await c.start()  # remembered: no question the second time
    await c.close()
    assert asked == []


async def test_changed_host_key_is_refused(sshd: SshServer, tmp_path: Path) -> None:
    sshd.change_host_key()
    sshd.restart()
    asked = []

    async def yes(host: str, fp: str) -> bool:
        asked.append(host)
        return True

    c = client(sshd, tmp_path / "r", confirm_host_key=yes)
    with pytest.raises(HostKeyError) as err:
        await c.start()
    assert "CHANGED" in str(err.value) and "ssh-keygen -R" in str(err.value)
    assert asked == []  # never offered to accept a changed key
    assert c.state.status == "lost"


async def test_host_without_agent_says_how_to_fix(sshd: SshServer, tmp_path: Path) -> None:
    tr = SshTransport(sshd.dest, remote_python=f"{PY} -S", **sshd.ssh_options)  # -S: no site-packages
    with pytest.raises(AgentMissing, match="nsa-tui setup"):
        await HostClient(sshd.dest, transport=tr).start()


async def test_runs_root_with_shell_metacharacters_is_not_injected(sshd: SshServer, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    root = tmp_path / f"runs; touch {marker}; echo 'q\" $(touch {marker})"
    c = client(sshd, root)
    await c.start()
    try:
        assert c.hello.runs_root == str(root)
        await c.runs()
    finally:
        await c.close()
    assert not marker.exists()


def test_the_cli_refusing_an_unknown_key_says_the_fingerprint_and_how_to_accept_it(sshd: SshServer,
                                                                                   tmp_path: Path) -> None:
    """Without a terminal the CLI never says yes: it says which key it saw and the exact commands."""
    import subprocess

    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(sshd.ssh_config.read_text().replace(str(sshd.known_hosts), str(empty)))
    env = dict(sshd.env(), NSA_TUI_SSH_CONFIG=str(cfg))
    res = subprocess.run([sys.executable, "-m", "nsa_tui.cli", "runs", ALIAS], capture_output=True, text=True,
                         env=env, stdin=subprocess.DEVNULL, timeout=60)
    assert res.returncode == 5
    fingerprint = subprocess.run(["ssh-keygen", "-lf", f"{sshd.host_key}.pub"], capture_output=True,
                                 text=True).stdout.split()[1]
    assert fingerprint in res.stderr and "ssh-ed25519" in res.stderr
    assert f"ssh-keyscan -p {sshd.port} -t ssh-ed25519 127.0.0.1 >> {empty}" in res.stderr
    assert f"ssh -p {sshd.port} {sshd.user}@127.0.0.1" in res.stderr
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in res.stderr
    assert empty.read_text() == ""  # nothing accepted
