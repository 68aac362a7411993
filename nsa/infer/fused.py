"""What a decode step runs on CUDA instead of the torch ops (nsa/infer/cache.py and the
model's ``Block`` keep those as the reference, and for the CPU): which fused kernel a step
may use, its projections of one input as a single GEMM with the RMSNorm before them folded
into its weights, and a block's residual adds inside its GEMMs.

A decode step replayed from a CUDA graph costs about one kernel's latency per launch, and
for a small model most of its launches are not attention: per layer two norms, the
projections, the feed-forward's two matmuls and its activation, two residual adds. The
adds go into the output projections' GEMMs (``addmm_`` into the residual stream), the
SwiGLU activation is one kernel, and the norms go into the GEMMs after them: ``norm(x) @
W.T`` is ``(x @ (W * gain).T) / rms(x)``, so the GEMM takes the raw ``x`` and the kernel
that reads its output (``decode_write``, ``silu_mul``) divides by ``rms(x)``, which it
computes from ``x`` itself. Five launches fewer per layer and token."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nsa.model.layers import RMSNorm, add_linear_
from nsa.ops import get_ops

if TYPE_CHECKING:
    from nsa.model.transformer import Block

# ``step(h, residual, norm)``: a layer cache's step on the input ``h`` (normed already when
# ``norm`` is None, else the raw input that ``norm`` is applied to), returning ``residual +
# attention`` when ``residual`` is given, else the attention alone
Step = Callable[[torch.Tensor, torch.Tensor | None, RMSNorm | None], torch.Tensor]


def fused_op(backend: str, x: torch.Tensor, name: str) -> Callable[..., Any] | None:
    """The ops' fused decode op ``name`` (Triton's, on CUDA) for a step on ``x``, or None: off
    CUDA, in fp64, or with the reference ops a step runs the torch ops those kernels replace
    (the reference the tests compare them with)."""
    if not x.is_cuda or x.dtype == torch.float64:
        return None
    return getattr(get_ops(backend, x.device.type), name, None)


class JointProjection:
    """Several of a layer's projections of the same input as one GEMM (a decode step on CUDA:
    one launch per layer and token instead of two or three), optionally with the RMSNorm
    before them folded in. The joint weight is built on the first call from the modules'
    weights, which do not change while a cache decodes (a new prefill makes a new cache);
    linears without a bias count as a zero bias when another has one."""

    def __init__(self, linears: list[torch.nn.Linear], norm: RMSNorm | None = None) -> None:
        if norm is not None and any(m.bias is not None for m in linears[:-1]):
            # the kernel that finishes the norm adds one bias, after the scale: the last linear's
            raise ValueError("with a norm folded in, only the last linear may have a bias")
        self.linears = linears
        self.norm = norm
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    def _build(self) -> None:
        with torch.no_grad():
            weight = torch.cat([m.weight for m in self.linears])
            if self.norm is not None:  # the gain scales the input's columns: fold it into W's
                weight = (weight.float() * self.norm.weight.float()[None, :]).to(weight.dtype)
            self._weight = weight
            if self.norm is None and any(m.bias is not None for m in self.linears):
                self._bias = torch.cat([m.weight.new_zeros(m.out_features) if m.bias is None else m.bias
                                        for m in self.linears])

    def project(self, x: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """``x [B, 1, dim]`` through every linear -> one view ``[B, 1, *shape]`` per linear
        (slices of one output: no copy). With a norm, ``x`` is the norm's raw input and the
        views are ``(linear(norm(x)) - bias) * rms(x)``: what ``decode_write`` or ``silu_mul``
        finish with ``norm=(x, self.norm.eps)`` (and the last linear's bias)."""
        if self._weight is None:
            self._build()
        assert self._weight is not None
        bias = self._bias if self.norm is None else None
        out = torch.nn.functional.linear(x, self._weight, bias)
        views, start = [], 0
        for m, shape in zip(self.linears, shapes, strict=True):
            views.append(out[..., start:start + m.out_features].view(*x.shape[:-1], *shape))
            start += m.out_features
        return views


def joint_for(current: JointProjection | None, linears: list[torch.nn.Linear], norm: RMSNorm | None
              ) -> JointProjection:
    """``current`` when it already projects with ``norm`` folded in (or none), else a new
    projection that does: a cache builds its joint weights once, on its first step."""
    if current is not None and current.norm is norm:
        return current
    return JointProjection(linears, norm)


def decode_block(block: Block, x: torch.Tensor, step: Step, backend: str,
                 folds: dict[str, JointProjection]) -> torch.Tensor:
    """``block(x)`` for one new token per sequence, ``x [B, 1, dim]``, with the layer's cached
    attention ``step``: on CUDA (``silu_mul`` among the ``backend``'s fused ops) the norms
    folded into the GEMMs after them (``step`` gets the raw ``x`` and the norm), the residual
    adds inside the output projections' GEMMs and SwiGLU's activation in one kernel; else the
    block's own forward (the reference). ``folds``: the layer's folded projections, kept by its
    cache from step to step (built here on the first)."""
    silu_mul = fused_op(backend, x, "silu_mul")
    if silu_mul is None:
        return block(x, lambda h: step(h, None, None))
    x = x.contiguous()
    x = step(x, x, block.attn_norm)  # x + attention: the norm in the projection's GEMM, the add in o_proj's
    ffn = folds["ffn"] = joint_for(folds.get("ffn"), [block.ffn.gate_up], block.ffn_norm)
    (gate_up,) = ffn.project(x, [(2 * block.ffn.hidden,)])
    hidden = silu_mul(gate_up, norm=(x, block.ffn_norm.eps))
    return add_linear_(x, hidden, block.ffn.down)
