"""Causality of the whole model (docs/lessons.md#no-future-leak): no output at position <= t may depend
on a token after t, for every branch alone and for the gated mix, with T a multiple of
no block size; and a prefix run gives the same logits (what decoding would see)."""

from __future__ import annotations

import pytest
import torch
from nsa_model_testlib import SEQ, set_gates

GATES = {"mixed": None, "compressed": (1.0, 0.0, 0.0), "selected": (0.0, 1.0, 0.0), "window": (0.0, 0.0, 1.0)}


@pytest.mark.parametrize("branch", list(GATES))
def test_future_tokens_change_no_past_logit(make_model, branch: str) -> None:
    model = make_model()
    set_gates(model, GATES[branch])
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (2, SEQ), generator=g)
    with torch.no_grad():
        ref = model(tokens)
        for t in [0, 3, 7, 8, 11, 12, 19, 31, 32, 40, 51]:
            changed = tokens.clone()
            changed[:, t + 1 :] = torch.randint(0, 64, (2, SEQ - t - 1), generator=g)
            out = model(changed)
            torch.testing.assert_close(out[:, : t + 1], ref[:, : t + 1], rtol=0, atol=1e-12)
            # and the change is visible after t: the test can see a leak if there was one
            assert not torch.allclose(out[:, t + 1 :], ref[:, t + 1 :])
            prefix = model(tokens[:, : t + 1])  # any T, also shorter than every block
            torch.testing.assert_close(prefix, ref[:, : t + 1], rtol=0, atol=1e-12)


def test_dense_model_is_causal(make_model) -> None:
    model = make_model("dense")
    tokens = torch.randint(0, 64, (2, SEQ))
    with torch.no_grad():
        ref = model(tokens)
        for t in [0, 17, 50]:
            changed = tokens.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % 64
            torch.testing.assert_close(model(changed)[:, : t + 1], ref[:, : t + 1], rtol=0, atol=1e-12)
            # a prefix (T = 1 included) sees the same: T_q == T_k always (top-left causal mask)
            torch.testing.assert_close(model(tokens[:, : t + 1]), ref[:, : t + 1], rtol=0, atol=1e-12)
