"""Selection-block scores (Eq. 9 + 10) and the top-n block choice, in one kernel.

Pass 1 is the compressed-attention forward (band.py), which stores each row's
log-sum-exp. This is pass 2: one program per (P consecutive query positions, batch, KV
group). Its rows are the positions x the group's query heads (``R = P * HPGP`` rows, like
the selected kernels), so q is loaded once and each compressed key tile once for all
heads. It walks the selection blocks in tiles of ``BJ``; for each tile it recomputes the
normalised compressed probabilities ``p = exp(q.k * scale - lse)`` of the compressed
tokens that overlap those blocks, sums them over the group's heads (Eq. 10) and
multiplies by the overlap weights ``W[i, j] = |[i*d, i*d + l) ∩ [j*l', (j+1)*l')| / d``
built from indices on the fly (Eq. 9). The compressed tokens overlapping a tile are its
aligned main range (the tokens that start inside it) plus a "halo": about l/d tokens that
start before its first block and reach into it (into its first ``MC`` blocks at most,
one when l <= l' + 1). The halo is the previous tile's last tokens, so that tile also
weighs them for the next tile's first MC blocks and hands the sums on (``carry``, [P, MC]);
the first tile (block 0) has no halo. Before, each tile loaded, dotted and exponentiated a
16-token halo tile of its own, for one useful token at the paper's l, d, l'.

With ``TOPN`` the tile's scores never leave registers: they are merged into a running
top-``NR`` per position (``NR = max(16, next_pow2(n))``, ``BJ = NR``) and only the
chosen block indices are written, ``[B, T, G, n]``; no ``[B, T, G, Ns]`` scores tensor, no
torch top-n. Without ``TOPN`` (the contract's ``compressed_attention_and_scores``) the
same scores are stored instead: the two modes share every arithmetic step, so they rank
identical numbers.

The choice is exactly ``nsa.ops.reference.select_blocks``'s: a block's key packs the
order-preserving int32 image of its score (``+inf`` for forced initial/local blocks,
``-inf`` for blocks after the query) above ``Ns - 1 - j``, so keys are distinct and
larger means "preferred" (higher score, ties to the lower block). Merging ``NR``
candidates sorted descending into the running set sorted ascending is one elementwise
max (a bitonic half-cleaner keeps the top ``NR`` of the union) and one sort. The chosen
blocks (key above ``-inf``, among the top n) are written in ascending order, -1 after.
``_select_kernel`` runs the same merge over a given scores tensor (the contract's
``select_blocks``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops import poison

from .band import LOG2E, _prec
from .bitonic import NO_BLOCK, _bitonic_merge, _bitonic_sort
from .tuning import launch, tunable

# Order-preserving int32 image of -inf, and a key below every candidate's.
ORD_NEG_INF = tl.constexpr(-2139095041)
NO_KEY = tl.constexpr(-2139095041 * 2**32)


@triton.jit
def _pack(score, j, NS):
    """(score fp32, block) -> int64 key, larger = preferred: higher score, then lower block.
    -0.0 ranks as +0.0 (the reference's float compare)."""
    bits = tl.where(score == 0.0, 0.0, score).to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    low = tl.where(j < NS, NS - 1 - j, 0)  # columns past the last block: a valid low word
    return (ordered.to(tl.int64) << 32) | low.to(tl.int64)


@triton.jit
def _candidates(sc, j, t, NS, SBLK, NI, NL):
    """Keys of blocks ``j [BJ]`` for queries ``t [P]``: forced initial/local blocks +inf,
    blocks that start after the query -inf, the others their score ``sc [P, BJ]``."""
    own = (t // SBLK)[:, None]
    jj = j[None, :]
    elig = (jj <= own) & (jj < NS)
    forced = elig & ((jj < NI) | (jj > own - NL))
    s = tl.where(forced, float("inf"), tl.where(elig, sc, float("-inf")))
    return _pack(s, jj, NS)


@triton.jit
def _merge(top, cand, P: tl.constexpr, N: tl.constexpr, LOGN: tl.constexpr):
    """Running top-N keys (ascending) and N candidates -> the top N of both, ascending: the
    elementwise max of an ascending and a descending run holds the N largest of the two
    and is bitonic, so one merge pass (log N steps) sorts it."""
    return _bitonic_merge(tl.maximum(top, _bitonic_sort(cand, 1, P, N, LOGN)), P, N, LOGN)


@triton.jit
def _store_choice(IDX, top, t, b, g, sib, sit, sig, T, NS, NSEL, P: tl.constexpr, NR: tl.constexpr,
                  LOGN: tl.constexpr):
    """The top NSEL keys of each row that beat -inf, as ascending block indices, -1 after."""
    col = tl.arange(0, NR)
    chosen = ((top >> 32) > ORD_NEG_INF) & (col >= NR - NSEL)[None, :]
    j = (NS - 1 - (top & 0xFFFFFFFF)).to(tl.int32)
    js = _bitonic_sort(tl.where(chosen, j, NO_BLOCK), 0, P, NR, LOGN)
    out = tl.where(js == NO_BLOCK, -1, js).to(tl.int64)
    tl.store(IDX + b * sib + t[:, None] * sit + g * sig + col[None, :], out,
             mask=(t < T)[:, None] & (col < NSEL)[None, :])


@triton.jit
def _weights(c0, imask, s0, STRIDE, BLK, SBLK):
    """Eq. 9's weights ``[BN, blocks]``: the overlap of tokens starting at ``c0 [BN]`` (``imask``:
    real ones) with the blocks starting at ``s0 [blocks]``, over d."""
    lo = tl.maximum(c0[:, None], s0[None, :])
    hi = tl.minimum(c0[:, None] + BLK, s0[None, :] + SBLK)
    return tl.where(imask[:, None], tl.maximum(hi - lo, 0).to(tl.float32) / STRIDE, 0.0)


@triton.jit
def _tile_scores(q, K, lse, b, g, t_r, valid, i0, i_hi, j0, skb, skt, skh, qk_scale,
                 STRIDE, BLK, SBLK, P: tl.constexpr, HPGP: tl.constexpr, D: tl.constexpr,
                 BD: tl.constexpr, BN: tl.constexpr, BJ: tl.constexpr, MC: tl.constexpr,
                 PREC: tl.constexpr):
    """Scores [P, BJ] of blocks [j0, j0+BJ) from compressed tokens [i0, min(i0+BN, i_hi)), and
    [P, MC] of the next tile's first MC blocks from the same tokens (its halo's share): with
    P < 16 as the scores, a broadcast product; from 16 rows one row reduction per block on
    the [P, BN] sums as they lie (a [P, BN, MC] product or a second dot there cost the 4-warp
    program registers it did not have under Triton 3.6)."""
    offs_i = i0 + tl.arange(0, BN)
    imask = offs_i < i_hi
    offs_d = tl.arange(0, BD)
    kt = tl.load(K + b * skb + offs_i[None, :] * skt + g * skh + offs_d[:, None],
                 mask=imask[None, :] & (offs_d < D)[:, None], other=0.0)
    s = tl.dot(q, kt, input_precision=PREC) * qk_scale  # log2 units, like the LSE
    e = offs_i * STRIDE + BLK - 1
    vis = (e[None, :] <= t_r[:, None]) & imask[None, :] & valid[:, None]
    p = tl.exp2(tl.where(vis, s - lse[:, None], float("-inf")))
    psum = tl.sum(tl.reshape(p, [P, HPGP, BN]), 1)  # Eq. 10: over the group's heads
    c0 = offs_i * STRIDE
    w = _weights(c0, imask, (j0 + tl.arange(0, BJ)) * SBLK, STRIDE, BLK, SBLK)
    if P >= 16:
        out = tl.dot(psum, w, input_precision="ieee")
        cm = tl.arange(0, MC)
        nxt = tl.zeros([P, MC], tl.float32)
        for m in tl.static_range(MC):
            s1 = (j0 + BJ + m) * SBLK
            ov = tl.maximum(tl.minimum(c0 + BLK, s1 + SBLK) - tl.maximum(c0, s1), 0)
            wn = tl.where(imask, ov.to(tl.float32) / STRIDE, 0.0)
            nxt += tl.where(cm[None, :] == m, tl.sum(psum * wn[None, :], 1)[:, None], 0.0)
    else:  # a dot needs 16 rows: broadcast-multiply and reduce instead
        out = tl.sum(psum[:, :, None] * w[None, :, :], 1)
        w_next = _weights(c0, imask, (j0 + BJ + tl.arange(0, MC)) * SBLK, STRIDE, BLK, SBLK)
        nxt = tl.sum(psum[:, :, None] * w_next[None, :, :], 1)
    return out, nxt


# 4 warps by default (the gate's table), 8 as the alternative the autotuner may time in
# the scores mode only. The 8-warp config states ptxas's own ceiling of 255 registers
# (without it ptxas trimmed it to 128 registers); with the running top-n it spilled either
# way (sm_80 at D = 128 without the ceiling, sm_90 with it: bench/compile_check.py).
SCORES_CONFIGS = [triton.Config({}, num_warps=4), triton.Config({}, num_warps=8, maxnreg=255)]


def _scores_prune(configs: list[triton.Config], nargs: dict, **kwargs) -> list[triton.Config]:
    """The top-n mode keeps the 4-warp default only."""
    return configs[:1] if kwargs["TOPN"] else configs


@tunable(SCORES_CONFIGS, ["T", "NC", "HPG", "STRIDE", "BLK", "SBLK", "NSEL", "D"], _scores_prune)
@triton.jit
def _scores_topn(Q, K, LSE, OUT,
                 sqb, sqt, sqh, skb, skt, skh, sob, sot, sog,
                 T, NC, NS, H, HPG, qk_scale, STRIDE, BLK, SBLK, NSEL, NI, NL,
                 P: tl.constexpr, HPGP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                 BN: tl.constexpr, MC: tl.constexpr, BJ: tl.constexpr, LOGJ: tl.constexpr,
                 TOPN: tl.constexpr, PREC: tl.constexpr):
    # the last query tiles see the most blocks: launch them first
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bg = tl.program_id(1)
    G = H // HPG
    b = pid_bg // G
    g = pid_bg % G
    t0 = pid_m * P
    r = tl.arange(0, P * HPGP)
    t_r = t0 + r // HPGP
    h_r = r % HPGP
    valid = (h_r < HPG) & (t_r < T)
    offs_d = tl.arange(0, BD)
    h = g * HPG + h_r
    q = tl.load(Q + b * sqb + t_r[:, None] * sqt + h[:, None] * sqh + offs_d[None, :],
                mask=valid[:, None] & (offs_d < D)[None, :], other=0.0)
    lse = tl.load(LSE + (b * H + h) * T + t_r, mask=valid, other=float("inf"))
    t_p = t0 + tl.arange(0, P)
    last = tl.minimum(T, t0 + P) - 1
    # compressed tokens visible to the last position: i*d + l - 1 <= last
    i_vis = tl.where(last >= BLK - 1, tl.maximum(last - BLK + 1, 0) // STRIDE + 1, 0)
    i_vis = tl.minimum(i_vis, NC)
    ns_hi = last // SBLK + 1  # selection blocks that start at or before the last position
    top = tl.full([P, BJ], NO_KEY, tl.int64)
    col = tl.arange(0, BJ)
    cm = tl.arange(0, MC)
    into = (cm[:, None] == col[None, :]).to(tl.float32)  # [MC, BJ]: carry column m -> block m
    carry = tl.zeros([P, MC], tl.float32)  # the tile's halo's share of its first MC blocks
    for j0 in range(0, ns_hi, BJ):
        if P >= 16:
            acc = tl.zeros([P, BJ], tl.float32)
            for m in tl.static_range(MC):
                from_m = tl.sum(tl.where(cm[None, :] == m, carry, 0.0), 1)
                acc += tl.where(col[None, :] == m, from_m[:, None], 0.0)
        else:
            acc = tl.sum(carry[:, :, None] * into[None, :, :], 1)
        carry = tl.zeros([P, MC], tl.float32)
        i_main = (j0 * SBLK + STRIDE - 1) // STRIDE  # the first token that starts in the tile
        i_end = tl.minimum((j0 * SBLK + BJ * SBLK + STRIDE - 1) // STRIDE, i_vis)
        for i0 in range(i_main, i_end, BN):
            part, nxt = _tile_scores(q, K, lse, b, g, t_r, valid, i0, i_end, j0, skb, skt, skh, qk_scale,
                                     STRIDE, BLK, SBLK, P, HPGP, D, BD, BN, BJ, MC, PREC)
            acc += part
            carry += nxt
        offs_j = j0 + tl.arange(0, BJ)
        if TOPN:
            top = _merge(top, _candidates(acc, offs_j, t_p, NS, SBLK, NI, NL), P, BJ, LOGJ)
        else:
            tl.store(OUT + b * sob + t_p[:, None] * sot + g * sog + offs_j[None, :], acc,
                     mask=(t_p < T)[:, None] & (offs_j < NS)[None, :])
    if TOPN:
        _store_choice(OUT, top, t_p, b, g, sob, sot, sog, T, NS, NSEL, P, BJ, LOGJ)
    else:  # blocks after the last position: score 0 (written here: no torch.zeros)
        for j0 in range(tl.cdiv(ns_hi, BJ) * BJ, NS, BJ):
            offs_j = j0 + tl.arange(0, BJ)
            tl.store(OUT + b * sob + t_p[:, None] * sot + g * sog + offs_j[None, :],
                     tl.zeros([P, BJ], tl.float32), mask=(t_p < T)[:, None] & (offs_j < NS)[None, :])


@triton.jit
def _select_kernel(S, IDX, ssb, sst, ssg, sib, sit, sig, T, G, NS, NSEL, SBLK, NI, NL,
                   P: tl.constexpr, NR: tl.constexpr, LOGN: tl.constexpr):
    """``select_blocks`` over a scores tensor [B,T,G,Ns]: the same running top-n."""
    pid_m = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // G
    g = pid_bg % G
    t = pid_m * P + tl.arange(0, P)
    last = tl.minimum(T, pid_m * P + P) - 1
    top = tl.full([P, NR], NO_KEY, tl.int64)
    for j0 in range(0, last // SBLK + 1, NR):
        j = j0 + tl.arange(0, NR)
        sc = tl.load(S + b * ssb + t[:, None] * sst + g * ssg + j[None, :],
                     mask=(t < T)[:, None] & (j < NS)[None, :], other=0.0).to(tl.float32)
        top = _merge(top, _candidates(sc, j, t, NS, SBLK, NI, NL), P, NR, LOGN)
    _store_choice(IDX, top, t, b, g, sib, sit, sig, T, NS, NSEL, P, NR, LOGN)


ROWS = 64  # rows (positions x padded heads) per scores program


def halo_blocks(block: int, select_block: int) -> int:
    """The most blocks that a token starting before a block reaches into, that one included:
    the latest such token starts one position before it and ends ``l - 1`` later."""
    return max(1, (block - 2) // select_block + 1)


def _tiles(hpg: int, d: int, block: int, stride: int, select_block: int, n: int) -> dict:
    """Constexprs of ``_scores_topn``: positions P, padded heads, head dim tile, key tiles, BJ,
    the halo's blocks MC (to a power of two)."""
    hpgp = triton.next_power_of_2(hpg)
    bj = max(16, triton.next_power_of_2(max(n, 1)))
    bn = min(64, max(16, triton.next_power_of_2(max(1, bj * select_block // stride))))
    if block - 1 > bj * select_block:  # the halo would reach back past the previous tile
        raise ValueError(f"compress_block {block} > {bj} x select_block {select_block} + 1: the scores "
                         "kernel takes a tile's halo from the previous tile")
    return dict(P=max(1, ROWS // hpgp), HPGP=hpgp, D=d, BD=max(16, triton.next_power_of_2(d)),
                BN=bn, MC=triton.next_power_of_2(halo_blocks(block, select_block)), BJ=bj,
                LOGJ=bj.bit_length() - 1)


def scores_from_lse(q: torch.Tensor, k_cmp: torch.Tensor, lse: torch.Tensor, block: int, stride: int,
                    select_block: int, scale: float) -> torch.Tensor:
    """Scores [B,T,G,Ns] (fp32) from q, compressed keys and pass 1's LSE [B,H,T] (log2 units)."""
    B, T, H, D = q.shape
    NC, G = k_cmp.shape[1], k_cmp.shape[2]
    ns = triton.cdiv(T, select_block)
    out = poison.empty(B, T, G, ns, device=q.device, dtype=torch.float32)
    if T == 0 or ns == 0:
        return out
    c = _tiles(H // G, D, block, stride, select_block, 16)
    launch(_scores_topn, (triton.cdiv(T, c["P"]), B * G),
        q, k_cmp, lse, out, *q.stride()[:3], *k_cmp.stride()[:3], *out.stride()[:3],
        T, NC, ns, H, H // G, scale * LOG2E, stride, block, select_block, 0, 0, 0,
        TOPN=False, PREC=_prec(q), **c)
    return out


def selection_from_lse(q: torch.Tensor, k_cmp: torch.Tensor, lse: torch.Tensor, block: int, stride: int,
                       select_block: int, scale: float, num_selected: int, num_initial: int,
                       num_local: int) -> torch.Tensor:
    """The chosen blocks [B,T,G,n] (int64, ascending, -1 last) straight from q, the compressed
    keys and pass 1's LSE: ``select_blocks(scores_from_lse(...))`` without the scores."""
    B, T, H, D = q.shape
    NC, G = k_cmp.shape[1], k_cmp.shape[2]
    ns = triton.cdiv(T, select_block)
    if T == 0 or num_selected == 0:
        return torch.full((B, T, G, num_selected), -1, device=q.device, dtype=torch.int64)
    idx = poison.empty(B, T, G, num_selected, device=q.device, dtype=torch.int64)
    c = _tiles(H // G, D, block, stride, select_block, num_selected)
    launch(_scores_topn, (triton.cdiv(T, c["P"]), B * G),
        q, k_cmp, lse, idx, *q.stride()[:3], *k_cmp.stride()[:3], *idx.stride()[:3],
        T, NC, ns, H, H // G, scale * LOG2E, stride, block, select_block, num_selected, num_initial,
        num_local, TOPN=True, PREC=_prec(q), **c)
    return idx


def select_blocks(scores: torch.Tensor, select_block: int, num_selected: int, num_initial: int,
                  num_local: int) -> torch.Tensor:
    """``scores [B,T,G,Ns] -> idx [B,T,G,n]`` int64, identical to the reference's choice."""
    B, T, G, ns = scores.shape
    if T == 0 or num_selected == 0:
        return torch.full((B, T, G, num_selected), -1, device=scores.device, dtype=torch.int64)
    idx = poison.empty(B, T, G, num_selected, device=scores.device, dtype=torch.int64)
    s = scores.detach()
    s = s if s.stride(-1) == 1 else s.contiguous()
    p = 64
    nr = max(16, triton.next_power_of_2(num_selected))
    _select_kernel[(triton.cdiv(T, p), B * G)](
        s, idx, *s.stride()[:3], *idx.stride()[:3], T, G, ns, num_selected, select_block, num_initial,
        num_local, P=p, NR=nr, LOGN=nr.bit_length() - 1)
    return idx
