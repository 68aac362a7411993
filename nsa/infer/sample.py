"""Sampling from a model with the KV-cache decoder: temperature, top-k, top-p, a seed.

``generate`` returns the new tokens of each prompt; ``stream`` yields them one step at a
time (for printing text as it is produced). The same seed gives the same tokens on the
same device (the draws come from a ``torch.Generator`` seeded once per call). Choosing a
token reads nothing back to the host, so it runs inside the decode step that a CUDA graph
replays (nsa/infer/graph.py); ``stream`` logs which path decoded (``decode path: ...``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence

import torch

from nsa.infer.decode import prefill
from nsa.infer.graph import DecodeRunner
from nsa.model.transformer import Transformer

log = logging.getLogger(__name__)


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """ValueError unless temperature >= 0, top_k >= 1 and 0 < top_p <= 1 (when given)."""
    if temperature < 0 or (top_k is not None and top_k < 1) or (top_p is not None and not 0 < top_p <= 1):
        raise ValueError(f"need temperature >= 0, top_k >= 1, 0 < top_p <= 1 (got {temperature}, "
                         f"{top_k}, {top_p})")


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logits [B, V]``: the argmax when ``temperature`` is 0, else a
    draw from softmax(logits / temperature) restricted to the ``top_k`` most likely tokens
    and to the smallest set of most likely tokens whose probability reaches ``top_p``.

    The draw is the argmax of ``p / E`` with ``E ~ Exp(1)`` per token (an exponential race:
    token i wins with probability ``p_i``), the draw ``torch.multinomial`` makes for one
    sample, with the same tokens for the same generator state, but without its check of the
    probabilities on the host: a device sync, which a CUDA graph cannot hold."""
    check_sampling(temperature, top_k, top_p)
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
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1)


@torch.no_grad()
def stream(model: Transformer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
           temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           seed: int = 0) -> Iterator[torch.Tensor]:
    """Yield ``[B]`` new tokens per step (one per prompt), ``max_new_tokens`` times. Prompts
    may differ in length (each decodes at its own positions). Decoded by ``DecodeRunner``: a
    CUDA graph on CUDA, eager elsewhere (a log line says which)."""
    check_sampling(temperature, top_k, top_p)
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
    choose = functools.partial(sample_next, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)
    tok = choose(logits[torch.arange(len(lens), device=device), last])
    yield tok
    runner = DecodeRunner(model, state, choose, generator=gen if temperature > 0 else None)
    if max_new_tokens > 1:
        log.info("%s", runner.describe())
    for _ in range(max_new_tokens - 1):
        tok = runner.step(tok)
        yield tok


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
