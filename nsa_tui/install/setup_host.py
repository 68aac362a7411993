"""``nsa-tui setup HOST``: install the running nsa-tui, with its training side, on an SSH host.

Works from any install of nsa-tui (source checkout, editable, wheel): it ships a wheel
of the running version (``nsa_tui.install.wheel``), cached on the host by its content hash.
The host's torch is kept wherever it lives: the venv is made from ``--python`` with
``--system-site-packages``, and when that python is itself a venv or conda env (whose
packages such a venv would not see), a ``.pth`` file appends that environment's
site-packages after the venv's own. Which torch will be used is said before anything
is installed, and a pip dry run checks that pip will not replace it.

Steps, each named in its error: probe, upload, venv, link, plan, pip install, check.
Every remote command is built from an argument list with ``shlex``; paths are absolute.
"""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import Callable
from typing import Any

from nsa.torch_range import TESTED as TORCH_TESTED
from nsa_tui.install.wheel import Wheel, build_wheel, extra_requirements
from nsa_tui.transport import ConfirmHostKey
from nsa_tui.transport.asyncssh_quiet import asyncssh
from nsa_tui.transport.ssh import SshTransport

DEFAULT_PREFIX = "~/.nsa-tui"
EXTRA = "host"  # the training side: torch, triton, datasets, psutil, NVML (pyproject)
PTH_NAME = "nsa-tui-host-env.pth"

# What a python on the host is: its prefixes, site dirs and the torch it would import.
# find_spec does not import torch (seconds on a GPU box); the version comes from metadata.
PROBE = r"""
import json, os, site, sys
from importlib import metadata, util
dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
if site.ENABLE_USER_SITE:
    dirs.append(site.getusersitepackages())
torch = None
spec = util.find_spec("torch")
if spec is not None and spec.origin:
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        version = None
    torch = {"version": version, "location": os.path.dirname(os.path.dirname(os.path.realpath(spec.origin)))}
print(json.dumps({
    "executable": sys.executable, "python": "%d.%d" % sys.version_info[:2],
    "prefix": sys.prefix, "base_prefix": sys.base_prefix,
    "conda_prefix": os.environ.get("CONDA_PREFIX"),
    "conda": os.path.isdir(os.path.join(sys.prefix, "conda-meta")),
    "site": [d for d in dirs if os.path.isdir(d)], "torch": torch,
    "home": os.path.expanduser("~"),
}))
"""

# Run by the venv's python with argv[1] = JSON list of directories it must see: writes the
# .pth with those it does not see by itself (its own sys.path, less an older .pth of ours).
LINK = r"""
import json, os, sys, sysconfig
want, name = json.loads(sys.argv[1]), sys.argv[2]
pth = os.path.join(sysconfig.get_paths()["purelib"], name)
old = set()
if os.path.exists(pth):
    with open(pth) as fh:
        old = {line.strip() for line in fh if line.strip()}
seen = {os.path.realpath(p) for p in sys.path if p and p not in old}
missing = []
for d in want:
    if os.path.realpath(d) not in seen:
        missing.append(d)
        seen.add(os.path.realpath(d))
if missing:
    with open(pth + ".tmp", "w") as fh:
        fh.write("".join(d + "\n" for d in missing))
    os.replace(pth + ".tmp", pth)
elif os.path.exists(pth):
    os.remove(pth)
print(json.dumps({"pth": pth if missing else None, "linked": missing}))
"""

CHECK = r"""
import json, os, sys
from importlib import metadata, util
import nsa, nsa_tui
spec = util.find_spec("torch")
origin = spec.origin if spec else None
def version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
print(json.dumps({
    "version": nsa_tui.__version__, "build": version("nsa-tui"), "python": sys.executable,
    "nsa": nsa.__version__, "torch": version("torch") if origin else None,
    "torch_location": os.path.dirname(os.path.dirname(os.path.realpath(origin))) if origin else None,
}))
"""


class SetupError(RuntimeError):
    """A step of the setup failed; the message names the step and the host."""


