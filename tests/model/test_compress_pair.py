"""``compress_pair``: the keys' and the values' phi in one pass (batched GEMMs, a backward
written out by hand) is the two ``Compressor`` modules, forward and backward."""

from __future__ import annotations

import pytest
import torch

from nsa.model.compress import Compressor, compress_pair

# (B, T, G, D, l, d): whole and partial last blocks, l = 2d and not, one and two KV groups,
# fewer tokens than a block (no compressed token)
SHAPES = [(2, 64, 1, 16, 8, 4), (2, 37, 2, 8, 6, 3), (1, 30, 2, 8, 12, 4), (2, 5, 2, 8, 6, 3)]


def _maps(mode: str, D: int, block: int, stride: int, dtype: torch.dtype) -> tuple[Compressor, Compressor]:
    ck, cv = Compressor(D, block, stride, mode).to(dtype), Compressor(D, block, stride, mode).to(dtype)
    for p in [*ck.parameters(), *cv.parameters()]:
        torch.nn.init.normal_(p, 0.0, 0.3)  # every parameter nonzero: each gradient path counts
    return ck, cv


def _run(fn, kv: torch.Tensor, maps: tuple[Compressor, Compressor]) -> list[torch.Tensor]:
    """The two outputs, then the gradients of kv and of every parameter for fixed output grads."""
    for m in maps:
        m.zero_grad(set_to_none=True)
    kv.grad = None
    k, v = fn()
    gen = torch.Generator().manual_seed(7)
    if k.requires_grad:
        grads = [torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device) for t in (k, v)]
        torch.autograd.backward([k, v], grads)
    params = [p.grad for m in maps for p in m.parameters()]
    return [k, v, kv.grad, *params]


@pytest.mark.parametrize("mode", ["mlp", "avgpool"])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_pair_is_both_maps_forward_and_backward(mode: str, shape: tuple[int, ...]) -> None:
    B, T, G, D, block, stride = shape
    torch.manual_seed(0)
    maps = _maps(mode, D, block, stride, torch.float64)
    joint = torch.randn(B, T, 6, G, D, dtype=torch.float64, requires_grad=True)  # a layer's projection
    want = _run(lambda: (maps[0](joint[:, :, 0]), maps[1](joint[:, :, 1])), joint, maps)
    got = _run(lambda: compress_pair(*maps, joint[:, :, :2]), joint, maps)
    Nc = (T - block) // stride + 1 if T >= block else 0
    assert got[0].shape == got[1].shape == (B, Nc, G, D)
    assert got[0].is_contiguous() and got[1].is_contiguous()
    names = ["k", "v", "kv grad", *(f"{w} {n}" for w in "kv" for n, _ in maps[0].named_parameters())]
    for name, g, w in zip(names, got, want, strict=True):
        if w is None:  # T < l: nothing reaches the parameters
            assert g is None, name
            continue
        torch.testing.assert_close(g, w, msg=name)


def test_under_bf16_autocast_it_computes_as_the_maps_do() -> None:
    """Autocast runs ``nn.Linear`` in bf16 with the fp32 weights cast: the pair computes in
    its input's dtype with the weights cast the same way, and hands fp32 gradients back."""
    torch.manual_seed(0)
    maps = _maps("mlp", 16, 8, 4, torch.float32)
    joint = torch.randn(2, 64, 6, 1, 16, requires_grad=True)

    def under_autocast(fn):
        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                x = (joint * 1.0).to(torch.bfloat16)  # a projection's bf16 output
                return fn(x)
        return run

    want = _run(under_autocast(lambda x: (maps[0](x[:, :, 0]), maps[1](x[:, :, 1]))), joint, maps)
    got = _run(under_autocast(lambda x: compress_pair(*maps, x[:, :, :2])), joint, maps)
    assert got[0].dtype == want[0].dtype == torch.bfloat16
    assert {g.dtype for g in got[3:]} == {torch.float32}
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_maps_that_differ_or_a_wrong_shape_are_refused() -> None:
    ck = Compressor(8, 8, 4, "mlp")
    kv = torch.randn(1, 32, 2, 1, 8)
    with pytest.raises(ValueError, match="block, stride or mode"):
        compress_pair(ck, Compressor(8, 8, 2, "mlp"), kv)
    with pytest.raises(ValueError, match="side by side"):
        compress_pair(ck, Compressor(8, 8, 4, "mlp"), torch.randn(1, 32, 3, 1, 8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_under_bf16_autocast_it_matches_the_maps() -> None:
    """nsa-125m's phi (head dim 64, l 32, d 16, one KV group) as a GPU run trains it: cuBLAS's
    batched GEMMs against the two modules' own, outputs and every gradient within bf16's
    rounding (relative 1e-2 of each tensor's largest entry)."""
    torch.manual_seed(0)
    maps = tuple(m.cuda() for m in _maps("mlp", 64, 32, 16, torch.float32))
    joint = torch.randn(4, 2048, 6, 1, 64, device="cuda", requires_grad=True)

    def under_autocast(fn):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return fn(joint.to(torch.bfloat16))
        return run

    want = _run(under_autocast(lambda x: (maps[0](x[:, :, 0]), maps[1](x[:, :, 1]))), joint, maps)
    got = _run(under_autocast(lambda x: compress_pair(*maps, x[:, :, :2])), joint, maps)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        err = float((g.float() - w.float()).abs().max() / w.float().abs().max())
        assert err <= 1e-2, f"tensor {i}: relative error {err:.2e}"
