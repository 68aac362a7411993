"""What a decode step runs on CUDA instead of the torch ops (nsa/infer/cache.py and the
model's ``Block`` keep those as the reference, and for the CPU): which fused kernel a step
may use, its projections of one input as a single GEMM, and a block's residual adds inside
its GEMMs.

A decode step replayed from a CUDA graph costs about one kernel's latency per launch, and
for a small model most of its launches are not attention: per layer two norms, the
projections, the feed-forward's two matmuls and its activation, two residual adds. The
adds go into the output projections' GEMMs (``addmm_`` into the residual stream) and the
SwiGLU activation is one kernel: three launches fewer per layer and token."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nsa.model.layers import add_linear_
from nsa.ops import get_ops

if TYPE_CHECKING:
    from nsa.model.transformer import Block

# ``step(h, residual)``: a layer cache's step on the normed input ``h``, returning
# ``residual + attention`` when ``residual`` is given, else the attention alone
Step = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


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


def decode_block(block: Block, x: torch.Tensor, step: Step, backend: str) -> torch.Tensor:
    """``block(x)`` for one new token per sequence, ``x [B, 1, dim]``, with the layer's cached
    attention ``step``: on CUDA (``silu_mul`` among the ``backend``'s fused ops) the residual
    adds inside the output projections' GEMMs and SwiGLU's activation in one kernel; else
    the block's own forward (the reference)."""
    silu_mul = fused_op(backend, x, "silu_mul")
    if silu_mul is None:
        return block(x, lambda h: step(h, None))
    x = step(block.attn_norm(x), x.contiguous())  # x + attention: the add in o_proj's GEMM
    hidden = silu_mul(block.ffn.gate_up(block.ffn_norm(x)))
    return add_linear_(x, hidden, block.ffn.down)
