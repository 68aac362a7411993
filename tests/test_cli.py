"""``nsa-tui`` CLI: real subprocesses against the local agent and a real crashing run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsa_tui.cli import main as cli
from nsa_tui.hosts.client import HostClient

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke-cpu.yaml")


def nsa_tui(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_exit_codes_without_a_run(tmp_path: Path) -> None:
    root = ["--runs-root", str(tmp_path)]
    assert nsa_tui("runs", "local", *root).returncode == 0
    r = nsa_tui("status", "local", "20990101-000000-none-0000", *root, "--json")
    assert r.returncode == cli.EXIT_NO_RUN and json.loads(r.stdout)["error"]["code"] == "no_such_run"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    r = nsa_tui("launch", "local", "--config", str(bad), *root)
    assert r.returncode == cli.EXIT_BAD_CONFIG and "model" in r.stderr
    r = nsa_tui("runs", "nobody@127.0.0.1:1", "--json")
    assert r.returncode == cli.EXIT_UNREACHABLE
    assert "cannot connect" in json.loads(r.stdout)["error"]["message"]
    assert nsa_tui("launch", "local").returncode == cli.EXIT_USAGE  # --config is required


def test_panel_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    import nsa_tui.app

    seen: list[list[str]] = []
    monkeypatch.setattr(nsa_tui.app, "main", lambda dests: seen.append(dests))
    assert cli.main([]) == 0 and cli.main(["connect", "gpu1", "me@gpu2:22"]) == 0
    assert seen == [[], ["gpu1", "me@gpu2:22"]]


@pytest.mark.slow
def test_crash_is_reported_by_status_logs_and_resume(tmp_path: Path) -> None:
    root = ["--runs-root", str(tmp_path)]
    t0 = time.monotonic()
    r = nsa_tui("launch", "local", "--config", SMOKE, "--nproc", "2", "--name", "crashy", "--json", *root,
                "--set", "debug.crash_at_step=5", "debug.crash_rank=1", "train.save_every=3",
                "train.eval_every=1000")
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]

    async def first_beat() -> float:
        c = HostClient("local", runs_root=str(tmp_path))
        await c.start()
        try:
            async for ev in c.watch(rid, streams=["heartbeats"]):
                if ev.kind == "beats":
                    return time.monotonic() - t0
        finally:
            await c.close()
        return -1.0

    print(f"\nMEASURE local: nsa-tui launch -> first heartbeat seen by the client "
          f"{asyncio.run(asyncio.wait_for(first_beat(), 90)):.2f} s")
    logs = nsa_tui("logs", "local", rid, "-f", *root)
    assert logs.returncode == 0 and "InjectedCrash" in logs.stdout
    st = nsa_tui("status", "local", rid, "--json", *root)
    assert st.returncode == cli.EXIT_UNHEALTHY, st.stdout + st.stderr
    out = json.loads(st.stdout)
    assert out["run"]["status"] == "failed"
    crash = next(a for a in out["alerts"] if a["kind"] == "crash")
    assert crash["severity"] == "critical" and crash["host"] and crash["run"] == rid
    assert crash["log_tail"][0].startswith("Traceback") and "InjectedCrash" in crash["log_tail"][-1]
    runs = json.loads(nsa_tui("runs", "local", "--json", *root).stdout)
    assert [(x["run_id"], x["status"], x["name"]) for x in runs] == [(rid, "failed", "crashy")]
    k = nsa_tui("kill", "local", rid, "--json", *root)
    assert k.returncode == 0 and json.loads(k.stdout)["was_running"] is False
    res = nsa_tui("resume", "local", rid, "--json", *root)
    assert res.returncode == 0, res.stderr
    child = json.loads(res.stdout)
    assert child["parent_run"] == rid and child["resume_from"].endswith("step-3")
    logs = nsa_tui("logs", "local", child["run_id"], "-f", "--json", *root)  # crashes again at step 5
    lines = [json.loads(x)["line"] for x in logs.stdout.splitlines()]
    assert any("InjectedCrash" in ln for ln in lines)
    rec = json.loads((tmp_path / child["run_id"] / "run.json").read_text())
    assert rec["parent_run"] == rid and rec["resumed_from"].endswith("step-3") and rec["world_size"] == 2


def test_logs_json_never_cuts_a_line(tmp_path: Path) -> None:
    """`logs --json` reads train.log in 1 MiB pieces: a line across a piece's end is still one record,
    with and without -f (a finished run, its last line still without its newline)."""
    rid = "20260101-000000-log-0001"
    d = tmp_path / rid
    d.mkdir(mode=0o700)
    (d / "run.json").write_text(json.dumps({"run_id": rid, "status": "finished"}))
    lines = [f"line {i:06d} " + "x" * 90 for i in range(12_000)]  # ~1.2 MB: the first read ends mid-line
    (d / "train.log").write_text("\n".join(lines) + "\nno newline yet")
    for follow in ([], ["-f"]):
        r = nsa_tui("logs", "local", rid, "--runs-root", str(tmp_path), "--json", *follow)
        assert r.returncode == 0, r.stderr
        assert [json.loads(x)["line"] for x in r.stdout.splitlines()] == [*lines, "no newline yet"], follow


def test_runs_hides_archived_runs_unless_all_and_delete_says_what_it_frees(tmp_path: Path) -> None:
    root = ["--runs-root", str(tmp_path)]
    ids = ["20260101-000000-keep-0001", "20260101-000100-old-0002"]
    for rid in ids:
        (tmp_path / rid).mkdir(mode=0o700)
        (tmp_path / rid / "run.json").write_text(json.dumps({"run_id": rid, "status": "finished"}))
    (tmp_path / ids[1] / "big.bin").write_bytes(b"\0" * (5 << 20))
    r = nsa_tui("archive", "local", ids[1], *root)
    assert r.returncode == 0 and "archived" in r.stdout, r.stderr
    listed = nsa_tui("runs", "local", *root)
    assert ids[0] in listed.stdout and ids[1] not in listed.stdout and "1 archived: --all" in listed.stdout
    every = nsa_tui("runs", "local", "--all", *root)
    assert ids[0] in every.stdout and f"{ids[1]}" in every.stdout and "finished (archived)" in every.stdout
    as_json = json.loads(nsa_tui("runs", "local", "--json", "--all", *root).stdout)
    assert {v["run_id"]: v["archived"] for v in as_json} == {ids[0]: False, ids[1]: True}
    r = nsa_tui("delete", "local", ids[1], *root)  # no terminal, no --yes: it says what and stops
    assert r.returncode == cli.EXIT_USAGE and "5 MiB in 4 files" in r.stderr and "--yes" in r.stderr
    assert (tmp_path / ids[1]).is_dir()
    r = nsa_tui("delete", "local", ids[1], "--yes", *root)
    assert r.returncode == 0 and "freed 5 MiB" in r.stdout, r.stderr
    assert not (tmp_path / ids[1]).exists() and (tmp_path / ids[0]).is_dir()


@pytest.mark.slow
def test_status_gives_a_frozen_ranks_true_heartbeat_age(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank frozen by SIGSTOP: ``status`` (text and --json) says how long ago its last beat was
    written, growing with the freeze, and agrees with its own no_heartbeat alert (the age is at
    least that alert's threshold while it holds), never "0.0 s ago"."""
    import os
    import re
    import signal

    settings = tmp_path / "settings.yaml"
    settings.write_text("alerts:\n  no_heartbeat_s: 5\n")
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(settings))  # the run's watchdog reads it
    root = ["--runs-root", str(tmp_path / "runs")]
    r = nsa_tui("launch", "local", "--config", SMOKE, "--nproc", "1", "--name", "frozen", "--json", *root,
                "--set", "train.steps=100000", "train.save_every=100000", "train.eval_every=100000",
                "debug.slow_data_s=0.05")
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]

    def status() -> dict:
        st = nsa_tui("status", "local", rid, "--json", *root)
        assert st.stdout, st.stderr
        return json.loads(st.stdout)

    pid = None
    try:
        deadline = time.monotonic() + 120
        while True:  # training: a step beat past step 3
            out = status()
            beats = out["beats"]
            if beats and beats[0]["phase"] == "train" and beats[0]["step"] >= 3:
                break
            assert time.monotonic() < deadline, f"no training step within 120 s: {out['run']['status']}"
            time.sleep(0.5)
        pid = beats[0]["pid"]
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.time()
        deadline = time.monotonic() + 120
        while True:  # the watchdog records no_heartbeat once 5 s pass without a beat
            out = status()
            alerts = [a for a in out["alerts"] if a["kind"] == "no_heartbeat"]
            if alerts and out["heartbeat_age_s"]["0"] > 8:
                break
            assert time.monotonic() < deadline, f"no no_heartbeat alert within 120 s: {out['alerts']}"
            time.sleep(1.0)
        last = out["beats"][0]["ts"]
        age = out["heartbeat_age_s"]["0"]
        assert last <= frozen_at + 1.0  # the newest beat is from before the freeze
        assert abs(age - (time.time() - last)) < 5.0, (age, time.time() - last)  # its true age
        assert alerts[0]["severity"] == "critical" and alerts[0]["rank"] == 0 and age >= 5
        started, later = time.monotonic(), out
        while later["heartbeat_age_s"]["0"] < age + 2.0:  # the freeze goes on: the age grows with it
            assert time.monotonic() - started < 60, (age, later["heartbeat_age_s"])
            later = status()
        grown = time.monotonic() - started
        assert later["heartbeat_age_s"]["0"] - age <= grown + 5.0  # as fast as time passes, no faster
        text = nsa_tui("status", "local", rid, *root)
        assert text.returncode == cli.EXIT_UNHEALTHY, text.stdout + text.stderr
        shown = float(re.search(r"rank 0: .* heartbeat ([\d.]+) s ago", text.stdout).group(1))
        assert shown >= later["heartbeat_age_s"]["0"] and "[CRITICAL] no_heartbeat: rank 0" in text.stdout
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        nsa_tui("kill", "local", rid, "--json", *root, timeout=180)


