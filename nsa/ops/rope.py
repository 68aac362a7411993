"""Rotary position embedding, applied per head and identically to queries and keys.

Why (docs/lessons.md#rope-per-head): a former code base rotated Q over the flattened heads dimension and K per
head, so scores depended on absolute position. Here one function rotates the last
(head) dimension of ``[B, T, heads, D]`` tensors, whatever the number of heads.
"""

from __future__ import annotations

import torch


def rope_angles(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[T, D/2]`` for (possibly fractional) positions ``[T]``; fp32 unless
    ``dtype`` asks for fp64 (tests)."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=dtype) / head_dim
    inv_freq = theta ** (-exponents)
    ang = positions.to(dtype)[:, None] * inv_freq[None, :]
    return ang.cos(), ang.sin()


def rope_table(n: int, head_dim: int, theta: float, dtype: torch.dtype, device: torch.device
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[n, D/2]`` of positions ``0 .. n-1``: row p is ``rope_angles`` of p, the
    angles the forward uses at p. A decoder computes it once for every position its caches
    hold, and each step reads its rows instead of computing them."""
    return rope_angles(torch.arange(n, device=device), head_dim, theta, dtype)


class RopeCache:
    """RoPE's angles of the positions a training forward rotates at, kept across forwards:
    ``angles(n, ...)`` gives the first ``n`` rows of a table of ``start + i * step``
    (``start = 0, step = 1``: the tokens of a sequence that starts at 0; NSA's compressed
    blocks: their last tokens). A small model's train step is bound by the host's ops, and
    the angles were eight of them in every layer of every step; now they are computed when
    a longer sequence than any before comes (the table grows to the next power of two) and
    otherwise sliced (a view). One cache serves all the layers of a model (the same head dim
    and theta). Row i is ``rope_angles`` of that position, as in ``rope_table``. A table that
    a longer one replaced is kept, not freed: a CUDA graph captured before (``train.cuda_graph``)
    reads it by its address at every replay. A torch.compile'd forward (``train.compile``)
    computes its angles in its graph instead, where they cost no host op."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim, self.theta = head_dim, theta
        self._tables: dict[tuple[int, int, torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self._replaced: list[tuple[torch.Tensor, torch.Tensor]] = []

    def angles(self, n: int, device: torch.device, dtype: torch.dtype = torch.float32, start: int = 0,
               step: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[n, D/2]`` of positions ``start + i * step`` for ``i < n``."""
        if torch.compiler.is_compiling():
            # inside a compiled graph the angles cost no host op, and a table made in a trace run
            # under inference mode would be an inference tensor that training could not save
            positions = torch.arange(n, device=device) * step + start
            return rope_angles(positions, self.head_dim, self.theta, dtype)
        key = (start, step, dtype, torch.device(device))
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < n:
            size = 1 << max(4, (n - 1).bit_length())
            # normal tensors even when the first forward runs under inference_mode: a later
            # training forward saves them for its backward
            with torch.inference_mode(False), torch.no_grad():
                positions = torch.arange(size, device=device) * step + start
                new = rope_angles(positions, self.head_dim, self.theta, dtype)
            if table is not None:
                self._replaced.append(table)
            self._tables[key] = table = new
        cos, sin = table
        return cos[:n], sin[:n]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, heads, D]`` pairwise (half-split layout) by the angles of its position."""
    half = x.shape[-1] // 2
    xf = x.to(cos.dtype) if x.dtype != torch.float64 else x.double()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
    return out.to(x.dtype)
