"""The CLI for people: runs table within 100 columns, runs named by prefix or name, status while a
run boots, and a closed stdout (``| head``) without a traceback. Real subprocesses against the
local agent over run directories written as the trainer and the agent write them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsa.contract import (
    AttentionOps,
    Beat,
    EpochMetric,
    EvalMetric,
    JsonlWriter,
    LaunchInfo,
    Phase,
    RunInfo,
    RunStatus,
    RunStatusReport,
    RunView,
    SelfCheck,
    TrainMetric,
)
from nsa.contract import write_json_atomic as write_json
from nsa_tui.cli import main as cli
from nsa_tui.cli.runref import RunRefError, resolve, short_ids
from nsa_tui.cli.text import LineSplitter, runs_table, status_text

NOW = 1_800_000_000.0


def view(run_id: str, name: str, status: str = "finished", created: float = NOW - 3600, **info) -> RunView:
    return RunView(run_id=run_id, dir=f"/r/{run_id}", name=name, status=RunStatus(status),
                   info=RunInfo(run_id=run_id, name=name, **info), created=created)


LONG_NAME = "nsa-125m-with-a-long-descriptive-name-fallback"
RUNS = [view("20261123-101500-nsa-125m-fallback-resume-9f3a", LONG_NAME, "running", NOW - 90,
             step=1_234_567, total_steps=10_000_000, world_size=8, param_count=124_900_000),
        view("20261123-101500-nsa-125m-77c1", "nsa-125m", world_size=2),
        view("20261122-080000-demo-0b48", "demo", created=NOW - 2 * 86400),
        view("20261121-080000-demo-aa01", "demo", created=NOW - 3 * 86400)]


def test_log_chunks_cut_anywhere_give_whole_lines_once() -> None:
    text = "step 1 loss 5.1\nstep 2 loss 4.9\nno newline at the end"
    for cut in range(len(text) + 1):
        split = LineSplitter()
        lines = split.feed(text[:cut]) + split.feed(text[cut:]) + split.feed("", final=True)
        assert lines == text.split("\n"), cut


def test_runs_table_fits_100_columns_with_short_ids_and_age() -> None:
    text = runs_table(RUNS, NOW)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, text
    assert lines[0].split()[:3] == ["RUN", "AGE", "NAME"]
    short = [line.split()[0] for line in lines[1:]]
    assert short[2] == "20261122-080000" and short[0].startswith("20261123-101500-n")
    for s, r in zip(short, RUNS):  # each short id names exactly its run
        assert resolve(s, RUNS) == r.run_id
    assert lines[1].split()[1] == "1m30s" and lines[3].split()[1] == "2d00h"
    name = lines[1].split()[2]  # cut in the middle: its start and its end stay
    assert name.startswith("nsa-125m-w") and name.endswith("-fallback") and "…" in name
    assert "None" not in text


def test_a_run_by_id_prefix_or_name_and_ambiguity_lists_the_matches() -> None:
    assert resolve("20261122", RUNS) == "20261122-080000-demo-0b48"
    assert resolve("nsa-125m", RUNS) == "20261123-101500-nsa-125m-77c1"  # by name
    with pytest.raises(RunRefError) as exc:
        resolve("demo", RUNS)
    assert exc.value.code == "ambiguous_run"
    msg = exc.value.message
    assert "20261122-080000-demo-0b48" in msg and "20261121-080000-demo-aa01" in msg
    with pytest.raises(RunRefError) as exc:
        resolve("20261123-1015", RUNS)
    assert exc.value.code == "ambiguous_run" and len(exc.value.matches) == 2
    with pytest.raises(RunRefError) as exc:
        resolve("nothing", RUNS)
    assert exc.value.code == "no_such_run"
    assert short_ids(["a-1", "a-2"], minimum=1) == {"a-1": "a-1", "a-2": "a-2"}


def test_status_of_a_booting_run_prints_no_none() -> None:
    """Before run.json exists the agent's view is synthesised from launch.json: total steps, batch and
    parameters are unknown. Say it is booting (and in which phase, for how long), not None/None."""
    launch = LaunchInfo(run_id="20261123-101500-x-0001", name="x", created=NOW - 12, nproc=2)
    v = RunView(run_id=launch.run_id, dir="/r", name="x", status=RunStatus.STARTING, alive=True,
                launch=launch, info=RunInfo(run_id=launch.run_id, name="x", world_size=2),
                created=launch.created)
    text = status_text(RunStatusReport(run=v), [], NOW, 0.0)
    assert "None" not in text and "?" not in text
    assert "status=starting" in text and "step=0 " in text and "world=2" in text
    assert "(booting for 12s: no heartbeat yet)" in text
    beat = Beat(ts=NOW - 1, run_id=v.run_id, rank=0, phase=Phase.DATA, phase_since=NOW - 7)
    text = status_text(RunStatusReport(run=v, beats=[beat]), [], NOW, 0.0)
    assert "rank 0: step 0 phase data for 7s, heartbeat 1.0 s ago" in text
    assert "latest:" not in text  # no step logged yet: nothing to say where training stands


# three steps of 1,000, 1,500 and 1,000 tokens in 2 s: 1,750 tokens/s (the steps' mean would say 2,000)
PROGRESS = [TrainMetric(ts=NOW + 1, step=1, loss=5.25, tokens=1000, tokens_per_s=1000.0, step_time_s=1.0),
            EvalMetric(ts=NOW + 1.5, step=1, val_loss=5.5),
            TrainMetric(ts=NOW + 2, step=2, loss=4.75, tokens=2500, tokens_per_s=3000.0, step_time_s=0.5),
            TrainMetric(ts=NOW + 3, step=3, loss=4.5, tokens=3500, tokens_per_s=2000.0, step_time_s=0.5),
            EpochMetric(ts=NOW + 3, step=3, epoch=1)]
PROGRESS_LINE = ("  latest: step 3 loss 4.5, 1,750 tokens/s over the last 3 steps (667 ms/step), "
                 "val_loss 5.5 at step 1\n")


def test_status_says_where_training_stands(tmp_path: Path) -> None:
    """``status`` gives the newest loss, the recent steps' throughput (their tokens over their
    time) and the newest validation loss from the run's metric lines, through the real agent."""
    rid = "20261122-080000-demo-0b48"
    finished_run(tmp_path, rid, "demo")
    w = JsonlWriter(tmp_path / rid / "metrics.jsonl")
    for m in PROGRESS:
        w.write(m)
    w.close()
    r = nsa_tui("status", "local", rid, "--runs-root", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert PROGRESS_LINE in r.stdout, r.stdout
    one = [TrainMetric(ts=NOW, step=7, loss=3.0, tokens_per_s=512.0, step_time_s=0.25)]
    text = status_text(RunStatusReport(run=view(rid, "demo"), recent_metrics=one), [], NOW, 0.0)
    assert "  latest: step 7 loss 3, 512 tokens/s over the last step (250 ms/step)\n" in text + "\n"
    untimed = [TrainMetric(ts=NOW, step=7, loss=3.0)]  # an older trainer's line: loss only
    text = status_text(RunStatusReport(run=view(rid, "demo"), recent_metrics=untimed), [], NOW, 0.0)
    assert "  latest: step 7 loss 3\n" in text + "\n"


# -- real subprocesses --------------------------------------------------------------------------
def nsa_tui(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], capture_output=True, text=True,
                          timeout=120, **kw)


