"""Group-centric selected attention (NSA's selection branch), forward and backward.

Forward and dQ: one program per (P consecutive query positions, batch, KV group g). Its
rows are those positions x the group's query heads, padded to a power of two: P = 64 /
heads positions at a head dim up to 64, 32 / heads beyond (at least 1, at most 16), or a
forced P (``POSITIONS``; P = 1 pads a small group with zero rows). It walks the union of
the positions' selected blocks ``idx[b, t, g, :]``, handles each distinct block once and
loads its K/V once for all rows (the paper's group-centric scheme), with a per-row mask: the row's position
selected the block, and keys ``s <= t`` (causal inside the query's own block). ``-1``
slots are skipped. The union is ascending, so two loops walk it: the blocks that end at or before
the first position need no element mask (a row that did not choose one gets an exponent
offset of ``+inf``), the rest (the diagonal block) the full one. dK/dV splits its ascending
query list the same way.

dK/dV: KV-block-major, no atomics. An inverted index (which query positions selected
block j of group g: ``invert.py``, a sort of the selections' keys between small kernels; no
host sync, fixed shapes). Each block's query list is cut into chunks of at most CH
queries; one program per chunk loads the block's K/V once and loops over its queries, QC
positions x heads rows per tile (32 rows; a group of more than 32 heads takes several
tiles per position), accumulating fp32 partial dK/dV in registers; a second kernel sums
each block's partials in chunk order. Deterministic, and the blocks that every query
selects (initial and local ones) are spread over many programs instead of one long serial
loop (``dkdv_chunk``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops import poison

from . import tuning
from .band import LOG2E, NEG, _prec
from .bitonic import NO_BLOCK, _bitonic_sort
from .glue import row_delta
from .invert import chunk_map, inverted_index
from .tuning import launch, tunable

# Query positions per forward/dQ program. None: ``_sizes``' choice (ROWS rows of positions x
# heads); an int forces it (bench.run and bench.roofline --sel-positions).
POSITIONS: int | None = None
# Forward/dQ rows a program aims at (positions x padded heads) for a head dim of at most 64:
# 64, sm_90's wgmma height. On the first GPU measurement the selected forward and dQ took
# 1.3-1.5x the time their tile loads need at HBM bandwidth and 7-8x their dot FLOPs at peak
# (docs/kernels.md): more positions per program share more of their blocks' loads. Measured
# since on an H200: at D 64 (nsa-125m) 64 rows took the forward + dQ from 4.57 to 2.22 ms
# (2k) and from 7.66 to 5.12 ms (16k); at D 128 (the paper's layout, 16k) the fwd+bwd went
# from 141.7 to 173.9 ms, so wider heads keep half the rows (``rows_target``).
ROWS = 64
MAX_POSITIONS = 16  # at most this many positions share one union of blocks
# dK/dV chunks: about this many per SM over the whole launch, of at least MIN_CHUNK queries
# (``dkdv_chunk``).
CHUNKS_PER_SM = 16
MIN_CHUNK = 256


def _warps(rows: int, bd: int, four_up_to: int) -> int:
    """4 warps, or 8 once a ``rows x bd`` tile passes ``four_up_to`` elements (4 spilled
    there: bench/compile_check.py)."""
    return 4 if rows * bd <= four_up_to else 8


def _fwd_warps(rows: int, bd: int, four_up_to: int) -> int:
    """Forward/dQ warps: 2 for a 16-row tile (4 warps would split 16 rows x 64 keys into
    16 x 16 slivers), else as ``_warps`` (bench/compile_check.py)."""
    return 2 if rows <= 16 and bd <= 64 else _warps(rows, bd, four_up_to)


# Forward and dQ state ptxas's own ceiling of 255 registers: without it ptxas (Triton
# passes --regAllocOptLevel=2) trims them to an occupancy step (96 or 128 registers) at
# the price of a few bytes of spill. Not for dK/dV: there it made ptxas 12.9 (sm_80) spill.
MAXNREG = 255
# Forward/dQ tune warps and the software-pipelining depth STAGES of the block loop (the
# next block's K/V load is issued while this one is computed; the union list makes its
# address known ahead): 2 stages by default (tuning.py, the configs below).


@triton.jit
def _rows(IDX, sib, sit, sig, t0, b, g, T, HPG, NSEL,
          R: tl.constexpr, HPGP: tl.constexpr, P: tl.constexpr, NP: tl.constexpr):
    """Tile rows = P positions x the group's heads (padded): their position, head, validity
    and selection lists ``sel [R, NP]`` (-1 where empty)."""
    r = tl.arange(0, R)
    p_r = r // HPGP
    h_r = r % HPGP
    t_r = t0 + p_r
    valid = (r < P * HPGP) & (h_r < HPG) & (t_r < T)
    slots = tl.arange(0, NP)
    # block indices fit int32 (Ns < 2**31); int64 doubled this tile's registers
    sel = tl.load(IDX + b * sib + t_r[:, None] * sit + g * sig + slots[None, :],
                  mask=valid[:, None] & (slots < NSEL)[None, :], other=-1).to(tl.int32)
    return h_r, t_r, valid, sel


@triton.jit
def _union(IDX, SCR, sib, sit, sig, t0, b, g, T, NSEL, BS,
           P: tl.constexpr, NP: tl.constexpr, LOGU: tl.constexpr):
    """The distinct blocks that positions t0..t0+P-1 selected, ascending, written to this
    program's scratch row; returns (the row, how many, how many of them end at or before
    ``t0``: wholly visible to every position, no causal mask). Computed once per program so
    the block loops have a fixed list (no per-block branch) whose next entry can be
    prefetched: sort the P*NP slots (-1 last), drop each entry equal to its predecessor
    (read back from the scratch row), sort again."""
    U: tl.constexpr = P * NP
    u = tl.arange(0, U)
    t = t0 + u // NP
    slot = u % NP
    x = tl.load(IDX + b * sib + t * sit + g * sig + slot, mask=(t < T) & (slot < NSEL), other=-1).to(tl.int32)
    x = tl.where(x >= 0, x, NO_BLOCK)
    xs = tl.reshape(_bitonic_sort(tl.reshape(x, [1, U]), 0, 1, U, LOGU), [U])
    row = SCR + (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)) * U
    tl.store(row + u, xs)
    tl.debug_barrier()
    prev = tl.load(row + u - 1, mask=u > 0, other=-1)
    keep = (xs != prev) & (xs != NO_BLOCK)
    tl.debug_barrier()  # every thread has read its predecessor before the row is rewritten
    xs = tl.reshape(_bitonic_sort(tl.reshape(tl.where(keep, xs, NO_BLOCK), [1, U]), 0, 1, U, LOGU), [U])
    tl.store(row + u, xs)
    tl.debug_barrier()
    # block j ends at or before t0 iff (j + 1) * BS <= t0 + 1 (the fillers, NO_BLOCK, never)
    return row, tl.sum(keep.to(tl.int32), 0), tl.sum((xs < (t0 + 1) // BS).to(tl.int32), 0)


def _sel_configs() -> list[triton.Config]:
    return [triton.Config({"STAGES": s}, num_warps=w, maxnreg=MAXNREG) for w in (2, 4, 8) for s in (2, 3)]


def _sel_prune(four_up_to: int, four_up_to_sm90: int | None = None):
    """Forward/dQ configs for a launch's tile (R rows x BD): the default warps with 2 and
    (tiles of at most 32 rows) 3 pipeline stages, then twice the warps (up to 8) with 2.
    A third stage on a 64-row tile took the dQ to 255 registers and a 36 B spill (sm_80,
    D = 64, 8 warps: bench/compile_check.py). ``four_up_to_sm90``: the 4-warp limit on
    sm_90 and newer (``tuning.capability``), where the dQ's 64 x 64 tile fits 4 warps (156
    registers, three programs per SM) and spilled 16 B on sm_80."""
    def prune(configs: list[triton.Config], nargs: dict, **kwargs) -> list[triton.Config]:
        q = nargs.get("Q")
        limit = four_up_to
        if four_up_to_sm90 is not None and tuning.capability(q.device if q is not None else None) >= 90:
            limit = four_up_to_sm90
        w = _fwd_warps(kwargs["R"], kwargs["BD"], limit)
        pick = [(w, 2)] + ([(w, 3)] if kwargs["R"] <= 32 else []) + ([(2 * w, 2)] if w < 8 else [])
        by = {(c.num_warps, c.kwargs["STAGES"]): c for c in configs}
        return [by[p] for p in pick]
    return prune


SEL_KEY = ["T", "HPG", "NSEL", "BS", "D"]


@triton.jit
def _key_tiles(kbase, vbase, row, u, skt, T, offs_d, dmask, BS: tl.constexpr, LS: tl.constexpr,
               V_T: tl.constexpr):
    """Block ``row[u]``'s keys: (j, key positions [LS], which are real, K^T [BD, LS], V as
    [LS, BD] or, ``V_T``, transposed like K)."""
    j = tl.load(row + u)
    offs_n = j * BS + tl.arange(0, LS)
    nmask = (tl.arange(0, LS) < BS) & (offs_n < T)
    kt_mask = nmask[None, :] & dmask[:, None]
    kt = tl.load(kbase + offs_n[None, :] * skt + offs_d[:, None], mask=kt_mask, other=0.0)
    if V_T:
        v = tl.load(vbase + offs_n[None, :] * skt + offs_d[:, None], mask=kt_mask, other=0.0)
    else:
        v = tl.load(vbase + offs_n[:, None] * skt + offs_d[None, :], mask=nmask[:, None] & dmask[None, :],
                    other=0.0)
    return j, offs_n, nmask, kt, v


@triton.jit
def _masked(s, member, nmask, offs_n, t_r, CAUSAL: tl.constexpr, BS: tl.constexpr, LS: tl.constexpr):
    """Scores ``s [R, LS]`` with -inf where a key is hidden from a row. ``CAUSAL``: the block
    reaches past some row's position, so every element is checked (the row chose the block, the
    key is real and at or before the row's position); otherwise rows are handled by the caller
    and only padding columns (``LS > BS``) are masked here, or nothing."""
    if CAUSAL:
        s = tl.where(member[:, None] & nmask[None, :] & (offs_n[None, :] <= t_r[:, None]), s, float("-inf"))
    elif LS != BS:
        s = tl.where(nmask[None, :], s, float("-inf"))
    return s


@triton.jit
def _fwd_step(q, kbase, vbase, row, u, sel, valid, t_r, m_i, l_i, acc, skt, T, qk_scale, offs_d, dmask,
              BS: tl.constexpr, LS: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr):
    """One block of the online softmax. A row that did not choose the block gets nothing from
    it through its offset (``+inf``: ``exp2`` gives 0), not an element-wise mask; the scale
    is applied to the row maximum and fused into the exponent's argument (one FMA)."""
    j, offs_n, nmask, kt, v = _key_tiles(kbase, vbase, row, u, skt, T, offs_d, dmask, BS, LS, False)
    member = (tl.sum((sel == j).to(tl.int32), 1) > 0) & valid  # rows whose position chose j
    s = _masked(tl.dot(q, kt, input_precision=PREC), member, nmask, offs_n, t_r, CAUSAL, BS, LS)
    m_new = tl.maximum(m_i, tl.where(member, tl.max(s, 1) * qk_scale, float("-inf")))  # log2 units
    pr = tl.exp2(s * qk_scale - tl.where(member, m_new, float("inf"))[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(pr, 1)
    acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _dq_step(q, do, kbase, vbase, row, u, sel, valid, t_r, lse, delta, dq, skt, T, qk_scale, offs_d, dmask,
             causal, BS: tl.constexpr, LS: tl.constexpr, PREC: tl.constexpr):
    """One block of dQ: P from the row's LSE (``+inf`` for a row that did not choose the block),
    the scale fused into the exponent's argument, as in the forward; ``causal`` (a branch, not a
    second loop: two loops cost dQ 12 B of spill at 64 heads on sm_80) adds the element mask."""
    j, offs_n, nmask, kt, vt = _key_tiles(kbase, vbase, row, u, skt, T, offs_d, dmask, BS, LS, True)
    member = (tl.sum((sel == j).to(tl.int32), 1) > 0) & valid
    s = tl.dot(q, kt, input_precision=PREC)
    if causal:
        s = _masked(s, member, nmask, offs_n, t_r, True, BS, LS)
    else:
        s = _masked(s, member, nmask, offs_n, t_r, False, BS, LS)
    pr = tl.exp2(s * qk_scale - tl.where(member, lse, float("inf"))[:, None])
    dp = tl.dot(do, vt, input_precision=PREC)
    ds = pr * (dp - delta[:, None])
    return dq + tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PREC)


@tunable(_sel_configs(), SEL_KEY, _sel_prune(64 * 64))
@triton.jit
def _sel_fwd(Q, K, V, IDX, SCR, OUT, LSE,
             sqb, sqt, sqh, skb, skt, skh, sib, sit, sig,
             T, G, HPG, NSEL, qk_scale,
             BS: tl.constexpr, LS: tl.constexpr, R: tl.constexpr, HPGP: tl.constexpr, P: tl.constexpr,
             NP: tl.constexpr, LOGU: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr,
             PREC: tl.constexpr):
    t0 = tl.program_id(0) * P
    pid_bg = tl.program_id(1)
    b = pid_bg // G
    g = pid_bg % G
    h_r, t_r, valid, sel = _rows(IDX, sib, sit, sig, t0, b, g, T, HPG, NSEL, R, HPGP, P, NP)
    row, nu, n_before = _union(IDX, SCR, sib, sit, sig, t0, b, g, T, NSEL, BS, P, NP, LOGU)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    qoff = b * sqb + t_r[:, None] * sqt + (g * HPG + h_r)[:, None] * sqh + offs_d[None, :]
    qmask = valid[:, None] & dmask[None, :]
    q = tl.load(Q + qoff, mask=qmask, other=0.0)
    m_i = tl.full([R], NEG, tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BD], tl.float32)
    kbase = K + b * skb + g * skh
    vbase = V + b * skb + g * skh
    # the blocks that end at or before the first position (nearly all), then the rest with
    # the full mask, not pipelined (one or two blocks; their own buffers cost dQ a program per SM)
    for u in tl.range(0, n_before, num_stages=STAGES):
        m_i, l_i, acc = _fwd_step(q, kbase, vbase, row, u, sel, valid, t_r, m_i, l_i, acc, skt, T, qk_scale,
                                  offs_d, dmask, BS, LS, False, PREC)
    for u in tl.range(n_before, nu, num_stages=1):
        m_i, l_i, acc = _fwd_step(q, kbase, vbase, row, u, sel, valid, t_r, m_i, l_i, acc, skt, T, qk_scale,
                                  offs_d, dmask, BS, LS, True, PREC)
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))  # log2 units
    tl.store(OUT + qoff, out.to(OUT.dtype.element_ty), mask=qmask)
    tl.store(LSE + (b * T + t_r) * G * HPG + g * HPG + h_r, lse, mask=valid)


