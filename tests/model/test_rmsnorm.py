"""RMSNorm: torch's fused kernel on CUDA against the formula (the CPU's path)."""

from __future__ import annotations

import pytest
import torch

from nsa.model.layers import RMSNorm

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _norm(device: str, dtype: torch.dtype) -> RMSNorm:
    norm = RMSNorm(96, eps=1e-5).to(device=device, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 96))
    return norm


def test_the_cpu_runs_the_formula() -> None:
    norm = _norm("cpu", torch.float32)
    x = torch.randn(3, 5, 96)
    assert torch.equal(norm(x), norm.reference(x))
    ms = x.pow(2).mean(-1, keepdim=True)
    torch.testing.assert_close(norm(x), x / torch.sqrt(ms + 1e-5) * norm.weight, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_kernel_equals_the_formula(dtype: torch.dtype) -> None:
    """Forward and both gradients, fp32 and bf16 (fp32 inside either way), and under bf16
    autocast over an fp32 input as in training."""
    torch.manual_seed(0)
    norm = _norm("cuda", dtype)
    x = (torch.randn(4, 33, 96, device="cuda") * 3).to(dtype).requires_grad_()
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    got = norm(x)
    want = norm.reference(x)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, **tol)
    g = torch.randn_like(got)
    gx, gw = torch.autograd.grad(got, (x, norm.weight), g)
    rx, rw = torch.autograd.grad(want, (x, norm.weight), g)
    torch.testing.assert_close(gx, rx, **tol)
    torch.testing.assert_close(gw.float(), rw.float(), rtol=tol["rtol"] * 4, atol=tol["atol"] * 40)
    if dtype == torch.float32:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got_ac = norm(x)
        torch.testing.assert_close(got_ac.float(), want, rtol=1.6e-2, atol=1e-2)
