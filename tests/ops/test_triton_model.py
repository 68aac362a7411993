"""The NSA model with ``attention.backend: triton`` equals the reference backend (fp32, CPU
interpreter): selection scores, logits and the gradient of every parameter, both GQA
layouts, batch > 1, a length that is a multiple of no block size. This is the
"against the reference model's branches" check end to end, through the fused
compressed-attention + scores path.

Top-n selection is discontinuous: two scores within rounding of each other (common at
init, where compressed attention is near uniform and many block scores are equal) can
be ordered differently by two correct fp32 implementations. So the triton run replays the
blocks the reference run selected (recorded per layer); the scores that led to them are
compared separately, and the fused kernel's own choice must agree with the reference's
up to such near-ties (``selection_mismatch``)."""

from __future__ import annotations

import copy
import os

import pytest
import torch

import nsa.ops.reference as R
from nsa.config import AttentionConfig, ModelConfig
from nsa.model import build_model
from nsa.ops.self_check import selection_mismatch

TOL = 1e-5


def _cfg(n_heads: int, n_kv_heads: int, backend: str) -> ModelConfig:
    acfg = AttentionConfig(kind="nsa", backend=backend, compress_block=16, compress_stride=8,
                           select_block=16, num_selected=4, num_initial=1, num_local=2, window=32)
    return ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads,
                       head_dim=16, ffn_hidden=128, attention=acfg, init_std=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, 1), (4, 2)])
def test_triton_model_matches_reference(n_heads, n_kv_heads, monkeypatch):
    import nsa.ops.triton as t_ops
    scores: dict[str, list[torch.Tensor]] = {"reference": [], "triton": []}
    chosen: list[torch.Tensor] = []
    fused_choice: list[torch.Tensor] = []

    def record(scores_, *args):  # reference run: select, remember the choice
        scores["reference"].append(scores_.detach().clone())
        chosen.append(select(scores_, *args))
        return chosen[-1]

    def replay(q, kc, vc, blk, d, sblk, g, *args):  # triton run: the fused op, then the same blocks
        out, idx = fused(q, kc, vc, blk, d, sblk, g, *args)
        fused_choice.append(idx)
        q, kc, vc = q.detach(), kc.detach(), vc.detach()
        scores["triton"].append(t_ops.compressed_attention_and_scores(q, kc, vc, blk, d, sblk, g)[1])
        return out, chosen[len(scores["triton"]) - 1]

    select, fused = R.select_blocks, t_ops.compressed_attention_and_selection
    monkeypatch.setattr(R, "select_blocks", record)
    monkeypatch.setattr(t_ops, "compressed_attention_and_selection", replay)
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    ref = build_model(_cfg(n_heads, n_kv_heads, "reference"))
    tri = build_model(_cfg(n_heads, n_kv_heads, "triton"))
    tri.load_state_dict(copy.deepcopy(ref.state_dict()))
    tokens = torch.randint(0, 64, (2, 100))
    targets = torch.randint(0, 64, (2, 100))
    losses = []
    for model in (ref, tri):
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        losses.append((logits.detach(), loss.detach()))
    assert len(scores["triton"]) == len(scores["reference"]) == 2
    a = _cfg(n_heads, n_kv_heads, "triton").attention
    for sr, st, idx in zip(scores["reference"], scores["triton"], fused_choice):
        assert ((st - sr).norm() / sr.norm()).item() <= TOL, f"seed={seed} scores"
        problem = selection_mismatch(idx, sr, a.select_block, a.num_selected, a.num_initial, a.num_local, TOL)
        assert problem is None, f"seed={seed} {problem}"
    (lr, _), (lt, _) = losses
    assert ((lt - lr).norm() / lr.norm()).item() <= TOL, f"seed={seed} logits"
    ref_params = dict(ref.named_parameters())
    for name, p in tri.named_parameters():
        r = ref_params[name].grad
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"seed={seed} {name}"
        err = ((p.grad - r).norm() / r.norm()).item()
        assert err <= TOL, f"seed={seed} grad {name}: {err:.2e}"


@pytest.mark.slow
def test_nsa_core_at_the_125m_head_layout_and_hyperparameters():
    """The benchmark's NSA attention core with nsa-125m's exact head layout (16 q heads, 1 KV
    group, dim 64) and NSA hyperparameters (l=32, d=16, l'=64, n=16, w=512): out and the
    gradient of all eight inputs vs the reference, fp32, T = 300 (no block size divides it)."""
    import nsa.ops.triton as t_ops
    from bench import run
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    xs = run.attention_inputs("nsa_triton", 1, 300, 16, 1, 64, dev="cpu", dt=torch.float32)
    a = [x.clone().requires_grad_() for x in xs]
    b = [x.clone().requires_grad_() for x in xs]
    out, ref = run.nsa_attention(t_ops, *a), run.nsa_attention(R, *b)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    assert ((out - ref).norm() / ref.norm()).item() <= TOL, f"seed={seed} out"
    for i, (x, y) in enumerate(zip(a, b)):
        assert ((x.grad - y.grad).norm() / y.grad.norm()).item() <= TOL, f"seed={seed} input {i}"
