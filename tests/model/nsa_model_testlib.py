"""Helpers for the model tests: small configs (fp64 on CPU, seconds per test), gate forcing."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import torch

from nsa.config import AttentionConfig, ModelConfig
from nsa.model import build_model

# T = 53 is a multiple of no block size below (l=8, d=4, l'=8, w=12, n*l'=32).
SEQ = 53


def small_cfg(kind: str = "nsa", vocab: int = 64, **attn: Any) -> ModelConfig:
    """Two layers, 4 query heads in 2 KV groups, head dim 8; blocks small enough that a
    53-token sequence has several compressed, selected and window blocks, partial ones too."""
    base: dict[str, Any] = dict(compress_block=8, compress_stride=4, select_block=8, num_selected=4,
                                num_initial=1, num_local=2, window=12)
    base.update(attn)
    acfg = AttentionConfig(kind=kind, backend="reference", **(base if kind == "nsa" else {}))
    return ModelConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                       ffn_hidden=64, attention=acfg)


def set_gates(model: torch.nn.Module, gates: tuple[float, float, float] | None) -> None:
    """Force (compressed, selected, window) gates in every NSA layer (None: learned gates)."""
    for blk in model.blocks:
        blk.attn.gate_override = gates


def peaked_model(kind: str = "nsa", backend: str = "reference", seed: int = 0, n_kv_heads: int = 2,
                 vocab: int = 64, **attn: Any) -> torch.nn.Module:
    """An fp32 ``small_cfg`` model in eval mode with weights of std 0.2 (not 0.02): peaked
    attention, so the block ranking has clear winners (decoding tests: a wrong selection
    moves the logits far more than rounding does)."""
    torch.manual_seed(seed)
    cfg = small_cfg(kind, vocab, **attn)
    cfg = dataclasses.replace(cfg, n_kv_heads=n_kv_heads, init_std=0.2,
                              attention=dataclasses.replace(cfg.attention, backend=backend))
    return build_model(cfg).eval()


def count_triton_launches(monkeypatch: Any, counter: Any) -> Counter[str]:
    """Count the Triton launches of the interpreter by kernel name (warm-up calls aside), and take
    the ops the interpreter itself dispatches inside a launch back out of ``counter``
    (an ``nsa.syncs.OpCounter``): they are not the step's."""
    from triton.runtime.interpreter import InterpretedFunction

    kernels: Counter[str] = Counter()
    launch = InterpretedFunction.run

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = Counter(counter.ops)
        try:
            return launch(self, *args, **kwargs)
        finally:
            counter.ops = before
            kernels[self.fn.__name__] += not kwargs.get("warmup")

    monkeypatch.setattr(InterpretedFunction, "run", counted)
    return kernels
