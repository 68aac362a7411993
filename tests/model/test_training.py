"""Loss floor (docs/lessons.md#no-future-leak): trained briefly on uniform random tokens, a causal model
cannot beat ln(vocab) on fresh random tokens; on a learnable stream it goes far below;
and a deliberately leaky model (future keys visible) does beat the floor, which shows
the floor test can catch a leak.

Why the margin: for a causal model, the next token is uniform and independent of all it
sees, so E[-log q(next)] = ln V + KL(U || q) >= ln V (Gibbs). The held-out mean over N
tokens deviates from its expectation by about sigma / sqrt(N) (the per-token terms are
martingale differences, so the CLT applies); we allow 4 sigma / sqrt(N), a false alarm
probability of about 3e-5, with sigma the measured spread of the per-token losses.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from nsa_model_testlib import small_cfg

import nsa.ops.reference as reference
from nsa.model import build_model

V = 32
STEPS = 150
PERM = torch.randperm(V, generator=torch.Generator().manual_seed(5))


def uniform_stream(g: torch.Generator, B: int, T: int) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=g)


def learnable_stream(g: torch.Generator, B: int, T: int) -> torch.Tensor:
    """x[t] = PERM[x[t-2]]: predictable from the token two back, i.e. through attention."""
    x = torch.empty(B, T, dtype=torch.long)
    x[:, :2] = torch.randint(0, V, (B, 2), generator=g)
    for t in range(2, T):
        x[:, t] = PERM[x[:, t - 2]]
    return x


def train_and_eval(stream: Callable[[torch.Generator, int, int], torch.Tensor], steps: int,
                   first: int = 0) -> tuple[float, float, int]:
    """Train on fresh batches; return (mean, std, count) of held-out per-token losses on
    positions >= first."""
    torch.manual_seed(0)
    model = build_model(small_cfg("nsa", V))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = stream(g, 16, 33)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x = stream(torch.Generator().manual_seed(99), 64, 65)
        nll = F.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:], reduction="none")[:, first:]
    return nll.mean().item(), nll.std().item(), nll.numel()


def floor(std: float, n: int) -> float:
    return math.log(V) - 4 * std / math.sqrt(n)


def test_random_tokens_stay_at_or_above_ln_vocab() -> None:
    mean, std, n = train_and_eval(uniform_stream, STEPS)
    assert mean >= floor(std, n), f"held-out loss {mean:.4f} < ln V = {math.log(V):.4f}: a future leak?"


def test_learnable_stream_goes_well_below_ln_vocab() -> None:
    mean, _, _ = train_and_eval(learnable_stream, STEPS, first=2)
    assert mean < 0.35 * math.log(V), f"loss {mean:.3f} on a learnable stream: the model does not learn"


def test_floor_catches_a_leaky_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a window branch that also sees the next tokens beats ln V."""

    def leaky_window(q, k, v, window, scale=None):
        s = torch.arange(q.shape[1])
        mask = (s[:, None] - s[None, :]).abs() < window  # two-sided: reads the future
        return reference._masked_attention(q, k, v, mask, q.shape[-1] ** -0.5)[0]

    monkeypatch.setattr(reference, "window_attention", leaky_window)
    mean, std, n = train_and_eval(uniform_stream, STEPS)
    assert mean < floor(std, n)
