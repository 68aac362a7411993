"""One optimizer step in process (a one-rank gloo group, like nsa-train without torchrun)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from nsa.config import load_config
from nsa.train import distributed as D
from nsa.train.faults import StopFlag
from nsa.train.telemetry import Heartbeat, ensure_run_dir
from nsa.train.trainer import NonFiniteLoss, Trainer
from tests.train.trainrun import SMOKE


@pytest.mark.parametrize("clip", ["1.0", "0.0"])  # 0 = no clipping: the norm is still checked
def test_non_finite_gradient_with_finite_loss_stops_before_the_update(tmp_path: Path, clip: str) -> None:
    """An inf gradient (finite loss) must not reach the weights: clipping by a
    non-finite norm would turn every parameter into NaN, and the next save would keep it
    as the 'last good' checkpoint. The step stops before the update, like a NaN loss."""
    cfg = load_config(SMOKE, ["train.device=cpu", f"train.grad_clip={clip}"])
    run_dir = ensure_run_dir(tmp_path / "run")
    hb = Heartbeat(run_dir, "rid", 0, 0, 1, D.device_record(torch.device("cpu")), 10.0)
    info = D.init(cfg.train, run_dir, torch.device("cpu"))
    try:
        trainer = Trainer(cfg, run_dir, info, hb, StopFlag(), None, None, lambda msg: None)
        trainer.setup()
        try:
            trainer._start_step = 0
            loss, grad_norm = trainer.train_step()  # a normal step first
            assert torch.isfinite(torch.tensor(loss)) and torch.isfinite(grad_norm)
            raw = trainer.raw
            before = {n: p.detach().clone() for n, p in raw.named_parameters()}
            raw.blocks[0].ffn.down.weight.register_hook(lambda g: g * float("inf"))
            with pytest.raises(NonFiniteLoss, match=r"non-finite gradient norm \(nan/inf\) at step 2"):
                trainer.train_step()
            for n, p in raw.named_parameters():
                assert torch.equal(p.detach(), before[n]), f"{n} changed by a non-finite step"
            assert trainer.step == 1
        finally:
            trainer.finish()
    finally:
        dist.destroy_process_group()
