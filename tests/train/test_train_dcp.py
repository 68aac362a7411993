"""Sharded checkpoints (DCP): every rank writes its shard, resume on any world size, async
saves, interrupted saves, a different model refused, old single-file checkpoints, and a
tampered index refused. Real nsa-train runs (torchrun, gloo on CPU)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from tests.train.trainrun import metrics, read_jsonl, run_json, run_train

pytestmark = pytest.mark.timeout(300)

# 2 ranks x batch 1 x accumulation 3 = global batch 6: divisible on 1, 2, 3 and 6 ranks
BASE = ["train.batch_size=1", "train.grad_accum=3", "train.steps=6", "train.save_every=3",
        "debug.record_rank_state=true"]


def debug(run_dir: Path, rank: int, key: str) -> list:
    return [x[key] for x in read_jsonl(run_dir / "debug" / f"rank-{rank}.jsonl") if key in x]


def losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run_dir)}


@pytest.fixture(scope="module")
def two_rank_async(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 ranks, async saves: step 3 written in the background while training goes on."""
    done = run_train(tmp_path_factory.mktemp("dcp") / "run", BASE + ["train.checkpoint_async=true"])
    assert done.rc == 0, done.output[-3000:]
    return done.run_dir


def test_every_rank_writes_its_shard_and_meta_json_is_last(two_rank_async: Path) -> None:
    ck = two_rank_async / "checkpoints"
    assert (ck / "latest").read_text().strip() == "step-6"
    step3 = ck / "step-3"
    names = sorted(p.name for p in step3.iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.json"], names
    meta = json.loads((step3 / "meta.json").read_text())
    assert meta["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (meta["step"], meta["world_size"], meta["global_batch"]) == (3, 2, 6)
    assert set(meta["data_positions"]) == {"0", "1"}  # each rank's stream position
    assert not [p for p in ck.iterdir() if p.name.startswith(".tmp")]
    assert run_json(two_rank_async)["pg_timeouts"] == {"start_s": 1800.0, "steady_s": 60.0}


def test_async_checkpoint_resumes_on_one_rank_exactly(two_rank_async: Path, tmp_path: Path) -> None:
    """The async save copied step 3's state before training went on: a 1-rank resume from it
    trains steps 4-6 like the uninterrupted run (same sequences, other reduction order)."""
    done = run_train(tmp_path / "one", BASE, nproc=1, resume=str(two_rank_async / "checkpoints" / "step-3"))
    assert done.rc == 0, done.output[-3000:]
    assert "grad_accum 3 -> 6 keeps the global batch of 6 sequences" in done.output
    got, want = losses(done.run_dir), losses(two_rank_async)
    assert sorted(got) == [4, 5, 6]
    for step in (4, 5, 6):
        assert got[step] == pytest.approx(want[step], rel=1e-5), f"step {step}"


def test_two_rank_checkpoint_resumes_on_three_ranks(tmp_path: Path) -> None:
    """DCP reshards 2 -> 3; the 3 ranks load the same parameters as the final 2-rank ones."""
    src = tmp_path / "two"
    first = run_train(src, BASE + ["debug.stop_at_step=3"])
    assert first.rc == 0, first.output[-3000:]
    saved = debug(src, 0, "param_digest")[-1]
    three = run_train(tmp_path / "three", BASE, nproc=3, resume=str(src))
    assert three.rc == 0, three.output[-3000:]
    assert "grad_accum 3 -> 2 keeps the global batch of 6 sequences" in three.output
    loaded = [debug(three.run_dir, r, "param_digest")[0] for r in range(3)]
    assert loaded == [saved] * 3
    assert sorted(losses(three.run_dir)) == [4, 5, 6]
    assert run_json(three.run_dir)["status"] == "finished"


def test_fsdp2_shards_reshard_from_two_ranks_to_three(tmp_path: Path) -> None:
    src = tmp_path / "fsdp2"
    sets = BASE + ["train.strategy=fsdp", "train.checkpoint_async=false"]  # the synchronous path
    first = run_train(src, sets + ["debug.stop_at_step=3"])
    assert first.rc == 0, first.output[-3000:]
    saved = debug(src, 0, "param_digest")[-1]
    three = run_train(tmp_path / "three", sets, nproc=3, resume=str(src))
    assert three.rc == 0, three.output[-3000:]
    assert [debug(three.run_dir, r, "param_digest")[0] for r in range(3)] == [saved] * 3
    assert run_json(three.run_dir)["status"] == "finished"


def test_interrupted_save_never_becomes_latest(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = ["train.steps=4", "train.save_every=2", "train.eval_every=100"]
    died = run_train(run_dir, sets + ["debug.die_in_save_at_step=4"], nproc=None)
    assert died.rc != 0 and "dying before the commit" in died.output
    ck = run_dir / "checkpoints"
    assert (ck / "latest").read_text().strip() == "step-2"
    assert not (ck / "step-4").exists()
    tmp = [p for p in ck.iterdir() if p.name.startswith(".tmp-step-4-")]
    assert len(tmp) == 1 and (tmp[0] / "__0_0.distcp").is_file()  # written, never committed
    again = run_train(run_dir, sets, nproc=None, resume="auto")
    assert again.rc == 0, again.output[-3000:]
    assert "at step 2" in again.output
    assert (ck / "latest").read_text().strip() == "step-4"
    assert not [p for p in ck.iterdir() if p.name.startswith(".tmp")]  # the next save cleaned up


def test_a_checkpoint_of_another_model_is_refused_naming_the_keys(tmp_path: Path) -> None:
    src = run_train(tmp_path / "a", ["train.steps=2", "train.save_every=2"], nproc=None)
    assert src.rc == 0, src.output[-3000:]
    other = run_train(tmp_path / "b", ["train.steps=4", "model.dim=48", "model.ffn_hidden=96"], nproc=None,
                      resume=str(tmp_path / "a"))
    assert other.rc != 0
    reason = run_json(other.run_dir)["exit_reason"]
    assert "another model config" in reason and "model.dim: 32 -> 48" in reason, reason
    assert "model.ffn_hidden: 64 -> 96" in reason
    # the attention backend does not change the weights: not a difference
    same = run_train(tmp_path / "c", ["train.steps=3", "model.attention.backend=reference"], nproc=None,
                     resume=str(tmp_path / "a"))
    assert same.rc == 0, same.output[-3000:]


def test_tampered_index_is_refused_not_run(tmp_path: Path) -> None:
    from nsa.train.checkpoint import CheckpointError, SafeReader

    src = run_train(tmp_path / "a", ["train.steps=1", "train.save_every=1"], nproc=None)
    assert src.rc == 0, src.output[-3000:]
    ckpt = tmp_path / "a" / "checkpoints" / "step-1"
    SafeReader(str(ckpt)).read_metadata()  # the real index reads fine
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):  # what a crafted .metadata would run under plain pickle.load
            import os
            return (os.system, (f"touch {marker}",))

    (ckpt / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(CheckpointError, match="refusing to load"):
        SafeReader(str(ckpt)).read_metadata()
    assert not marker.exists()


def test_a_damaged_shard_is_refused_with_the_checkpoint_named(tmp_path: Path) -> None:
    """A shard cut short (a full disk, a copy interrupted) ends the resume with the checkpoint's
    path in run.json's exit reason, not a traceback of DCP internals."""
    src = run_train(tmp_path / "a", ["train.steps=1", "train.save_every=1"], nproc=None)
    assert src.rc == 0, src.output[-3000:]
    ckpt = tmp_path / "a" / "checkpoints" / "step-1"
    shard = ckpt / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])
    again = run_train(tmp_path / "b", ["train.steps=2"], nproc=None, resume=str(tmp_path / "a"))
    assert again.rc != 0
    reason = run_json(again.run_dir)["exit_reason"]
    assert f"{ckpt}: cannot load" in reason, reason


def test_single_file_checkpoint_of_an_earlier_version_still_resumes(tmp_path: Path) -> None:
    """A run written before DCP (state.pt, ranks.pt) resumes; read with weights_only=True."""
    import torch

    from nsa.config import load_config, to_dict
    from nsa.train import distributed as D
    from nsa.train.checkpoint_legacy import save_single_file
    from nsa.train.faults import StopFlag
    from nsa.train.telemetry import Heartbeat, ensure_run_dir
    from nsa.train.trainer import Trainer, param_digest
    from tests.train.trainrun import SMOKE

    cfg = load_config(SMOKE, ["train.device=cpu"])
    run_dir = ensure_run_dir(tmp_path / "old")
    info = D.init(cfg.train, run_dir, torch.device("cpu"))
    try:
        hb = Heartbeat(run_dir, "old", 0, 0, 1, D.device_record(torch.device("cpu")), 10.0)
        trainer = Trainer(cfg, run_dir, info, hb, StopFlag(), None, None, lambda msg: None)
        trainer.setup()
        trainer.train_step()
        meta = {"tokens": trainer.tokens, "world_size": 1, "grad_accum": 1, "batch_size": 2,
                "global_batch": 2, "seq_len": 64, "n_streams": 1, "step": 1, "config": to_dict(cfg),
                "strategy": "ddp",
                "data_positions": {str(s): vars(p) for s, p in trainer.positions.items()}}
        save_single_file(run_dir / "checkpoints" / "step-1", trainer.model, trainer.optimizer, meta, True)
        saved = param_digest(trainer.model)
        trainer.finish()
    finally:
        D.close()
    ckpt = run_dir / "checkpoints" / "step-1"
    assert sorted(p.name for p in ckpt.iterdir()) == ["meta.json", "ranks.pt", "state.pt"]
    done = run_train(tmp_path / "new", ["train.steps=2", "debug.record_rank_state=true"], nproc=None,
                     resume=str(ckpt))
    assert done.rc == 0, done.output[-3000:]
    assert "single-file checkpoint of an earlier version" in done.output
    assert debug(done.run_dir, 0, "param_digest")[0] == saved
    assert sorted(losses(done.run_dir)) == [2]


def test_a_crash_right_after_an_async_save_keeps_that_checkpoint(tmp_path: Path) -> None:
    """Rank 1 fails one step after an async save began: the failing rank finishes the write with
    its healthy peer before it exits, so the checkpoint is committed and resumable."""
    sets = ["train.save_every=3", "train.eval_every=100", "train.checkpoint_async=true",
            "debug.crash_at_step=4", "debug.crash_rank=1"]
    done = run_train(tmp_path / "run", sets)
    assert done.rc != 0 and run_json(done.run_dir)["status"] == "failed"
    ck = done.run_dir / "checkpoints"
    assert (ck / "latest").read_text().strip() == "step-3"
    assert json.loads((ck / "step-3" / "meta.json").read_text())["files"] == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]
