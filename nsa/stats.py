"""Parameter count and FLOPs per token of a model config, so reports compare like with like.

``python -m nsa.stats CONFIG [--set section.key=value ...]`` prints them for the config's
``train.seq_len``. FLOPs are algorithmic (what a kernel that skips masked work does),
forward, one multiply-add = 2 FLOPs, averaged over the positions of one causal sequence:

- attention core: ``4 * n_heads * head_dim`` per (query, visible key) pair (QK^T and PV);
  NSA counts its three branches: compressed tokens whose block has ended, the tokens
  ``<= t`` of the n selected blocks, and the window; dense counts ``t + 1`` keys;
- matmuls: ``2 * weights`` per token for every linear layer (LM head included), the
  compression MLP amortised over the ``Nc / T`` compressed tokens per token;
- a training step is 3x the forward (backward = 2x forward).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from nsa.config import ConfigError, ModelConfig, load_config
from nsa.ops.reference import num_compressed

if TYPE_CHECKING:
    from nsa.model import Transformer


def _meta_model(model_cfg: ModelConfig) -> Transformer:
    from nsa.model import build_model

    with torch.device("meta"):  # exact shapes, no memory, no init cost
        return build_model(model_cfg)


def param_count(model_cfg: ModelConfig, non_embedding: bool = False) -> int:
    """Parameters of the model ``model_cfg`` builds (tied weights counted once)."""
    return _meta_model(model_cfg).param_count(non_embedding=non_embedding)


def _keys_per_query(model_cfg: ModelConfig, t: int) -> int:
    """Keys (compressed + selected + window, or dense) that query position t attends to."""
    a = model_cfg.attention
    if a.kind == "dense":
        return t + 1
    n_cmp = num_compressed(t + 1, a.compress_block, a.compress_stride)
    eligible = t // a.select_block + 1
    if eligible <= a.num_selected:
        n_slc = t + 1
    else:
        n_slc = (a.num_selected - 1) * a.select_block + (t % a.select_block + 1)
    n_win = min(a.window, t + 1)
    return n_cmp + n_slc + n_win


def attention_flops_per_token(model_cfg: ModelConfig, seq_len: int) -> float:
    """Forward attention-core FLOPs per token, all layers, mean over a causal sequence."""
    keys = sum(_keys_per_query(model_cfg, t) for t in range(seq_len)) / seq_len
    return 4.0 * model_cfg.n_heads * model_cfg.head_dim * keys * model_cfg.n_layers


def matmul_flops_per_token(model_cfg: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per token of every linear layer (2 * weights), compression amortised."""
    from nsa.model.compress import Compressor

    model = _meta_model(model_cfg)
    in_compressor = {id(m) for c in model.modules() if isinstance(c, Compressor) for m in c.modules()}
    flops = 0.0
    for m in model.modules():
        if isinstance(m, nn.Linear) and id(m) not in in_compressor:
            flops += 2.0 * m.weight.numel()
    a = model_cfg.attention
    if a.kind == "nsa" and a.compress_mode == "mlp":
        per_token = num_compressed(seq_len, a.compress_block, a.compress_stride) / seq_len
        for c in model.modules():
            if isinstance(c, Compressor):  # applied per KV head and compressed token
                w = sum(m.weight.numel() for m in c.modules() if isinstance(m, nn.Linear))
                flops += 2.0 * w * model_cfg.n_kv_heads * per_token
    return flops


def train_flops_per_token(model_cfg: ModelConfig, seq_len: int) -> float:
    """FLOPs of one trained token (3x forward): what run.json records for TFLOP/s and MFU."""
    return 3.0 * (attention_flops_per_token(model_cfg, seq_len) + matmul_flops_per_token(model_cfg, seq_len))


@dataclass
class ModelStats:
    """Everything ``python -m nsa.stats`` prints."""

    params: int
    params_non_embedding: int
    seq_len: int
    attention_flops_per_token: float
    forward_flops_per_token: float
    train_flops_per_token: float


def model_stats(model_cfg: ModelConfig, seq_len: int) -> ModelStats:
    """Parameters and FLOPs per token of ``model_cfg`` at ``seq_len``."""
    attn = attention_flops_per_token(model_cfg, seq_len)
    fwd = attn + matmul_flops_per_token(model_cfg, seq_len)
    return ModelStats(  # train_flops_per_token == 3 * fwd
        params=param_count(model_cfg),
        params_non_embedding=param_count(model_cfg, non_embedding=True),
        seq_len=seq_len,
        attention_flops_per_token=attn,
        forward_flops_per_token=fwd,
        train_flops_per_token=3.0 * fwd,
    )


def format_stats(name: str, s: ModelStats) -> str:
    """Human-readable lines, every number with its unit."""
    return "\n".join(
        [
            f"config: {name}",
            f"parameters: {s.params:,} ({s.params / 1e6:.2f} M), non-embedding {s.params_non_embedding:,}",
            f"seq_len: {s.seq_len} tokens",
            f"attention FLOPs/token (forward): {s.attention_flops_per_token / 1e6:.2f} MFLOP",
            f"model FLOPs/token (forward): {s.forward_flops_per_token / 1e6:.2f} MFLOP",
            f"model FLOPs/token (train step, 3x forward): {s.train_flops_per_token / 1e6:.2f} MFLOP",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nsa.stats", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="config YAML file")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value (repeatable)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_stats(cfg.name, model_stats(cfg.model, cfg.train.seq_len)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
