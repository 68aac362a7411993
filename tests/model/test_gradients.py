"""Gradients reach every parameter, checkpointing changes none (docs/lessons.md#checkpoint-the-block),
and the gate shares are what the gates did."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from nsa_model_testlib import SEQ, set_gates

from nsa.model import NSAAttention


def _loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@pytest.mark.parametrize("kind,mode", [("nsa", "mlp"), ("nsa", "avgpool"), ("dense", None)])
def test_every_parameter_gets_a_nonzero_gradient(make_model, kind: str, mode) -> None:
    model = make_model(kind, **({"compress_mode": mode} if mode else {}))
    tokens = torch.randint(0, 64, (2, SEQ + 1))
    _loss(model, tokens).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name
        assert torch.isfinite(p.grad).all(), name
    for i, blk in enumerate(model.blocks):
        if not isinstance(blk.attn, NSAAttention):
            continue
        # the fused K/V projection: k and v of each of the three branches, separately
        for j, part in enumerate(blk.attn.kv_proj.weight.grad.chunk(6, dim=0)):
            assert part.abs().sum() > 0, f"block {i}: kv_proj rows of {['k', 'v'][j % 2]} branch {j // 2}"
        # the gates: every head's gate of every branch (rows are head * 3 + branch)
        rows = blk.attn.gate.weight.grad.abs().sum(dim=1).view(-1, 3)
        assert (rows > 0).all(), f"block {i}: gate rows without gradient: {rows}"


def test_activation_checkpointing_gives_the_same_gradients(make_model) -> None:
    model = make_model("nsa")
    twin = copy.deepcopy(model)
    twin.activation_checkpointing = True
    assert model.activation_checkpointing is False
    tokens = torch.randint(0, 64, (2, SEQ + 1))
    loss_a = _loss(model, tokens)
    loss_b = _loss(twin, tokens)
    loss_a.backward()
    loss_b.backward()
    torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=0)
    for (name, pa), (_, pb) in zip(model.named_parameters(), twin.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-12, atol=1e-14, msg=name)
    # the blocks differ, so a checkpoint that recomputed the wrong block would differ
    w0, w1 = (b.ffn.down.weight for b in model.blocks[:2])
    assert not torch.equal(w0, w1)


def test_gate_shares(make_model) -> None:
    dense = make_model("dense")
    dense(torch.randint(0, 64, (1, 9)))
    assert dense.gate_shares() is None
    model = make_model("nsa")
    assert torch.isnan(model.gate_shares()).all()  # no forward yet
    model(torch.randint(0, 64, (2, SEQ)))
    shares = model.gate_shares()
    assert shares.shape == (3,) and not shares.requires_grad
    torch.testing.assert_close(shares.sum(), torch.tensor(1.0))
    assert ((shares > 0.2) & (shares < 0.5)).all()  # init: sigmoid(~0) = 0.5 each, not saturated
    set_gates(model, (0.2, 0.6, 0.2))
    model(torch.randint(0, 64, (2, SEQ)))
    torch.testing.assert_close(model.gate_shares(), torch.tensor([0.2, 0.6, 0.2]))
    # layers with different gates are averaged
    model.blocks[0].attn.gate_override = (1.0, 0.0, 0.0)
    model(torch.randint(0, 64, (2, SEQ)))
    torch.testing.assert_close(model.gate_shares(), torch.tensor([1.2, 0.6, 0.2]) / 2.0)
