"""DDP + per-block activation checkpointing gives the unchecked model's gradients; the
process-group timeout follows the phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.trainrun import REPO, SMOKE, train_env


def run_workers(worker: Path, out: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    """``worker`` under torchrun on 2 ranks (gloo); (the finished torchrun, a report naming
    each rank: torchrun's own lines, which give every failed rank's exit code or signal, then
    each rank's stderr, with faulthandler's stacks of every thread should a rank die of a
    signal). A rank that dies at teardown is a failure of the test like any other."""
    logs = out / "rank-logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--log-dir={logs}", "--redirects=3", str(worker), str(SMOKE), str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=train_env({"PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"}),
                          capture_output=True, text=True, timeout=110, start_new_session=True)
    parts = [f"torchrun exit code {proc.returncode}; its stderr:\n{proc.stderr[-3000:]}"]
    for rank_dir in sorted(logs.glob("*/attempt_*/*")):  # <log-dir>/<run>/attempt_N/<local rank>/
        err = rank_dir / "stderr.log"
        text = err.read_text(errors="replace")[-3000:] if err.is_file() else "(no stderr.log)"
        parts.append(f"--- rank {rank_dir.name} ({rank_dir.parent.name}) stderr:\n{text}")
    return proc, "\n".join(parts)


@pytest.mark.timeout(120)
def test_ddp_with_activation_checkpointing_gives_same_gradients(tmp_path: Path) -> None:
    proc, report = run_workers(Path(__file__).with_name("ddp_ckpt_worker.py"), tmp_path)
    assert proc.returncode == 0, report
    for rank in (0, 1):
        res = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert res["n_params"] > 10 and res["max_grad"] > 0
        # recomputation runs the same block on the same input: equal up to float noise
        assert res["max_abs_diff"] <= 1e-6 * max(1.0, res["max_grad"]), res
        # D.close() freed the group: gloo's threads and connections are not left to be torn down
        # during interpreter finalization, racing the other rank's exit (a SIGABRT at teardown)
        assert res["gloo_threads_after_close"] == [], (rank, res, report)


@pytest.mark.timeout(120)
def test_process_group_timeout_follows_the_phase(tmp_path: Path) -> None:
    """A peer 3 s late is waited for under the start timeout (10 s) and inside ``long()``, and
    fails the collective in steady state (1 s): the timeouts are really applied."""
    proc, report = run_workers(Path(__file__).with_name("pg_timeout_worker.py"), tmp_path)
    got = {p.name for p in tmp_path.glob("rank-*.json")}
    assert got == {"rank-0.json", "rank-1.json"}, (got, report)
    r0 = json.loads((tmp_path / "rank-0.json").read_text())
    r1 = json.loads((tmp_path / "rank-1.json").read_text())
    assert r0["start"] == r1["start"] == "ok 2", (r0, r1, report)
    assert r0["long"] == r1["long"] == "ok 2"
    assert r0["now_after_long"] == "steady"
    assert r0["steady"].startswith("failed after"), r0
    waited = float(r0["steady"].split()[2])
    assert waited < 4.0, r0  # the 1 s steady timeout, not the 10 s start one nor rank 1's exit at 6 s
