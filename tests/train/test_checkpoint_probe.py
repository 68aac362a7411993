"""The start-up checkpoint probe: before the first step, a real save, commit and load through the
run's own checkpoint code, on one process and on two (DDP and FSDP2, blocking and async), against
real directories; a checkpoint path that does not work ends the run before step 1, naming torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train.trainrun import REPO, metrics, run_json, run_train, train_env

pytestmark = pytest.mark.timeout(300)
WORKER = Path(__file__).with_name("probe_worker.py")


def probe(tmp_path: Path, root: Path, strategy: str, mode: str, nproc: int | None) -> list[dict]:
    out = tmp_path / "out"
    out.mkdir()
    launch = [sys.executable] if nproc is None else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run([*launch, str(WORKER), str(root), strategy, mode, str(out)], cwd=REPO,
                          env=train_env({"PYTHONPATH": str(REPO)}), capture_output=True, text=True,
                          timeout=240, start_new_session=True)
    ranks = nproc or 1
    got = [out / f"rank-{r}.json" for r in range(ranks)]
    assert all(p.is_file() for p in got), (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return [json.loads(p.read_text()) for p in got]


@pytest.mark.parametrize(("strategy", "mode", "nproc"), [("ddp", "async", None), ("fsdp", "blocking", 2),
                                                         ("ddp", "async", 2)])
def test_the_probe_saves_commits_and_loads_then_leaves_nothing(tmp_path: Path, strategy: str, mode: str,
                                                               nproc: int | None) -> None:
    root = tmp_path / "checkpoints"
    for res in probe(tmp_path, root, strategy, mode, nproc):
        assert res["error"] is None, res
        assert not res["rng_moved"], "the probe changed the run's random numbers"
        assert res["left"] == [], res["left"]  # the scratch directory is gone, no latest written
    lines = res["lines"]  # the last rank's: every rank says it (nsa-train prints rank 0's)
    how = "an async" if mode == "async" else "a blocking"
    want = f"{how} save, commit and load proven in {root} before the first step (torch {torch.__version__}"
    assert len(lines) == 1 and want in lines[0], lines


def test_a_checkpoint_path_that_fails_is_refused_naming_torch(tmp_path: Path) -> None:
    """The run's checkpoints would go under a regular file: every rank's probe fails (none hangs)."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the checkpoints directory would be\n")
    for res in probe(tmp_path, blocker / "checkpoints", "ddp", "async", 2):
        assert res["error"] is not None, res
        assert f"checkpoints do not work on this host with torch {torch.__version__}" in res["error"]
        assert "before the first step (nothing was trained)" in res["error"]
        assert str(blocker / "checkpoints") in res["error"]


def test_nsa_train_proves_checkpoints_before_the_first_step(tmp_path: Path) -> None:
    """Through nsa-train: the probe's line comes before step 1's, and nothing of it is left."""
    done = run_train(tmp_path / "run", ["train.steps=2", "train.save_every=2"], nproc=None)
    assert done.rc == 0, done.output[-3000:]
    lines = done.output.splitlines()
    proven = [i for i, line in enumerate(lines) if "save, commit and load proven" in line]
    first_step = [i for i, line in enumerate(lines) if line.startswith("step 1/")]
    assert proven and first_step and proven[0] < first_step[0], done.output[-3000:]
    ck = done.run_dir / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step-2"]
    assert [m["step"] for m in metrics(done.run_dir)] == [1, 2]
    assert run_json(done.run_dir)["status"] == "finished"
