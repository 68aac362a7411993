"""The same error gives the same exit code on one host and over several: each command run for
real (two OpenSSH servers on 127.0.0.1, tests/sshd.py) as ``nsa-node0`` and as
``nsa-node0,nsa-node1``, with input their agents refuse; and nothing on stderr but what the command says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from nsa_tui.cli import exitcodes as cli_exit
from tests.agent.e2e import SMOKE
from tests.sshd import SshNodes

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(600)]

NO_RUN = "20990101-000000-none-0000"  # a well-formed run id that no host has
CASES: list[tuple[list[str], int]] = [
    (["launch", "{H}", "--config", SMOKE, "--set", "train.nonsense=1"], cli_exit.EXIT_BAD_CONFIG),
    (["launch", "{H}", "--config", SMOKE, "--set", "train.device=cuda"], cli_exit.EXIT_BAD_CONFIG),
    (["status", "{H}", NO_RUN], cli_exit.EXIT_NO_RUN),
    (["status", "{H}", "no-run-has-this-name"], cli_exit.EXIT_NO_RUN),
    (["logs", "{H}", NO_RUN], cli_exit.EXIT_NO_RUN),
    (["alerts", "{H}", NO_RUN], cli_exit.EXIT_NO_RUN),
    (["kill", "{H}", NO_RUN, "--grace", "1"], cli_exit.EXIT_NO_RUN),
    (["dump", "{H}", NO_RUN], cli_exit.EXIT_NO_RUN),
    (["fallback", "{H}", NO_RUN, "--grace", "1"], cli_exit.EXIT_NO_RUN),
    (["resume", "{H}", NO_RUN], cli_exit.EXIT_NO_RUN),
    (["runs", "{H}"], cli_exit.EXIT_OK),
]


def _run(nodes: SshNodes, args: list[str], hosts: str) -> subprocess.CompletedProcess[str]:
    argv = [a.replace("{H}", hosts) for a in args]
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *argv, "--json"], env=nodes.env(),
                          capture_output=True, text=True, timeout=180)


def test_one_error_one_exit_code_on_one_host_and_on_several(sshd_nodes: SshNodes) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("a host with a GPU runs a CUDA config: the cannot_run case needs a CPU-only host")
    one, both = sshd_nodes.aliases[0], ",".join(sshd_nodes.aliases)
    got = {}
    for args, want in CASES:
        r1, r2 = _run(sshd_nodes, args, one), _run(sshd_nodes, args, both)
        got[" ".join(args[:1] + args[2:3])] = (r1.returncode, r2.returncode, want)
        for r in (r1, r2):
            assert r.returncode in cli_exit.EXIT_CODES, (args, r.stdout, r.stderr)
            # no library's deprecation notices (asyncssh's "DSA is deprecated" under newer
            # cryptography) on the way: stderr is for what the user must read
            assert "Warning" not in r.stderr, (args, r.stderr)
            if r.returncode != cli_exit.EXIT_OK:  # said: the error document, or each host's error
                assert "no_such_run" in r.stdout or "error" in json.loads(r.stdout), (args, r.stdout)
    assert all(a == b == want for a, b, want in got.values()), got
    # no runs anywhere (every launch above was refused): the text names each host's runs root
    r = subprocess.run([sys.executable, "-m", "nsa_tui.cli", "runs", both], env=sshd_nodes.env(),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.startswith("no runs in "), r.stdout + r.stderr
    assert all(f" on {alias}" in r.stdout for alias in sshd_nodes.aliases), r.stdout
