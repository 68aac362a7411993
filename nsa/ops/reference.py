"""Reference NSA attention ops in plain PyTorch (the CPU path and the kernels' oracle).

Every function follows the ops contract (docs/ops-contract.md): ``q [B, T, H, D]``,
``k, v [B, T, G, D]`` with query head h in KV group ``h // (H // G)``. They are
vectorized: no Python loop over positions, tokens, heads or rows and no host sync, so
they trace under ``torch.compile(fullgraph=True)``. The selected and window branches
are a dense attention under a boolean mask (fused by SDPA; the mask is O(T^2) per KV
group); the Triton kernels are the fast path, this is the one that is obviously right.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "block_view",
    "num_compressed",
    "num_select_blocks",
    "compressed_attention",
    "compressed_attention_and_scores",
    "selection_scores",
    "select_blocks",
    "selected_attention",
    "window_attention",
]


def num_compressed(T: int, block: int, stride: int) -> int:
    """Number of compressed tokens: token i covers ``[i*stride, i*stride + block)``."""
    return (T - block) // stride + 1 if T >= block else 0


def num_select_blocks(T: int, select_block: int) -> int:
    """Number of selection blocks ``ceil(T / l')`` (the last one may be partial)."""
    return (T + select_block - 1) // select_block


def block_view(x: torch.Tensor, block: int, stride: int) -> torch.Tensor:
    """``x [B, T, G, D] -> [B, Nc, block, G, D]``: the overlapping blocks, as a view (no copy)."""
    B, T, G, D = x.shape
    if T < block:
        return x.new_zeros(B, 0, block, G, D)
    # unfold puts the window last: [B, Nc, G, D, block]
    return x.unfold(1, block, stride).permute(0, 1, 4, 2, 3)


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: fp64 stays fp64 (tests), everything else computes in fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q [B,T,H,D]`` over ``k, v [B,S,G,D]`` where ``mask`` (bool,
    broadcastable to ``[B, G, R, T, S]``) says which keys a query may see, with the
    probabilities (for the compressed branch, whose probabilities rank the blocks).

    Rows with no visible key give output 0 and probabilities 0, never NaN. Softmax in
    fp32 (fp64 for fp64 inputs). Returns (out [B,T,H,D], probs [B,G,R,T,S]).
    """
    B, T, H, D = q.shape
    G = k.shape[2]
    R = H // G
    acc = _acc_dtype(q)
    qg = q.reshape(B, T, G, R, D).to(acc) * scale
    scores = torch.einsum("btgrd,bsgd->bgrts", qg, k.to(acc))
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # finfo.min (not -inf) keeps fully masked rows finite; they are zeroed by row below
    probs = torch.softmax(scores, dim=-1) * mask.any(dim=-1, keepdim=True)
    out = torch.einsum("bgrts,bsgd->btgrd", probs.to(v.dtype), v)
    return out.reshape(B, T, H, v.shape[-1]), probs


def _sdpa_grouped(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Fused masked attention (``F.scaled_dot_product_attention``) for masks that differ
    per KV group: ``mask`` is ``[T, S]`` or ``[B, G, T, S]`` (bool) and every query must
    see at least one key (true for the window and selected branches: t sees itself).

    The group becomes part of the batch (``[B*G, R, T, D]``) so a per-group mask is a
    view shared by the group's R heads, and K/V are shared through ``enable_gqa``.
    """
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    R = H // G
    qb = q.reshape(B, T, G, R, D).permute(0, 2, 3, 1, 4).reshape(B * G, R, T, D)
    kb = k.permute(0, 2, 1, 3).reshape(B * G, 1, S, D)
    vb = v.permute(0, 2, 1, 3).reshape(B * G, 1, S, v.shape[-1])
    mb = mask.reshape(B * G, 1, T, S) if mask.dim() == 4 else mask
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mb, scale=scale, enable_gqa=True)
    return out.reshape(B, G, R, T, -1).permute(0, 3, 1, 2, 4).reshape(B, T, H, -1)


