"""Triton kernels for NSA with the ops contract's names and signatures (docs/ops-contract.md).

- ``compressed_attention`` / ``window_attention``: one flash-style "band" kernel family
  (band.py), forward + backward.
- ``compressed_attention_and_selection``: what the model uses: compressed attention, then
  a second pass (topn.py) that recomputes the compressed probabilities from the row LSE,
  turns them into selection-block scores (Eq. 9 + 10) and keeps a running top-n in
  registers: only the chosen block indices [B,T,G,n] are written (no T x Nc
  probabilities, no [B,T,G,Ns] scores, no torch top-n).
- ``compressed_attention_and_scores``: the contract's pair (out, scores [B,T,G,Ns]) from the
  same kernel with the scores stored instead of ranked.
- ``selected_attention``: group-centric, forward + backward (selected.py).
- ``select_blocks``: no gradient; the same running top-n over a given scores tensor
  (topn.py), exactly the reference's choice.
- ``selection_scores`` (from a probability tensor): the reference's torch function.

Every kernel is deterministic (no atomics). Under ``TRITON_INTERPRET=1`` they run on CPU
in fp32 (bf16 ``tl.dot`` is wrong in the interpreter). Design notes: docs/kernels.md.
"""

from __future__ import annotations

import math

import torch

from nsa.ops.reference import selection_scores

from . import topn, tuning
from .band import LN2, band_backward, band_forward, dkdv_key_tile
from .decode import nsa_decode_branches, nsa_decode_gated
from .decode_dense import dense_decode
from .glue import GatedCombine, Rope, silu_mul
from .glue import gated_combine_logits as _combine_logits
from .selected import selected_backward, selected_forward
from .step_compress import decode_compress
from .step_write import decode_write
from .topn import scores_from_lse, selection_from_lse
from .tuning import sm_count as _sm_count

__all__ = [
    "compressed_attention",
    "compressed_attention_and_scores",
    "compressed_attention_and_selection",
    "apply_rope",
    "decode_compress",
    "decode_write",
    "dense_decode",
    "gated_combine",
    "gated_combine_logits",
    "nsa_decode_branches",
    "nsa_decode_gated",
    "selection_scores",
    "select_blocks",
    "selected_attention",
    "silu_mul",
    "window_attention",
]


class _BandAttention(torch.autograd.Function):
    """Band attention (window or compressed); returns (out, lse), lse without gradient."""

    @staticmethod
    def forward(ctx, q, k, v, stride: int, off: int, win: int, scale: float, nsplit: int):
        kd, vd = k.dtype, v.dtype
        q = q.contiguous()
        k = k.to(q.dtype).contiguous()
        v = v.to(q.dtype).contiguous()
        o, lse = band_forward(q, k, v, stride, off, win, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (stride, off, win, scale, nsplit, kd, vd)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        stride, off, win, scale, nsplit, kd, vd = ctx.args
        dq, dk, dv = band_backward(q, k, v, o, lse, do.to(q.dtype), stride, off, win, scale, nsplit)
        return dq, dk.to(kd), dv.to(vd), None, None, None, None, None


class _SelectedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, idx, block: int, scale: float):
        kd, vd = k.dtype, v.dtype
        q = q.contiguous()
        k = k.to(q.dtype).contiguous()
        v = v.to(q.dtype).contiguous()
        idx = idx.to(torch.int64).contiguous()
        o, lse = selected_forward(q, k, v, idx, block, scale)
        ctx.save_for_backward(q, k, v, idx, o, lse)
        ctx.args = (block, scale, kd, vd)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, idx, o, lse = ctx.saved_tensors
        block, scale, kd, vd = ctx.args
        dq, dk, dv = selected_backward(q, k, v, idx, o, lse, do.to(q.dtype), block, scale,
                                       sms=_sm_count(q.device))
        return dq, dk.to(kd), dv.to(vd), None, None, None


