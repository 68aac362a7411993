"""Block selection (Eqs. 8-10 + top-n) against a brute-force per-query reference.

The reference here recomputes everything from the definitions with Python sets and
sorting: overlap lengths of token ranges (Eq. 9), the sum over a group's heads
(Eq. 10), forced initial/local blocks, the causal limit, top-n by score with ties to
the lower block index, ascending order, -1 padding.
"""

from __future__ import annotations

import pytest
import torch

from nsa.ops import reference


def _brute_scores(probs: torch.Tensor, G: int, block: int, stride: int, lp: int) -> torch.Tensor:
    B, T, H, Nc = probs.shape
    Ns = -(-T // lp)
    R = H // G
    out = torch.zeros(B, T, G, Ns, dtype=probs.dtype)
    for j in range(Ns):
        slc = set(range(j * lp, (j + 1) * lp))
        for i in range(Nc):
            w = len(slc & set(range(i * stride, i * stride + block))) / stride
            if w:
                for h in range(H):
                    out[:, :, h // R, j] += w * probs[:, :, h, i]
    return out


def _brute_select(scores: torch.Tensor, lp: int, n: int, n_init: int, n_local: int) -> torch.Tensor:
    B, T, G, Ns = scores.shape
    idx = torch.full((B, T, G, n), -1, dtype=torch.long)
    for b in range(B):
        for t in range(T):
            for g in range(G):
                eligible = [j for j in range(Ns) if j * lp <= t]  # never a block after t
                own = t // lp
                forced = [j for j in eligible if j < n_init or own - n_local < j <= own]
                rest = sorted((j for j in eligible if j not in forced),
                              key=lambda j: (-float(scores[b, t, g, j]), j))
                chosen = sorted(forced + rest[: n - len(forced)])
                idx[b, t, g, : len(chosen)] = torch.tensor(chosen, dtype=torch.long)
    return idx


def _probs(B: int, T: int, H: int, G: int, block: int, stride: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    Nc = reference.num_compressed(T, block, stride)
    q = torch.randn(B, T, H, 8, generator=g, dtype=torch.float64) * 2
    kc = torch.randn(B, Nc, G, 8, generator=g, dtype=torch.float64)
    _, p = reference.compressed_attention(q, kc, kc, block, stride)
    return p


CASES = [  # T, H, G, l, d, l', n, initial, local
    (45, 4, 2, 4, 2, 8, 4, 1, 2),
    (45, 4, 1, 8, 4, 16, 3, 1, 2),
    (37, 2, 2, 4, 4, 4, 5, 1, 1),  # l' == l == d: Eq. 9 is the identity
    (50, 4, 2, 8, 4, 8, 4, 0, 2),  # no initial block
    (7, 2, 1, 4, 2, 8, 4, 1, 2),  # fewer blocks than n: -1 padding everywhere
]


@pytest.mark.parametrize("T,H,G,block,stride,lp,n,n_init,n_local", CASES)
def test_selection_matches_brute_force(T, H, G, block, stride, lp, n, n_init, n_local) -> None:
    probs = _probs(2, T, H, G, block, stride, seed=T + n)
    scores = reference.selection_scores(probs, G, block, stride, lp)
    want_scores = _brute_scores(probs, G, block, stride, lp)
    torch.testing.assert_close(scores, want_scores)
    if block == stride == lp:  # identity mapping: just the group sum of the probabilities
        Nc = probs.shape[-1]
        torch.testing.assert_close(scores[..., :Nc], probs.reshape(2, T, G, H // G, Nc).sum(3))
    idx = reference.select_blocks(scores, lp, n, n_init, n_local)
    assert idx.dtype == torch.int64 and idx.shape == (2, T, G, n)
    assert torch.equal(idx, _brute_select(scores, lp, n, n_init, n_local))
    t = torch.arange(T)[None, :, None, None]
    assert ((idx == -1) | (idx * lp <= t)).all()  # causal limit
    assert (idx == (t // lp)).any(-1).all()  # the query's own block is always in


def test_ties_go_to_the_lower_block_and_forced_blocks_win() -> None:
    """Integer scores with many ties; forced blocks are chosen even with the lowest score."""
    g = torch.Generator().manual_seed(3)
    T, G, lp, n = 70, 2, 4, 5
    Ns = -(-T // lp)
    scores = torch.randint(0, 3, (2, T, G, Ns), generator=g).double()
    scores[..., 0] = -5.0  # the initial block has the worst score but is forced
    idx = reference.select_blocks(scores, lp, n, 1, 2)
    assert torch.equal(idx, _brute_select(scores, lp, n, 1, 2))
    late = idx[:, 4 * lp :]  # queries with enough eligible blocks
    assert (late[..., 0] == 0).all()


def test_future_scores_never_matter() -> None:
    """Huge scores on blocks after the query must not be selected."""
    T, G, lp, n = 40, 1, 8, 3
    Ns = T // lp
    scores = torch.zeros(1, T, G, Ns, dtype=torch.float64)
    scores[..., -1] = 1e9
    idx = reference.select_blocks(scores, lp, n, 1, 1)
    for t in range(T):
        chosen = [j for j in idx[0, t, 0].tolist() if j >= 0]
        assert all(j * lp <= t for j in chosen)
        assert (Ns - 1 in chosen) == ((Ns - 1) * lp <= t)


@pytest.mark.parametrize("T,H,G,block,stride,lp,n,n_init,n_local", CASES[:3])
def test_selection_in_query_chunks_matches_brute_force(monkeypatch, T, H, G, block, stride, lp, n, n_init,
                                                       n_local) -> None:
    """select_blocks ranks queries in chunks (a few queries each here): same blocks."""
    monkeypatch.setattr(reference, "CHUNK_ELEMS", 64)
    monkeypatch.setattr(reference, "WHOLE_CALL_CHUNKS", 0)
    probs = _probs(2, T, H, G, block, stride, seed=T + n)
    scores = reference.selection_scores(probs, G, block, stride, lp)
    assert reference._chunk_len(T, 4 * 2 * G * scores.shape[-1], scores.device) < T
    idx = reference.select_blocks(scores, lp, n, n_init, n_local)
    assert torch.equal(idx, _brute_select(scores, lp, n, n_init, n_local))


def test_chunked_selection_compiles_fullgraph(monkeypatch) -> None:
    monkeypatch.setattr(reference, "CHUNK_ELEMS", 64)
    monkeypatch.setattr(reference, "WHOLE_CALL_CHUNKS", 0)
    torch._dynamo.reset()
    scores = torch.rand(1, 40, 2, 5)
    fn = torch.compile(reference.select_blocks, fullgraph=True, backend="aot_eager")
    assert torch.equal(fn(scores, 8, 3, 1, 1), reference.select_blocks(scores, 8, 3, 1, 1))
