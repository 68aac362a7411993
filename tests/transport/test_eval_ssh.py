"""``nsa-tui eval`` over a real sshd: the same record as on the host itself, progress on the
way, the records read back over the same connection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_tui.cli.exitcodes import EXIT_USAGE
from tests.agent.e2e import SMOKE
from tests.sshd import ALIAS, SshServer

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def test_eval_over_ssh_gives_the_hosts_own_record(sshd: SshServer, tmp_path: Path) -> None:
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
    args = ["--passkey", "--lengths", "48,64", "--depths", "0,1", "--trials", "2", "--seed", "4",
            "--loss-sequences", "1", "--buckets", "2"]
    remote = cli("eval", ALIAS, rid, *args, "--json")
    assert remote.returncode == 0, remote.stderr
    assert "[8/9] passkey length 64" in remote.stderr  # progress came over the connection
    local = cli("eval", "local", rid, *args, "--json")
    a, b = json.loads(remote.stdout), json.loads(local.stdout)
    assert a["checkpoint"] == "step-3" and a["attention"] == "dense" and a["lengths"] == [48, 64]
    assert (a["hits"], a["loss_buckets"]) == (b["hits"], b["loss_buckets"])
    hist = cli("eval", ALIAS, rid, "--history", "--json")
    assert hist.returncode == 0, hist.stderr
    assert json.loads(hist.stdout) == [a, b]
    refused = cli("eval", ALIAS, rid, "--passkey", "--lengths", "65")
    assert refused.returncode == EXIT_USAGE and "exceed the context" in refused.stderr