def finished_run(root: Path, run_id: str, name: str, log_lines: int = 10) -> None:
    d = root / run_id
    d.mkdir(mode=0o700, parents=True)
    write_json(d / "run.json", RunInfo(run_id=run_id, name=name, status=RunStatus.FINISHED, step=5,
                                              total_steps=5, started_at=time.time() - 60))
    (d / "train.log").write_text("".join(f"line {i} " + "x" * 100 + "\n" for i in range(log_lines)))


def test_runs_of_an_empty_root_says_where_it_looked(tmp_path: Path) -> None:
    """No runs (a mistyped ``--runs-root``, a fresh host): ``runs`` names the runs root it read
    and the host, not a bare header; ``--json`` is the empty list; archived runs are counted."""
    root = tmp_path / "no-such-root"
    r = nsa_tui("runs", "local", "--runs-root", str(root))
    assert r.returncode == 0 and r.stdout.startswith(f"no runs in {root} on "), r.stdout + r.stderr
    r = nsa_tui("runs", "local", "--runs-root", str(root), "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout + r.stderr
    finished_run(tmp_path, "20261122-080000-demo-0b48", "demo")
    assert nsa_tui("archive", "local", "demo", "--runs-root", str(tmp_path)).returncode == 0
    r = nsa_tui("runs", "local", "--runs-root", str(tmp_path))
    assert r.stdout.startswith(f"no runs in {tmp_path} on ") and "(1 archived: --all lists them)" in r.stdout


def test_commands_take_a_prefix_or_a_name(tmp_path: Path) -> None:
    finished_run(tmp_path, "20261122-080000-demo-0b48", "demo")
    finished_run(tmp_path, "20261121-080000-demo-aa01", "demo")
    finished_run(tmp_path, "20261120-080000-other-cc02", "other")
    root = ["--runs-root", str(tmp_path)]
    r = nsa_tui("status", "local", "20261122", *root, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["run"]["run_id"] == "20261122-080000-demo-0b48"
    r = nsa_tui("logs", "local", "other", *root)
    assert r.returncode == 0 and r.stdout.startswith("line 0 ")
    r = nsa_tui("status", "local", "demo", *root)
    assert r.returncode == cli.EXIT_USAGE and "matches 2 runs" in r.stderr
    assert "20261121-080000-demo-aa01" in r.stderr and "20261122-080000-demo-0b48" in r.stderr
    r = nsa_tui("kill", "local", "nosuchrun", *root, "--json")
    assert r.returncode == cli.EXIT_NO_RUN and json.loads(r.stdout)["error"]["code"] == "no_such_run"
    r = nsa_tui("runs", "local", *root)
    assert r.returncode == 0 and max(len(x) for x in r.stdout.splitlines()) <= 100


@pytest.mark.parametrize("args", [["runs"], ["status", "demo"], ["logs", "demo"], ["logs", "demo", "-f"]],
                         ids=["runs", "status", "logs", "logs-f"])
@pytest.mark.parametrize("json_out", [True, False], ids=["json", "text"])
def test_a_closed_stdout_ends_quietly(tmp_path: Path, args: list[str], json_out: bool) -> None:
    """`nsa-tui status ... --json | head`: the reader is gone before the output is written."""
    finished_run(tmp_path, "20261122-080000-demo-0b48", "demo", log_lines=2000)
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write fails with EPIPE
    try:
        r = subprocess.run([sys.executable, "-m", "nsa_tui.cli", args[0], "local", *args[1:],
                            "--runs-root", str(tmp_path), *(["--json"] if json_out else [])],
                           stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode == cli.EXIT_PIPE and r.stderr == ""


REASON = ("Triton self-check failed on cuda (bfloat16): selected_attention: out differs from the "
          "reference by 0.92 (tolerance 0.02)")


@pytest.mark.parametrize("ops, shown", [
    (AttentionOps(requested="auto", backend="reference", fallback_reason=REASON,
                  self_check=SelfCheck(ok=False, device="cuda", dtype="bfloat16",
                                       ops=["selected_attention"], failures=["selected_attention: out ..."])),
     f"attention: reference (FALLBACK from auto, far slower: {REASON})"),
    (AttentionOps(requested="auto", backend="triton",
                  self_check=SelfCheck(ok=True, device="cuda", dtype="bfloat16")),
     "attention: triton (self-check passed on cuda, bfloat16)"),
    (AttentionOps(requested="auto", backend="reference"), "attention: reference (requested auto)"),
    (AttentionOps(requested="sdpa", backend="sdpa",
                  self_check=SelfCheck(ok=True, device="cuda", dtype="bfloat16", ops=["apply_rope"])),
     "attention: sdpa (RoPE kernel checked on cuda, bfloat16)"),
    (AttentionOps(requested="sdpa", backend="sdpa",
                  self_check=SelfCheck(ok=False, device="cuda", dtype="bfloat16", ops=["apply_rope"],
                                       failures=["apply_rope: out not written"])),
     "attention: sdpa (RoPE on torch's formula, its kernel failed the check: apply_rope: out not written)"),
], ids=["fallback", "triton", "reference-off-cuda", "dense", "dense-rope-failed"])
def test_status_names_the_attention_ops_and_why_a_run_fell_back(tmp_path: Path, ops: AttentionOps,
                                                                 shown: str) -> None:
    """What the panel's summary shows (the ops the run trains on, a fallback's reason), ``status``
    says too: in its text and in its JSON (the run's ``attention_ops``, as run.json has it)."""
    rid = "20261122-080000-demo-0b48"
    finished_run(tmp_path, rid, "demo")
    info = RunInfo(run_id=rid, name="demo", status=RunStatus.FINISHED, step=5, total_steps=5,
                   started_at=time.time() - 60, attention_ops=ops)
    write_json(tmp_path / rid / "run.json", info)
    r = nsa_tui("status", "local", rid, "--runs-root", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert f"  {shown}\n" in r.stdout + "\n", r.stdout
    r = nsa_tui("status", "local", rid, "--runs-root", str(tmp_path), "--json")
    got = json.loads(r.stdout)["run"]["info"]["attention_ops"]
    assert got["backend"] == ops.backend and got["requested"] == ops.requested
    assert got["fallback_reason"] == ops.fallback_reason


def test_status_detects_a_hand_runs_alerts_with_this_machines_thresholds(tmp_path: Path) -> None:
    """A run started by hand has no watchdog: ``status`` runs the alert rules itself, with the
    ``alerts:`` thresholds of this machine's settings (the defaults when there are none, or when
    the file does not read). A live rank (a real process of the run) whose last beat is 15 s
    old: past a 10 s ``no_heartbeat_s``, within the default 30 s."""
    from tests.handrun import RID, hand_run, write_beat

    with hand_run(tmp_path) as rank:

        def status(settings: str | None) -> subprocess.CompletedProcess[str]:
            write_beat(tmp_path, rank, 15)  # 15 s old as each command starts
            path = tmp_path / "settings.yaml"
            if settings is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(settings)
            return nsa_tui("status", "local", RID, "--runs-root", str(tmp_path),
                           env=dict(os.environ, NSA_TUI_SETTINGS=str(path)))

        for settings in (None, "alerts:\n  no_heartbeat_s: 60\n", "alerts: {no_heartbeat: 10}\n"):
            r = status(settings)  # the defaults, a looser threshold, a typo (so the defaults)
            assert r.returncode == cli.EXIT_OK, (settings, r.stdout, r.stderr)
            assert "status=running" in r.stdout and "no_heartbeat" not in r.stdout, (settings, r.stdout)
        r = status("alerts:\n  no_heartbeat_s: 10\n")
        assert r.returncode == cli.EXIT_UNHEALTHY, r.stdout + r.stderr
        assert "[CRITICAL] no_heartbeat: rank 0" in r.stdout, r.stdout


def test_status_of_a_run_over_several_hosts_names_its_attention_ops() -> None:
    """Over several hosts the text is rank 0's host's view of run.json: its ops (all ranks run the same)."""
    from nsa_tui.cli.multi import _text_of
    from nsa_tui.hosts.merge import MergedRun

    ops = AttentionOps(requested="auto", backend="reference", fallback_reason=REASON)
    info = RunInfo(run_id="20261122-080000-demo-0b48", name="demo", world_size=4, attention_ops=ops)
    merged = MergedRun(run_id=info.run_id, name="demo", status=RunStatus.RUNNING, hosts=["gpu1", "gpu2"],
                       primary="gpu1", info=info, ranks=[], lost={})
    text = _text_of(merged, NOW, [])
    assert f"\n  attention: reference (FALLBACK from auto, far slower: {REASON})" in text
    assert "latest:" not in text
    assert PROGRESS_LINE in _text_of(merged, NOW, [], metrics=PROGRESS) + "\n"  # rank 0's host's lines
