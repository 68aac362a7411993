"""The resume rules (nsa/train/resume.py) on their own: no process group, no checkpoint on disk.

The end-to-end resumes (two ranks to one and to three, with the parameters compared) are in
test_train_dcp.py; these pin each rule and each refusal's message quickly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nsa.config import Config, load_config, to_dict
from nsa.contract import CheckpointMeta
from nsa.train import resume
from nsa.train.checkpoint import CheckpointError
from nsa.train.data import StreamPos
from tests.train.trainrun import SMOKE

PATH = Path("/runs/r/checkpoints/step-8")


def config(*sets: str) -> Config:
    return load_config(SMOKE, ["train.batch_size=2", "train.grad_accum=1", *sets])


def meta(cfg: Config, world: int, accum: int, **kw: object) -> CheckpointMeta:
    positions = {str(s): {"epoch": 0, "doc": 10 + s, "offset": 3 if s == 0 else 0} for s in range(world)}
    fields: dict = dict(step=8, tokens=1024, world_size=world, grad_accum=accum, batch_size=2,
                        global_batch=2 * world * accum, seq_len=cfg.train.seq_len, n_streams=world,
                        data_positions=positions, config=to_dict(cfg))
    fields.update(kw)
    return CheckpointMeta(**fields)


def test_same_world_keeps_the_layout_and_the_positions_without_a_note() -> None:
    cfg = config()
    m = meta(cfg, world=2, accum=1)
    plan = resume.layout(PATH, m, cfg, world=2, rank=1)
    assert (plan.grad_accum, plan.n_streams, plan.micro_per_stream, plan.reshard) == (1, 2, 1, False)
    assert plan.note is None
    positions, said = resume.positions(m, plan)
    assert positions == {0: StreamPos(0, 10, 3), 1: StreamPos(0, 11, 0)} and said is None


def test_fewer_ranks_keep_the_global_batch_and_read_every_saved_stream() -> None:
    cfg = config()
    plan = resume.layout(PATH, meta(cfg, world=2, accum=1), cfg, world=1, rank=0)
    assert (plan.grad_accum, plan.n_streams, plan.micro_per_stream, plan.reshard) == (2, 2, 1, False)
    assert plan.note == ("resuming a 2-rank checkpoint on 1 rank(s): grad_accum 1 -> 2 keeps the global "
                         "batch of 4 sequences")


def test_a_world_that_does_not_divide_the_streams_reshards_without_replaying() -> None:
    cfg = config()
    m = meta(cfg, world=2, accum=3)  # global batch 12 = 2 x 3 ranks x 2
    plan = resume.layout(PATH, m, cfg, world=3, rank=2)
    assert (plan.grad_accum, plan.n_streams, plan.micro_per_stream, plan.reshard) == (2, 3, 2, True)
    positions, said = resume.positions(m, plan)
    # the furthest document reached: stream 1 at doc 11 (11*2+1 = 23), so every new stream starts past it
    assert positions == {s: StreamPos(0, 8, 0) for s in range(3)}
    assert said is not None and "re-sharding into 3 streams starting at document 8" in said


@pytest.mark.parametrize(("change", "message"), [
    ({"batch_size": 4}, "saved with train.batch_size=4, this run has 2; resume needs the same value"),
    ({"seq_len": 7}, "saved with train.seq_len=7"),
])
def test_a_different_batch_or_sequence_length_is_refused(change: dict, message: str) -> None:
    cfg = config()
    with pytest.raises(CheckpointError, match=message):
        resume.layout(PATH, meta(cfg, world=2, accum=1, **change), cfg, world=2, rank=0)


def test_a_global_batch_that_does_not_divide_over_the_world_is_refused() -> None:
    cfg = config()
    with pytest.raises(CheckpointError, match=r"global batch 4 is not a multiple of batch_size 2 x world 3"):
        resume.layout(PATH, meta(cfg, world=2, accum=1), cfg, world=3, rank=0)


def test_another_model_is_refused_before_anything_else() -> None:
    cfg = config()
    other = config("model.n_layers=3")
    with pytest.raises(CheckpointError, match="another model config"):
        resume.layout(PATH, meta(other, world=2, accum=1, batch_size=9), cfg, world=2, rank=0)
