"""Sampling with the KV-cache decoder: greedy equals the naive loop, seeds reproduce."""

from __future__ import annotations

import pytest
import torch
from nsa_model_testlib import peaked_model

from nsa.infer import generate, sample_next

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [2, 7], [1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5]]


def naive_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """The full forward over the whole sequence for every new token, argmax of the last."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_greedy_equals_the_naive_loop(kind: str) -> None:
    model = peaked_model(kind)
    got = generate(model, PROMPTS, 25, temperature=0)
    assert got == [naive_greedy(model, p, 25) for p in PROMPTS]
    # top_k = 1 and a tiny top_p keep only the most likely token: greedy whatever the seed
    assert generate(model, PROMPTS, 25, top_k=1, seed=5) == got
    assert generate(model, PROMPTS, 25, top_p=1e-6, seed=6) == got


def test_the_seed_decides_the_sample() -> None:
    model = peaked_model("nsa")
    a = generate(model, PROMPTS, 30, temperature=1.5, top_k=20, top_p=0.95, seed=1)
    assert a == generate(model, PROMPTS, 30, temperature=1.5, top_k=20, top_p=0.95, seed=1)
    assert a != generate(model, PROMPTS, 30, temperature=1.5, top_k=20, top_p=0.95, seed=2)
    assert [len(x) for x in a] == [30, 30, 30]


def test_eos_stops_a_sequence() -> None:
    model = peaked_model("dense")
    free = generate(model, PROMPTS, 20, temperature=0)
    eos = free[0][3]
    got = generate(model, PROMPTS, 20, temperature=0, eos=eos)
    for g, f in zip(got, free):
        cut = f.index(eos) + 1 if eos in f else len(f)
        assert g == f[:cut]


def test_top_k_and_top_p_restrict_the_draws() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 64) * 3
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_next(logits, 1.0, top_k=5, generator=gen) for _ in range(300)], 1)
    top5 = logits.topk(5, dim=-1).indices
    assert (draws[:, :, None] == top5[:, None, :]).any(-1).all()
    assert all(len(set(row.tolist())) > 1 for row in draws)  # a draw, not the argmax
    # top_p: only the smallest most-likely set whose mass reaches p
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    keep = (probs.cumsum(-1) - probs) < 0.7
    draws = torch.stack([sample_next(logits, 1.0, top_p=0.7, generator=gen) for _ in range(300)], 1)
    for b in range(4):
        assert set(draws[b].tolist()) <= set(order[b][keep[b]].tolist())
    with pytest.raises(ValueError):
        sample_next(logits, -1.0)
