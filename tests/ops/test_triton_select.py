"""The triton module's top-n (topn.py's running top-n over a given scores tensor) picks
exactly the reference's blocks."""

from __future__ import annotations

import os

import pytest
import torch

from nsa.ops import reference as R
from nsa.ops.triton.topn import select_blocks


@pytest.mark.parametrize("kind", ["ties", "uniform", "sparse_signed"])
def test_select_blocks_equals_reference(kind):
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    for _ in range(4):  # the interpreter runs the sorts slowly: few, varied draws
        B, T, G = 2, int(torch.randint(1, 300, (), generator=gen)), 2
        blk = int(torch.randint(3, 40, (), generator=gen))
        ns = R.num_select_blocks(T, blk)
        if kind == "ties":  # many equal scores: the tie order (lower block first) decides
            s = torch.randint(0, 3, (B, T, G, ns), generator=gen).float()
        elif kind == "uniform":
            s = torch.rand(B, T, G, ns, generator=gen)
        else:  # negative scores, exact zeros, -0.0
            s = torch.randn(B, T, G, ns, generator=gen)
            s[s.abs() < 0.3] = 0.0
            s[s.abs() > 1.5] = -0.0
        n = int(torch.randint(0, 20, (), generator=gen))
        ni, nl = int(torch.randint(0, 3, (), generator=gen)), int(torch.randint(0, 4, (), generator=gen))
        got = select_blocks(s, blk, n, ni, nl)
        want = R.select_blocks(s, blk, n, ni, nl)
        assert got.dtype == want.dtype and torch.equal(got, want), f"seed={seed} T={T} l'={blk} n={n}"


@pytest.mark.parametrize("blk", [1, 2])
def test_select_blocks_with_many_blocks(blk):
    """Tiny selection blocks: Ns up to T, so the running top-n merges many candidate tiles
    (the draws above keep l' >= 3 for the interpreter's sake)."""
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    B, T, G, n = 1, 181, 2, 19
    s = torch.randint(0, 4, (B, T, G, R.num_select_blocks(T, blk)), generator=gen).float()
    got = select_blocks(s, blk, n, 1, 2)
    want = R.select_blocks(s, blk, n, 1, 2)
    assert torch.equal(got, want), f"seed={seed} l'={blk}"
