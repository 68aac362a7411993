"""Attention layers: NSAAttention (three gated branches) and DenseAttention (SDPA baseline).

NSA (arXiv 2502.11089, Sec. 3): every query attends over three views of the past,
compressed blocks, selected full-resolution blocks and a sliding window, and a per-head
sigmoid gate from the input mixes them (Eq. 5). Each branch has its own K and V
projection (the paper: independent keys/values keep the branches from learning
shortcuts through one another); the query is shared. The tensor maths of each branch
lives in ``nsa.ops`` (reference or Triton, same API); parameters live here.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from nsa.config import AttentionConfig
from nsa.model.compress import Compressor
from nsa.model.layers import upcast
from nsa.ops import apply_rope as ops_rope
from nsa.ops import compressed_attention_and_selection, gated_combine, get_ops
from nsa.ops.rope import apply_rope, rope_angles

BRANCHES = ("compressed", "selected", "window")


class NSAAttention(nn.Module):
    """Native Sparse Attention over ``x [B, T, dim]`` for any T (blocks may be partial)."""

    gate_mean: torch.Tensor  # a buffer (register_buffer): the last forward's mean gate per branch

    def __init__(
        self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, cfg: AttentionConfig, rope_theta: float
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.cfg = cfg
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
        # rows: k_cmp, v_cmp, k_slc, v_slc, k_win, v_win (each n_kv_heads * head_dim)
        self.kv_proj = nn.Linear(dim, 6 * n_kv_heads * head_dim, bias=False)
        self.compress_k = Compressor(head_dim, cfg.compress_block, cfg.compress_stride, cfg.compress_mode)
        self.compress_v = Compressor(head_dim, cfg.compress_block, cfg.compress_stride, cfg.compress_mode)
        self.gate = nn.Linear(dim, 3 * n_heads)  # per head: compressed, selected, window
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)
        # For ablations and tests: a fixed (compressed, selected, window) gate instead of the learned one.
        self.gate_override: tuple[float, float, float] | None = None
        # Mean gate per branch over the last forward, written in place (no host sync; a
        # buffer so that it follows .to() and stays legal under torch.compile together
        # with activation checkpointing, where rebinding an attribute is not). NaN until
        # the first forward.
        self.register_buffer("gate_mean", torch.full((3,), float("nan")), persistent=False)
        # Resolve (and cache) the ops now so that forward does no import (torch.compile),
        # and a bad backend fails at build time. Modules are not stored: the layer stays
        # picklable and deep-copyable.
        if cfg.backend != "triton" or os.environ.get("TRITON_INTERPRET") == "1":
            get_ops(cfg.backend, "cpu")
        if cfg.backend == "triton" or torch.cuda.is_available():
            get_ops(cfg.backend, "cuda")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H, G, D, c = self.n_heads, self.n_kv_heads, self.head_dim, self.cfg
        ops = get_ops(c.backend, x.device.type)
        q = self.q_proj(x).view(B, T, H, D)
        kv = self.kv_proj(x).view(B, T, 6, G, D)
        pos = torch.arange(T, device=x.device)
        adt = upcast(x).dtype  # fp32, or fp64 in tests
        cos, sin = rope_angles(pos, D, self.rope_theta, adt)
        # RoPE in the compute dtype (the kernels: one pass, fp32 maths inside); q is rotated
        # once and shared by the three branches
        q = ops_rope(ops, q, cos, sin)
        k_slc = ops_rope(ops, kv[:, :, 2], cos, sin)
        k_win = ops_rope(ops, kv[:, :, 4], cos, sin)
        v_slc, v_win = kv[:, :, 3].contiguous(), kv[:, :, 5].contiguous()

        # Compressed branch: phi over raw keys/values, then RoPE at each block's last
        # token (the first position allowed to see it), so scores stay relative.
        k_cmp = self.compress_k(kv[:, :, 0])
        v_cmp = self.compress_v(kv[:, :, 1]).contiguous()
        cpos = torch.arange(k_cmp.shape[1], device=x.device) * c.compress_stride + (c.compress_block - 1)
        ccos, csin = rope_angles(cpos, D, self.rope_theta, adt)
        k_cmp = ops_rope(ops, k_cmp, ccos, csin)
        # Its probabilities rank the selection blocks (Eqs. 8-10; no gradient through
        # the ranking): the top-n blocks per (query, KV group). The kernels pick them
        # inside the scores pass, without [T, Nc] probabilities or [T, Ns] scores.
        o_cmp, idx = compressed_attention_and_selection(
            ops, q, k_cmp, v_cmp, c.compress_block, c.compress_stride, c.select_block, G, c.num_selected,
            c.num_initial, c.num_local
        )

        # Selected branch: attention over those blocks.
        o_slc = ops.selected_attention(q, k_slc, v_slc, idx, c.select_block)

        o_win = ops.window_attention(q, k_win, v_win, c.window)

        if self.gate_override is None:
            g = torch.sigmoid(upcast(self.gate(x))).view(B, T, H, 3)
        else:  # fills, not torch.tensor(..., device=): no host-to-device copy per call
            g = torch.cat([x.new_full((B, T, H, 1), v, dtype=adt) for v in self.gate_override], -1)
        with torch.no_grad():
            self.gate_mean.copy_(g.detach().mean(dim=(0, 1, 2)))
        # the gated sum in the branches' dtype (the kernels: one fused pass, fp32 inside)
        o = gated_combine(ops, g, o_cmp, o_slc, o_win)
        return self.o_proj(o.reshape(B, T, H * D))


class DenseAttention(nn.Module):
    """Dense causal attention with GQA through ``F.scaled_dot_product_attention``.

    Always full T x T with ``is_causal=True`` (T_q == T_k, so PyTorch's top-left aligned
    causal mask is the right one; with one query it would see key 0 only).
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, rope_theta: float) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.kv_proj = nn.Linear(dim, 2 * n_kv_heads * head_dim, bias=False)  # rows: k, v
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, H, D)
        kv = self.kv_proj(x).view(B, T, 2, G, D)
        cos, sin = rope_angles(torch.arange(T, device=x.device), D, self.rope_theta, upcast(x).dtype)
        q = apply_rope(q, cos, sin).transpose(1, 2)
        k = apply_rope(kv[:, :, 0], cos, sin).transpose(1, 2)
        v = kv[:, :, 1].transpose(1, 2)
        if G != H:  # repeat K/V per query head: keeps the fused (flash) kernels usable
            k = k.repeat_interleave(H // G, dim=1)
            v = v.repeat_interleave(H // G, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D))
