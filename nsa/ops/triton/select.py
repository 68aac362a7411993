"""Top-n block selection with ``torch.topk`` on a packed (score, block) key.

Same contract and result as ``nsa.ops.reference.select_blocks`` (which does a full stable
sort over all Ns blocks of every (query, group)): forced initial/local blocks first, then
the highest scores, ties to the lower block index, ascending output, -1 for unused slots.
Here each score's float32 bits are mapped to an order-preserving int32 and packed with
``Ns - 1 - j`` into one int64, so every key is distinct and larger means "preferred"
(higher score, then lower block index). ``topk`` then picks exactly the reference's set
without sorting the whole row; only the n chosen indices are sorted. No host sync.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _ordered_int(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 with the same order (IEEE trick: flip the magnitude bits of negatives)."""
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def select_blocks(scores: torch.Tensor, select_block: int, num_selected: int, num_initial: int,
                  num_local: int) -> torch.Tensor:
    """``scores [B,T,G,Ns] -> idx [B,T,G,n]`` int64, identical to the reference's choice."""
    B, T, G, Ns = scores.shape
    dev = scores.device
    t = torch.arange(T, device=dev)[:, None]
    j = torch.arange(Ns, device=dev)[None, :]
    own = t // select_block
    eligible = (j <= own)[:, None, :]  # [T, 1, Ns]
    forced = eligible & ((j < num_initial) | (j > own - num_local))[:, None, :]
    inf = torch.tensor(float("inf"), device=dev)
    key = torch.where(eligible, scores.detach().float(), -inf)
    key = torch.where(forced, inf, key)
    key = torch.where(key == 0, 0.0, key)  # -0.0 == 0.0 for the sort: one bit pattern for both
    k = min(num_selected, Ns)
    if k == 0:
        return torch.full((B, T, G, num_selected), -1, dtype=torch.int64, device=dev)
    packed = _ordered_int(key) * (1 << 32) + (Ns - 1 - torch.arange(Ns, device=dev))
    top = torch.topk(packed, k, dim=-1, largest=True, sorted=False).values
    block = (Ns - 1) - (top & 0xFFFFFFFF)
    chosen = (top >> 32) > _ordered_int(torch.tensor([float("-inf")], device=dev))
    idx = torch.sort(torch.where(chosen, block, Ns), dim=-1).values
    idx = torch.where(idx == Ns, -1, idx)
    if k < num_selected:
        idx = F.pad(idx, (0, num_selected - k), value=-1)
    return idx
