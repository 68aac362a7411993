"""What a decode step runs on CUDA instead of the torch ops (nsa/infer/cache.py keeps those
as the reference, and for the CPU): which fused kernel a step may use, and its projections
of one input as a single GEMM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nsa.ops import get_ops


def fused_op(backend: str, x: torch.Tensor, name: str) -> Callable[..., Any] | None:
    """The ops' fused decode op ``name`` (Triton's, on CUDA) for a step on ``x``, or None: off
    CUDA, in fp64, or with the reference ops a step runs the torch ops those kernels replace
    (the reference the tests compare them with)."""
    if not x.is_cuda or x.dtype == torch.float64:
        return None
    return getattr(get_ops(backend, x.device.type), name, None)


class JointProjection:
    """Several of a layer's projections of the same input as one GEMM (a decode step on CUDA:
    one launch per layer and token instead of two or three). The joint weight is built on the
    first call from the modules' weights, which do not change while a cache decodes (a new
    prefill makes a new cache); linears without a bias count as a zero bias when another has
    one."""

    def __init__(self, linears: list[torch.nn.Linear]) -> None:
        self.linears = linears
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    def project(self, x: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """``x [B, 1, dim]`` through every linear -> one view ``[B, 1, *shape]`` per linear
        (slices of one output: no copy)."""
        if self._weight is None:
            with torch.no_grad():
                self._weight = torch.cat([m.weight for m in self.linears])
                if any(m.bias is not None for m in self.linears):
                    self._bias = torch.cat([m.weight.new_zeros(m.out_features) if m.bias is None else m.bias
                                            for m in self.linears])
        out = torch.nn.functional.linear(x, self._weight, self._bias)
        views, start = [], 0
        for m, shape in zip(self.linears, shapes, strict=True):
            views.append(out[..., start:start + m.out_features].view(*x.shape[:-1], *shape))
            start += m.out_features
        return views
