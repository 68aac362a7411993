"""Scores + top-n in one kernel (topn.py): the chosen blocks without a scores tensor.

The fused kernel and the scores kernel share every arithmetic step, so the fused choice
must be exactly the reference's ``select_blocks`` applied to the kernel's own scores; and
those scores match the reference's at 1e-5, so the choice agrees with the reference's
choice on the reference's scores up to near-ties (checked by the self-check's rule).
CPU interpreter, fp32.
"""

from __future__ import annotations

import pytest
import torch

import nsa.ops.triton as T_OPS
from nsa.ops import reference as R
from nsa.ops.self_check import selection_mismatch
from nsa.ops.triton import topn
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err

CASES = [  # B, T, H, G, D, l, d, l', n, initial, local
    (2, 290, 4, 2, 16, 8, 4, 16, 5, 1, 2),  # 2 heads/group: 32 positions per program; Ns = 19
    (1, 257, 16, 1, 32, 32, 16, 64, 3, 1, 1),  # the paper's l, d, l' at 16 heads/1 group, odd T
    # 64 heads/4 groups: one position per program
    pytest.param(1, 150, 64, 4, 16, 16, 8, 16, 4, 1, 2, marks=pytest.mark.slow),
    (2, 133, 4, 1, 16, 10, 6, 16, 20, 0, 1),  # n larger than the blocks that exist; d divides nothing
    (1, 70, 8, 2, 16, 12, 4, 8, 3, 2, 2),  # l' < l: tokens spread over three blocks
]


def _inputs(B, T, H, G, D, blk, d):
    nc = R.num_compressed(T, blk, d)
    return torch.randn(B, T, H, D), torch.randn(B, nc, G, D), torch.randn(B, nc, G, D)


@pytest.mark.parametrize("B,T,H,G,D,blk,d,sblk,n,ni,nl", CASES)
def test_fused_selection_is_select_blocks_of_the_kernel_scores(B, T, H, G, D, blk, d, sblk, n, ni, nl):
    seed = fresh_seed()
    q, k, v = _inputs(B, T, H, G, D, blk, d)
    do = torch.randn(B, T, H, D)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out, idx = T_OPS.compressed_attention_and_selection(*xs, blk, d, sblk, G, n, ni, nl)
    out.backward(do)
    _, scores = T_OPS.compressed_attention_and_scores(q, k, v, blk, d, sblk, G)
    assert idx.shape == (B, T, G, n) and idx.dtype == torch.int64 and not idx.requires_grad
    assert torch.equal(idx, R.select_blocks(scores, sblk, n, ni, nl)), f"seed={seed} vs own scores"
    assert torch.equal(idx, T_OPS.select_blocks(scores, sblk, n, ni, nl)), f"seed={seed} vs select kernel"
    rs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref, ref_scores = R.compressed_attention_and_scores(*rs, blk, d, sblk, G)
    ref.backward(do)
    assert rel_err(scores, ref_scores) <= TOL, f"seed={seed} scores"
    problem = selection_mismatch(idx, ref_scores, sblk, n, ni, nl, tol=1e-5)
    assert problem is None, f"seed={seed} {problem}"
    assert rel_err(out, ref) <= TOL, f"seed={seed} out"
    for name, a, r in zip("qkv", xs, rs):
        assert rel_err(a.grad, r.grad) <= TOL, f"seed={seed} d{name}"


def test_fused_selection_before_the_first_compressed_token():
    """T shorter than one compressed block: every score is 0, so the choice is the forced
    blocks and then the lowest eligible blocks (ties to the lower index)."""
    fresh_seed()
    B, T, H, G, D, blk, d, sblk, n = 2, 29, 4, 2, 16, 32, 16, 4, 3
    q, k, v = _inputs(B, T, H, G, D, blk, d)
    assert k.shape[1] == 0
    out, idx = T_OPS.compressed_attention_and_selection(q, k, v, blk, d, sblk, G, n, 1, 1)
    assert out.abs().max() == 0
    zeros = torch.zeros(B, T, G, R.num_select_blocks(T, sblk))
    assert torch.equal(idx, R.select_blocks(zeros, sblk, n, 1, 1))


@pytest.mark.parametrize("positions", [1, 4])
def test_positions_per_program_do_not_change_the_choice(positions, monkeypatch):
    """One position per program (pure head padding) and several give the same blocks."""
    seed = fresh_seed()
    B, T, H, G, D, blk, d, sblk, n = 1, 90, 4, 1, 16, 8, 4, 8, 4
    q, k, v = _inputs(B, T, H, G, D, blk, d)
    _, want = T_OPS.compressed_attention_and_selection(q, k, v, blk, d, sblk, G, n, 1, 2)
    monkeypatch.setattr(topn, "ROWS", positions * 4)
    _, got = T_OPS.compressed_attention_and_selection(q, k, v, blk, d, sblk, G, n, 1, 2)
    assert torch.equal(got, want), f"seed={seed}"


def test_selection_mismatch_tells_near_ties_from_wrong_blocks():
    """The self-check's rule: a swap between two scores within tol passes, a wrong block not."""
    scores = torch.tensor([[0.5, 0.3, 0.3 + 1e-7, 0.1]]).view(1, 1, 1, 4).expand(1, 200, 1, 4).contiguous()
    want = R.select_blocks(scores, 50, 2, 1, 0)
    t = 199  # own block 3: blocks 0..3 eligible, block 0 forced
    assert want[0, t, 0].tolist() == [0, 2]
    swapped = want.clone()
    swapped[0, t, 0] = torch.tensor([0, 1])
    assert selection_mismatch(swapped, scores, 50, 2, 1, 0, tol=1e-5) is None
    wrong = want.clone()
    wrong[0, t, 0] = torch.tensor([0, 3])
    assert "t=199" in selection_mismatch(wrong, scores, 50, 2, 1, 0, tol=1e-5)
    future = want.clone()
    future[0, 10, 0] = torch.tensor([0, 1])  # t = 10 sees block 0 only
    assert "t=10" in selection_mismatch(future, scores, 50, 2, 1, 0, tol=1e-5)
