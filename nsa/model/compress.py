"""The compression map phi of NSA: blocks of l tokens (stride d) -> one compressed token.

Paper (Sec. 3.3.1): "phi is a learnable MLP with intra-block position encoding". Ours,
per KV head and shared across heads, for a block ``x [l, D]``:

    phi(x) = mean_r x[r] + W2 gelu(W1 flatten(x + P))          (mode "mlp")
    phi(x) = mean_r x[r]                                        (mode "avgpool")

P ``[l, D]`` is the intra-block position embedding. The mean path makes the map start
close to average pooling (a well-behaved compressed key from step 0); the MLP learns
what to keep. Hidden width: 4 * D.

A layer has two maps, one for the keys and one for the values (``Compressor`` each).
A layer's forward runs both as one (``compress_pair``): their weights stacked, batched GEMMs,
and a backward written out by hand. The two maps as ``nn.Linear`` pairs under autograd took
about 34 ops with device work and 116 in all per layer, forward and backward: most of what an
NSA layer dispatches beyond a dense one, where a small model's train step is bound by the
host's ops (docs/training.md).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nsa.ops.reference import block_view


class Compressor(nn.Module):
    """``x [B, T, G, D] -> [B, Nc, G, D]`` with ``Nc = (T - l) // d + 1`` (0 if T < l)."""

    def __init__(self, head_dim: int, block: int, stride: int, mode: str) -> None:
        super().__init__()
        if mode not in ("mlp", "avgpool"):
            raise ValueError(f"unknown compression mode {mode!r}")
        self.block, self.stride, self.mode = block, stride, mode
        if mode == "mlp":
            hidden = 4 * head_dim
            self.pos = nn.Parameter(torch.zeros(block, head_dim))
            self.fc1 = nn.Linear(block * head_dim, hidden)
            self.fc2 = nn.Linear(hidden, head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = block_view(x, self.block, self.stride)  # [B, Nc, l, G, D] (a view)
        mean = blocks.mean(dim=2)
        if self.mode == "avgpool":
            return mean
        B, Nc, L, G, D = blocks.shape
        z = (blocks + self.pos[None, None, :, None, :].to(blocks.dtype)).permute(0, 1, 3, 2, 4)
        z = z.reshape(B, Nc, G, L * D)
        return mean + self.fc2(F.gelu(self.fc1(z)))


def stacked_weights(ck: Compressor, cv: Compressor) -> list[torch.Tensor]:
    """The two maps' parameters stacked, keys' first: ``pos [2, l, D]``, ``W1 [2, 4D, l*D]``,
    ``b1 [2, 4D]``, ``W2 [2, D, 4D]``, ``b2 [2, D]`` (empty for average pooling). Under
    autograd their gradients flow back to each map's own parameters."""
    if ck.mode != "mlp":
        return []
    return [torch.stack([ck.pos, cv.pos]), torch.stack([ck.fc1.weight, cv.fc1.weight]),
            torch.stack([ck.fc1.bias, cv.fc1.bias]), torch.stack([ck.fc2.weight, cv.fc2.weight]),
            torch.stack([ck.fc2.bias, cv.fc2.bias])]


def compress_pair(ck: Compressor, cv: Compressor, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ck(kv[:, :, 0]), cv(kv[:, :, 1]))`` for the raw keys and values side by side, ``kv
    [B, T, 2, G, D]`` (any strides: a slice of the layer's joint projection), each ``[B, Nc,
    G, D]`` and contiguous. The maps must agree on l, d and mode."""
    if (ck.block, ck.stride, ck.mode) != (cv.block, cv.stride, cv.mode):
        raise ValueError("the keys' and the values' compression differ in block, stride or mode")
    B, T, two, G, D = kv.shape
    if two != 2:
        raise ValueError(f"want the keys and values side by side, [B, T, 2, G, D]; got {tuple(kv.shape)}")
    if T < ck.block or ck.mode == "avgpool":  # no whole block, or a mean each: the maps themselves
        k, v = kv.unbind(2)
        return ck(k), cv(v).contiguous()
    out: torch.Tensor = _PairPhi.apply(  # type: ignore[no-untyped-call]
        kv, ck.block, ck.stride, *stacked_weights(ck, cv))
    k, v = out.unbind(0)  # backward: one stack
    return k, v


class _PairPhi(torch.autograd.Function):
    """phi of both maps over ``kv [B, T, 2, G, D]`` -> ``[2, B, Nc, G, D]``, in ``kv``'s dtype
    (the weights cast to it: what autocast does to ``nn.Linear``), with two batched GEMMs per
    direction and per matrix. No op in place: with some, torch 2.11's ``torch.compile`` gave
    the values' map wrong gradients (tests/model/test_compile.py under that torch)."""

    @staticmethod
    def forward(ctx: Any, kv: torch.Tensor, block: int, stride: int, pos: torch.Tensor, w1: torch.Tensor,
                b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
        with torch.autocast(kv.device.type, enabled=False):  # kv's dtype throughout, as stated
            return _PairPhi._forward(ctx, kv, block, stride, pos, w1, b1, w2, b2)

    @staticmethod
    def _forward(ctx: Any, kv: torch.Tensor, block: int, stride: int, pos: torch.Tensor, w1: torch.Tensor,
                 b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
        B, T, _, G, D = kv.shape
        dt = kv.dtype
        blocks = kv.unfold(1, block, stride)  # [B, Nc, 2, G, D, l] (a view)
        Nc = blocks.shape[1]
        n = B * Nc * G
        # x + P in the GEMM's row layout [2, B, Nc, G, l, D] (an add alone would keep the
        # blocks' interleaved layout)
        z = blocks.permute(2, 0, 1, 3, 5, 4).contiguous() + pos.to(dt)[:, None, None, None]
        z = z.view(2, n, block * D)
        w1, w2 = w1.to(dt), w2.to(dt)
        h = torch.baddbmm(b1.to(dt)[:, None, :], z, w1.transpose(1, 2))  # [2, n, 4D]
        a = F.gelu(h)
        out = torch.baddbmm(b2.to(dt)[:, None, :], a, w2.transpose(1, 2))  # [2, n, D]
        out = out.view(2, B, Nc, G, D) + blocks.mean(-1).permute(2, 0, 1, 3, 4)  # + the mean path
        ctx.save_for_backward(z, h, a, w1, w2)
        ctx.shape, ctx.block, ctx.stride = kv.shape, block, stride
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        z, h, a, w1, w2 = ctx.saved_tensors
        B, _, _, G, D = ctx.shape
        block, stride = ctx.block, ctx.stride
        Nc = g.shape[2]
        g = g.to(a.dtype).reshape(2, -1, D)  # [2, n, D]
        g_w2 = torch.bmm(g.transpose(1, 2), a)
        g_b2 = g.sum(1)
        g_h = torch.ops.aten.gelu_backward(torch.bmm(g, w2), h)
        g_w1 = torch.bmm(g_h.transpose(1, 2), z)
        g_b1 = g_h.sum(1)
        g_z = torch.bmm(g_h, w1)  # [2, n, l*D]: the gradient of x + P
        g_pos = g_z.view(2, -1, block, D).sum(1)
        # the mean path's share, 1/l of the output's gradient on each of the block's rows
        g_blocks = torch.add(g_z.view(2, B, Nc, G, block, D), g.view(2, B, Nc, G, 1, D), alpha=1 / block)
        g_kv = torch.ops.aten.unfold_backward(g_blocks.permute(1, 2, 0, 3, 5, 4), list(ctx.shape), 1, block,
                                              stride)
        return g_kv, None, None, g_pos, g_w1, g_b1, g_w2, g_b2
