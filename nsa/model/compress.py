"""The compression map phi of NSA: blocks of l tokens (stride d) -> one compressed token.

Paper (Sec. 3.3.1): "phi is a learnable MLP with intra-block position encoding". Ours,
per KV head and shared across heads, for a block ``x [l, D]``:

    phi(x) = mean_r x[r] + W2 gelu(W1 flatten(x + P))          (mode "mlp")
    phi(x) = mean_r x[r]                                        (mode "avgpool")

P ``[l, D]`` is the intra-block position embedding. The mean path makes the map start
close to average pooling (a well-behaved compressed key from step 0); the MLP learns
what to keep. Hidden width: 4 * D.
"""

from __future__ import annotations

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
