"""DDP + per-block activation checkpointing gives the unchecked model's gradients; the
process-group timeout follows the phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.trainrun import REPO, SMOKE, train_env


@pytest.mark.timeout(120)
def test_ddp_with_activation_checkpointing_gives_same_gradients(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("ddp_ckpt_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(worker), str(SMOKE), str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=train_env({"PYTHONPATH": str(REPO)}), capture_output=True,
                          text=True, timeout=110, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        res = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert res["n_params"] > 10 and res["max_grad"] > 0
        # recomputation runs the same block on the same input: equal up to float noise
        assert res["max_abs_diff"] <= 1e-6 * max(1.0, res["max_grad"]), res


@pytest.mark.timeout(120)
def test_process_group_timeout_follows_the_phase(tmp_path: Path) -> None:
    """A peer 3 s late is waited for under the start timeout (10 s) and inside ``long()``, and
    fails the collective in steady state (1 s): the timeouts are really applied."""
    worker = Path(__file__).with_name("pg_timeout_worker.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(worker), str(SMOKE), str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=train_env({"PYTHONPATH": str(REPO)}), capture_output=True,
                          text=True, timeout=110, start_new_session=True)
    got = {p.name for p in tmp_path.glob("rank-*.json")}
    assert got == {"rank-0.json", "rank-1.json"}, (got, proc.stderr[-3000:])
    r0 = json.loads((tmp_path / "rank-0.json").read_text())
    r1 = json.loads((tmp_path / "rank-1.json").read_text())
    assert r0["start"] == r1["start"] == "ok 2", (r0, r1, proc.stderr[-2000:])
    assert r0["long"] == r1["long"] == "ok 2"
    assert r0["now_after_long"] == "steady"
    assert r0["steady"].startswith("failed after"), r0
    waited = float(r0["steady"].split()[2])
    assert waited < 4.0, r0  # the 1 s steady timeout, not the 10 s start one nor rank 1's exit at 6 s
