"""Install by role: the panel and the CLI work without the training side (extra ``host``).

A subprocess hides torch, triton, datasets, tiktoken, numpy, psutil and pynvml behind an
import blocker, as on a laptop where ``pip install nsa-tui`` brought only the core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HOST_ONLY = ("torch", "triton", "datasets", "tiktoken", "numpy", "psutil", "pynvml")

SCRIPT = r"""
import asyncio, io, json, sys, tempfile
BLOCKED = set(sys.argv[1].split(","))

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed (blocked by the test)")
        return None

sys.meta_path.insert(0, Blocker())
import nsa_tui.app, nsa_tui.cli.main, nsa_tui.hosts.client
from nsa_tui.app.app import NsaApp

try:
    nsa_tui.cli.main.main(["--help"])
except SystemExit as exc:
    assert exc.code == 0, exc.code

app = NsaApp(["local"], live=False)
screens = []

async def mount():
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screens.append(type(app.screen).__name__)

asyncio.run(mount())

from nsa_tui.agent.server import Agent  # the local agent the panel starts
agent = Agent(tempfile.mkdtemp(), out=io.BytesIO())
from nsa.contract.io import to_builtins
hello, sample = agent.hello(), to_builtins(agent.sampler.sample())
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({"screens": screens, "problems": hello.problems, "sample": sample, "loaded": loaded}))
"""


def test_panel_cli_and_agent_work_without_the_host_extra(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(HOST_ONLY)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "usage: nsa-tui" in out.stdout
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["loaded"] == [] and res["screens"] == ["MainScreen"]
    problems = " | ".join(res["problems"])
    assert "psutil not installed" in problems and "nvidia-ml-py not installed" in problems
    sample = res["sample"]
    assert sample["cpu_pct"] is None and sample["ram"]["total_bytes"] is None and sample["gpus"] is None
    assert sample["disk"]["total_bytes"] > 0 and sample["cpu_count"] >= 1


def test_core_dependencies_leave_the_training_side_to_the_host_extra() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split(";")[0].strip() for d in project["dependencies"]}
    assert names == {"textual", "textual-plotext", "asyncssh", "pyyaml", "msgspec"}
    host = {d.split(">")[0].split(";")[0].strip() for d in project["optional-dependencies"]["host"]}
    # no Triton: a GPU host's torch brings the one it pairs with, a CPU host never runs the kernels
    assert host == {"torch", "numpy", "datasets", "tiktoken", "psutil", "nvidia-ml-py"}
    assert "torch>=2.11,<2.15" in project["optional-dependencies"]["host"]  # a range: the tested one
    assert any(d.startswith("triton>=3.6") for d in project["optional-dependencies"]["test"])  # interpreter
    assert project["optional-dependencies"]["train"] == ["nsa-tui[host]"]


def _host_only(entry: str) -> bool:
    """A site-packages entry of the host extra's packages (and their own parts), or of an installed
    nsa-tui (the venv below gets this checkout instead)."""
    base = entry.split("-")[0].split(".")[0].lower()
    return base in {"torch", "torchgen", "functorch", "triton", "numpy", "datasets", "tiktoken", "psutil",
                    "pynvml", "nvidia_ml_py", "nvidia", "nsa_tui"} or entry.startswith("__editable__")


@pytest.fixture(scope="module")
def watch_only_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The python of a virtual environment that has the core install and not the host extra, as
    ``pip install nsa-tui`` leaves a laptop: every package of this interpreter's site-packages
    linked in except torch, numpy, triton, datasets, tiktoken, psutil and nvidia-ml-py (their
    metadata too), and this checkout as the installed nsa-tui (a .pth, as ``pip install -e``)."""
    import sysconfig

    venv = tmp_path_factory.mktemp("watch-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in sorted(os.listdir(ours)):
        if not _host_only(entry):
            os.symlink(ours / entry, Path(purelib) / entry)
    (Path(purelib) / "nsa_tui_checkout.pth").write_text(str(REPO) + "\n")
    probe = ("import importlib.util as u, nsa_tui, nsa, textual; "
             "print(nsa_tui.__file__, [m for m in ('torch', 'numpy', 'psutil') if u.find_spec(m)])")
    check = subprocess.run([str(python), "-c", probe],
                           capture_output=True, text=True, timeout=120, env=_clean_env())
    assert check.returncode == 0, check.stderr
    assert check.stdout.split()[0].startswith(str(REPO)) and check.stdout.strip().endswith("[]"), check.stdout
    return str(python)


def _clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH (it would hand the venv this interpreter's packages)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_a_host_without_the_training_side_refuses_a_launch_naming_the_fix(watch_only_python: str,
                                                                          tmp_path: Path) -> None:
    """A watch-only install (no torch) can watch, never train: ``launch`` is refused before anything is
    created, saying what to install, instead of starting a run that dies at once on ``import torch``.
    ``--force`` (which overrides a missing GPU or Hub) cannot start it either."""
    root = tmp_path / "runs"
    for extra in ([], ["--force"]):
        r = subprocess.run([watch_only_python, "-m", "nsa_tui.cli", "launch", "local", "--config",
                            str(REPO / "configs" / "tiny-cpu.yaml"), "--runs-root", str(root), *extra],
                           capture_output=True, text=True, timeout=120, env=_clean_env(), cwd=tmp_path)
        assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)  # EXIT_BAD_CONFIG: cannot run here
        assert "no module torch" in r.stderr and "pip install 'nsa-tui[host]'" in r.stderr
        assert "nsa-tui setup HOST" in r.stderr
        assert not [p for p in root.iterdir() if not p.name.startswith(".")], list(root.iterdir())
    r = subprocess.run([watch_only_python, "-m", "nsa_tui.cli", "launch", "local", "--config",
                        str(REPO / "configs" / "tiny-cpu.yaml"), "--runs-root", str(root), "--json"],
                       capture_output=True, text=True, timeout=120, env=_clean_env(), cwd=tmp_path)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 3 and err["code"] == "cannot_run" and "nsa-tui[host]" in err["message"]


DESCRIBE = r"""
import asyncio, json, sys
from nsa_tui.hosts.client import HostClient

async def main():
    c = HostClient("local", runs_root=sys.argv[1])
    await c.start()
    try:
        summary = await c.describe(sys.argv[2])
        pre = await c.preflight(config_path=sys.argv[2])
    finally:
        await c.close()
    print(json.dumps({"problems": summary.problems, "preflight": pre.config_error}))

asyncio.run(main())
"""


def test_describe_and_preflight_say_the_training_side_is_missing(watch_only_python: str,
                                                                 tmp_path: Path) -> None:
    """What the launch dialog and a launch over several hosts ask first says it too."""
    r = subprocess.run([watch_only_python, "-c", DESCRIBE, str(tmp_path / "runs"),
                        str(REPO / "configs" / "tiny-cpu.yaml")],
                       capture_output=True, text=True, timeout=120, env=_clean_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    problems = " | ".join(res["problems"])
    assert "torch" in problems and "pip install 'nsa-tui[host]'" in problems, problems
    assert res["preflight"] and "torch" in res["preflight"], res
