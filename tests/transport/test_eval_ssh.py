"""``nsa-tui eval`` over a real sshd: the same record as on the host itself, progress on the
way, the records read back over the same connection."""

from __future__ import annotations

import json

import pytest

from nsa_tui.cli.exitcodes import EXIT_USAGE
from tests.sshd import ALIAS, Cli

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def test_eval_over_ssh_gives_the_hosts_own_record(ended_run_over_ssh: tuple[Cli, str]) -> None:
    cli, rid = ended_run_over_ssh
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
