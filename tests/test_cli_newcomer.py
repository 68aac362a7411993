"""What a newcomer met first: a runs root that is a file, a fallback the panel refuses,
HOST after ``--set``, ``--version``, ``runs`` without HOST, the greedy sample's seed, ``ack``'s
words and ``eval``'s header before a refusal (declining a delete at a terminal: tests/test_cli.py).
Real subprocesses against the local agent, over run directories as the agent writes them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsa.contract import Alert, AlertEvent
from nsa.contract.io import encode
from nsa.contract.rundir import ALERTS_JSONL
from nsa_tui import __version__
from nsa_tui.cli import main as cli
from nsa_tui.hosts.client import AgentError, HostClient
from tests.agent.test_describe import stopped_run

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke-cpu.yaml")
RID = "20260101-000000-exp-0001"


def nsa_tui(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


async def test_a_runs_root_that_is_a_file_is_said_so_by_the_cli_and_the_agent(tmp_path: Path) -> None:
    file = tmp_path / "runs"
    file.write_text("not a directory\n")
    want = f"runs root {file} is not a directory"
    r = nsa_tui("runs", "local", "--runs-root", str(file))
    assert r.returncode == cli.EXIT_USAGE and want in r.stderr and not r.stdout, (r.stdout, r.stderr)
    r = nsa_tui("launch", "local", "--config", SMOKE, "--runs-root", str(file), "--json")
    assert r.returncode == cli.EXIT_USAGE, (r.stdout, r.stderr)
    assert json.loads(r.stdout)["error"] == {"code": "bad_request", "message": want}
    r = nsa_tui("status", "local", RID, "--runs-root", str(file / "below"))
    assert r.returncode == cli.EXIT_USAGE and f"({file} is a file)" in r.stderr, r.stderr
    c = HostClient("local", runs_root=str(file))  # what the panel's launch dialog asks
    await c.start()
    try:
        for ask in (c.describe(SMOKE, upload=True), c.launch(SMOKE, upload=True)):
            with pytest.raises(AgentError) as exc:
                await ask
            assert (exc.value.code, exc.value.message) == ("bad_request", want)
        assert (await c.ping())["time"] > 0  # the host itself still answers
    finally:
        await c.close()


async def test_fallback_of_a_one_process_run_is_refused_as_the_panel_refuses_it(tmp_path: Path) -> None:
    stopped_run(tmp_path, RID, world=1)
    r = nsa_tui("fallback", "local", RID, "--runs-root", str(tmp_path))
    assert r.returncode == cli.EXIT_USAGE, (r.stdout, r.stderr)
    assert "nsa-tui: exp-resume already runs on one process: there is nothing to fall back from" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [RID]  # nothing started
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        plan = await c.plan(RID, "fallback")
        assert plan.problem == "exp-resume already runs on one process: there is nothing to fall back from"
    finally:
        await c.close()


def test_host_after_the_set_items_is_host(tmp_path: Path) -> None:
    root = ["--runs-root", str(tmp_path)]
    r = nsa_tui("launch", "--config", SMOKE, *root, "--set", "train.steps=oops", "local")
    assert r.returncode == cli.EXIT_BAD_CONFIG, r.stderr  # HOST taken; the override reached the host
    assert "train.steps" in r.stderr and "HOST" not in r.stderr
    r = nsa_tui("launch", "--config", SMOKE, *root, "--set", "train.steps=5", "train.lr=1")
    assert r.returncode == cli.EXIT_USAGE and "required: HOST" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_version_runs_without_host_and_ack_says_it_once(tmp_path: Path) -> None:
    r = nsa_tui("--version")
    assert r.returncode == 0 and r.stdout == f"nsa-tui {__version__}\n", (r.stdout, r.stderr)
    stopped_run(tmp_path, RID)
    r = nsa_tui("runs", "--runs-root", str(tmp_path), "--json")
    assert r.returncode == 0 and [x["run_id"] for x in json.loads(r.stdout)] == [RID], r.stderr
    alert = Alert(kind="stall", severity="warning", host="h", run=RID, message="no step for 5 min")
    (tmp_path / RID / ALERTS_JSONL).write_bytes(encode(AlertEvent(ts=1.0, action="raised", id="1-stall",
                                                                  alert=alert, by="watchdog")) + b"\n")
    r = nsa_tui("ack", "local", RID, "stall", "--runs-root", str(tmp_path))
    assert r.returncode == 0 and r.stdout == f"{RID} 1-stall: acknowledged\n", (r.stdout, r.stderr)


@pytest.mark.slow
def test_a_greedy_sample_prints_no_seed(trained_nsa_run: tuple[Path, str]) -> None:
    root, rid = trained_nsa_run
    r = nsa_tui("sample", "local", rid, "--runs-root", str(root), "--temperature", "0", "--prompt", "hi",
                "--max-new-tokens", "4", timeout=240)
    assert r.returncode == 0, r.stderr
    assert "on cpu, greedy" in r.stderr and "seed" not in r.stderr, r.stderr
    assert "decoding: eager (no CUDA graphs on cpu)" in r.stderr, r.stderr  # which decode path, said


@pytest.mark.slow
def test_eval_refuses_a_short_length_before_its_header(trained_nsa_run: tuple[Path, str]) -> None:
    root, rid = trained_nsa_run
    r = nsa_tui("eval", "local", rid, "--runs-root", str(root), "--passkey", "--lengths", "8",
                "--depths", "0.5", "--trials", "1", "--loss-sequences", "0", timeout=240)
    assert r.returncode == cli.EXIT_USAGE, r.stderr
    assert r.stderr.startswith("nsa-tui: length(s) 8 below"), r.stderr  # the refusal, no header before it
