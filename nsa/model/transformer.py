"""The decoder-only language model: pre-norm blocks of attention (NSA or dense) + SwiGLU."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from nsa.config import ModelConfig
from nsa.model.attention import DenseAttention, NSAAttention
from nsa.model.layers import RMSNorm, SwiGLU, swiglu_hidden
from nsa.ops.rope import RopeCache


class Block(nn.Module):
    """``x + attn(norm(x))`` then ``x + ffn(norm(x))``; called as ``block(x)``."""

    def __init__(self, cfg: ModelConfig, rope_cache: RopeCache | None = None) -> None:
        """``rope_cache``: RoPE's angles, shared by the model's layers."""
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if cfg.attention.kind == "nsa":
            self.attn: NSAAttention | DenseAttention = NSAAttention(
                cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.attention, cfg.rope_theta, rope_cache
            )
        else:
            self.attn = DenseAttention(cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope_theta,
                                       rope_cache, cfg.attention.backend)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = SwiGLU(cfg.dim, swiglu_hidden(cfg.dim, cfg.ffn_hidden))

    def forward(self, x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> torch.Tensor:
        """``attend`` replaces ``self.attn`` (the KV-cache decoder passes its cached attention,
        so the residual, norms and feed-forward stay this code)."""
        x = x + (self.attn if attend is None else attend)(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """Tokens ``[B, T]`` -> logits ``[B, T, vocab]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        rope = RopeCache(cfg.head_dim, cfg.rope_theta)  # one table of angles for every layer
        self.blocks = nn.ModuleList(Block(cfg, rope) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.activation_checkpointing = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-style init: N(0, std) everywhere, residual outputs scaled by 1/sqrt(2 L),
        zero biases (so every gate starts at sigmoid(0) = 0.5, far from saturation)."""
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, std)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        resid_std = std / math.sqrt(2 * self.cfg.n_layers)
        for blk in self.blocks:
            assert isinstance(blk, Block)  # for the type checker: a ModuleList yields nn.Module
            nn.init.normal_(blk.attn.o_proj.weight, 0.0, resid_std)
            nn.init.normal_(blk.ffn.down.weight, 0.0, resid_std)
            if isinstance(blk.attn, NSAAttention):
                for comp in (blk.attn.compress_k, blk.attn.compress_v):
                    if comp.mode == "mlp":
                        nn.init.normal_(comp.pos, 0.0, std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(tokens)
        for block in self.blocks:
            if self.activation_checkpointing and torch.is_grad_enabled():
                # the block itself, no closure; it draws no random numbers, so the RNG states are
                # not saved and restored per block (host work, and not allowed in a CUDA graph capture)
                x = checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)
            else:
                x = block(x)
        return self.lm_head(self.norm(x))

    def gate_shares(self) -> torch.Tensor | None:
        """Mean gate per branch (compressed, selected, window) over the last forward (all
        layers, heads and tokens), normalised to sum 1, detached and on the model's device
        (the caller syncs when it logs); NaN before the first forward; None for dense."""
        means = [b.attn.gate_mean for b in self.blocks if isinstance(b.attn, NSAAttention)]
        if not means:
            return None
        m = torch.stack(means).float().mean(dim=0)
        return m / m.sum()

    def param_count(self, non_embedding: bool = False) -> int:
        """Number of parameters (tied weights once); ``non_embedding`` drops the token embedding."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel()
        return n


def build_model(model_cfg: ModelConfig) -> Transformer:
    """The model a ``model:`` config section describes (NSA or dense attention)."""
    return Transformer(model_cfg)
