"""``nsa-tui setup HOST``: install this version of nsa-tui on an SSH host.

Uploads a source archive of this very version over SFTP, creates a virtualenv with
``--system-site-packages`` (so the host's own CUDA torch is kept, never replaced) and
pip-installs the archive into it. The agent command prefers that venv's python.
Every remote command is a fixed template with ``shlex``-quoted parts.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh

import nsa_tui
from nsa_tui.transport import ConfirmHostKey
from nsa_tui.transport.ssh import SshTransport

DEFAULT_PREFIX = "~/.nsa-tui"
PACKAGES = ("nsa", "nsa_tui")
EXTRA = ("pyproject.toml", "README.md", "configs")


def source_root() -> Path:
    """The directory holding pyproject.toml and the packages of this install."""
    root = Path(nsa_tui.__file__).resolve().parent.parent
    if not (root / "pyproject.toml").exists():
        raise RuntimeError(f"{root} has no pyproject.toml: run setup from a source checkout of nsa-tui")
    return root


def make_archive(root: Path) -> bytes:
    """A .tar.gz of the packages and build files (no caches, no runs, no tests)."""
    buf = io.BytesIO()

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = info.name
        return None if "__pycache__" in name or name.endswith((".pyc", ".egg-info")) else info

    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in PACKAGES + EXTRA:
            if (root / name).exists():
                tar.add(root / name, arcname=name, filter=keep)
    return buf.getvalue()


def _remote_path(prefix: str) -> tuple[str, str]:
    """(shell expression, SFTP path) of ``prefix``; ``~/x`` means the remote home."""
    if prefix.startswith("~/"):
        rest = prefix[2:]
        return f'"$HOME"/{shlex.quote(rest)}', rest
    return shlex.quote(prefix), prefix


async def setup_host(
    dest: str, *, prefix: str = DEFAULT_PREFIX, python: str = "python3", no_deps: bool = False,
    confirm_host_key: ConfirmHostKey | None = None, log: Callable[[str], None] | None = None,
    **ssh_options: Any,
) -> dict[str, Any]:
    """Upload, create the venv (keeping the host's torch), pip install; returns what is installed.

    Raises TransportError when the host cannot be reached and RuntimeError when a step fails.
    """
    say = log or (lambda m: None)
    version = nsa_tui.__version__
    tr = SshTransport(dest, confirm_host_key=confirm_host_key, **ssh_options)
    conn = await tr.open_connection()
    try:
        shell_prefix, sftp_prefix = _remote_path(prefix)
        archive = make_archive(source_root())
        name = f"nsa-tui-{version}.tar.gz"
        say(f"uploading {name} ({len(archive) // 1024} KiB) to {dest}:{prefix}")
        async with conn.start_sftp_client() as sftp:
            await sftp.makedirs(sftp_prefix, exist_ok=True)
            async with sftp.open(f"{sftp_prefix}/{name}", "wb") as fh:
                await fh.write(archive)
        src = f"{shell_prefix}/src-{shlex.quote(version)}"
        venv = f"{shell_prefix}/venv"
        pip = ["--quiet", "--disable-pip-version-check"]
        if no_deps:
            pip += ["--no-deps"]
        steps = [
            ("unpack", f"chmod 700 {shell_prefix} && rm -rf {src} && mkdir -p {src} && "
                       f"tar -xzf {shell_prefix}/{shlex.quote(name)} -C {src}"),
            ("venv", f"[ -x {venv}/bin/python ] || "
                     f"{shlex.join(shlex.split(python))} -m venv --system-site-packages {venv}"),
            ("pip install", f"{venv}/bin/python -m pip install {shlex.join(pip)} {src}"),
        ]
        for label, cmd in steps:
            say(f"{label} ...")
            res = await conn.run(cmd, check=False)
            if res.exit_status != 0:
                raise RuntimeError(f"setup step {label!r} failed on {dest} (exit {res.exit_status}):\n"
                                   f"{str(res.stderr or res.stdout)[-2000:]}")
        probe = ("import json, sys, importlib.metadata as m, nsa, nsa_tui\n"
                 "def v(d):\n    try:\n        return m.version(d)\n"
                 "    except Exception:\n        return None\n"
                 "print(json.dumps({'version': nsa_tui.__version__, 'python': sys.executable, "
                 "'torch': v('torch'), 'nsa': nsa.__version__}))")
        res = await conn.run(f"{venv}/bin/python -c {shlex.quote(probe)}", check=False)
        if res.exit_status != 0:
            raise RuntimeError(f"installed, but the check failed on {dest}: {str(res.stderr)[-2000:]}")
        info = json.loads(str(res.stdout).strip().splitlines()[-1])
        if info.get("torch") is None:
            say("warning: no torch on the host; install the torch build for its GPUs into the venv")
        return info
    except asyncssh.Error as exc:
        raise RuntimeError(f"setup on {dest} failed: {exc}") from exc
    finally:
        await tr.close()
