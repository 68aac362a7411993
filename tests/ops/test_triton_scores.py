"""Compressed attention + selection scores (topn.py, scores mode) against the reference.

The kernel path never builds the T x Nc probability matrix; it must equal
``selection_scores(compressed_attention(...)[1])`` (Eq. 9 + 10). CPU interpreter, fp32.
"""

from __future__ import annotations

import pytest
import torch

import nsa.ops.triton as T_OPS
from nsa.ops import reference as R
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err


def _naive_scores(q, k, blk, stride, sblk, n_groups):
    """Per-query loop: softmax over visible compressed tokens, Eq. 9 overlap weights, Eq. 10 sum."""
    B, T, H, D = q.shape
    nc = k.shape[1]
    ns = R.num_select_blocks(T, sblk)
    out = torch.zeros(B, T, n_groups, ns)
    for t in range(T):
        vis = [i for i in range(nc) if i * stride + blk - 1 <= t]
        if not vis:
            continue
        for h in range(H):
            g = h // (H // n_groups)
            p = torch.softmax(torch.einsum("bd,bid->bi", q[:, t, h], k[:, vis, g]) * D**-0.5, -1)
            for n, i in enumerate(vis):
                for j in range(ns):
                    ov = min(i * stride + blk, (j + 1) * sblk) - max(i * stride, j * sblk)
                    if ov > 0:
                        out[:, t, g, j] += p[:, n] * ov / stride
    return out


CASES = [  # B, T, H, G, D, l, d, l'
    (2, 290, 4, 2, 16, 8, 4, 16),  # Ns = 19 > one 16-block tile of scores
    (2, 190, 16, 1, 32, 32, 16, 64),  # the paper's l, d, l' (scaled T)
    (2, 151, 8, 2, 16, 12, 4, 8),  # l' < l
    (1, 133, 4, 1, 16, 10, 6, 16),  # d divides neither l nor l'
]


@pytest.mark.parametrize("B,T,H,G,D,blk,d,sblk", CASES)
def test_fused_scores_match_reference(B, T, H, G, D, blk, d, sblk):
    seed = fresh_seed()
    nc = R.num_compressed(T, blk, d)
    q, do = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    k, v = torch.randn(B, nc, G, D), torch.randn(B, nc, G, D)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out, scores = T_OPS.compressed_attention_and_scores(*xs, blk, d, sblk, G)
    out.backward(do)
    rs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref, ref_scores = R.compressed_attention_and_scores(*rs, blk, d, sblk, G)
    ref.backward(do)
    assert scores.shape == (B, T, G, R.num_select_blocks(T, sblk))
    assert not scores.requires_grad
    assert rel_err(scores, ref_scores) <= TOL, f"seed={seed} scores"
    assert rel_err(out, ref) <= TOL, f"seed={seed} out"
    for name, a, r in zip("qkv", xs, rs):
        assert rel_err(a.grad, r.grad) <= TOL, f"seed={seed} d{name}"


def test_fused_scores_match_naive_loop():
    """An independent per-query construction of Eq. 9 + 10."""
    seed = fresh_seed()
    B, T, H, G, D, blk, d, sblk = 1, 75, 4, 2, 16, 8, 4, 16
    nc = R.num_compressed(T, blk, d)
    q, k, v = torch.randn(B, T, H, D), torch.randn(B, nc, G, D), torch.randn(B, nc, G, D)
    _, scores = T_OPS.compressed_attention_and_scores(q, k, v, blk, d, sblk, G)
    assert rel_err(scores, _naive_scores(q, k, blk, d, sblk, G)) <= TOL, f"seed={seed}"


def test_scores_are_causal_and_rows_sum_to_block_over_stride():
    """Scores of blocks after the query are 0; each head's probabilities sum to 1, and each
    compressed token spreads weight l/d over the blocks it overlaps, so a row of the group
    sums to (heads per group) * l / d once the query sees a compressed token."""
    seed = fresh_seed()
    B, T, H, G, D, blk, d, sblk = 2, 120, 4, 2, 16, 8, 4, 16
    nc = R.num_compressed(T, blk, d)
    q, k, v = torch.randn(B, T, H, D), torch.randn(B, nc, G, D), torch.randn(B, nc, G, D)
    _, scores = T_OPS.compressed_attention_and_scores(q, k, v, blk, d, sblk, G)
    t = torch.arange(T)[:, None]
    j = torch.arange(scores.shape[-1])[None, :]
    assert scores[:, (j * sblk > t)[None, :, None, :].expand_as(scores)[0]].abs().max() == 0
    sums = scores.sum(-1)[:, blk - 1:]
    want = torch.full_like(sums, (H // G) * blk / d)
    assert rel_err(sums, want) <= TOL, f"seed={seed}"
    assert scores[:, : blk - 1].abs().max() == 0


def test_fused_scores_fp16_path_in_interpreter():
    seed = fresh_seed()
    B, T, H, G, D, blk, d, sblk = 2, 150, 8, 2, 32, 16, 8, 16
    nc = R.num_compressed(T, blk, d)
    q = torch.randn(B, T, H, D).half()
    k, v = torch.randn(B, nc, G, D).half(), torch.randn(B, nc, G, D).half()
    out, scores = T_OPS.compressed_attention_and_scores(q, k, v, blk, d, sblk, G)
    ref, ref_scores = R.compressed_attention_and_scores(q.float(), k.float(), v.float(), blk, d, sblk, G)
    assert out.dtype == torch.float16 and scores.dtype == torch.float32
    assert rel_err(out.float(), ref) <= 1e-2, f"seed={seed} out"
    assert rel_err(scores, ref_scores) <= 1e-2, f"seed={seed} scores"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("H,G,D", [(16, 1, 64), (64, 4, 128)])
def test_fused_scores_bf16_on_gpu(H, G, D):
    seed = fresh_seed()
    B, T, blk, d, sblk = 2, 2000, 32, 16, 64
    nc = R.num_compressed(T, blk, d)
    dev = "cuda"
    q = torch.randn(B, T, H, D, device=dev).bfloat16()
    k = torch.randn(B, nc, G, D, device=dev).bfloat16()
    v = torch.randn(B, nc, G, D, device=dev).bfloat16()
    out, scores = T_OPS.compressed_attention_and_scores(q, k, v, blk, d, sblk, G)
    ref, ref_scores = R.compressed_attention_and_scores(q.float(), k.float(), v.float(), blk, d, sblk, G)
    assert rel_err(out.float(), ref) <= 1e-2, f"seed={seed} out"
    assert rel_err(scores, ref_scores) <= 1e-2, f"seed={seed} scores"
