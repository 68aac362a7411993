"""The bitonic helper the decode kernels merge their candidate lists with, against torch."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from nsa.ops.triton.bitonic import _merge_row_pairs
from tests.ops.kernel_testlib import fresh_seed


@triton.jit
def _one_level(X, OUT, K: tl.constexpr, N: tl.constexpr, LOGN: tl.constexpr):
    rows = tl.arange(0, K)
    col = tl.arange(0, N)
    x = tl.load(X + rows[:, None] * N + col[None, :])
    y = _merge_row_pairs(x, K, N, LOGN)
    half = tl.arange(0, K // 2)
    tl.store(OUT + half[:, None] * N + col[None, :], y)


@pytest.mark.parametrize("K", [2, 4, 8, 64])
@pytest.mark.parametrize("N", [16, 32])
def test_each_row_pair_gives_its_n_largest_in_alternating_order(K: int, N: int) -> None:
    """Even rows ascending, odd descending in; row i out: the N largest of rows 2i and 2i + 1
    (repeated keys included, as the fillers are), ascending in even rows and descending in
    odd ones while more than one row comes out, ascending when one does."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(-(2**62), 2**62, (K, N), generator=g, dtype=torch.int64)
    keys[1::3, : N // 2] = -(2**63) + 1  # runs of one repeated filler value
    asc = keys.sort(-1).values
    x = torch.where((torch.arange(K) % 2 == 1)[:, None], asc.flip(-1), asc).contiguous()
    out = torch.empty(K // 2, N, dtype=torch.int64)
    _one_level[(1,)](x, out, K=K, N=N, LOGN=N.bit_length() - 1)
    want = torch.cat([asc[0::2], asc[1::2]], -1).sort(-1).values[:, N:]  # the N largest, ascending
    if K // 2 > 1:
        want[1::2] = want[1::2].flip(-1)
    assert torch.equal(out, want), f"seed={seed}"