def torch_plan(probe: dict[str, Any], python: str, no_deps: bool) -> tuple[bool, str]:
    """(kept, sentence): which torch the venv will use, said before anything is installed."""
    torch = probe.get("torch")
    if torch:
        version = torch.get("version") or "(unknown version)"
        return True, f"host torch {version} from {torch['location']} (kept)"
    if no_deps:
        return False, (f"no torch found with {python}; --no-deps installs none: "
                       "install the torch build for this host's GPUs into the venv")
    return False, f"no torch found with {python}: pip will install one (several GB)"


def needs_new_venv(current: dict[str, Any] | None, base: dict[str, Any]) -> bool:
    """A venv made from another interpreter (another python version, another base) is redone."""
    return current is None or (current["python"], current["base_prefix"]) != (base["python"],
                                                                              base["base_prefix"])


def _absolute(prefix: str, home: str) -> str:
    """``~``, ``~/x`` and relative prefixes are under the remote home."""
    if prefix == "~":
        return home
    if prefix.startswith("~/"):
        return f"{home}/{prefix[2:]}"
    return prefix if prefix.startswith("/") else f"{home}/{prefix}"


class _Host:
    """Runs the steps on one connection; a failure raises SetupError naming step and host."""

    def __init__(self, conn: asyncssh.SSHClientConnection, dest: str) -> None:
        self.conn, self.dest = conn, dest

    def fail(self, step: str, why: str) -> SetupError:
        return SetupError(f"setup step {step!r} failed on {self.dest}: {why}")

    async def run(self, step: str, argv: list[str], check: bool = True) -> asyncssh.SSHCompletedProcess:
        """Run ``argv`` (quoted word by word); a non-zero exit fails the step when ``check``."""
        try:
            res = await self.conn.run(shlex.join(argv), check=False)
        except asyncssh.Error as exc:
            raise self.fail(step, str(exc)) from exc
        if check and res.exit_status != 0:
            out = str(res.stderr or "").strip() or str(res.stdout or "").strip()
            raise self.fail(step, f"exit {res.exit_status}:\n{out[-2000:]}")
        return res

    async def json(self, step: str, argv: list[str]) -> dict[str, Any]:
        res = await self.run(step, argv)
        try:
            return json.loads(str(res.stdout).strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise self.fail(step, f"unexpected output: {str(res.stdout)[-500:]!r}") from exc

    async def upload(self, wheel: Wheel, wheels_dir: str, prefix: str) -> bool:
        """Put the wheel in ``wheels_dir`` unless it is there already; True when uploaded."""
        path = f"{wheels_dir}/{wheel.filename}"
        try:
            async with self.conn.start_sftp_client() as sftp:
                await sftp.makedirs(wheels_dir, exist_ok=True)
                await sftp.chmod(prefix, 0o700)
                if await sftp.exists(path):
                    return False
                part = f"{path}.part-{secrets.token_hex(4)}"
                async with sftp.open(part, "wb") as fh:
                    await fh.write(wheel.data)
                await sftp.posix_rename(part, path)  # never a half-written wheel under its name
                return True
        except (asyncssh.Error, OSError) as exc:
            raise self.fail("upload", str(exc)) from exc


async def setup_host(
    dest: str, *, prefix: str = DEFAULT_PREFIX, python: str = "python3", no_deps: bool = False,
    confirm_host_key: ConfirmHostKey | None = None, log: Callable[[str], None] | None = None,
    **ssh_options: Any,
) -> dict[str, Any]:
    """Install the running nsa-tui[host] into ``<prefix>/venv`` on ``dest``; returns what is there.

    Raises TransportError when the host cannot be reached and SetupError (a RuntimeError)
    when a step fails.
    """
    say = log or (lambda m: None)
    try:
        wheel = build_wheel()
    except (RuntimeError, OSError) as exc:
        raise SetupError(f"setup step 'build wheel' failed (for {dest}): {exc}") from exc
    py = shlex.split(python)
    tr = SshTransport(dest, confirm_host_key=confirm_host_key, **ssh_options)
    conn = await tr.open_connection()
    try:
        host = _Host(conn, dest)
        probe = await host.json("probe", [*py, "-c", PROBE])
        kept, sentence = torch_plan(probe, python, no_deps)
        say(sentence)
        root = _absolute(prefix, probe["home"])
        venv = f"{root}/venv"
        vpy = f"{venv}/bin/python"

        uploaded = await host.upload(wheel, f"{root}/wheels", root)
        wheel_path = f"{root}/wheels/{wheel.filename}"
        kib = len(wheel.data) // 1024
        say(f"{'uploaded' if uploaded else 'cached'}: {wheel.filename} ({kib} KiB) in {root}/wheels")

        res = await host.run("venv", [vpy, "-c", PROBE], check=False)  # the venv of an earlier setup
        try:
            current = json.loads(str(res.stdout).strip().splitlines()[-1]) if res.exit_status == 0 else None
        except (ValueError, IndexError):
            current = None
        if needs_new_venv(current, probe):
            say(f"venv: creating {venv} from {probe['executable']}")
            await host.run("venv", [*py, "-m", "venv", "--clear", "--system-site-packages", venv])

        want = list(probe["site"]) + ([probe["torch"]["location"]] if probe.get("torch") else [])
        link = await host.json("link", [vpy, "-c", LINK, json.dumps(want), PTH_NAME])
        if link["linked"]:
            say(f"link: the venv also sees {', '.join(link['linked'])} ({link['pth']})")
        if kept:
            where = probe["torch"]["location"]
            seen = (await host.json("link", [vpy, "-c", PROBE])).get("torch") or {}
            if seen.get("location") != where:
                raise host.fail("link", f"the venv does not see the host torch at {where} "
                                        f"(it sees {seen.get('location')})")

        target = f"{wheel_path}[{EXTRA}]"
        pip = [vpy, "-m", "pip", "install", "--disable-pip-version-check"]
        installs: list[str] | None = None
        keep_torch = False
        if not no_deps:
            installs = await _plan(host, [*pip, "--dry-run", "--quiet", "--report", "-", target], say)
            torch_new = next((p for p in installs or [] if _name(p) == "torch"), None)
            if torch_new and kept:
                # a torch outside the tested range: pip would put another (several GB, maybe for
                # other CUDA drivers) in front of the host's; the host's is kept, and nsa-train says
                # at start that it is outside the range
                keep_torch = True
                sentence = (f"host torch {probe['torch']['version']} from {probe['torch']['location']} "
                            f"is outside nsa-tui's tested range (torch{TORCH_TESTED}): kept (pip would "
                            f"install {torch_new}); nsa-train warns at start, docs/install.md")
                say(sentence)

        say("pip install ...")
        if keep_torch:  # nsa-tui alone, then the extra's other packages (Triton stays torch's pairing)
            await host.run("pip install", [*pip, "--quiet", "--no-deps", wheel_path])
            others = extra_requirements(EXTRA, leave_out=("torch", "triton"))
            await host.run("pip install", [*pip, "--quiet", *others])
            installs = None  # the plan above was for a torch that was not installed
        else:
            await host.run("pip install", [*pip, "--quiet", *(["--no-deps"] if no_deps else []), target])
        info = await host.json("check", [vpy, "-c", CHECK])
        if info.get("torch") is None:
            say("warning: no torch on the host; install the torch build for its GPUs into the venv")
        info.update(wheel=wheel.filename, uploaded=uploaded, torch_plan=sentence, torch_kept=kept,
                    host_python=probe, linked=link["linked"], installs=installs)
        return info
    finally:
        await tr.close()


def _name(pin: str) -> str:
    """The normalized project name of ``name==version``."""
    return pin.split("==")[0].lower().replace("_", "-").replace(".", "-")


async def _plan(host: _Host, argv: list[str], say: Callable[[str], None]) -> list[str] | None:
    """What pip would install (``name==version``, nsa-tui left out); None where pip is too old."""
    res = await host.run("plan", argv, check=False)
    if res.exit_status != 0 and "no such option" in str(res.stderr):  # pip before 22.2
        say("plan: this pip has no --dry-run; installing without a plan")
        return None
    if res.exit_status != 0:
        raise host.fail("plan", f"pip --dry-run exit {res.exit_status}:\n{str(res.stderr).strip()[-2000:]}")
    try:
        report = json.loads(str(res.stdout))
    except ValueError as exc:
        raise host.fail("plan", f"pip printed no report: {str(res.stdout)[-500:]!r}") from exc
    names = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in report.get("install", [])]
    names = [n for n in names if _name(n) != "nsa-tui"]
    say(f"plan: pip will install {', '.join(names)}" if names
        else "plan: every dependency is present; pip installs only nsa-tui")
    return names
