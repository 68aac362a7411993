"""Run-directory writers and checkpoint discovery, in process (no torchrun needed)."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

from nsa.contract import (
    Beat,
    DeviceInfo,
    Metric,
    MetricsSummary,
    RunInfo,
    TrainMetric,
    decode_lines,
    read_json,
    write_json_atomic,
)
from nsa.train.checkpoint import find_latest, prune, resolve
from nsa.train.telemetry import Heartbeat, MetricsLog, RunRecord, ensure_run_dir


def test_heartbeat_thread_beats_on_time_in_every_phase(tmp_path: Path) -> None:
    rd = ensure_run_dir(tmp_path / "run")
    assert stat.S_IMODE(rd.stat().st_mode) == 0o700
    hb = Heartbeat(rd, "rid", 1, 1, 2, DeviceInfo(), interval_s=0.1)
    hb.start()
    time.sleep(0.35)
    hb.set_phase("train")
    hb.step_beat(1)
    hb.set_phase("eval")
    time.sleep(0.35)
    hb.stop("done")
    lines = (rd / "heartbeats" / "rank-1.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]  # every line complete JSON
    assert recs[0]["phase"] == "boot" and recs[-1]["phase"] == "done"
    boot = [r for r in recs if r["phase"] == "boot"]
    assert len(boot) >= 3  # the thread kept beating while nothing else happened
    step = [r for r in recs if r["source"] == "step"]
    assert len(step) == 1 and step[0]["step"] == 1 and step[0]["phase"] == "train"
    evals = [r for r in recs if r["phase"] == "eval"]
    assert len(evals) >= 3 and all(r["step"] == 1 for r in evals)  # timer beats repeat the last step
    assert len({r["phase_since"] for r in evals}) == 1
    assert all(r["rank"] == 1 and r["local_rank"] == 1 and r["world_size"] == 2 and r["pid"] == os.getpid()
               for r in recs)


def test_json_written_atomically_and_run_record_status(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "x.json", {"a": 1})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary left behind
    rec = RunRecord(tmp_path, RunInfo(run_id="r", name="n"))
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "starting"
    rec.update(status="failed", exit_reason="boom")
    data = json.loads((tmp_path / "run.json").read_text())
    assert (data["status"], data["exit_reason"], data["run_id"]) == ("failed", "boom", "r")


def test_run_directory_files_are_private(tmp_path: Path) -> None:
    """Every file and subdirectory of a run is its user's alone (0600 / 0700), not only the top."""
    rd = ensure_run_dir(tmp_path / "run")
    hb = Heartbeat(rd, "rid", 0, 0, 1, DeviceInfo(), interval_s=10)
    hb.start()
    hb.stop("done")
    RunRecord(rd, RunInfo(run_id="rid", name="n"))
    log = MetricsLog(rd)
    log.write(TrainMetric(ts=1.0, step=1, loss=2.0))
    log.close()
    for sub in ("heartbeats", "stacks", "checkpoints"):
        assert stat.S_IMODE((rd / sub).stat().st_mode) == 0o700, sub
    for f in ("run.json", "metrics.jsonl", "metrics-summary.json", "heartbeats/rank-0.jsonl"):
        assert stat.S_IMODE((rd / f).stat().st_mode) == 0o600, f


def test_heartbeat_files_rotate_and_the_latest_beat_stays_readable(tmp_path: Path) -> None:
    from nsa.contract import last_record

    rd = ensure_run_dir(tmp_path / "run")
    hb = Heartbeat(rd, "rid", 3, 0, 4, DeviceInfo(), interval_s=100, rotate_bytes=4096)
    for step in range(1, 200):
        hb.step_beat(step)
    path = rd / "heartbeats" / "rank-3.jsonl"
    old = rd / "heartbeats" / "rank-3.jsonl.1"
    assert path.stat().st_size < 4096 and old.stat().st_size >= 4096 - 400  # bounded on disk
    beat = last_record(path, Beat)
    assert beat is not None and beat.step == 199 and beat.rank == 3
    older = decode_lines(old.read_text().splitlines(), Beat)
    assert older[-1].step + 1 == decode_lines(path.read_text().splitlines(), Beat)[0].step  # nothing lost


