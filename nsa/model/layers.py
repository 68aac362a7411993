"""Small building blocks of the decoder: RMSNorm, the SwiGLU feed-forward, a residual linear."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def upcast_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ``upcast`` gives, without making the copy (a decode step asks it per layer)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def upcast(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32 for reductions and nonlinearities; fp32 and fp64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learnable gain (computed in fp32 for bf16 stability)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # torch's fused kernel (fp32 inside for bf16, as below): one launch forward and
            # one backward instead of nine and a dozen; a decode step and a small model's
            # train step are bound by launches (a GPU test compares it with the formula)
            return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)
        return self.reference(x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The formula, op by op: the CPU's path, and what the fused kernel is checked against."""
        xf = upcast(x)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(xf.dtype)).to(x.dtype)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``; gate and up share one matmul."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.hidden, dim=-1)
        return self.down(F.silu(gate) * up)


def swiglu_hidden(dim: int, ffn_hidden: int | None) -> int:
    """The configured hidden size, or SwiGLU's 8/3 * dim rounded up to a multiple of 64."""
    if ffn_hidden is not None:
        return ffn_hidden
    h = (8 * dim) // 3
    return ((h + 63) // 64) * 64


def add_linear_(residual: torch.Tensor, x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    """``residual += linear(x)`` as one GEMM whose epilogue adds (``addmm_``, in place, so no
    copy of ``residual`` first); ``residual [..., out]`` contiguous, ``x [..., in]``. Returns
    ``residual``. A linear with a bias adds it too (a second op)."""
    flat = residual.view(-1, residual.shape[-1])
    flat.addmm_(x.reshape(-1, x.shape[-1]), linear.weight.t())
    if linear.bias is not None:
        flat.add_(linear.bias)
    return residual
