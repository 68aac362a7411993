"""FlexAttention's window branch (nsa/ops/flex.py): its block mask, its forward against the
reference, where the model uses it, and its check before a run trains on it.

FlexAttention has no backward on CPU: here its forward runs (uncompiled and compiled by
inductor for the CPU); its backward is compared with the reference on a GPU (the ``gpu``
tests below, and the self-check every run does first)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask
from torch.utils._python_dispatch import TorchDispatchMode

import nsa.ops as ops_pkg
from nsa.ops import AttentionShape, choose_ops, flex, reference, self_check, window_attention
from nsa.ops.self_check import FLEX_WINDOW, FLEX_WINDOW_CHECKPOINTED

# smoke-cpu's NSA layout, as tests/ops/test_self_check.py
SHAPE = AttentionShape(n_heads=2, n_kv_heads=1, head_dim=16, compress_block=16, compress_stride=8,
                       select_block=16, num_selected=3, num_initial=1, num_local=1, window=32)
MASKS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
         "full_q_num_blocks", "full_q_indices")


@pytest.fixture(autouse=True)
def _restore():
    """choose_ops settles get_ops and may turn the FlexAttention path off: undo both."""
    saved, off = dict(ops_pkg._RESOLVED), flex.off_reason()
    yield
    ops_pkg._RESOLVED.clear()
    ops_pkg._RESOLVED.update(saved)
    flex.turn_off(off) if off is not None else flex.turn_on()


@pytest.mark.parametrize("T", [1, 100, 128, 129, 256, 300, 700])
def test_the_window_block_mask_is_create_block_masks(T: int) -> None:
    """Built from the window's arithmetic, it equals what ``create_block_mask`` finds by
    evaluating the mask at every pair: partial and full blocks, both directions (the
    backward reads the query-side ones)."""
    for window in (1, 5, 127, 128, 129, 200, 512, 1000):
        mine = flex.window_block_mask(T, window, torch.device("cpu"))
        theirs = create_block_mask(flex._window_mask_mod(window), None, None, T, T, device="cpu")
        for name in MASKS:
            assert torch.equal(getattr(mine, name), getattr(theirs, name)), (T, window, name)
        assert mine.seq_lengths == (T, T)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(("B", "T", "H", "G", "D", "window"), [
    (2, 300, 4, 2, 32, 100),  # GQA, a partial last block, the window's far edge inside a block
    (1, 257, 2, 2, 16, 128),  # one head per group, the window one block wide
    (1, 64, 4, 1, 64, 512),  # the window longer than the sequence: causal
])
def test_its_forward_equals_the_reference(B: int, T: int, H: int, G: int, D: int, window: int) -> None:
    gen = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(B, T, n, D, generator=gen) for n in (H, G, G))
    want = reference.window_attention(q, k, v, window)
    got = flex.window_attention(q, k, v, window)
    assert got.shape == want.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    scaled = flex.window_attention(q, k, v, window, scale=0.3)
    torch.testing.assert_close(scaled, reference.window_attention(q, k, v, window, scale=0.3), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.timeout(300)
def test_its_compiled_forward_equals_the_reference() -> None:
    """The path a GPU run takes (torch.compile, static shapes, the block mask through the
    graph, autocast off inside), compiled by inductor for the CPU."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 300, n, 32, generator=gen) for n in (4, 2, 2))
    with torch.no_grad():
        got = flex.window_attention(q, k, v, 100, compiled=True)
    torch.testing.assert_close(got, reference.window_attention(q, k, v, 100), rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(300)
def test_the_compiled_graph_takes_and_returns_tokens_by_heads() -> None:
    """The transposes to FlexAttention's [B, heads, T, D] are inside the compiled graph, and
    what it returns is contiguous [B, T, H, D]: so is the gradient autograd hands its backward
    on a GPU, which torch 2.11 would otherwise copy into the layout it traced (a strided copy
    the size of the output, every backward; the gpu test below counts the copies)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 300, n, 32, generator=gen) for n in (4, 2, 2))
    with torch.no_grad():
        got = flex._compiled()(q, k, v, flex.window_block_mask(300, 100, q.device), 32**-0.5, True)
    assert got.shape == q.shape and got.is_contiguous()
    torch.testing.assert_close(got, reference.window_attention(q, k, v, 100), rtol=1e-5, atol=1e-5)


def test_bad_input_is_refused_with_what_is_wrong() -> None:
    q, k = torch.zeros(1, 8, 3, 16), torch.zeros(1, 8, 2, 16)
    with pytest.raises(ValueError, match="3 query heads do not split into 2 KV groups"):
        flex.window_attention(q, k, k, 4)
    with pytest.raises(ValueError, match="window must be at least 1"):
        flex.window_attention(q, q, q, 0)


def test_where_a_training_run_uses_it() -> None:
    """CUDA, 16-bit, a head dim it takes whole; named reasons otherwise (no GPU needed: the
    decision reads the device, not a tensor on it)."""
    cuda = torch.device("cuda")
    assert flex.unsuited(cuda, torch.bfloat16, 64) is None
    assert flex.unsuited(cuda, torch.float16, 128) is None
    assert "float32 compute" in flex.unsuited(cuda, torch.float32, 64)
    assert "head dim 48" in flex.unsuited(cuda, torch.bfloat16, 48)
    assert "need CUDA, not cpu" in flex.unsuited(torch.device("cpu"), torch.bfloat16, 64)
    flex.turn_off("NSA_FLEX_WINDOW=0 in the environment")
    assert flex.unsuited(cuda, torch.bfloat16, 64) == "NSA_FLEX_WINDOW=0 in the environment"


def test_off_a_gpu_the_model_keeps_its_ops_window_attention() -> None:
    """``nsa.ops.window_attention`` on CPU, with a gradient: the ops' own kernel (here the
    reference's), bit for bit."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 40, n, 16, generator=gen, requires_grad=True) for n in (2, 1, 1))
    assert torch.equal(window_attention(reference, q, k, v, 8), reference.window_attention(q, k, v, 8))


@pytest.mark.timeout(300)
def test_a_failing_flex_check_turns_off_flex_not_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU stands in for the GPU (fp32, the interpreted kernels): FlexAttention's real
    backward then fails there ("does not support backward on CPU"), as a GPU-only failure
    would. The kernels pass; the run keeps them, with the band kernel for the window, and
    says why."""
    monkeypatch.setattr(flex, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(flex, "DTYPES", (torch.float32,))
    cpu_check = lambda device, dtype, shape: self_check("cpu", dtype, shape)  # noqa: E731
    choice = choose_ops("triton", "cpu", torch.float32, SHAPE, check=cpu_check)
    assert choice.backend == "triton" and choice.fallback_reason is None and choice.check.ok
    assert {FLEX_WINDOW, FLEX_WINDOW_CHECKPOINTED} <= set(choice.check.checked)
    # both checks failed, each named, neither among the kernels' failures
    assert choice.check.flex_failure.startswith(f"{FLEX_WINDOW}: NotImplementedError")
    assert f"; {FLEX_WINDOW_CHECKPOINTED}: NotImplementedError" in choice.check.flex_failure
    assert "backward on CPU" in choice.check.flex_failure
    assert choice.window == "triton"
    assert choice.window_reason.startswith("FlexAttention failed the self-check on cpu (float32): ")
    rec = choice.record()
    assert rec.window == "triton" and rec.window_reason == choice.window_reason
    assert rec.self_check.ok and rec.self_check.failures == []
    assert flex.off_reason() == choice.window_reason  # the model's window branch keeps the band kernel


def test_a_kernels_run_records_which_kernel_trains_the_window() -> None:
    """Off CUDA, or in fp32, the band kernel, with the reason; the reference backend: the reference."""
    cpu_check = lambda device, dtype, shape: self_check("cpu", dtype, shape)  # noqa: E731
    choice = choose_ops("auto", "cuda", torch.float32, SHAPE, check=cpu_check)
    assert choice.window == "triton" and "float32 compute" in choice.window_reason
    assert FLEX_WINDOW not in choice.check.checked
    ref = choose_ops("reference", "cpu", torch.float32, SHAPE).record()
    assert ref.window == "reference" and ref.window_reason is None


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize(("H", "G", "D"), [(16, 1, 64), (64, 4, 128)])
def test_compiled_forward_and_backward_on_gpu(H: int, G: int, D: int) -> None:
    """bf16 on the GPU against the fp32 reference on the same rounded inputs: the output and
    every gradient within 1e-2 relative (Frobenius), as the band kernel's test."""
    gen = torch.Generator().manual_seed(H)
    B, T, window = 2, 1000, 256
    xs = [torch.randn(B, T, n, D, generator=gen).bfloat16().cuda() for n in (H, G, G)]
    do = torch.randn(B, T, H, D, generator=gen).bfloat16().cuda()
    mine = [x.clone().requires_grad_() for x in xs]
    theirs = [x.float().clone().requires_grad_() for x in xs]
    assert flex.suits(*mine)
    got = window_attention(ops_pkg.get_ops("triton", "cuda"), *mine, window)  # the model's dispatch
    got.backward(do)
    want = reference.window_attention(*theirs, window)
    want.backward(do.float())
    for a, b in [(got, want), *((m.grad, t.grad) for m, t in zip(mine, theirs))]:
        err = float((a.double() - b.double()).norm() / b.double().norm())
        assert err <= 1e-2, err


class _CopiesOf(TorchDispatchMode):
    """How many copies the ops under it make of ``source``'s memory (a view of it included)."""

    def __init__(self, source: torch.Tensor) -> None:
        super().__init__()
        self.ptr, self.copies = source.untyped_storage().data_ptr(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        src = {torch.ops.aten.clone.default: 0, torch.ops.aten.copy_.default: 1}.get(func)
        if src is not None and args[src].untyped_storage().data_ptr() == self.ptr:
            self.copies += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.gpu
@GPU
def test_its_backward_copies_no_gradient_on_gpu() -> None:
    """The window's gradient reaches FlexAttention's compiled backward as it is, not copied
    (torch 2.11 copied it when the graph returned a transposed view)."""
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(2, 1000, n, 64, generator=gen).bfloat16().cuda().requires_grad_() for n in (16, 1, 1)]
    do = torch.randn(2, 1000, 16, 64, generator=gen).bfloat16().cuda()
    flex.window_attention(*xs, 256).backward(do)  # compiles the forward and the backward
    out = flex.window_attention(*xs, 256)
    with _CopiesOf(do) as seen:
        out.backward(do)
    assert seen.copies == 0


@pytest.mark.gpu
@GPU
def test_the_gpu_self_check_covers_it() -> None:
    report = self_check("cuda", torch.bfloat16, AttentionShape(16, 1, 64))
    assert report.ok and report.flex_failure is None, (report.reason(), report.flex_failure)
    assert {FLEX_WINDOW, FLEX_WINDOW_CHECKPOINTED} <= set(report.checked)


def test_every_shape_combination_is_one_block_map() -> None:
    """Partial and full blocks never overlap, and together they are every block some pair sees."""
    for T, window in itertools.product((1, 130, 513), (1, 64, 300)):
        partial, full = flex._window_blocks(T, window, torch.device("cpu"))
        assert not (partial & full).any()
        t = torch.arange(T)
        seen = ((t[None, :] <= t[:, None]) & (t[:, None] - t[None, :] < window)).float()
        n = partial.shape[0]
        padded = torch.zeros(n * flex.BLOCK, n * flex.BLOCK)
        padded[:T, :T] = seen
        blocks = padded.view(n, flex.BLOCK, n, flex.BLOCK).sum((1, 3))
        assert torch.equal(partial | full, blocks > 0)


@pytest.mark.gpu
@GPU
def test_a_checkpointed_model_on_gpu_trains_the_window_on_flex() -> None:
    """smoke-cpu's NSA model on the GPU in bf16 autocast, with the Triton kernels: the same
    gradients with and without activation checkpointing (the window recomputed by
    FlexAttention inside the backward), and close to the band kernel's."""
    from nsa.config import load_config
    from nsa.model.transformer import build_model

    smoke = Path(__file__).resolve().parents[2] / "configs" / "smoke-cpu.yaml"
    cfg = load_config(str(smoke), ["model.attention.kind=nsa", "model.attention.backend=triton"])
    torch.manual_seed(0)
    model = build_model(cfg.model).cuda()
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 300), device="cuda")
    calls = []
    real = flex.window_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    def grads(checkpointed: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        model.activation_checkpointing = checkpointed
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        return [p.grad.float().clone() for p in model.parameters()]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flex, "window_attention", counted)
        plain = grads(False)
        assert len(calls) == cfg.model.n_layers  # every layer's window on FlexAttention
        checkpointed = grads(True)
        assert len(calls) == 3 * cfg.model.n_layers  # its forward, then the recompute in the backward
    flex.turn_off("the band kernel, to compare")
    band = grads(False)
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)  # the same kernels, recomputed
    flat_flex, flat_band = torch.cat([g.flatten() for g in plain]), torch.cat([g.flatten() for g in band])
    assert float((flat_flex - flat_band).norm()) <= 3e-2 * float(flat_band.norm())  # bf16 rounding apart
