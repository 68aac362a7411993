"""``nsa-tui setup`` against a real sshd: the wheel of the running version, cached by hash, in a
venv that keeps the host's torch, from a source checkout and from a wheel-installed nsa-tui.

The "host" is this machine and its python is the one running the tests, itself a venv (as
the README's path makes it): its torch lives in that venv, which a venv made with
``--system-site-packages`` from it would not see.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import sysconfig
from importlib import metadata, util
from pathlib import Path

import pytest

from nsa.contract import Hello
from nsa_tui import __version__
from nsa_tui.hosts.client import HostClient
from nsa_tui.install.setup_host import setup_host
from nsa_tui.install.wheel import build_wheel
from nsa_tui.transport.ssh import SshTransport
from tests.sshd import ALIAS, SshServer

pytestmark = [pytest.mark.slow, pytest.mark.ssh]

SITE = sysconfig.get_paths()["purelib"]  # this venv's packages (textual, asyncssh, ...)
TORCH_SITE = os.path.dirname(os.path.dirname(os.path.realpath(util.find_spec("torch").origin)))
IN_VENV = sys.prefix != sys.base_prefix


def _setup_cli(python: str, sshd: SshServer, prefix: Path, *extra: str, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> dict:
    cmd = [python, "-m", "nsa_tui.cli", "setup", ALIAS, "--prefix", str(prefix), "--python", sys.executable,
           "--json", *extra]
    out = subprocess.run(cmd, env=env or sshd.env(), capture_output=True, text=True, timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


async def _agent_hello(sshd: SshServer, venv_py: Path, runs: Path) -> Hello:
    tr = SshTransport(sshd.dest, runs_root=str(runs), remote_python=shlex.quote(str(venv_py)),
                      **sshd.ssh_options)
    c = HostClient(sshd.dest, transport=tr)
    await c.start()
    try:
        return c.hello
    finally:
        await c.close()


async def test_setup_installs_into_a_venv_that_keeps_torch(sshd: SshServer, tmp_path: Path) -> None:
    prefix = tmp_path / "nsa tui home"  # a space: every remote path must be quoted
    info = _setup_cli(sys.executable, sshd, prefix, "--no-deps")
    venv_py = prefix / "venv" / "bin" / "python"
    wheel = build_wheel()
    assert info["version"] == __version__ and info["python"] == str(venv_py)
    assert info["build"] == wheel.version and info["wheel"] == wheel.filename and info["uploaded"]
    assert (prefix / "wheels" / wheel.filename).read_bytes() == wheel.data
    # this venv's torch, said before installing and used after, never a second copy
    assert info["torch"] == metadata.version("torch") and info["torch_kept"]
    assert info["torch_plan"] == f"host torch {info['torch']} from {TORCH_SITE} (kept)"
    assert info["torch_location"] == TORCH_SITE
    if IN_VENV:  # the case a plain --system-site-packages venv gets wrong
        assert info["linked"] == [SITE]
    out = subprocess.run([str(venv_py), "-c", "import torch; print(torch.__file__)"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == os.path.join(TORCH_SITE, "torch", "__init__.py")
    hello = await _agent_hello(sshd, venv_py, tmp_path / "runs")
    assert hello.nsa_tui == __version__ and hello.python_exe == str(venv_py)
    assert hello.torch == info["torch"]


async def test_second_setup_is_cached_and_pip_installs_no_torch(sshd: SshServer, tmp_path: Path) -> None:
    """With dependencies: pip's dry run plans no torch (it and the rest come from the linked venv)."""
    prefix = tmp_path / "home"
    logs: list[list[str]] = []
    infos = []
    for _ in range(2):
        log: list[str] = []
        infos.append(await setup_host(sshd.dest, prefix=str(prefix), python=sys.executable, log=log.append,
                                      **sshd.ssh_options))
        logs.append(log)
    first, second = infos
    assert first["uploaded"] and not second["uploaded"]
    assert any(line.startswith(f"cached: {first['wheel']}") for line in logs[1])
    # torch needs a newer setuptools than the one a new venv has: that small one comes once
    assert {p.split("==")[0] for p in first["installs"]} <= {"setuptools"} and second["installs"] == []
    for info, log in zip(infos, logs):
        assert info["torch_kept"] and info["torch_location"] == TORCH_SITE
        said = log.index(info["torch_plan"])  # which torch, before anything is installed
        assert said < log.index("pip install ...") and "(kept)" in info["torch_plan"]
    assert [p.name for p in (prefix / "wheels").iterdir()] == [first["wheel"]]


async def test_setup_from_a_wheel_installed_nsa_tui(sshd: SshServer, tmp_path: Path) -> None:
    """A user who got nsa-tui as a wheel (no source tree) sets up a host with it."""
    wheel = build_wheel()
    whl = tmp_path / wheel.filename
    whl.write_bytes(wheel.data)
    user = tmp_path / "user venv"
    subprocess.run([sys.executable, "-m", "venv", str(user)], check=True, timeout=300)
    user_py = str(user / "bin" / "python")
    subprocess.run([user_py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(whl)],
                   check=True, timeout=300)
    # the core dependencies (textual, asyncssh, ...) from this venv, after the user venv's own packages;
    # not the source tree: nothing of the checkout is importable there
    user_site = subprocess.run([user_py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    Path(user_site, "deps.pth").write_text(SITE + "\n")
    env = {k: v for k, v in sshd.env().items() if k != "PYTHONPATH"}
    where = subprocess.run([user_py, "-c", "import nsa_tui; print(nsa_tui.__file__)"], capture_output=True,
                           text=True, check=True, cwd=tmp_path, env=env).stdout.strip()
    assert where == os.path.join(user_site, "nsa_tui", "__init__.py")

    prefix = tmp_path / "host"
    info = _setup_cli(user_py, sshd, prefix, "--no-deps", cwd=tmp_path, env=env)
    assert info["build"] == wheel.version  # rebuilt from site-packages: the same content, the same wheel
    assert info["version"] == __version__ and info["torch_location"] == TORCH_SITE
    hello = await _agent_hello(sshd, prefix / "venv" / "bin" / "python", tmp_path / "runs")
    assert hello.nsa_tui == __version__ and not [p for p in hello.problems if "nsa" in p]


def test_a_failing_step_names_itself_and_the_host(sshd: SshServer, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "nsa_tui.cli", "setup", ALIAS, "--prefix", str(tmp_path / "p"),
           "--python", str(tmp_path / "no such python"), "--json"]
    out = subprocess.run(cmd, env=sshd.env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    err = json.loads(out.stdout)["error"]
    assert err["code"] == "setup_failed"
    assert err["message"].startswith(f"setup step 'probe' failed on {ALIAS}: exit 127")
    assert not (tmp_path / "p").exists()  # nothing uploaded or installed
