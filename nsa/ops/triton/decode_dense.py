"""Dense decode attention: one new query per sequence over its whole KV cache, in 1-2 launches.

``DenseCache.step`` (nsa/infer/cache_dense.py) attends each sequence's query at ``pos[b]`` to the
cache's keys ``0 .. pos[b]`` with ``F.scaled_dot_product_attention`` under a boolean mask.
On CUDA that case (a mask and GQA) is refused by SDPA's flash kernel (no mask) and, in the
torch releases checked (2.11, 2.14), by its memory-efficient one (equal head counts only);
what takes it was about a dozen launches per layer and token on an H200, where a decode
step replayed from a CUDA graph pays for every launch. Here it is flash-decoding with the
decode kernels' own pieces (``decode_flash.py``):

1. ``_dense_partials``: one program per (split, sequence, KV group), the group's query
   heads as its rows (every K/V row loaded once for the group), an equal chunk of the
   visible keys ``[0, pos]``; with one split it writes the output itself, with up to
   ``MAX_FUSED_SLOTS`` the last of them to finish merges the partials and writes it;
2. ``_decode_combine`` (more splits: batch 1 at a long context): the partials' softmax merge
   -> the output, one program per (sequence, query head).

The chunks are cut from ``pos`` inside the kernel and the grid from shapes alone: no host
sync, a CUDA graph holds it. fp32/fp16/bf16, fp32 accumulation; under
``TRITON_INTERPRET=1`` on CPU in fp32 (the tests compare it with the step's SDPA).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops import poison

from .band import LOG2E, _prec
from .decode_flash import (
    MAX_FUSED_SLOTS,
    PROGRAMS_PER_SM,
    _combine_rows,
    _decode_combine,
    _flash_chunk,
    _group_of_program,
    _group_queries,
    _last_to_finish,
    _store_out,
    _store_partial,
    check_tickets,
    merge_tile,
    row_merge_tile,
)
from .tuning import sm_count as _sm_count

# Keys per program below which another split costs more (a partial stored and merged) than
# it spreads. A design estimate, like decode.py's MIN_* (bench.decode_kernel --sweep measures
# the NSA ones).
MIN_DENSE_KEYS = 256


def plan_dense_splits(batch: int, groups: int, capacity: int, device: torch.device) -> int:
    """Programs per (sequence, KV group): about ``PROGRAMS_PER_SM`` per SM, none with fewer than
    ``MIN_DENSE_KEYS`` of the capacity (shapes only, no sync); 1 off CUDA."""
    sms = _sm_count(device)
    if sms == 0:
        return 1
    per = max(1, -(-PROGRAMS_PER_SM * sms // max(1, batch * groups)))
    return max(1, min(per, capacity // MIN_DENSE_KEYS))


@triton.jit
def _dense_partials(Q, K, V, POS, PM, PL, PACC, OUT, TICKETS,
                    sqb, sqh, skb, skt, skh, sob, soh,
                    G, HPG, S, qk_scale, SPLITS,
                    R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr,
                    FINAL: tl.constexpr, FUSED: tl.constexpr, CS: tl.constexpr, PREC: tl.constexpr):
    """Program ``pid`` of SPLITS: its equal BN-aligned chunk of the keys ``[0, min(pos, S - 1)]``;
    the output when FINAL (one split), else a partial in slot ``pid``, which with FUSED the
    last program of the (sequence, group) merges with the others into the output."""
    pid = tl.program_id(1)
    bg, b, g, p = _group_of_program(POS, G)
    r, offs_d, q = _group_queries(Q, b, g, sqb, sqh, HPG, R, D, BD)
    kv = b * skb + g * skh
    m_i, l_i, acc = _flash_chunk(q, K + kv, V + kv, skt, tl.minimum(p + 1, S), pid, SPLITS, qk_scale, offs_d,
                                 R, D, BD, BN, PREC)
    if FINAL:
        _store_out(OUT, acc, l_i, b, g, HPG, sob, soh, r, r < HPG, offs_d, D)
    else:
        _store_partial(PM, PL, PACC, bg * SPLITS + pid, m_i, l_i, acc, r, offs_d, R, BD)
        if FUSED:
            if _last_to_finish(TICKETS, bg, SPLITS):
                m_o, l_o, acc_o = _combine_rows(PM, PL, PACC, bg * SPLITS, 0, SPLITS, r, offs_d, R, BD, CS)
                _store_out(OUT, acc_o, l_o, b, g, HPG, sob, soh, r, r < HPG, offs_d, D)


def dense_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                 scale: float | None = None, splits: int | None = None,
                 tickets: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of ``q [B, 1, H, D]`` (sequence b's new query, at position ``pos[b]``)
    over the cache ``k, v [B, S, G, D]``: keys ``0 .. pos[b]`` (all S once ``pos >= S - 1``)
    -> ``[B, 1, H, D]`` in q's dtype. ``splits``: programs per (sequence, group), default
    ``plan_dense_splits``. ``tickets``: the caller's zeroed counters for the fused merge
    (``decode_tickets(B * G)``, kept across steps); fresh ones when not given."""
    B, one, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    if one != 1:
        raise ValueError(f"one query per sequence, got q of shape {tuple(q.shape)}")
    if H % G or pos.shape != (B,) or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"pos {tuple(pos.shape)}: want q [B, 1, H, D], k and v [B, S, G, D] with G "
                         "dividing H, pos [B]")
    if q.dtype == torch.float64:
        raise TypeError("the decode kernels compute in fp32 / fp16 / bf16, not fp64")
    if k.numel() >= 2**31:
        raise ValueError(f"cache of shape {tuple(k.shape)} has >= 2**31 elements: the kernels use 32-bit "
                         "offsets; split the batch")
    if splits is not None and splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    k, v, pos = k.contiguous(), v.contiguous(), pos.contiguous()  # the cache's own tensors are: no copy
    out = poison.empty(B, 1, H, D, device=q.device, dtype=q.dtype)
    if B == 0:
        return out
    q = q.to(k.dtype).contiguous()  # one tl.dot dtype; a [B, 1, H, D] copy at most
    hpg = H // G
    sp = splits if splits is not None else plan_dense_splits(B, G, S, q.device)
    qk_scale = (D**-0.5 if scale is None else float(scale)) * LOG2E
    R = max(16, triton.next_power_of_2(hpg))
    BD = max(16, triton.next_power_of_2(D))
    final = sp == 1
    fused = not final and sp <= MAX_FUSED_SLOTS
    tk = check_tickets(tickets, B * G, q.device) if fused else pos  # unused pointer otherwise
    if final:  # no partials: the kernel writes ``out`` (its partial pointers go unused)
        pm = pl = pacc = out
    else:
        pm = poison.empty(B * G, sp, R, device=q.device, dtype=torch.float32)
        pl = poison.empty_like(pm)
        pacc = poison.empty(B * G, sp, R, BD, device=q.device, dtype=torch.float32)
    so = (out.stride(0), out.stride(2))
    warps = 4 if R * BD <= 64 * 64 else 8
    _dense_partials[(B * G, sp)](q, k, v, pos, pm, pl, pacc, out, tk, q.stride(0), q.stride(2),
                                 *k.stride()[:3], *so, G, hpg, S, qk_scale, sp,
                                 R=R, D=D, BD=BD, BN=64, FINAL=final, FUSED=fused, CS=merge_tile(sp, R, BD),
                                 PREC=_prec(q), num_warps=warps)
    if not final and not fused:
        _decode_combine[(B * G, hpg)](pm, pl, pacc, out, out, out, out, *so, 0, G, hpg, sp, 0, sp,
                                      R=R, D=D, BD=BD, CA=row_merge_tile(sp, BD), GATED=False,
                                      num_warps=4)
    return out
