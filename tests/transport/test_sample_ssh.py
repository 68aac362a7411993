"""``nsa-tui sample`` over a real sshd: the same text as on the host itself."""

from __future__ import annotations

import json

import pytest

from nsa_tui.cli.sample import EXIT_NO_CHECKPOINT
from tests.sshd import ALIAS, Cli

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def test_sample_over_ssh_streams_the_text_the_host_gives(ended_run_over_ssh: tuple[Cli, str]) -> None:
    cli, rid = ended_run_over_ssh
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
