"""The small kernels around attention (glue.py): delta, the gated combine, RoPE.

Each against the torch expression it replaces, forward and backward, fp32 in the
interpreter (and the 16-bit path in fp16, whose dtype handling is the point)."""

from __future__ import annotations

import pytest
import torch

import nsa.ops.triton as T_OPS
from nsa.ops.rope import apply_rope, rope_angles
from nsa.ops.triton.glue import row_delta
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err


@pytest.mark.parametrize("heads_major", [False, True])
def test_row_delta_is_rowsum_of_do_times_o(heads_major):
    seed = fresh_seed()
    o, do = torch.randn(2, 37, 3, 24), torch.randn(2, 37, 3, 24)  # D not a power of two
    want = (o * do).sum(-1)
    want = want.permute(0, 2, 1) if heads_major else want
    got = row_delta(o, do, heads_major)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert rel_err(got, want) <= TOL, f"seed={seed}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gated_combine_matches_torch(dtype):
    seed = fresh_seed()
    B, T, H, D = 2, 29, 3, 40
    g = torch.rand(B, T, H, 3)
    os_ = [torch.randn(B, T, H, D).to(dtype) for _ in range(3)]
    dout = torch.randn(B, T, H, D).to(dtype)
    xs = [x.clone().requires_grad_() for x in (g, *os_)]
    out = T_OPS.gated_combine(*xs)
    out.backward(dout)
    rs = [x.detach().double().requires_grad_() for x in (g, *os_)]
    ref = rs[0][..., 0:1] * rs[1] + rs[0][..., 1:2] * rs[2] + rs[0][..., 2:3] * rs[3]
    ref.backward(dout.double())
    tol = TOL if dtype == torch.float32 else 1e-3
    assert out.dtype == dtype and xs[0].grad.dtype == torch.float32
    assert rel_err(out, ref) <= tol, f"seed={seed} out"
    for i, (a, r) in enumerate(zip(xs, rs)):
        assert a.grad.dtype == a.dtype and rel_err(a.grad, r.grad) <= tol, f"seed={seed} grad {i}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_kernel_matches_the_model_rope_on_a_strided_slice(dtype):
    """The model rotates slices of its fused K/V projection: a view with gaps between heads."""
    seed = fresh_seed()
    B, T, G, D = 2, 33, 2, 24
    kv = torch.randn(B, T, 6, G, D).to(dtype)
    cos, sin = rope_angles(torch.arange(T), D, 10000.0)
    x = kv[:, :, 2].clone().requires_grad_()
    view = kv.clone()
    view[:, :, 2] = x.detach()
    strided = view[:, :, 2].requires_grad_(False)
    got = T_OPS.apply_rope(strided, cos, sin)
    assert got.dtype == dtype and got.is_contiguous()
    ref = apply_rope(x.detach().float(), cos, sin)
    tol = TOL if dtype == torch.float32 else 1e-3
    assert rel_err(got, ref) <= tol, f"seed={seed} out"
    dy = torch.randn(B, T, G, D).to(dtype)
    a = x.detach().clone().requires_grad_()
    T_OPS.apply_rope(a, cos, sin).backward(dy)
    r = x.detach().float().requires_grad_()
    apply_rope(r, cos, sin).backward(dy.float())
    assert a.grad.dtype == dtype and rel_err(a.grad, r.grad) <= tol, f"seed={seed} grad"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_combine_of_gate_logits_is_the_combine_of_their_sigmoid(dtype):
    """Decoding's combine (``gated_combine_logits``): the sigmoid of 16-bit or fp32 logits,
    in fp32 inside the kernel, as the model's ``torch.sigmoid(upcast(logits))``."""
    seed = fresh_seed()
    B, T, H, D = 3, 1, 5, 40
    logits = (4 * torch.randn(B, T, H, 3)).to(dtype)
    os_ = [torch.randn(B, T, H, D).to(dtype) for _ in range(3)]
    got = T_OPS.gated_combine_logits(logits, *os_)
    g = torch.sigmoid(logits.double())
    want = sum(g[..., c:c + 1] * os_[c].double() for c in range(3))
    assert got.dtype == dtype and got.shape == (B, T, H, D)
    assert rel_err(got, want) <= (TOL if dtype == torch.float32 else 1e-3), f"seed={seed}"


@pytest.mark.parametrize("T", [1, 4])
def test_gate_logits_are_read_in_place_through_their_strides(T):
    """Gate logits sliced from a wider projection (as a decode step's are): read through
    their position stride, no copy, for one position per sequence and several; a layout
    whose positions are not evenly spaced is copied first. All equal the contiguous result."""
    seed = fresh_seed()
    B, H, D = 3, 4, 16
    os_ = [torch.randn(B, T, H, D) for _ in range(3)]
    wide = torch.randn(B, T, 7 + 3 * H)
    sliced = wide[..., 7:].view(B, T, H, 3)
    want = T_OPS.gated_combine_logits(sliced.contiguous(), *os_)
    assert rel_err(T_OPS.gated_combine_logits(sliced, *os_), want) <= TOL, f"seed={seed}"
    uneven = torch.randn(T, B, 3 * H + 2)[..., :3 * H].transpose(0, 1).reshape(B, T, H, 3)  # B, T don't merge
    want = T_OPS.gated_combine_logits(uneven.contiguous(), *os_)
    assert rel_err(T_OPS.gated_combine_logits(uneven, *os_), want) <= TOL, f"seed={seed}"


@pytest.mark.parametrize("hidden", [24, 1500])
def test_silu_mul_is_swiglus_activation(hidden):
    """``silu_mul`` of SwiGLU's joint output (gate half, then up half) as the model's
    ``F.silu(gate) * up``: rows of a strided input, a hidden size past one program's columns."""
    seed = fresh_seed()
    x = torch.randn(3, 1, 2 * hidden + 5)[..., 5:]  # not contiguous: rows 2 * hidden + 5 apart
    gate, up = x.split(hidden, dim=-1)
    got = T_OPS.silu_mul(x)
    assert got.shape == (3, 1, hidden) and got.dtype == x.dtype
    assert rel_err(got, torch.nn.functional.silu(gate) * up) <= TOL, f"seed={seed}"
    with pytest.raises(ValueError, match="gate and up halves"):
        T_OPS.silu_mul(torch.randn(2, 7))


@pytest.mark.parametrize("dim", [12, 1500])
def test_silu_mul_finishes_a_folded_norm(dim):
    """With ``norm=(xn, eps)`` the input is SwiGLU's joint matmul of the raw ``xn`` by weights
    holding the RMSNorm's gain: ``silu_mul`` equals the activation of the normed input's matmul
    (a row longer than one program's chunk, 1,500, too); a mismatched ``xn`` is refused."""
    seed = fresh_seed()
    hidden, eps = 24, 1e-5
    xn = 4.0 * torch.randn(3, 1, dim)
    gain, w = torch.rand(dim) + 0.5, torch.randn(2 * hidden, dim) / dim**0.5
    normed = xn * torch.rsqrt(xn.pow(2).mean(-1, keepdim=True) + eps) * gain
    gate, up = (normed @ w.t()).split(hidden, dim=-1)
    got = T_OPS.silu_mul(xn @ (w * gain).t(), norm=(xn, eps))
    assert rel_err(got, torch.nn.functional.silu(gate) * up) <= TOL, f"seed={seed}"
    with pytest.raises(ValueError, match="the norm's input"):
        T_OPS.silu_mul(xn @ (w * gain).t(), norm=(xn[:2], eps))
