"""Selection block scores straight from compressed attention (Eq. 9 + Eq. 10), no T x Nc matrix.

Pass 1 is the compressed-attention forward (band.py), which stores each row's
log-sum-exp. This is pass 2: one program per (query tile, batch, KV group) walks the
selection blocks in tiles of BJ; for each tile it recomputes the normalised compressed
probabilities ``p = exp(q.k * scale - lse)`` of the compressed tokens that overlap those
blocks, sums them over the group's query heads (Eq. 10) and multiplies by the overlap
weights ``W[i, j] = |[i*d, i*d + l) ∩ [j*l', (j+1)*l')| / d`` built from indices on the
fly (Eq. 9). Each score is written once: no atomics, no read-modify-write. The compressed
tokens overlapping a tile are a "halo" that starts before the tile (those whose block
began earlier but reaches into it) plus the aligned main range; the halo is recomputed
once per tile, a cost of about l/d extra tokens per BJ*l'/d.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .band import _prec


@triton.jit
def _tile_contrib(Q, K, LSE, b, g, offs_m, i0, i_hi, j0,
                  sqb, sqt, sqh, skb, skt, skh,
                  T, NC, H, HPG, scale, STRIDE, BLK, SBLK,
                  D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  BJ: tl.constexpr, PREC: tl.constexpr):
    """sum_h p_h[t, i] over compressed tokens i in [i0, i0+BN) ∩ [.., i_hi), times W[i, j0:j0+BJ]."""
    offs_i = i0 + tl.arange(0, BN)
    imask = (offs_i < NC) & (offs_i < i_hi)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    kt = tl.load(K + b * skb + offs_i[None, :] * skt + g * skh + offs_d[:, None],
                 mask=imask[None, :] & dmask[:, None], other=0.0)
    e = offs_i * STRIDE + BLK - 1
    vis = (e[None, :] <= offs_m[:, None]) & imask[None, :] & (offs_m[:, None] < T)
    psum = tl.zeros([BM, BN], tl.float32)
    for hh in range(0, HPG):
        h = g * HPG + hh
        q = tl.load(Q + b * sqb + offs_m[:, None] * sqt + h * sqh + offs_d[None, :],
                    mask=(offs_m[:, None] < T) & dmask[None, :], other=0.0)
        lse = tl.load(LSE + (b * H + h) * T + offs_m, mask=offs_m < T, other=float("inf"))
        s = tl.dot(q, kt, input_precision=PREC) * scale
        psum += tl.exp(tl.where(vis, s - lse[:, None], float("-inf")))
    offs_j = j0 + tl.arange(0, BJ)
    c0 = offs_i * STRIDE
    s0 = offs_j * SBLK
    lo = tl.maximum(c0[:, None], s0[None, :])
    hi = tl.minimum(c0[:, None] + BLK, s0[None, :] + SBLK)
    w = tl.maximum(hi - lo, 0).to(tl.float32) / STRIDE
    w = tl.where(imask[:, None], w, 0.0)
    return tl.dot(psum, w, input_precision="ieee")


@triton.jit
def _scores_kernel(Q, K, LSE, S,
                   sqb, sqt, sqh, skb, skt, skh, ssb, sst, ssg,
                   T, NC, NS, H, HPG, scale, STRIDE, BLK, SBLK,
                   D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BH: tl.constexpr, BJ: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bg = tl.program_id(1)
    G = H // HPG
    b = pid_bg // G
    g = pid_bg % G
    offs_m = pid_m * BM + tl.arange(0, BM)
    last = tl.minimum(T, pid_m * BM + BM) - 1
    # compressed tokens visible to the tile: i*d + l - 1 <= last
    i_vis = tl.where(last >= BLK - 1, tl.maximum(last - BLK + 1, 0) // STRIDE + 1, 0)
    i_vis = tl.minimum(i_vis, NC)
    ns_hi = last // SBLK + 1  # selection blocks that start at or before the tile's last query
    for j0 in range(0, ns_hi, BJ):
        acc = tl.zeros([BM, BJ], tl.float32)
        # halo: tokens starting before the tile's first token that reach into it
        num = j0 * SBLK - BLK + 1
        i_start = tl.where(num > 0, (tl.maximum(num, 0) + STRIDE - 1) // STRIDE, 0)
        i_main = (j0 * SBLK + STRIDE - 1) // STRIDE
        i_end = tl.minimum((j0 * SBLK + BJ * SBLK + STRIDE - 1) // STRIDE, i_vis)
        for i0 in range(i_start, tl.minimum(i_main, i_end), BH):
            acc += _tile_contrib(Q, K, LSE, b, g, offs_m, i0, tl.minimum(i_main, i_end), j0,
                                 sqb, sqt, sqh, skb, skt, skh, T, NC, H, HPG, scale,
                                 STRIDE, BLK, SBLK, D=D, BD=BD, BM=BM, BN=BH, BJ=BJ, PREC=PREC)
        for i0 in range(i_main, i_end, BN):
            acc += _tile_contrib(Q, K, LSE, b, g, offs_m, i0, i_end, j0,
                                 sqb, sqt, sqh, skb, skt, skh, T, NC, H, HPG, scale,
                                 STRIDE, BLK, SBLK, D=D, BD=BD, BM=BM, BN=BN, BJ=BJ, PREC=PREC)
        offs_j = j0 + tl.arange(0, BJ)
        tl.store(S + b * ssb + offs_m[:, None] * sst + g * ssg + offs_j[None, :], acc,
                 mask=(offs_m[:, None] < T) & (offs_j[None, :] < NS))


def selection_scores_from_lse(q: torch.Tensor, k_cmp: torch.Tensor, lse: torch.Tensor, block: int,
                              stride: int, select_block: int, scale: float) -> torch.Tensor:
    """Scores [B,T,G,Ns] (fp32) from q, compressed keys and pass 1's LSE [B,H,T].

    Blocks that start after the tile's last query are left 0 (select_blocks never picks them).
    """
    B, T, H, D = q.shape
    NC, G = k_cmp.shape[1], k_cmp.shape[2]
    ns = triton.cdiv(T, select_block)
    out = torch.zeros(B, T, G, ns, device=q.device, dtype=torch.float32)
    if T == 0 or NC == 0:
        return out
    bd = max(16, triton.next_power_of_2(D))
    bm = 32
    bj = 16
    bn = max(16, triton.next_power_of_2(max(1, bj * select_block // stride)))
    bn = min(bn, 64)
    bh = max(16, triton.next_power_of_2(triton.cdiv(block, stride)))
    _scores_kernel[(triton.cdiv(T, bm), B * G)](
        q, k_cmp, lse, out, *q.stride()[:3], *k_cmp.stride()[:3], *out.stride()[:3],
        T, NC, ns, H, H // G, scale, stride, block, select_block,
        D=D, BD=bd, BM=bm, BN=bn, BH=bh, BJ=bj, PREC=_prec(q))
    return out
