"""Prefill a batch of prompts, then decode one token at a time with per-layer KV caches.

``prefill(model, tokens, lengths, max_new_tokens)`` runs the model's own forward over
the right-padded prompts (returning the prompt logits) and fills the caches;
``decode_step(model, state, next_tokens)`` appends one token to every sequence and
returns the logits of its next position. Each sequence keeps its own length: the logits
of a sequence are those of the full forward over that sequence alone (tests/model/
test_decode.py), whatever the other prompts' lengths.

A step is split in two: ``advance`` is its device work (every layer's cache step, the
positions ``lengths`` moved on in place, the logits), with no host sync, no tensor built
from host data and no Python branch on a device value, so that a CUDA graph can capture it
once and replay it per token (``nsa.infer.graph.DecodeRunner``) and ``torch.compile`` traces
it whole; ``decode_step`` adds the host's bookkeeping (the capacity check, from a counter the
host keeps, never a device read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from nsa.infer import fused
from nsa.infer.cache import LayerCache, make_cache
from nsa.infer.step_shared import StepShared
from nsa.model.layers import RMSNorm, upcast_dtype
from nsa.model.transformer import Block, Transformer
from nsa.ops.rope import rope_table


@dataclasses.dataclass
class DecodeState:
    """The caches of every layer and where each sequence stands."""

    caches: list[LayerCache]
    # [B] int64, on the model's device: tokens held per sequence, which is also the position
    # of each one's next token; moved on in place by every step (a CUDA graph's static input)
    lengths: torch.Tensor
    longest: int  # max(lengths), on the host: capacity checks without a device sync
    capacity: int  # positions the caches hold per sequence
    # lengths on the host (kept by every step): which steps complete a compressed block is
    # then known without a device read (``compresses``); None: not known, every step compresses
    positions: list[int] | None = None

    def moved_on(self) -> None:
        """The host's side of a step: every sequence one token longer."""
        self.longest += 1
        if self.positions is not None:
            self.positions = [p + 1 for p in self.positions]


def _lengths(tokens: torch.Tensor, lengths: Sequence[int] | torch.Tensor | None) -> list[int]:
    B, T = tokens.shape
    out = [T] * B if lengths is None else [int(n) for n in lengths]
    if len(out) != B or any(n < 1 or n > T for n in out):
        raise ValueError(f"lengths must be {B} values in [1, {T}], got {out}")
    return out


@torch.no_grad()
def prefill(model: Transformer, tokens: torch.Tensor, lengths: Sequence[int] | torch.Tensor | None = None,
            max_new_tokens: int = 0, last_only: bool = False) -> tuple[torch.Tensor, DecodeState]:
    """Run ``tokens [B, T]`` (sequence b's prompt in its first ``lengths[b]`` positions, the
    rest padding: any token id) through the model, filling caches that hold
    ``max(lengths) + max_new_tokens`` positions (at least T). Returns the logits ``[B, T, vocab]``
    (row b valid up to ``lengths[b]``) and the decode state. ``last_only``: the logits
    ``[B, vocab]`` at each sequence's last position alone (what predicts its next token; a
    long prompt's ``T x vocab`` logits may not fit in memory)."""
    lens = _lengths(tokens, lengths)
    B = tokens.shape[0]
    capacity = max(tokens.shape[1], max(lens) + max_new_tokens)
    lt = torch.tensor(lens, device=tokens.device)
    x = model.tok_emb(tokens)
    # RoPE's angles of every position the caches hold, once: each step reads its rows
    rope = rope_table(capacity, model.cfg.head_dim, model.cfg.rope_theta, upcast_dtype(x.dtype), x.device)
    caches = [make_cache(block.attn, B, capacity, rope) for block in model.blocks]
    for block, cache in zip(model.blocks, caches):
        x = block(x, lambda h, cache=cache: cache.prefill(h, lt))
    if last_only:  # the norm is per position: taking the positions first changes nothing
        x = x[torch.arange(B, device=x.device), lt - 1]
    return model.lm_head(model.norm(x)), DecodeState(caches, lt, max(lens), capacity, list(lens))


def compresses(model: Transformer, state: DecodeState) -> bool:
    """Whether the next step must run NSA's compression: its token at position p completes
    compressed token (p - l + 1) / d in some sequence when that is a whole number >= 0. Known
    on the host from ``state.positions``; a step that completes none skips phi and the
    compressed write in every layer (on a GPU about 30 of an nsa-125m layer's 80 kernels, on
    15 steps of 16 at batch 1). Dense models, or positions not known: True (the full step)."""
    a = model.cfg.attention
    if a.kind != "nsa" or state.positions is None:
        return True
    first, d = a.compress_block - 1, a.compress_stride
    return any(p >= first and (p - first) % d == 0 for p in state.positions)


def check_room(state: DecodeState) -> None:
    """ValueError when the caches are full: the host counts the steps, no device read."""
    if state.longest >= state.capacity:
        raise ValueError(f"the caches hold {state.capacity} positions; pass a larger max_new_tokens "
                         "to prefill")


@torch.no_grad()
def advance(model: Transformer, caches: Sequence[LayerCache], lengths: torch.Tensor, tokens: torch.Tensor,
            compress: bool = True) -> torch.Tensor:
    """The device work of one decode step: append ``tokens [B]`` at positions ``lengths [B]``
    in every layer's cache, add 1 to ``lengths`` in place, and return the logits ``[B, vocab]``
    that predict the next token. No capacity check (``check_room``, on the host). Fixed shapes,
    no host sync or host data: the function a CUDA graph captures and replays. ``compress``
    False: no sequence completes a compressed block at this step (``compresses``, decided on
    the host), so NSA layers skip the compression; the logits are the same."""
    pos = lengths
    x = model.tok_emb(tokens[:, None])
    # the step's ring slots, masks and RoPE angles (rows of the caches' tables), once for every layer
    shared: StepShared = {}
    backend = model.cfg.attention.backend
    for block, cache in zip(model.blocks, caches):
        assert isinstance(block, Block)  # for the type checker: a ModuleList yields nn.Module

        def step(h: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm | None,
                 cache: LayerCache = cache) -> torch.Tensor:
            return cache.step(h, pos, shared, compress, residual, norm)

        x = fused.decode_block(block, x, step, backend, cache.folds)
    lengths.add_(1)
    return model.lm_head(model.norm(x))[:, 0]


def decode_step(model: Transformer, state: DecodeState, next_tokens: torch.Tensor) -> torch.Tensor:
    """Append ``next_tokens [B]`` (one per sequence, at position ``lengths[b]``) and return
    the logits ``[B, vocab]`` that predict the token after it (eager; see ``advance``)."""
    check_room(state)
    logits = advance(model, state.caches, state.lengths, next_tokens, compresses(model, state))
    state.moved_on()
    return logits