def compressed_attention(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    block: int,
    stride: int,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention over compressed tokens ``k_cmp, v_cmp [B, Nc, G, D]``.

    Query t sees compressed token i iff its block has ended: ``i*stride + block - 1 <= t``
    (LESSONS 19). Returns (out [B,T,H,D], probs [B,T,H,Nc]); the probabilities feed the
    block selection.
    """
    B, T, H, D = q.shape
    Nc = k_cmp.shape[1]
    scale = D**-0.5 if scale is None else scale
    t = torch.arange(T, device=q.device)
    ends = torch.arange(Nc, device=q.device) * stride + (block - 1)
    mask = ends[None, :] <= t[:, None]  # [T, Nc]
    out, probs = _masked_attention(q, k_cmp, v_cmp, mask, scale)
    probs = probs.permute(0, 3, 1, 2, 4).reshape(B, T, H, Nc)
    return out, probs


def _overlap_matrix(T: int, block: int, stride: int, select_block: int, device: torch.device) -> torch.Tensor:
    """``W[i, j] = |[i*d, i*d+l) ∩ [j*l', (j+1)*l')| / d`` (Eq. 9 as overlap lengths)."""
    Nc = num_compressed(T, block, stride)
    Ns = num_select_blocks(T, select_block)
    c0 = torch.arange(Nc, device=device) * stride
    s0 = torch.arange(Ns, device=device) * select_block
    lo = torch.maximum(c0[:, None], s0[None, :])
    hi = torch.minimum(c0[:, None] + block, s0[None, :] + select_block)
    return (hi - lo).clamp_min(0).to(torch.float64) / stride


def selection_scores(
    probs: torch.Tensor, n_kv_heads: int, block: int, stride: int, select_block: int
) -> torch.Tensor:
    """Block importance per KV group: ``probs [B,T,H,Nc] -> [B,T,G,Ns]``.

    Eq. 9: the compressed probabilities spread over the selection blocks they overlap,
    weighted by overlap length / stride. Eq. 10: summed over the query heads of a group,
    so all heads of a group select the same blocks.
    """
    B, T, H, Nc = probs.shape
    W = _overlap_matrix(T, block, stride, select_block, probs.device)
    acc = _acc_dtype(probs)
    p_slc = torch.matmul(probs.to(acc), W.to(acc))  # [B, T, H, Ns]
    return p_slc.reshape(B, T, n_kv_heads, H // n_kv_heads, -1).sum(dim=3)


def select_blocks(
    scores: torch.Tensor, select_block: int, num_selected: int, num_initial: int, num_local: int
) -> torch.Tensor:
    """Top-n selection blocks per (query, group): ``scores [B,T,G,Ns] -> idx [B,T,G,n]``.

    Never a block that starts after the query; the first ``num_initial`` blocks and the
    ``num_local`` blocks ending with the query's own block are always in (when they
    exist); the rest by score, ties towards the lower block index. Ascending block order,
    unused slots -1 (last).
    """
    B, T, G, Ns = scores.shape
    dev = scores.device
    t = torch.arange(T, device=dev)[:, None]
    j = torch.arange(Ns, device=dev)[None, :]
    own = t // select_block
    eligible = j <= own  # j*l' <= t
    forced = eligible & ((j < num_initial) | (j > own - num_local))
    inf = torch.tensor(float("inf"), device=dev)
    key = torch.where(eligible[:, None, :], scores.detach().to(_acc_dtype(scores)), -inf)
    key = torch.where(forced[:, None, :], inf, key)  # [B, T, G, Ns]
    k = min(num_selected, Ns)
    # stable descending sort: equal keys keep ascending block order
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :k]
    chosen = torch.gather(key, -1, order) > -inf
    idx = torch.where(chosen, order, Ns)  # Ns sorts after every real block
    idx = torch.sort(idx, dim=-1).values
    idx = torch.where(idx == Ns, -1, idx)
    if k < num_selected:
        idx = F.pad(idx, (0, num_selected - k), value=-1)
    return idx


def selected_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    select_block: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of each query (all heads of group g) over the tokens ``s <= t`` of its
    selected blocks ``idx [B,T,G,n]`` (-1 slots ignored). Dense masked reference."""
    B, T, H, D = q.shape
    G = k.shape[2]
    scale = D**-0.5 if scale is None else scale
    Ns = num_select_blocks(T, select_block)
    slot = torch.where(idx < 0, Ns, idx)  # -1 -> an extra column that is dropped
    chosen = torch.zeros(B, T, G, Ns + 1, dtype=torch.bool, device=q.device)
    chosen = chosen.scatter(-1, slot, True)[..., :Ns]
    s = torch.arange(T, device=q.device)
    key_mask = chosen[..., s // select_block]  # [B, T, G, S]
    key_mask = key_mask & (s[None, :] <= s[:, None])[None, :, None, :]
    return _sdpa_grouped(q, k, v, key_mask.permute(0, 2, 1, 3).contiguous(), scale)


def window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float | None = None
) -> torch.Tensor:
    """Sliding-window attention: query t sees keys ``t - window < s <= t``."""
    T, D = q.shape[1], q.shape[3]
    scale = D**-0.5 if scale is None else scale
    s = torch.arange(T, device=q.device)
    diff = s[:, None] - s[None, :]
    mask = (diff >= 0) & (diff < window)
    return _sdpa_grouped(q, k, v, mask, scale)


def compressed_attention_and_scores(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    block: int,
    stride: int,
    select_block: int,
    n_kv_heads: int,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B,T,H,D], scores [B,T,G,Ns])``: compressed attention and the selection
    scores it implies (Eq. 9 + 10), without gradient through the scores. The Triton
    backend computes the same pair without materialising the T x Nc probabilities."""
    out, probs = compressed_attention(q, k_cmp, v_cmp, block, stride, scale)
    scores = selection_scores(probs.detach(), n_kv_heads, block, stride, select_block)
    return out, scores