@tunable(_sel_configs(), SEL_KEY, _sel_prune(32 * 64, 64 * 64))
@triton.jit
def _sel_bwd_dq(Q, K, V, IDX, SCR, DO, LSE, DELTA, DQ,
                sqb, sqt, sqh, skb, skt, skh, sib, sit, sig,
                T, G, HPG, NSEL, qk_scale, scale,
                BS: tl.constexpr, LS: tl.constexpr, R: tl.constexpr, HPGP: tl.constexpr, P: tl.constexpr,
                NP: tl.constexpr, LOGU: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, STAGES: tl.constexpr,
                PREC: tl.constexpr):
    t0 = tl.program_id(0) * P
    pid_bg = tl.program_id(1)
    b = pid_bg // G
    g = pid_bg % G
    h_r, t_r, valid, sel = _rows(IDX, sib, sit, sig, t0, b, g, T, HPG, NSEL, R, HPGP, P, NP)
    row, nu, n_before = _union(IDX, SCR, sib, sit, sig, t0, b, g, T, NSEL, BS, P, NP, LOGU)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    qoff = b * sqb + t_r[:, None] * sqt + (g * HPG + h_r)[:, None] * sqh + offs_d[None, :]
    qmask = valid[:, None] & dmask[None, :]
    q = tl.load(Q + qoff, mask=qmask, other=0.0)
    do = tl.load(DO + qoff, mask=qmask, other=0.0)
    rid = (b * T + t_r) * G * HPG + g * HPG + h_r
    lse = tl.load(LSE + rid, mask=valid, other=float("inf"))
    delta = tl.load(DELTA + rid, mask=valid, other=0.0)
    dq = tl.zeros([R, BD], tl.float32)
    kbase = K + b * skb + g * skh
    vbase = V + b * skb + g * skh
    for u in tl.range(0, nu, num_stages=STAGES):
        dq = _dq_step(q, do, kbase, vbase, row, u, sel, valid, t_r, lse, delta, dq, skt, T, qk_scale, offs_d,
                      dmask, u >= n_before, BS, LS, PREC)
    tl.store(DQ + qoff, (dq * scale).to(DQ.dtype.element_ty), mask=qmask)


