"""NSA reduces to dense causal attention where it must, and phi is a per-block map.

With n covering every selection block and the gate forced to the selected branch, an
NSA model is a dense causal model whose K/V are the selected branch's; the same for the
window branch with w >= T. The dense side is DenseAttention (SDPA, is_causal=True), a
different code path from nsa.ops.reference.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nsa_model_testlib import SEQ, set_gates

from nsa.model.compress import Compressor

BRANCH_ROWS = {"selected": 1, "window": 2}  # kv_proj rows: (k, v) per branch, cmp/slc/win


def _dense_twin(nsa_model, make_model, branch: str):
    dense = make_model("dense")
    sd = nsa_model.state_dict()
    out = {}
    for name, p in dense.state_dict().items():
        if name.endswith("attn.kv_proj.weight"):
            GD = p.shape[0] // 2
            b = BRANCH_ROWS[branch]
            out[name] = sd[name][2 * GD * b : 2 * GD * (b + 1)]
        else:
            out[name] = sd[name]
    dense.load_state_dict(out)
    return dense


@pytest.mark.parametrize("branch,attn", [
    ("selected", dict(num_selected=7)),  # Ns = ceil(53 / 8) = 7: every block
    ("selected", dict(num_selected=9, select_block=16)),  # more slots than blocks (-1 padding)
    ("window", dict(window=SEQ)),
])
def test_forced_branch_equals_dense_causal_attention(make_model, branch: str, attn: dict) -> None:
    model = make_model("nsa", **attn)
    set_gates(model, (0.0, 1.0, 0.0) if branch == "selected" else (0.0, 0.0, 1.0))
    dense = _dense_twin(model, make_model, branch)
    tokens = torch.randint(0, 64, (3, SEQ))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), dense(tokens))
        # and with the paper's n < Ns the selected branch really is sparse: it differs
        if branch == "selected":
            model_sparse = make_model("nsa", num_selected=3)
            model_sparse.load_state_dict(model.state_dict())
            set_gates(model_sparse, (0.0, 1.0, 0.0))
            assert not torch.allclose(model_sparse(tokens), dense(tokens))


@pytest.mark.parametrize("mode", ["mlp", "avgpool"])
def test_compressor_is_phi_applied_block_by_block(mode: str) -> None:
    torch.manual_seed(0)
    D, block, stride = 8, 6, 3
    comp = Compressor(D, block, stride, mode).double()
    if mode == "mlp":
        torch.nn.init.normal_(comp.pos, 0, 0.5)
    x = torch.randn(2, 20, 3, D, dtype=torch.float64)  # [B, T, G, D]
    out = comp(x)
    Nc = (20 - block) // stride + 1
    assert out.shape == (2, Nc, 3, D)
    for i in range(Nc):
        blk = x[:, i * stride : i * stride + block]  # [B, l, G, D]
        want = blk.mean(dim=1)
        if mode == "mlp":
            z = (blk + comp.pos[None, :, None, :]).permute(0, 2, 1, 3).reshape(2, 3, block * D)
            want = want + comp.fc2(F.gelu(comp.fc1(z)))
        torch.testing.assert_close(out[:, i], want)
    assert comp(x[:, : block - 1]).shape == (2, 0, 3, D)  # T < l: no compressed token


def test_intra_block_position_matters() -> None:
    """Permuting the tokens inside a block changes phi's output (position encoding + MLP)."""
    torch.manual_seed(1)
    comp = Compressor(4, 4, 4, "mlp").double()
    x = torch.randn(1, 8, 1, 4, dtype=torch.float64)
    perm = x.clone()
    perm[:, :4] = x[:, [3, 2, 1, 0]]
    out_x, out_p = comp(x), comp(perm)
    assert not torch.allclose(out_x[:, 0], out_p[:, 0])
    torch.testing.assert_close(out_x[:, 1], out_p[:, 1])
