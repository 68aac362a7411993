"""``nsa-tui setup`` against a real sshd: SFTP upload, venv keeping the host's torch, pip."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_tui import __version__
from nsa_tui.client import HostClient
from nsa_tui.transport.ssh import SshTransport
from tests.sshd import ALIAS, SshServer

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


async def test_setup_installs_into_a_venv_that_keeps_torch(sshd: SshServer, tmp_path: Path) -> None:
    prefix = tmp_path / "nsa tui home"  # a space: every remote path must be quoted
    cmd = [sys.executable, "-m", "nsa_tui.cli", "setup", ALIAS, "--no-deps", "--prefix", str(prefix),
           "--python", sys.executable, "--json"]
    out = subprocess.run(cmd, env=sshd.env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    info = json.loads(out.stdout)
    venv_py = prefix / "venv" / "bin" / "python"
    assert info["version"] == __version__ and info["python"] == str(venv_py)
    assert info["torch"]  # the host's torch, seen through --system-site-packages
    assert (prefix / f"nsa-tui-{__version__}.tar.gz").exists()
    tr = SshTransport(sshd.dest, runs_root=str(tmp_path / "runs"), remote_python=shlex.quote(str(venv_py)),
                      **sshd.ssh_options)
    c = HostClient(sshd.dest, transport=tr)
    await c.start()
    try:
        assert c.hello["nsa_tui"] == __version__ and c.hello["python_exe"] == str(venv_py)
    finally:
        await c.close()