@triton.jit
def _dkdv_tile(Q, DO, LSE, DELTA, TLIST, k, v, dk, dv, c0, stop, b, g, qi, hc, offs_n, nmask, offs_d, dmask,
               sqb, sqt, sqh, T, G, HPG, qk_scale, HPP: tl.constexpr, HC: tl.constexpr, CAUSAL: tl.constexpr,
               PREC: tl.constexpr):
    """Queries ``c0 + qi`` (those before ``stop``) x the group's heads against the block's keys:
    dK/dV accumulated. ``CAUSAL``: some query is before the block's last key, so every element
    is checked; otherwise a padded row's LSE (``+inf``) is its only mask, and padding keys
    (past the block or T) only feed rows of dK/dV that are never stored."""
    t_ok = c0 + qi < stop
    t = tl.load(TLIST + c0 + qi, mask=t_ok, other=0)
    for h0 in range(0, HPP, HC):
        hr = h0 + hc
        valid = t_ok & (hr < HPG)
        h = g * HPG + hr
        # rows = (position, head) pairs, loaded row-major: [rows, BD]
        qoff = b * sqb + t[:, None] * sqt + h[:, None] * sqh + offs_d[None, :]
        qr = tl.load(Q + qoff, mask=valid[:, None] & dmask[None, :], other=0.0)
        dor = tl.load(DO + qoff, mask=valid[:, None] & dmask[None, :], other=0.0)
        row = (b * T + t) * G * HPG + h
        lse = tl.load(LSE + row, mask=valid, other=float("inf"))
        delta = tl.load(DELTA + row, mask=valid, other=0.0)
        st = tl.dot(k, tl.trans(qr), input_precision=PREC)
        if CAUSAL:
            vis = nmask[:, None] & (offs_n[:, None] <= t[None, :]) & valid[None, :]
            pt = tl.exp2(tl.where(vis, st * qk_scale - lse[None, :], float("-inf")))
        else:
            pt = tl.exp2(st * qk_scale - lse[None, :])
        dv += tl.dot(pt.to(dor.dtype), dor, input_precision=PREC)
        dpt = tl.dot(v, tl.trans(dor), input_precision=PREC)
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(qr.dtype), qr, input_precision=PREC)
    return dk, dv


