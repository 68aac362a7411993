"""nsa.syncs sees each kind of host sync on CPU, names where it came from, and leaves torch as it was."""

from __future__ import annotations

import torch

from nsa.syncs import HostSyncs, OpCounter


def test_each_kind_of_host_sync_is_recorded_with_its_caller() -> None:
    x = torch.arange(6)
    with HostSyncs() as s:
        x.tolist()  # not dispatched: seen through the wrapped method
        int(x[1])
        x[x > 2]
        torch.nonzero(x)
        torch.tensor([1, 2])
        x.to(torch.float32)  # same device: not a sync
        x + 1
    kinds = [(e.kind, e.op) for e in s.events]
    assert kinds == [("read", "Tensor.tolist"), ("read", "aten._local_scalar_dense.default"),
                     ("shape", "aten.index.Tensor (boolean mask)"), ("shape", "aten.nonzero.default"),
                     ("upload", "aten.lift_fresh.default (torch.tensor of host data)")], kinds
    assert all(e.where.startswith("tests/test_syncs.py:") for e in s.events), s.report()
    assert s.counts() == {"read": 2, "shape": 2, "upload": 1}
    assert torch.Tensor.tolist is not None and x.tolist() == [0, 1, 2, 3, 4, 5]
    with HostSyncs() as quiet:
        x.tolist()
        x.tolist()
    assert len(quiet.events) == 2 and not s.events[5:]  # the first block's record is closed


def test_code_without_syncs_records_none_and_ops_are_counted() -> None:
    x = torch.randn(4, 8)
    with HostSyncs() as s, OpCounter() as ops:
        y = torch.softmax(x @ x.T, dim=-1)
        torch.where(y > 0.5, y, 0.0).sum()
    assert not s.events, s.report()
    assert ops.ops["aten.mm.default"] == 1 and ops.total >= 5


def test_views_are_counted_but_do_not_launch() -> None:
    x = torch.randn(4, 8)
    with OpCounter() as ops:
        y = x.view(8, 4).t().unsqueeze(0)[:, 1]  # views and metadata only
    assert ops.total >= 4 and ops.launching == 0
    with OpCounter() as ops:
        (y * 2).sum()  # two ops with device work
    assert ops.launching == 2
    with OpCounter() as ops:
        torch.empty(3).fill_(1.0)  # an allocation launches nothing, its fill does
    assert ops.total == 2 and ops.launching == 1