def test_metrics_summary_keeps_every_spike_and_nan_of_a_long_run(tmp_path: Path) -> None:
    """metrics-summary.json: bounded buckets of every series; a one-step spike is a bucket's max,
    a NaN is counted (never averaged away), and the summary covers the whole file."""
    rd = ensure_run_dir(tmp_path / "run")
    log = MetricsLog(rd, every_s=1e9)
    n = 20_000
    for step in range(1, n + 1):
        loss = 1000.0 if step == 12_345 else (float("nan") if step == 17_000 else 2.0)
        log.write(TrainMetric(ts=float(step), step=step, loss=loss, lr=1e-3))
    log.close()
    summary = read_json(rd / "metrics-summary.json", MetricsSummary)
    assert summary is not None and summary.upto_step == n and summary.lines == n
    assert summary.upto_offset == (rd / "metrics.jsonl").stat().st_size
    loss = summary.series["loss"]
    assert len(loss.buckets) <= 1024 and sum(b.n + b.bad for b in loss.buckets) == n
    spike = [b for b in loss.buckets if b.first <= 12_345 <= b.last]
    assert spike[0].hi == 1000.0 and spike[0].lo == 2.0
    assert sum(b.bad for b in loss.buckets) == 1
    lines = decode_lines((rd / "metrics.jsonl").read_text().splitlines(), Metric)
    assert len(lines) == n and lines[16_999].loss != lines[16_999].loss  # NaN read back as NaN


def test_metrics_log_continued_in_place_catches_up_on_lines_its_summary_missed(tmp_path: Path) -> None:
    rd = ensure_run_dir(tmp_path / "run")
    log = MetricsLog(rd, every_s=1e9)
    for step in range(1, 11):
        log.write(TrainMetric(ts=1.0, step=step, loss=1.0))
    log.write_summary()
    for step in range(11, 21):  # a crash before the next summary
        log.write(TrainMetric(ts=1.0, step=step, loss=1.0))
    log.writer.close()
    again = MetricsLog(rd, every_s=1e9)  # --resume auto in the same directory
    assert again.folder.upto_step == 20 and again.folder.lines == 20


def make_ckpt(root: Path, step: int, complete: bool = True) -> Path:
    p = root / f"step-{step}"
    p.mkdir(parents=True)
    (p / "state.pt").write_bytes(b"x")
    if complete:
        (p / "meta.json").write_text("{}")
    return p


def test_latest_checkpoint_ignores_incomplete_and_temporary(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    assert find_latest(root) is None
    make_ckpt(root, 2)
    make_ckpt(root, 4)
    make_ckpt(root, 6, complete=False)  # crashed while writing: no meta.json
    (root / ".tmp-step-8-1-2").mkdir()
    (root / "latest").write_text("step-2\n")  # lagging pointer: the scan finds step-4
    assert find_latest(root) == root / "step-4"
    (root / "latest").write_text("step-4\n")
    assert find_latest(root) == root / "step-4"
    assert resolve("auto", tmp_path) == root / "step-4"
    assert resolve(str(tmp_path), tmp_path / "elsewhere") == root / "step-4"
    assert resolve(None, tmp_path) is None
    make_ckpt(root, 10)
    prune(root, 2, "step-10")
    kept = sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))
    assert kept == ["step-10", "step-4", "step-6"]  # the 2 newest complete ones (+ the incomplete one)


def test_sigusr1_after_the_stack_dumper_closes_does_not_kill(tmp_path: Path) -> None:
    """Teardown: a dump request that arrives after the dumper closed is ignored, not the
    default action of SIGUSR1 (terminate), which would turn a clean exit into a signal death."""
    import signal
    import subprocess
    import sys

    code = ("import os, signal, sys, time\n"
            "from pathlib import Path\n"
            "from nsa.train.faults import StackDumper\n"
            "d = StackDumper(Path(sys.argv[1]), 0)\n"
            "d.install()\n"
            "d.close()\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "time.sleep(0.2)\n"
            "print('alive')\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "stacks")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "alive" in proc.stdout, (proc.returncode, proc.stderr[-2000:])
    assert proc.returncode != -signal.SIGUSR1


def test_launcher_as_pid_one_is_not_mistaken_for_a_dead_launcher(monkeypatch) -> None:
    """torchrun as a container's PID 1 (docker run IMAGE torchrun ..., a Kubernetes pod): the
    workers' parent IS pid 1 and alive, so they must not stop themselves at boot; a worker
    re-parented between start and prctl (its launcher died) still stops."""
    import ctypes
    import signal

    from nsa.train import faults

    class FakeLibc:
        def prctl(self, *args: int) -> int:
            return 0

    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: FakeLibc())
    sent: list[int] = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: sent.append(sig))
    monkeypatch.setattr(faults.os, "getppid", lambda: 1)
    faults.stop_when_launcher_dies(True)
    assert sent == []
    parents = iter([4242, 1])  # alive at start, then re-parented to init
    monkeypatch.setattr(faults.os, "getppid", lambda: next(parents))
    faults.stop_when_launcher_dies(True)
    assert sent == [signal.SIGTERM]