@triton.jit
def _sel_bwd_dkdv(Q, K, V, DO, LSE, DELTA, TLIST, OFFS, KEY_OF_CHUNK, CHUNK_START, DKP, DVP,
                  sqb, sqt, sqh, skb, skt, skh,
                  T, G, HPG, NS, NKEYS, CH, qk_scale, scale,
                  BS: tl.constexpr, LS: tl.constexpr, HPP: tl.constexpr, HC: tl.constexpr,
                  QC: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr):
    """Chunk c of the query list of one (b, g, block j): partial dK/dV of that block.
    Tiles of QC positions x HC heads; groups of more than HC (padded) heads take HPP / HC
    tiles per position step."""
    c = tl.program_id(0)
    key_raw = tl.load(KEY_OF_CHUNK + c)
    ok = key_raw < NKEYS  # the grid is a static upper bound on the number of chunks
    key = tl.minimum(key_raw, NKEYS - 1)
    seg_lo = tl.load(OFFS + key)
    seg_hi = tl.load(OFFS + key + 1)
    start = seg_lo + (c - tl.load(CHUNK_START + key)) * CH
    end = tl.where(ok, tl.minimum(start + CH, seg_hi), start)
    pid_bg = key // NS
    j = key % NS
    b = pid_bg // G
    g = pid_bg % G
    offs_n = j * BS + tl.arange(0, LS)
    nmask = (tl.arange(0, LS) < BS) & (offs_n < T)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    kvoff = b * skb + offs_n[:, None] * skt + g * skh + offs_d[None, :]
    kvmask = nmask[:, None] & dmask[None, :]
    k = tl.load(K + kvoff, mask=kvmask, other=0.0)
    v = tl.load(V + kvoff, mask=kvmask, other=0.0)
    dk = tl.zeros([LS, BD], tl.float32)
    dv = tl.zeros([LS, BD], tl.float32)
    r = tl.arange(0, QC * HC)
    qi = r // HC
    hc = r % HC
    # The list is ascending: the queries that see only part of the block (before its last
    # key) come first, at most BS - 1 of them; the masked tiles cover them (rounded up to
    # whole tiles: as many tiles as one loop would run). LS of them means a selection of
    # blocks after their query (the contract's idx may hold any): then the whole chunk is masked.
    lim = (j + 1) * BS - 1
    head = start + tl.arange(0, LS)
    early = tl.sum(((tl.load(TLIST + head, mask=head < end, other=0) < lim) & (head < end)).to(tl.int32), 0)
    split = tl.where(early >= LS, end, tl.minimum(start + tl.cdiv(early, QC) * QC, end))
    # one loop with a branch (two loops cost sm_80 16 B of spill at one head per group)
    for c0 in range(start, end, QC):
        if c0 < split:
            dk, dv = _dkdv_tile(Q, DO, LSE, DELTA, TLIST, k, v, dk, dv, c0, end, b, g, qi, hc, offs_n, nmask,
                                offs_d, dmask, sqb, sqt, sqh, T, G, HPG, qk_scale, HPP, HC, True, PREC)
        else:
            dk, dv = _dkdv_tile(Q, DO, LSE, DELTA, TLIST, k, v, dk, dv, c0, end, b, g, qi, hc, offs_n, nmask,
                                offs_d, dmask, sqb, sqt, sqh, T, G, HPG, qk_scale, HPP, HC, False, PREC)
    poff = c * LS * BD + tl.arange(0, LS)[:, None] * BD + offs_d[None, :]
    # whole tile, real chunks only (a tensor compare: the interpreter rejects scalar-bool masks)
    pmask = (tl.zeros([LS, BD], tl.int64) + key_raw) < NKEYS
    tl.store(DKP + poff, dk * scale, mask=pmask)
    tl.store(DVP + poff, dv, mask=pmask)