def _amp(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Under autocast, run the kernels in the autocast dtype (as SDPA does): the model's
    RoPE hands us fp32 q/k, and fp32 ``tl.dot`` in exact mode would forgo tensor cores.
    The casts sit outside the autograd Functions, so gradients come back in each input's dtype."""
    dev = xs[0].device.type
    if dev == "cuda" and torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        return tuple(x.to(dt) for x in xs)
    return xs


def _check_size(*xs: torch.Tensor | tuple[int, ...]) -> None:
    """The kernels index with 32-bit integers: refuse tensors (or the shapes of tensors
    they would allocate) past 2**31 elements."""
    for x in xs:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else tuple(x)
        if math.prod(shape) >= 2**31:
            raise ValueError(f"tensor of shape {shape} has >= 2**31 elements: the Triton kernels "
                             "use 32-bit offsets; split the batch")


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def _cmp_split(q: torch.Tensor, n_cmp: int, n_groups: int) -> int:
    """How many programs share one compressed key tile's dK/dV (over query tiles).

    Nc = T/d is short and there is one program per (key tile, batch, group), so without a
    split a small batch leaves most SMs idle while each program walks all later queries.
    Aim for ~2 programs per SM (partials are summed afterwards: still deterministic)."""
    sms = _sm_count(q.device)
    if sms == 0:
        return 1
    key_tile = dkdv_key_tile(q.shape[-1], tuning.capability(q.device))
    tiles = max(1, -(-n_cmp // key_tile)) * q.shape[0] * n_groups
    return max(1, min(16, -(-2 * sms // tiles)))


def _compressed(q, k_cmp, v_cmp, block, stride, scale):
    T = q.shape[1]
    q, k_cmp, v_cmp = _amp(q, k_cmp, v_cmp)
    _check_size(q, k_cmp)
    return _BandAttention.apply(q, k_cmp, v_cmp, stride, block - 1, T + 1, _scale(q, scale),
                                _cmp_split(q, k_cmp.shape[1], k_cmp.shape[2]))


def compressed_attention(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, block: int, stride: int,
                         scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract version: (out [B,T,H,D], probs [B,T,H,Nc]).

    ``out`` comes from the kernel (with gradient). ``probs`` is rebuilt from the kernel's
    row LSE in torch, WITHOUT gradient (it only feeds the non-differentiable top-n); it
    materialises T x Nc, so the model should prefer ``compressed_attention_and_scores``.
    """
    out, lse = _compressed(q, k_cmp, v_cmp, block, stride, scale)
    with torch.no_grad():
        B, T, H, _ = q.shape
        G = k_cmp.shape[2]
        kk = k_cmp.float().repeat_interleave(H // G, dim=2)
        s = torch.einsum("bthd,bshd->bths", q.float(), kk) * _scale(q, scale)
        ends = torch.arange(k_cmp.shape[1], device=q.device) * stride + (block - 1)
        vis = ends[None, :] <= torch.arange(T, device=q.device)[:, None]  # [T, Nc]
        probs = torch.exp(s - LN2 * lse.permute(0, 2, 1)[..., None]) * vis[None, :, None, :]
    return out, probs


def compressed_attention_and_scores(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, block: int,
                                    stride: int, select_block: int, n_kv_heads: int,
                                    scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B,T,H,D], scores [B,T,G,Ns] fp32 without gradient) in two kernel passes.

    Equals ``selection_scores(compressed_attention(...)[1], n_kv_heads, block, stride,
    select_block)`` without the T x Nc probability matrix.
    """
    if k_cmp.shape[2] != n_kv_heads:
        raise ValueError(f"k_cmp has {k_cmp.shape[2]} KV groups, n_kv_heads={n_kv_heads}")
    B, T = q.shape[:2]
    _check_size((B, T, n_kv_heads, -(-T // select_block)))  # the scores tensor
    out, lse = _compressed(q, k_cmp, v_cmp, block, stride, scale)
    with torch.no_grad():
        qc, kc = _amp(q.detach(), k_cmp.detach())
        qc = qc.contiguous()
        kc = kc.to(qc.dtype).contiguous()
        scores = scores_from_lse(qc, kc, lse, block, stride, select_block, _scale(q, scale))
    return out, scores


def compressed_attention_and_selection(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, block: int,
                                       stride: int, select_block: int, n_kv_heads: int, num_selected: int,
                                       num_initial: int, num_local: int,
                                       scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B,T,H,D], idx [B,T,G,n] int64 without gradient): compressed attention and the
    blocks its probabilities select, with the top-n inside the scores kernel (topn.py).

    Equals ``select_blocks(compressed_attention_and_scores(...)[1], select_block, n,
    num_initial, num_local)`` without the [B,T,G,Ns] scores tensor.
    """
    if k_cmp.shape[2] != n_kv_heads:
        raise ValueError(f"k_cmp has {k_cmp.shape[2]} KV groups, n_kv_heads={n_kv_heads}")
    _check_size(q.shape[:2] + (n_kv_heads, num_selected))  # the selection: no scores tensor
    out, lse = _compressed(q, k_cmp, v_cmp, block, stride, scale)
    with torch.no_grad():
        qc, kc = _amp(q.detach(), k_cmp.detach())
        qc = qc.contiguous()
        kc = kc.to(qc.dtype).contiguous()
        idx = selection_from_lse(qc, kc, lse, block, stride, select_block, _scale(q, scale), num_selected,
                                 num_initial, num_local)
    return out, idx


def select_blocks(scores: torch.Tensor, select_block: int, num_selected: int, num_initial: int,
                  num_local: int) -> torch.Tensor:
    """``scores [B,T,G,Ns] -> idx [B,T,G,n]`` int64: the reference's choice, by topn.py's
    running top-n kernel (no torch sort or top-k)."""
    _check_size(scores, scores.shape[:3] + (num_selected,))
    return topn.select_blocks(scores, select_block, num_selected, num_initial, num_local)


def gated_combine(g: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor,
                  o_win: torch.Tensor) -> torch.Tensor:
    """``g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win`` in one kernel, in
    the branches' dtype (glue.py)."""
    return GatedCombine.apply(g, o_cmp, o_slc, o_win)


def gated_combine_logits(logits: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor,
                         o_win: torch.Tensor) -> torch.Tensor:
    """``gated_combine(sigmoid(logits), ...)`` in one kernel, no gradient (decoding)."""
    _check_size(o_cmp)
    return _combine_logits(logits, o_cmp, o_slc, o_win)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``nsa.ops.rope.apply_rope`` in one kernel, in ``x``'s dtype (glue.py)."""
    _check_size(x)
    return Rope.apply(x, cos, sin)


def selected_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                       select_block: int, scale: float | None = None) -> torch.Tensor:
    """Group-centric selected attention over ``idx [B,T,G,n]`` (distinct blocks, -1 = unused)."""
    scale = _scale(q, scale)
    q, k, v = _amp(q, k, v)
    _check_size(q, k, idx)
    return _SelectedAttention.apply(q, k, v, idx, select_block, scale)


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                     scale: float | None = None) -> torch.Tensor:
    """Sliding-window attention: query t sees keys ``t - window < s <= t``."""
    scale = _scale(q, scale)
    q, k, v = _amp(q, k, v)
    _check_size(q, k)
    out, _ = _BandAttention.apply(q, k, v, 1, 0, window, scale, 1)
    return out
