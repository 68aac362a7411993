"""RoPE (docs/lessons.md#rope-per-head): per head, identical for queries and keys, so scores depend only on
the relative position. The model rotates q and every branch's keys with these two
functions on ``[B, T, heads, D]`` tensors (compressed keys at their block's last token)."""

from __future__ import annotations

import torch

from nsa.ops.rope import apply_rope, rope_angles


def _rot(x: torch.Tensor, positions: list[float]) -> torch.Tensor:
    cos, sin = rope_angles(torch.tensor(positions, dtype=torch.float64), x.shape[-1], 10000.0, torch.float64)
    return apply_rope(x, cos, sin)


def test_scores_depend_only_on_relative_position() -> None:
    torch.manual_seed(0)
    H, D = 5, 16
    q = torch.randn(H, D, dtype=torch.float64)  # one query vector per head
    k = torch.randn(H, D, dtype=torch.float64)
    for delta in [0, 1, 7, 100]:
        scores = []
        for p in [0, 3, 50, 999, 2047.5]:  # fractional positions too (compressed keys)
            qr = _rot(q[None, None], [p + delta])[0, 0]
            kr = _rot(k[None, None], [p])[0, 0]
            scores.append((qr * kr).sum(-1))  # per head
        for s in scores[1:]:
            torch.testing.assert_close(s, scores[0])
    # and it does depend on the offset (the test could fail)
    s0 = (_rot(q[None, None], [5])[0, 0] * _rot(k[None, None], [0])[0, 0]).sum(-1)
    s1 = (_rot(q[None, None], [6])[0, 0] * _rot(k[None, None], [0])[0, 0]).sum(-1)
    assert not torch.allclose(s0, s1)


def test_rotation_is_per_head_and_norm_preserving() -> None:
    """Rotating [B, T, H, D] equals rotating each head alone with the same angles (no
    mixing across the flattened heads dimension), and keeps every vector's norm."""
    torch.manual_seed(1)
    x = torch.randn(2, 11, 4, 8, dtype=torch.float64)
    pos = list(range(11))
    full = _rot(x, pos)
    for h in range(4):
        torch.testing.assert_close(full[:, :, h : h + 1], _rot(x[:, :, h : h + 1], pos))
    torch.testing.assert_close(full.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(full[:, 0], x[:, 0])  # position 0: identity

