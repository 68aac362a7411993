"""The roles of NSA's decode attention (``decode.py``): what one program of a (sequence, KV
group) does in each phase, as jit functions of the program's part, so that ``decode.py``'s
three launches and ``decode_fused.py``'s one run the same code.

- ``_partial_share``: a chunk of the compressed tokens or of the window ring, its
  flash-decoding partial;
- ``_score_share``: the compressed branch's log-sum-exp from the partials, a share of the
  selection blocks scored and its running top-n (``_merge_top``) as a candidate list;
- ``_merge_branch``: a branch's partials merged for all the group's heads;
- ``_selected_share``: the candidate lists merged into the chosen blocks, attention over a
  share of them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .band import NEG
from .bitonic import _merge_row_pairs
from .decode_flash import (
    _combine_lse,
    _combine_rows,
    _flash_chunk,
    _group_queries,
    _online,
    _store_out,
    _store_partial,
)
from .topn import NO_KEY, ORD_NEG_INF, _candidates

# Below every packed key (topn.py's NO_KEY and the fillers under it): the max-reduction's
# neutral element in ``_merge_top``.
FLOOR = tl.constexpr(-(2**63) + 1)


@triton.jit
def _partial_share(Q, KC, VC, KW, VW, PM, PL, PACC, bg, b, g, p, pid,
                   sqb, sqh, scb, sct, sch, swb, swt, swh, HPG, NC, NW, qk_scale, STRIDE, BLK, SC, SW, SP,
                   R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """Part ``pid < SC``: a chunk of the visible compressed tokens (i*d + l - 1 <= pos);
    ``SC <= pid < SC + SW``: a chunk of the window ring's slots that hold a position (slot s
    holds one iff s <= pos). Equal BN-aligned chunks of what ``pos`` makes visible; the
    partial into slot ``pid``."""
    r, offs_d, q = _group_queries(Q, b, g, sqb, sqh, HPG, R, D, BD)
    if pid < SC:
        n = tl.minimum(tl.where(p >= BLK - 1, tl.maximum(p - BLK + 1, 0) // STRIDE + 1, 0), NC)
        part = pid
        parts = SC
        kbase = KC + b * scb + g * sch
        vbase = VC + b * scb + g * sch
        skt = sct
    else:
        n = tl.minimum(p + 1, NW)
        part = pid - SC
        parts = SW
        kbase = KW + b * swb + g * swh
        vbase = VW + b * swb + g * swh
        skt = swt
    m_i, l_i, acc = _flash_chunk(q, kbase, vbase, skt, n, part, parts, qk_scale, offs_d, R, D, BD, BN, PREC)
    _store_partial(PM, PL, PACC, bg * SP + pid, m_i, l_i, acc, r, offs_d, R, BD)


@triton.jit
def _merge_top(top, cand, N: tl.constexpr, C: tl.constexpr):
    """The N largest of ``top [N]`` (ascending) and ``cand [C]`` (any order), ascending. Each
    key's rank in the union (how many keys beat it) says whether it stays and in which
    slot. Real keys are distinct (one per block); fillers, below every real key, may repeat
    and then collide among themselves only, in the slots under the real keys (which then
    hold FLOOR or a filler: never chosen). O((N + C)^2) compares and no sort: a few ops where
    a bitonic merge takes dozens of compare-exchange steps. Its cost is mostly its
    reductions across warps (a barrier each), which do not grow with C: one merge of 64
    candidates costs far less than four of 16."""
    col = tl.arange(0, N)
    r_top = (N - 1 - col) + tl.sum((cand[None, :] > top[:, None]).to(tl.int32), 1)
    r_cand = (tl.sum((top[:, None] > cand[None, :]).to(tl.int32), 0)
              + tl.sum((cand[:, None] > cand[None, :]).to(tl.int32), 0))
    slot = col[None, :]  # key i goes to slot N - 1 - rank_i, or out when rank_i >= N
    from_top = tl.max(tl.where((N - 1 - r_top)[:, None] == slot, top[:, None], FLOOR), 0)
    from_cand = tl.max(tl.where((N - 1 - r_cand)[:, None] == slot, cand[:, None], FLOOR), 0)
    return tl.maximum(from_top, from_cand)


@triton.jit
def _merge_branch(PM, PL, PACC, OC, OW, bg, b, g, which, HPG, SC, SW, SP, sob, soh,
                  R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, CA: tl.constexpr):
    """Branch ``which``'s partials merged for all the group's heads, CA slots a load: the
    compressed ones (slots ``[0, SC)``) into ``OC`` when 0, else the window's into ``OW``."""
    rows = tl.arange(0, R)
    offs_d = tl.arange(0, BD)
    if which == 0:
        m_o, l_o, acc_o = _combine_rows(PM, PL, PACC, bg * SP, 0, SC, rows, offs_d, R, BD, CA)
        _store_out(OC, acc_o, l_o, b, g, HPG, sob, soh, rows, rows < HPG, offs_d, D)
    else:
        m_o, l_o, acc_o = _combine_rows(PM, PL, PACC, bg * SP, SC, SC + SW, rows, offs_d, R, BD, CA)
        _store_out(OW, acc_o, l_o, b, g, HPG, sob, soh, rows, rows < HPG, offs_d, D)


