"""Gradients as views of one flat buffer (nsa/train/gradsync.py), on a one-rank gloo group: they
accumulate in place, survive the optimizer's in-place zeroing, and a gradient that left the
buffer is refused before its all-reduce would average stale memory. And the checkpoint load
these views forced a fix in: DCP creates an optimizer's state to load into only while no
parameter has a gradient, so a load without it is refused instead of restarting AdamW.
(Two ranks averaging through the trainer: test_train_distributed.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from nsa.contract import CheckpointMeta
from nsa.contract.rundir import step_name
from nsa.train.checkpoint import Checkpointer, CheckpointError, load, read_meta
from nsa.train.gradsync import FlatGrads


@pytest.fixture
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))


def test_gradients_are_views_that_accumulate_and_are_averaged(group: None) -> None:
    net, ref = model(), model()
    flat = FlatGrads(list(net.parameters()), world_size=1)
    assert flat.nbytes == sum(p.numel() for p in net.parameters()) * 4
    x = torch.randn(5, 4)
    for m in (net, ref):
        m(x).square().sum().backward()
        m(2 * x).square().sum().backward()  # accumulated: a second backward adds
    flat.average()  # one rank: the mean is itself
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert torch.equal(flat.flats[0], torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    opt = torch.optim.AdamW(net.parameters())
    opt.step()
    opt.zero_grad(set_to_none=False)  # what the trainer does with flat gradients
    assert float(flat.flats[0].abs().sum()) == 0
    net(x).sum().backward()
    assert float(flat.flats[0].abs().sum()) > 0  # still views: the backward added into the buffer
    flat.average()


def test_a_gradient_that_left_the_buffer_is_refused(group: None) -> None:
    net = model()
    flat = FlatGrads(list(net.parameters()), world_size=1)
    torch.optim.AdamW(net.parameters()).zero_grad(set_to_none=True)
    net(torch.randn(2, 4)).sum().backward()  # fresh gradients, outside the flat buffer
    with pytest.raises(RuntimeError, match=r"parameter 0 \(\(8, 4\)\) no longer has its gradient in the "
                                           r"flat buffer"):
        flat.average()


def test_rank_zeros_parameters_are_broadcast(group: None) -> None:
    net = model()
    want = [p.detach().clone() for p in net.parameters()]
    FlatGrads(list(net.parameters()), world_size=1).broadcast_parameters()
    assert all(torch.equal(p, w) for p, w in zip(net.parameters(), want))


def test_a_load_into_an_optimizer_without_state_is_refused(group: None, tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    net = model()
    opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(2, 4)).sum().backward()
    opt.step()
    ckpt = Checkpointer(tmp_path, keep=1, committer=True, use_async=False, timeout_s=30)
    meta = CheckpointMeta(step=1, tokens=0, world_size=1, grad_accum=1, batch_size=1, global_batch=1,
                          seq_len=1, n_streams=1, data_positions={}, strategy="ddp", device_type="cpu")
    ckpt.save(1, net, opt, meta, 0, cpu, block=True)
    path = tmp_path / step_name(1)
    fresh = model()
    fresh_opt = torch.optim.AdamW(fresh.parameters())
    load(path, read_meta(path), fresh, fresh_opt, 0, cpu)  # no gradients: DCP builds the state to fill
    for p, q in zip(net.parameters(), fresh.parameters()):
        torch.testing.assert_close(opt.state[p]["exp_avg"], fresh_opt.state[q]["exp_avg"])
    late = model()
    FlatGrads(list(late.parameters()), world_size=1)  # gradients that exist before the load
    with pytest.raises(CheckpointError, match="cannot restore the optimizer: it has no state to load into"):
        load(path, read_meta(path), late, torch.optim.AdamW(late.parameters()), 0, cpu)
    ckpt.close()
