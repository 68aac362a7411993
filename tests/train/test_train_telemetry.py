"""Run-directory writers and checkpoint discovery, in process (no torchrun needed)."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

from nsa.train.checkpoint import find_latest, prune, resolve
from nsa.train.telemetry import Heartbeat, RunRecord, ensure_run_dir, write_json_atomic


def test_heartbeat_thread_beats_on_time_in_every_phase(tmp_path: Path) -> None:
    rd = ensure_run_dir(tmp_path / "run")
    assert stat.S_IMODE(rd.stat().st_mode) == 0o700
    hb = Heartbeat(rd, "rid", 1, 1, 2, {"type": "cpu", "index": None, "uuid": None}, interval_s=0.1)
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
    rec = RunRecord(tmp_path, {"run_id": "r"})
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "starting"
    rec.update(status="failed", exit_reason="boom")
    data = json.loads((tmp_path / "run.json").read_text())
    assert (data["status"], data["exit_reason"], data["run_id"]) == ("failed", "boom", "r")


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
