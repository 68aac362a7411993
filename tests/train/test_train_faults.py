"""Stop, stack dumps and injected faults under real torchrun: what the panel's alerts rely on."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.train.trainrun import beats, kill_group, metrics, run_json, run_train, start_train, wait_for

pytestmark = pytest.mark.timeout(180)
LONG = ["train.steps=100000", "train.save_every=100000", "train.eval_every=100000", "train.log_every=1"]


def last_step(run_dir: Path, rank: int) -> int:
    b = [x for x in beats(run_dir, rank) if x["source"] == "step"]
    return b[-1]["step"] if b else 0


def stack_files(run_dir: Path, rank: int) -> list[Path]:
    return sorted((run_dir / "stacks").glob(f"rank-{rank}-*.txt"))


def test_sigusr1_dumps_stacks_and_sigterm_still_saves_and_stops(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, LONG)
    try:
        wait_for(lambda: min(last_step(run_dir, 0), last_step(run_dir, 1)) >= 2, 90, "2 steps on both ranks")
        pid0 = beats(run_dir, 0)[-1]["pid"]
        os.kill(pid0, signal.SIGUSR1)
        dump = wait_for(lambda: stack_files(run_dir, 0), 15, "a stack dump of rank 0")[0]
        text = dump.read_text()
        assert text.count("most recent call first") >= 3  # main, heartbeat and data threads at least
        assert "nsa/train/" in text  # the training code's own frames
        os.killpg(proc.pid, signal.SIGTERM)  # as the agent does: the whole group
        out, _ = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    run = run_json(run_dir)
    assert run["status"] == "stopped", (run["exit_reason"], out[-3000:])
    assert "SIGTERM" in run["exit_reason"]
    step = run["step"]
    assert step >= 2
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step-{step}"
    assert (run_dir / "checkpoints" / f"step-{step}" / "meta.json").is_file()
    for rank in (0, 1):
        b = beats(run_dir, rank)
        assert b[-1]["phase"] == "done" and b[-1]["step"] == step, b[-1]
    assert "FAILED" not in out, out[-3000:]  # torchrun itself reports the TERM it got; the ranks did not fail


def test_stack_dumps_while_async_checkpoints_come_and_go_stop_nothing(tmp_path: Path) -> None:
    """Dump after dump on both ranks while async saves start and finish threads: every dump is
    written and no rank dies. faulthandler's C-level dump read the other threads' frames while
    they ran and killed a rank with SIGSEGV once in tens of dumps (a multi-host run ended before
    its kill)."""
    run_dir = tmp_path / "run"
    churn = ["train.steps=100000", "train.save_every=5", "train.eval_every=100000", "train.batch_size=1",
             "train.grad_accum=2"]
    proc = start_train(run_dir, churn, env={"NSA_THREADS": "1"})
    try:
        wait_for(lambda: min(last_step(run_dir, 0), last_step(run_dir, 1)) >= 2, 90, "2 steps on both ranks")
        pids = [beats(run_dir, r)[-1]["pid"] for r in (0, 1)]
        first = last_step(run_dir, 0)
        rounds = 0
        # dumps until 100 were written on each rank and the run went through 3 more saves meanwhile
        while rounds < 100 or last_step(run_dir, 0) < first + 15:
            for pid in pids:
                os.kill(pid, signal.SIGUSR1)
            rounds += 1
            wait_for(lambda n=rounds: proc.poll() is not None or all(len(stack_files(run_dir, r)) >= n
                                                                     for r in (0, 1)), 30, f"dump {rounds}")
            assert proc.poll() is None, f"the run ended at dump {rounds}:\n{proc.communicate()[0][-3000:]}"
        for r in (0, 1):
            for f in stack_files(run_dir, r):
                text = f.read_text()
                assert text.count("most recent call first") >= 3 and "nsa/train/" in text, (f, text)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    run = run_json(run_dir)
    assert run["status"] == "stopped" and "SIGTERM" in run["exit_reason"], (run["exit_reason"], out[-3000:])
    assert "FAILED" not in out, out[-3000:]


def test_nan_stops_every_rank_with_failed_status(tmp_path: Path) -> None:
    done = run_train(tmp_path / "run", ["train.save_every=2", "debug.nan_at_step=3", "debug.nan_rank=1"])
    assert done.rc != 0
    run = run_json(done.run_dir)
    assert run["status"] == "failed"
    reason = run["exit_reason"]
    assert "non-finite loss at step 3" in reason and "rank(s) [1]" in reason
    assert "step-2" in reason and "kept" in reason
    assert [m["step"] for m in metrics(done.run_dir)] == [1, 2]
    for rank in (0, 1):  # both ranks stopped, at the same place, saying so
        last = beats(done.run_dir, rank)[-1]
        assert last["phase"] == "failed" and last["step"] == 2
    assert (done.run_dir / "checkpoints" / "step-2" / "meta.json").is_file()


def test_crash_on_one_rank_fails_the_run_with_its_traceback(tmp_path: Path) -> None:
    done = run_train(tmp_path / "run", ["debug.crash_at_step=2", "debug.crash_rank=1"])
    assert done.rc != 0
    run = run_json(done.run_dir)
    assert run["status"] == "failed"
    assert "rank 1 failed at step 2" in run["exit_reason"], run["exit_reason"]
    assert "InjectedCrash" in run["exit_reason"] and "faults.py" in run["exit_reason"]
    assert "Traceback" in done.output
    assert beats(done.run_dir, 1)[-1]["phase"] == "failed"


def test_hang_freezes_step_while_timer_beats_continue(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    hang = ["debug.hang_at_step=2", "debug.hang_rank=1", "train.pg_timeout_s=120"]
    proc = start_train(run_dir, LONG + hang)
    try:
        def frozen() -> bool:
            b = beats(run_dir, 1)
            steps = [i for i, x in enumerate(b) if x["source"] == "step"]
            if not steps or b[steps[-1]]["step"] != 2:
                return False
            after = b[steps[-1] + 1:]
            return len(after) >= 4
        wait_for(frozen, 90, "4 timer beats of rank 1 after its step 2")
        after = [x for x in beats(run_dir, 1) if x["ts"] > 0][-4:]
        assert all(x["source"] == "timer" and x["phase"] == "train" and x["step"] == 2 for x in after), after
        assert last_step(run_dir, 1) == 2
        assert last_step(run_dir, 0) == 2  # its peer is stuck in the next collective
        assert after[-1]["ts"] - after[0]["ts"] >= 3 * 0.5 * 0.9  # beats keep coming
        pid1 = after[-1]["pid"]
        os.kill(pid1, signal.SIGUSR1)  # a hung rank still dumps its stacks
        dump = wait_for(lambda: stack_files(run_dir, 1), 15, "a stack dump of the hung rank")[0]
        assert "maybe_hang" in dump.read_text()
    finally:
        kill_group(proc)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def test_peer_of_a_hung_rank_fails_after_the_process_group_timeout(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    hang = ["debug.hang_at_step=2", "debug.hang_rank=1", "train.pg_timeout_s=4"]
    proc = start_train(run_dir, LONG + hang)
    try:
        wait_for(lambda: (run_dir / "run.json").exists() and run_json(run_dir)["status"] == "failed",
                 90, "rank 0 to give up on its hung peer")
        reason = run_json(run_dir)["exit_reason"]
        assert "rank 0 failed at step 3" in reason and "timed out" in reason, reason
        assert beats(run_dir, 0)[-1]["phase"] == "failed"
        assert last_step(run_dir, 1) == 2
    finally:
        kill_group(proc)  # the hung rank ignores SIGTERM, like a real deadlock
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def test_workers_stop_cleanly_when_torchrun_is_killed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, LONG)
    try:
        wait_for(lambda: min(last_step(run_dir, 0), last_step(run_dir, 1)) >= 2, 90, "2 steps on both ranks")
        pids = {beats(run_dir, r)[-1]["pid"] for r in (0, 1)}
        os.kill(proc.pid, signal.SIGKILL)  # torchrun only: its workers live in their own sessions
        proc.wait(timeout=10)

        def gone() -> bool:
            return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                           for p in pids)
        wait_for(gone, 60, "the orphaned workers to exit")
    finally:
        kill_group(proc)
    run = run_json(run_dir)
    assert run["status"] == "stopped" and "SIGTERM" in run["exit_reason"], run["exit_reason"]
    assert (run_dir / "checkpoints" / f"step-{run['step']}" / "meta.json").is_file()
