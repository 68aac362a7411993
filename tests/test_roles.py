"""Install by role: the panel and the CLI work without the training side (extra ``host``).

A subprocess hides torch, triton, datasets, tiktoken, numpy, psutil and pynvml behind an
import blocker, as on a laptop where ``pip install nsa-tui`` brought only the core.
"""

from __future__ import annotations

import json
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
import nsa_tui.app, nsa_tui.cli, nsa_tui.client
from nsa_tui.app.app import NsaApp

try:
    nsa_tui.cli.main(["--help"])
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
    assert host == {"torch", "numpy", "triton", "datasets", "tiktoken", "psutil", "nvidia-ml-py"}
    assert "torch>=2.5" in project["optional-dependencies"]["host"]  # a range: a GPU host keeps its torch
    assert project["optional-dependencies"]["train"] == ["nsa-tui[host]"]