def _delete_on_a_terminal(tmp_path: Path, rid: str, answer: str) -> tuple[int, str]:
    """``nsa-tui delete`` on a terminal (a pty for stdin, stdout and stderr), answering ``answer``
    once its question is shown; (exit code, everything it wrote)."""
    import os
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "nsa_tui.cli", "delete", "local", rid,
                             "--runs-root", str(tmp_path)], stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    seen, answered, deadline = b"", False, time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            seen += chunk
            if not answered and b"(yes/no)" in seen:
                os.write(master, answer.encode() + b"\n")
                answered = True
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert answered, seen
    return code, seen.decode(errors="replace")


@pytest.mark.parametrize("answer", ["y", "Y", " yes ", "YES"])
def test_delete_takes_y_or_yes_in_any_case(tmp_path: Path, answer: str) -> None:
    rid = "20260101-000100-old-0002"
    (tmp_path / rid).mkdir(mode=0o700)
    (tmp_path / rid / "run.json").write_text(json.dumps({"run_id": rid, "status": "finished"}))
    code, text = _delete_on_a_terminal(tmp_path, rid, answer)
    assert code == 0 and f"deleted {rid}" in text, text
    assert not (tmp_path / rid).exists()


@pytest.mark.parametrize("answer", ["n", "", "yep"])
def test_delete_keeps_the_run_on_any_other_answer(tmp_path: Path, answer: str) -> None:
    rid = "20260101-000100-old-0002"
    (tmp_path / rid).mkdir(mode=0o700)
    (tmp_path / rid / "run.json").write_text(json.dumps({"run_id": rid, "status": "finished"}))
    code, text = _delete_on_a_terminal(tmp_path, rid, answer)
    assert code == cli.EXIT_USAGE and "nothing deleted" in text, text  # not confirmed, as without a tty
    assert (tmp_path / rid).is_dir()
