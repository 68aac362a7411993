"""DDP + per-block activation checkpointing gives the unchecked model's gradients (LESSONS 9)."""

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
