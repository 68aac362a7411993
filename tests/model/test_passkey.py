"""Passkey prompts put the key where asked and are scored exactly; the evaluation of a real
(random) model is deterministic for a seed, batched as if one prompt at a time, and its loss
by position is the full forward's cross-entropy."""

from __future__ import annotations

import pytest
import torch
from nsa_model_testlib import peaked_model

from nsa.infer import generate
from nsa.infer.decode import prefill
from nsa.infer.evaluate import EvalPlan, evaluate, filler_windows, greedy, loss_by_position, prompts_for
from nsa.infer.passkey import (
    FILLER,
    NEEDLE,
    QUESTION,
    answer_digits,
    build_prompt,
    fixed_tokens,
    is_correct,
)
from nsa.train.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


@pytest.mark.parametrize("length", [30, 64, 257, 1000])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_the_key_sits_at_the_asked_depth_of_exactly_length_tokens(length: int, depth: float) -> None:
    p = build_prompt(TOK.encode, TOK.eot, length, depth, "40913")
    assert len(p.tokens) == length and p.tokens[0] == TOK.eot
    text = bytes(p.tokens[1:]).decode()
    needle = NEEDLE.format(key="40913")
    assert text.count("40913") == 1 and text.endswith(QUESTION)
    at = text.index(needle)  # characters = tokens for bytes
    assert p.needle_at == 1 + at
    n_filler = length - 1 - len(needle) - len(QUESTION)
    assert at == round(depth * n_filler)  # the fraction of the filler before the needle
    filler = text.replace(needle, "", 1)[: -len(QUESTION)]
    assert filler == (FILLER * (n_filler // len(FILLER) + 1))[:n_filler]


def test_too_short_and_bad_depths_are_refused() -> None:
    shortest = fixed_tokens(TOK.encode, 5)
    assert shortest == 1 + len(NEEDLE.format(key="12345")) + len(QUESTION)
    build_prompt(TOK.encode, TOK.eot, shortest, 0.5, "12345")
    with pytest.raises(ValueError, match=f"at least {shortest} tokens"):
        build_prompt(TOK.encode, TOK.eot, shortest - 1, 0.5, "12345")
    with pytest.raises(ValueError, match="between 0 and 1"):
        build_prompt(TOK.encode, TOK.eot, 100, 1.5, "12345")
    with pytest.raises(ValueError, match="below 30"):
        evaluate(peaked_model("dense", vocab=320), TOK, EvalPlan(lengths=[29, 64], depths=[0.5]), None)


def test_the_scorer_is_exact() -> None:
    assert is_correct(" 12345", "12345") and is_correct("12345.", "12345")
    assert is_correct("\n12345 x", "12345")
    assert not is_correct(" 123456", "12345")  # one digit too many
    assert not is_correct(" 1234", "12345") and not is_correct(" 12346", "12345")
    assert not is_correct("x 12345", "12345") and not is_correct("", "12345")
    assert answer_digits("  0042abc") == "0042"


def test_a_real_model_evaluates_deterministically_and_batching_changes_nothing() -> None:
    torch.set_num_threads(1)
    model = peaked_model("nsa", vocab=320)
    plan = EvalPlan(lengths=[40, 90], depths=[0.0, 0.5, 1.0], trials=3, seed=7, loss_sequences=2, buckets=4)
    seen: list[int] = []
    a = evaluate(model, TOK, plan, None, progress=lambda ev: seen.append(ev.done))
    assert seen == sorted(seen) and seen[-1] == plan.total() == 2 * 3 * 3 + 2
    b = evaluate(model, TOK, plan, None)
    assert (a.hits, a.buckets) == (b.hits, b.buckets)
    # the hits, one prompt at a time and scored here
    grid = prompts_for(TOK, plan)
    want = [[sum(is_correct(bytes(t for t in generate(model, [p.tokens], p.answer_tokens, temperature=0)[0]
                                     if t < 256).decode("utf-8", "replace"), p.key) for p in cell)
              for cell in row] for row in grid]
    assert a.hits == want
    assert a.accuracy == [[h / 3 for h in row] for row in want]
    keys = {p.key for row in grid for cell in row for p in cell}
    assert len(keys) > 10  # a key per prompt
    other = prompts_for(TOK, EvalPlan(lengths=[40, 90], depths=[0.0, 0.5, 1.0], trials=3, seed=8))
    assert keys != {p.key for row in other for cell in row for p in cell}

    # loss by position: the full forward's per-token cross-entropy, averaged per bucket
    assert [(x.start, x.end) for x in a.buckets] == [(0, 22), (22, 45), (45, 68), (68, 90)]
    w = torch.tensor(next(filler_windows(TOK, 91)))[None]
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(model(w[:, :-1])[0], w[0, 1:], reduction="none")
    for x in a.buckets:
        assert x.loss == pytest.approx(float(ce[x.start:x.end].mean()), rel=1e-5)
        assert x.tokens == 2 * (x.end - x.start)
    assert a.loss_source == "filler" and a.loss_length == 90
    chunked = loss_by_position(model, filler_windows(TOK, 91), plan, 90, chunk=7)  # 13 chunks, a short last
    assert [x.loss for x in chunked] == pytest.approx([x.loss for x in a.buckets], rel=1e-6)


@pytest.mark.parametrize("kind", ["nsa", "dense"])
def test_the_last_positions_logits_and_greedy_are_the_full_ones(kind: str) -> None:
    model = peaked_model(kind, vocab=320)
    tokens = torch.randint(0, 256, (3, 50), generator=torch.Generator().manual_seed(0))
    full, _ = prefill(model, tokens, [50, 20, 33])
    last, _ = prefill(model, tokens, [50, 20, 33], last_only=True)
    assert torch.allclose(last, full[torch.arange(3), torch.tensor([49, 19, 32])], rtol=1e-5, atol=1e-6)
    same = [list(map(int, tokens[0, :40])), list(map(int, tokens[1, :40]))]
    assert greedy(model, same, 6) == generate(model, same, 6, temperature=0)
