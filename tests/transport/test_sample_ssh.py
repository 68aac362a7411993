"""``nsa-tui sample`` over a real sshd: the same text as on the host itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_tui.cli.sample import EXIT_NO_CHECKPOINT
from tests.agent.e2e import SMOKE
from tests.sshd import ALIAS, SshServer

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def test_sample_over_ssh_streams_the_text_the_host_gives(sshd: SshServer, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    env = sshd.env()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args, "--runs-root", str(root)], env=env,
                              capture_output=True, text=True, timeout=300)

    out = cli("launch", ALIAS, "--config", SMOKE, "--nproc", "1", "--json", "--set", "train.steps=3",
              "train.save_every=3", "train.eval_every=1000")
    assert out.returncode == 0, out.stderr
    rid = json.loads(out.stdout)["run_id"]
    assert cli("logs", ALIAS, rid, "-f").returncode == 0  # returns once the run has ended
    args = ["--seed", "7", "--prompt", "über", "--max-new-tokens", "30"]
    remote = cli("sample", ALIAS, rid, *args, "--json")
    assert remote.returncode == 0, remote.stderr
    local = cli("sample", "local", rid, *args, "--json")
    a, b = json.loads(remote.stdout), json.loads(local.stdout)
    assert (a["text"], a["tokens"], a["prompt"]) == (b["text"], b["tokens"], "über")
    streamed = cli("sample", ALIAS, rid, *args)
    assert streamed.returncode == 0 and streamed.stdout == "über" + a["text"] + "\n"
    missing = cli("sample", ALIAS, rid, "--checkpoint", "2")
    assert missing.returncode == EXIT_NO_CHECKPOINT and "steps 3" in missing.stderr
