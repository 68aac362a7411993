"""Fixtures: the real sshd (tests/sshd.py) and helpers shared by the host-side tests."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # `tests` is not installed; make tests.sshd importable under any runner
    sys.path.insert(0, ROOT)

from tests.agent.e2e import SMOKE  # noqa: E402
from tests.sshd import ALIAS, Cli, SshServer, machines, sshd, sshd_nodes  # noqa: E402,F401


@pytest.fixture
def ended_run_over_ssh(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Cli, str]:
    """``nsa-tui`` run against the test sshd with a runs root of its own, and a 3-step smoke run
    (one checkpoint, at step 3) launched through it and ended: what sample and eval start from."""
    server: SshServer = request.getfixturevalue("sshd")
    root, env = tmp_path / "runs", server.env()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args, "--runs-root", str(root)], env=env,
                              capture_output=True, text=True, timeout=300)

    out = cli("launch", ALIAS, "--config", SMOKE, "--nproc", "1", "--json", "--set", "train.steps=3",
              "train.save_every=3", "train.eval_every=1000")
    assert out.returncode == 0, out.stderr
    rid = json.loads(out.stdout)["run_id"]
    assert cli("logs", ALIAS, rid, "-f").returncode == 0  # returns once the run has ended
    return cli, rid
