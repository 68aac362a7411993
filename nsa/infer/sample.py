"""Sampling from a model with the KV-cache decoder: temperature, top-k, top-p, a seed.

``generate`` returns the new tokens of each prompt; ``stream`` yields them one step at a
time (for printing text as it is produced). The same seed gives the same tokens on the
same device (the draws come from a ``torch.Generator`` seeded once per call).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from nsa.infer.decode import decode_step, prefill
from nsa.model.transformer import Transformer


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logits [B, V]``: the argmax when ``temperature`` is 0, else a
    draw from softmax(logits / temperature) restricted to the ``top_k`` most likely tokens
    and to the smallest set of most likely tokens whose probability reaches ``top_p``."""
    if temperature < 0 or (top_k is not None and top_k < 1) or (top_p is not None and not 0 < top_p <= 1):
        raise ValueError(f"need temperature >= 0, top_k >= 1, 0 < top_p <= 1 (got {temperature}, "
                         f"{top_k}, {top_p})")
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
        before = probs.cumsum(dim=-1) - probs  # the mass of the more likely tokens
        drop = before >= top_p  # never the most likely token (its `before` is 0)
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def stream(model: Transformer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
           temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           seed: int = 0) -> Iterator[torch.Tensor]:
    """Yield ``[B]`` new tokens per step (one per prompt), ``max_new_tokens`` times. Prompts
    may differ in length (each decodes at its own positions)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens <= 0:
        return
    device = next(model.parameters()).device
    lens = [len(p) for p in prompts]
    tokens = torch.zeros(len(prompts), max(lens), dtype=torch.long)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = torch.tensor(list(p), dtype=torch.long)
    tokens = tokens.to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    logits, state = prefill(model, tokens, lens, max_new_tokens=max_new_tokens - 1)
    last = torch.tensor(lens, device=device) - 1
    nxt = logits[torch.arange(len(lens), device=device), last]
    for i in range(max_new_tokens):
        tok = sample_next(nxt, temperature, top_k, top_p, gen)
        yield tok
        if i + 1 < max_new_tokens:
            nxt = decode_step(model, state, tok)


def generate(model: Transformer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             seed: int = 0, eos: int | None = None) -> list[list[int]]:
    """The new tokens of each prompt (up to and including ``eos`` when given: a sequence
    stops there; decoding stops when every sequence has)."""
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for tok in stream(model, prompts, max_new_tokens, temperature, top_k, top_p, seed):
        for b, t in enumerate(tok.tolist()):
            if not done[b]:
                out[b].append(t)
                done[b] = eos is not None and t == eos
        if all(done):
            break
    return out
