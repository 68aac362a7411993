"""Odd shapes for every kernel: head dims that are not powers of two (masked tiles), one
query head per group (MHA) and three (not a power of two), sequences shorter than every
block, T = 1. fp32 in the interpreter, against the reference."""

from __future__ import annotations

import pytest
import torch

import nsa.ops.triton as T_OPS
from nsa.ops import reference as R
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err


def _run(fn, xs, do):
    xs = [x.clone().requires_grad_() for x in xs]
    out = fn(*xs)
    out.backward(do)
    return [out] + [x.grad for x in xs]


@pytest.mark.parametrize("B,T,H,G,D", [(2, 5, 2, 2, 24), (1, 37, 3, 1, 24), (2, 70, 6, 2, 40)])
def test_odd_shapes_match_reference(B, T, H, G, D):
    seed = fresh_seed()
    q, do = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    k, v = torch.randn(B, T, G, D), torch.randn(B, T, G, D)
    idx = T_OPS.select_blocks(torch.rand(B, T, G, R.num_select_blocks(T, 16)), 16, 3, 1, 1)
    cases = {
        "window": (lambda a, b, c: T_OPS.window_attention(a, b, c, 7),
                   lambda a, b, c: R.window_attention(a, b, c, 7)),
        "selected": (lambda a, b, c: T_OPS.selected_attention(a, b, c, idx, 16),
                     lambda a, b, c: R.selected_attention(a, b, c, idx, 16)),
    }
    for name, (fn, rfn) in cases.items():
        for i, (x, y) in enumerate(zip(_run(fn, (q, k, v), do), _run(rfn, (q, k, v), do))):
            assert rel_err(x, y) <= TOL, f"seed={seed} {name} tensor {i}"
    nc = R.num_compressed(T, 8, 4)
    kc, vc = torch.randn(B, nc, G, D), torch.randn(B, nc, G, D)
    xs = [x.clone().requires_grad_() for x in (q, kc, vc)]
    out, scores = T_OPS.compressed_attention_and_scores(*xs, 8, 4, 16, G)
    out.backward(do)
    rs = [x.clone().requires_grad_() for x in (q, kc, vc)]
    ref, ref_scores = R.compressed_attention_and_scores(*rs, 8, 4, 16, G)
    ref.backward(do)
    if nc == 0:  # shorter than one compressed block: no compressed token, all zero
        assert out.abs().max() == 0 and scores.abs().max() == 0 and xs[0].grad.abs().max() == 0
        return
    assert rel_err(out, ref) <= TOL and rel_err(scores, ref_scores) <= TOL, f"seed={seed} compressed"
    for i, (x, y) in enumerate(zip(xs, rs)):
        assert rel_err(x.grad, y.grad) <= TOL, f"seed={seed} compressed grad {i}"


def test_single_token():
    """T = 1: one visible key, so the output is v and dq, dk are 0 (up to rounding)."""
    torch.manual_seed(0)
    q, do = torch.randn(2, 1, 4, 24), torch.randn(2, 1, 4, 24)
    k, v = torch.randn(2, 1, 2, 24), torch.randn(2, 1, 2, 24)
    idx = torch.zeros(2, 1, 2, 2, dtype=torch.int64)
    idx[..., 1] = -1
    for fn in (lambda a, b, c: T_OPS.window_attention(a, b, c, 5),
               lambda a, b, c: T_OPS.selected_attention(a, b, c, idx, 16)):
        out, dq, dk, dv = _run(fn, (q, k, v), do)
        assert rel_err(out, v.repeat_interleave(2, 2)) <= TOL
        assert dq.abs().max() <= TOL and dk.abs().max() <= TOL
        assert rel_err(dv, do.view(2, 1, 2, 2, 24).sum(3)) <= TOL