@triton.jit
def _score_share(Q, KC, PM, PL, CAND, PSUM, bg, b, g, p, pid, sqb, sqh, scb, sct, sch,
                 HPG, NC, NS, qk_scale, STRIDE, BLK, SBLK, NI, NL, SC, SP, SS, PCAP,
                 R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BJ: tl.constexpr, BT: tl.constexpr,
                 BN: tl.constexpr, M: tl.constexpr, CM: tl.constexpr, PREC: tl.constexpr):
    """Scoring program ``pid`` of SS: the compressed branch's log-sum-exp from its SC
    partials, then a share of the eligible blocks ``[0, pos // l']``, scored and ranked,
    their top BJ keys (ascending) into ``CAND[bg, pid]``."""
    r, offs_d, q = _group_queries(Q, b, g, sqb, sqh, HPG, R, D, BD)
    valid = r < HPG
    dmask = offs_d < D
    m_c, l_c = _combine_lse(PM, PL, bg * SP, 0, SC, r, R, CM)
    lse = tl.where(l_c > 0, m_c + tl.log2(tl.where(l_c > 0, l_c, 1.0)), float("inf"))
    nvis = tl.minimum(tl.where(p >= BLK - 1, tl.maximum(p - BLK + 1, 0) // STRIDE + 1, 0), NC)
    n_elig = p // SBLK + 1  # blocks that start at or before pos
    per = tl.cdiv(tl.cdiv(n_elig, BJ), SS) * BJ
    j_lo = tl.minimum(pid * per, n_elig)
    j_hi = tl.minimum(j_lo + per, n_elig)
    kbase = KC + b * scb + g * sch
    # 1. each compressed token that reaches into this program's blocks, once: the group's
    # summed probability (Eq. 10 before Eq. 9's weights) into the program's scratch row.
    # Contiguous key tiles; a block's tokens were M gathered loads and M thin dots before.
    lo_num = j_lo * SBLK - BLK
    t_lo = tl.where(lo_num >= 0, tl.maximum(lo_num, 0) // STRIDE + 1, 0)
    hi_num = tl.maximum(j_hi - 1, 0) * SBLK - BLK
    t_hi = tl.where(j_hi > j_lo, tl.where(hi_num >= 0, tl.maximum(hi_num, 0) // STRIDE + 1, 0) + M, t_lo)
    t_hi = tl.minimum(tl.minimum(t_hi, nvis), t_lo + PCAP)
    prow = PSUM + (bg * SS + pid) * PCAP - t_lo  # token i at prow + i
    for i0 in range(t_lo, t_hi, BN):
        offs_i = i0 + tl.arange(0, BN)
        im = offs_i < t_hi
        kt = tl.load(kbase + offs_i[None, :] * sct + offs_d[:, None], mask=im[None, :] & dmask[:, None],
                     other=0.0)
        s = tl.dot(q, kt, input_precision=PREC) * qk_scale
        pr = tl.exp2(tl.where(valid[:, None] & im[None, :], s - lse[:, None], float("-inf")))
        tl.store(prow + offs_i, tl.sum(pr, 0), mask=im)
    tl.debug_barrier()  # the scratch row, written by all of the program's threads, read back
    # 2. each block's score from its tokens, in ascending token order (the reference's),
    # and the running top BJ, BT blocks (up to a whole share) a merge
    t_p = tl.zeros([1], tl.int32) + p
    col = tl.arange(0, BJ)
    top = col.to(tl.int64) + (NO_KEY - BJ)  # below every real key, distinct
    colt = tl.arange(0, BT)
    for j0 in range(j_lo, j_hi, BT):
        offs_j = j0 + colt
        jm = offs_j < j_hi
        s0 = offs_j * SBLK
        # the first compressed token that reaches into block j: i*d + l > j*l'
        num = s0 - BLK
        i_first = tl.where(num >= 0, tl.maximum(num, 0) // STRIDE + 1, 0)
        score = tl.zeros([BT], tl.float32)
        for mm in tl.static_range(M):
            i = i_first + mm
            c0 = i * STRIDE
            overlap = tl.minimum(c0 + BLK, s0 + SBLK) - tl.maximum(c0, s0)
            ok = jm & (i < t_hi) & (overlap > 0)
            w = tl.where(ok, overlap.to(tl.float32) / STRIDE, 0.0)  # Eq. 9
            score += tl.load(prow + i, mask=ok, other=0.0) * w
        key = tl.reshape(_candidates(tl.reshape(score, [1, BT]), offs_j, t_p, NS, SBLK, NI, NL), [BT])
        # blocks of another program: distinct fillers below every real key and top's first
        key = tl.where(jm, key, colt.to(tl.int64) + (NO_KEY - BJ - BT))
        top = _merge_top(top, key, BJ, BT)
    tl.store(CAND + (bg * SS + pid) * BJ + col, top)


@triton.jit
def _selected_share(Q, KS, VS, CAND, IDX, bg, b, g, p, pid, sqb, sqh, ssb, sst, ssh, sib, sig,
                    HPG, S, NS, qk_scale, SBLK, NSEL, SS, SSEL,
                    R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, LS: tl.constexpr,
                    NR: tl.constexpr, LOGN: tl.constexpr, SSP: tl.constexpr, PREC: tl.constexpr):
    """The chosen blocks from the SS candidate lists (SSP: SS to a power of two, at most
    ``MAX_SCORE_SPLITS``; NR = 2**LOGN keys each), then share ``pid`` of SSEL of them:
    attention over their keys ``<= pos``, its (max, sum, unnormalised output) and the rows'
    ``(r, offs_d, valid)``. Share 0 writes the choice to ``IDX``. The lists were written by
    other programs: read from L2 (``.cg``)."""
    col = tl.arange(0, NR)
    lists = tl.arange(0, SSP)
    odd = (lists % 2 == 1)[:, None]  # [SSP, NR]: list c in row c, the odd ones reversed; FLOOR past SS
    top = tl.load(CAND + (bg * SS + lists[:, None]) * NR + tl.where(odd, NR - 1 - col[None, :], col[None, :]),
                  mask=lists[:, None] < SS, other=FLOOR, cache_modifier=".cg")
    # a tree of pairwise bitonic merges: log2(SSP) steps, not a chain of SS - 1 (constexpr ifs)
    if SSP >= 64:
        top = _merge_row_pairs(top, 64, NR, LOGN)
    if SSP >= 32:
        top = _merge_row_pairs(top, 32, NR, LOGN)
    if SSP >= 16:
        top = _merge_row_pairs(top, 16, NR, LOGN)
    if SSP >= 8:
        top = _merge_row_pairs(top, 8, NR, LOGN)
    if SSP >= 4:
        top = _merge_row_pairs(top, 4, NR, LOGN)
    if SSP >= 2:
        top = _merge_row_pairs(top, 2, NR, LOGN)
    top = tl.reshape(top, [NR])
    # the top NSEL keys that beat -inf are the choice: slots [NR - n_chosen, NR) of ``top``
    chosen = ((top >> 32) > ORD_NEG_INF) & (col >= NR - NSEL)
    j = (NS - 1 - (top & 0xFFFFFFFF)).to(tl.int32)
    n_chosen = tl.sum(chosen.to(tl.int32), 0)
    if pid == 0:  # ascending block order, -1 after: each block's rank among the chosen
        rank = tl.sum((chosen[None, :] & (j[None, :] < j[:, None])).to(tl.int32), 1)
        row = IDX + b * sib + g * sig
        tl.store(row + rank, j.to(tl.int64), mask=chosen)
        tl.store(row + col, tl.full([NR], -1, tl.int64), mask=(col >= n_chosen) & (col < NSEL))
    r, offs_d, q = _group_queries(Q, b, g, sqb, sqh, HPG, R, D, BD)  # after the merge: fewer live registers
    valid = r < HPG
    per = tl.cdiv(n_chosen, SSEL)
    k0 = tl.minimum(pid * per, n_chosen)
    k1 = tl.minimum(k0 + per, n_chosen)
    kbase = KS + b * ssb + g * ssh
    vbase = VS + b * ssb + g * ssh
    offs_l = tl.arange(0, LS)
    m_i = tl.full([R], NEG, tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BD], tl.float32)
    for k in range(k0, k1):  # the k-th best block: slot NR - 1 - k
        blk = tl.sum(tl.where(col == NR - 1 - k, j, 0), 0)
        offs_n = blk * SBLK + offs_l
        nmask = (offs_l < SBLK) & (offs_n <= p) & (offs_n < S)
        m_i, l_i, acc = _online(q, kbase, vbase, sst, offs_n, nmask, m_i, l_i, acc, qk_scale, offs_d, D, PREC)
    return m_i, l_i, acc, r, offs_d, valid
