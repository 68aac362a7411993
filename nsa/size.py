"""Parameter count of a model config without torch (the host agent describes configs before a
launch and must not load torch for it). ``tests/test_size.py`` checks it against the real
model built on the meta device (``nsa.stats.param_count``) for every shipped config and
variants of each term, so the two cannot drift apart."""

from __future__ import annotations

from nsa.config import ModelConfig


def ffn_hidden(dim: int, configured: int | None) -> int:
    """SwiGLU's hidden size: the configured one, or 8/3 * dim rounded up to a multiple of 64
    (the same rule as ``nsa.model.layers.swiglu_hidden``)."""
    if configured is not None:
        return configured
    return (((8 * dim) // 3 + 63) // 64) * 64


def param_count(m: ModelConfig) -> int:
    """Parameters of the model ``m`` describes, tied weights counted once."""
    d, h, kv, hd = m.dim, m.n_heads, m.n_kv_heads, m.head_dim
    a = m.attention
    attn = d * h * hd + h * hd * d  # q_proj, o_proj
    if a.kind == "dense":
        attn += d * 2 * kv * hd
    else:
        attn += d * 6 * kv * hd  # k, v of each branch
        attn += d * 3 * h + 3 * h  # gate (with bias)
        if a.compress_mode == "mlp":  # compress_k and compress_v
            hidden, block_in = 4 * hd, a.compress_block * hd
            attn += 2 * (block_in + (block_in * hidden + hidden) + (hidden * hd + hd))  # pos, fc1, fc2
    f = ffn_hidden(d, m.ffn_hidden)
    block = 2 * d + attn + d * 2 * f + f * d  # two norms, attention, SwiGLU
    embeddings = m.vocab_size * d * (1 if m.tie_embeddings else 2)
    return embeddings + m.n_layers * block + d  # + the final norm
