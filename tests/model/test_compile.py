"""NSAAttention traces under torch.compile(fullgraph=True): no graph break, no host sync
in the forward (the reference must compile; docs/lessons.md#no-python-loops)."""

from __future__ import annotations

import pytest
import torch

from nsa.config import AttentionConfig
from nsa.model import NSAAttention


def _layer() -> NSAAttention:
    torch.manual_seed(0)
    cfg = AttentionConfig(kind="nsa", backend="reference", compress_block=8, compress_stride=4,
                          select_block=16, num_selected=3, window=16)
    return NSAAttention(32, 4, 2, 8, cfg, 10000.0)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_nsa_attention_compiles_fullgraph(backend: str) -> None:
    torch._dynamo.reset()
    layer = _layer()
    x = torch.randn(2, 37, 32)
    want = layer(x)
    want.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)  # graph break -> error
    got = compiled(x)
    got.square().sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for n, p in layer.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-5, msg=n)


def test_a_compiled_layer_run_first_under_inference_mode_then_trains() -> None:
    """RoPE's angles are kept across forwards (``RopeCache``): a first forward under
    inference mode, compiled, must not leave tensors a training forward cannot save."""
    torch._dynamo.reset()
    layer, x = _layer(), torch.randn(2, 37, 32)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with torch.inference_mode():
        compiled(x)
    got = compiled(x)
    got.square().sum().backward()
    torch.testing.assert_close(got, _layer()(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_whole_model_compiles_fullgraph_with_checkpointing(make_model, checkpointing: bool) -> None:
    """The trainer may compile the whole model with per-block checkpointing: the gate
    statistics are written in place into a buffer, which the checkpoint HOP allows."""
    torch._dynamo.reset()
    model = make_model("nsa")
    model.activation_checkpointing = checkpointing
    tokens = torch.randint(0, 64, (2, 29))
    want = model(tokens)
    want.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    shares = model.gate_shares().clone()
    model.zero_grad()
    model.blocks[0].attn.gate_mean.zero_()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(tokens)
    got.square().mean().backward()
    torch.testing.assert_close(got, want)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], msg=n)
    torch.testing.assert_close(compiled.gate_shares(), shares)


@pytest.mark.parametrize("gather", [True, False])
def test_chunked_reference_compiles_fullgraph_inside_block_checkpoints(make_model, monkeypatch,
                                                                        gather: bool) -> None:
    """The reference ops process queries in chunks, each under its own checkpoint: three
    chunks per branch (the last one shorter) still trace without a graph break, nested in
    the model's per-block checkpoints, with the eager outputs and gradients; for both
    ways of the selected branch (per-query gather, masked scan of the prefix). Three, not
    the dozens a small budget gives at this size: tracing time grows with the chunks."""
    from nsa.ops import reference

    def three_chunks(T: int, per_query: int, device: torch.device, whole: int | None = None) -> int:
        return -(-T // 3)

    monkeypatch.setattr(reference, "_chunk_len", three_chunks)
    monkeypatch.setattr(reference, "SELECTED_PATH", "gather" if gather else "prefix")
    test_whole_model_compiles_fullgraph_with_checkpointing(make_model, checkpointing=True)
