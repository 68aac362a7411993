"""RoPE (docs/lessons.md#rope-per-head): per head, identical for queries and keys, so scores depend only on
the relative position. The model rotates q and every branch's keys with these two
functions on ``[B, T, heads, D]`` tensors (compressed keys at their block's last token)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nsa.ops.rope import RopeCache, apply_rope, rope_angles

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


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



def test_the_cache_gives_the_angles_of_its_positions_and_grows_only_for_a_longer_sequence() -> None:
    """``RopeCache`` rows are ``rope_angles`` of ``start + i * step`` exactly (the tokens', and
    NSA's compressed blocks' last tokens); a shorter sequence is a view of the table, a longer
    one grows it."""
    cache = RopeCache(16, 10000.0)
    for n, start, step in [(5, 0, 1), (37, 0, 1), (9, 31, 16), (3, 31, 16)]:
        cos, sin = cache.angles(n, torch.device("cpu"), torch.float32, start, step)
        want = rope_angles(torch.arange(start, start + n * step, step), 16, 10000.0)
        assert cos.shape == (n, 8)
        assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])
    first = cache.angles(100, torch.device("cpu"))[0]
    assert cache.angles(64, torch.device("cpu"))[0].data_ptr() == first.data_ptr()  # no new table
    grown = cache.angles(129, torch.device("cpu"))[0]
    assert grown.data_ptr() != first.data_ptr() and torch.equal(grown[:100], first)
    # the replaced table is kept: a CUDA graph captured before reads it by its address
    assert any(t[0].data_ptr() == first.data_ptr() for t in cache._replaced)
    assert cache.angles(4, torch.device("cpu"), torch.float64)[0].dtype == torch.float64


@pytest.mark.parametrize("config", ["tiny-cpu", "tiny-cpu-dense"])
def test_a_table_made_under_inference_mode_serves_a_training_forward_after(config: str) -> None:
    """Sampling first (inference mode), then training: the table the first forward made must
    be a normal tensor, or the training forward could not save it for its backward."""
    from nsa.config import load_config
    from nsa.model import build_model

    torch.manual_seed(0)
    cfg = load_config(CONFIGS / f"{config}.yaml", ["model.n_layers=2"])
    model = build_model(cfg.model)
    tokens = torch.randint(0, cfg.model.vocab_size, (1, 80))
    with torch.inference_mode():
        model(tokens)
    model(tokens).sum().backward()
    caches = {id(b.attn.rope_cache) for b in model.blocks}
    assert len(caches) == 1  # one table for every layer