@triton.jit
def _sel_bwd_reduce(DKP, DVP, CHUNK_START, DK, DV, skb, skt, skh, T, G, NS,
                    BS: tl.constexpr, LS: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """dK/dV of block j = sum of its chunks' partials, in chunk order (deterministic)."""
    key = tl.program_id(0)
    pid_bg = key // NS
    j = key % NS
    b = pid_bg // G
    g = pid_bg % G
    offs_n = j * BS + tl.arange(0, LS)
    offs_d = tl.arange(0, BD)
    kvmask = ((tl.arange(0, LS) < BS) & (offs_n < T))[:, None] & (offs_d < D)[None, :]
    tile = tl.arange(0, LS)[:, None] * BD + offs_d[None, :]
    dk = tl.zeros([LS, BD], tl.float32)
    dv = tl.zeros([LS, BD], tl.float32)
    for c in range(tl.load(CHUNK_START + key), tl.load(CHUNK_START + key + 1)):
        dk += tl.load(DKP + c * LS * BD + tile)
        dv += tl.load(DVP + c * LS * BD + tile)
    kvoff = b * skb + offs_n[:, None] * skt + g * skh + offs_d[None, :]
    tl.store(DK + kvoff, dk.to(DK.dtype.element_ty), mask=kvmask)
    tl.store(DV + kvoff, dv.to(DV.dtype.element_ty), mask=kvmask)


def rows_target(bd: int) -> int:
    """Forward/dQ rows a program aims at for the head-dim tile ``bd``: ROWS up to 64, half
    beyond (its [rows, bd] tiles of q, the output and dQ double with bd)."""
    return ROWS if bd <= 64 else ROWS // 2


def _sizes(hpg: int, d: int, block: int, positions: int | None) -> tuple[int, int, int, int, int, int]:
    """(forward/dQ rows R, positions P, padded heads HPGP, dK/dV positions per tile QC, BD, LS)."""
    hpgp = triton.next_power_of_2(hpg)
    bd = max(16, triton.next_power_of_2(d))
    pos = positions if positions is not None else (
        POSITIONS or max(1, min(MAX_POSITIONS, rows_target(bd) // hpgp)))
    pos = triton.next_power_of_2(pos)  # the union sorts P x NP slots: a power of two
    rows = max(16, triton.next_power_of_2(pos * hpgp))  # rows beyond pos * hpgp are zero padding
    qc = max(1, 32 // hpgp)  # dK/dV rows: QC positions x heads, 32 (64 spilled: docs/kernels.md)
    return rows, pos, hpgp, qc, bd, max(16, triton.next_power_of_2(block))


def dkdv_chunk(pairs: int, n: int, block: int, sms: int) -> int:
    """Queries per dK/dV program (before rounding to whole tiles), from the launch's
    (query, block) pairs and the GPU's SMs: a power of two near ``pairs / (CHUNKS_PER_SM *
    sms)``, between MIN_CHUNK and ``4 n l'`` (the fixed length it was; also what runs off a
    GPU, ``sms`` 0). A program's queries are one serial loop, and the initial block holds
    every query of its sequence: at 4,096 per chunk (nsa-125m, 16k) its few programs ran
    2,048 steps each while the average block's ran a quarter of that, and the launch took
    3.1 ms on an H200 where the same pairs at 2k (no chunk past 1,024 steps) took 2.1.
    Shorter chunks cost partials (``ls x bd`` fp32 twice per chunk) that the reduce sums."""
    most = 4 * n * block
    if sms <= 0:
        return most
    want = max(1, pairs // (CHUNKS_PER_SM * sms))
    return min(most, max(MIN_CHUNK, 1 << (want.bit_length() - 1)))


def _dkdv_heads(hpgp: int) -> int:
    """Heads per dK/dV tile (HC): all of the group's, at most 32 (the tile stays 32 rows)."""
    return min(hpgp, 32)


def _union_args(T: int, B: int, G: int, n: int, pos: int, device: torch.device) -> tuple[torch.Tensor, dict]:
    """The per-program scratch rows of ``_union`` and its constexprs (NP slots, log2 of P x NP)."""
    np_ = triton.next_power_of_2(max(n, 1))
    # written before it is read, within each program; not an output, and a poisoned index
    # read by mistake would address memory out of bounds: plain torch.empty
    scratch = torch.empty(triton.cdiv(T, pos) * B * G * pos * np_, device=device, dtype=torch.int32)
    return scratch, dict(NP=np_, LOGU=(pos * np_).bit_length() - 1)


def selected_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, block: int,
                     scale: float, positions: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Output [B,T,H,D] and LSE [B,T,H] (fp32, log2 units)."""
    B, T, H, D = q.shape
    G, n = k.shape[2], idx.shape[-1]
    o = poison.empty_like(q)
    lse = poison.empty(B, T, H, device=q.device, dtype=torch.float32)
    if T == 0:
        return o, lse
    rows, pos, hpgp, _, bd, ls = _sizes(H // G, D, block, positions)
    scratch, u = _union_args(T, B, G, n, pos, q.device)
    launch(_sel_fwd, (triton.cdiv(T, pos), B * G),
           q, k, v, idx, scratch, o, lse, *q.stride()[:3], *k.stride()[:3], *idx.stride()[:3],
           T, G, H // G, n, scale * LOG2E, BS=block, LS=ls, R=rows, HPGP=hpgp, P=pos, D=D, BD=bd,
           PREC=_prec(q), **u)
    return o, lse


def selected_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, o: torch.Tensor,
                      lse: torch.Tensor, do: torch.Tensor, block: int, scale: float, chunk: int | None = None,
                      positions: int | None = None, sms: int = 0
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (deterministic: dK/dV are KV-block-major over an inverted index).
    ``chunk``: queries per dK/dV program, default ``dkdv_chunk`` for a GPU of ``sms`` SMs."""
    B, T, H, D = q.shape
    G, n = k.shape[2], idx.shape[-1]
    do = do.contiguous()
    dq = poison.empty_like(q)
    dk = poison.empty_like(k)  # _sel_bwd_reduce writes every block, so every row
    dv = poison.empty_like(v)
    if T == 0:
        return dq, dk, dv
    delta = row_delta(o, do, heads_major=False)  # [B,T,H]
    rows, pos, hpp, qc, bd, ls = _sizes(H // G, D, block, positions)
    prec = _prec(q)
    scratch, u = _union_args(T, B, G, n, pos, q.device)
    launch(_sel_bwd_dq, (triton.cdiv(T, pos), B * G),
           q, k, v, idx, scratch, do, lse, delta, dq, *q.stride()[:3], *k.stride()[:3], *idx.stride()[:3],
           T, G, H // G, n, scale * LOG2E, scale, BS=block, LS=ls, R=rows, HPGP=hpp, P=pos, D=D, BD=bd,
           PREC=prec, **u)
    ns = triton.cdiv(T, block)
    nkeys = B * G * ns
    tlist, offsets = inverted_index(idx, ns)
    # Split every block's query list into chunks of at most `chunk` queries (one program
    # each) so that the blocks every query selects (initial, local) are not one long
    # serial loop; partials are summed per block in chunk order afterwards.
    ch = chunk if chunk is not None else max(qc, dkdv_chunk(B * T * G * n, n, block, sms))
    ch = triton.cdiv(ch, qc) * qc
    max_chunks = nkeys + triton.cdiv(B * T * G * n, ch)  # static bound: no host sync
    chunk_start, key_of_chunk = chunk_map(offsets, ch, max_chunks)
    dkp = poison.empty(max_chunks, ls, bd, device=q.device, dtype=torch.float32)
    dvp = poison.empty_like(dkp)
    _sel_bwd_dkdv[(max_chunks,)](q, k, v, do, lse, delta, tlist, offsets, key_of_chunk, chunk_start, dkp, dvp,
                                 *q.stride()[:3], *k.stride()[:3], T, G, H // G, ns, nkeys, ch,
                                 scale * LOG2E, scale,
                                 BS=block, LS=ls, HPP=hpp, HC=_dkdv_heads(hpp), QC=qc, D=D, BD=bd,
                                 PREC=prec, num_warps=_warps(qc * _dkdv_heads(hpp), bd, 32 * 64))
    _sel_bwd_reduce[(nkeys,)](dkp, dvp, chunk_start, dk, dv, *k.stride()[:3], T, G, ns,
                              BS=block, LS=ls, D=D, BD=bd, num_warps=_warps(ls, bd, 64 * 64))
    return dq, dk, dv
