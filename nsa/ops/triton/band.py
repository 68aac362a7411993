"""Flash-style attention with a "band" mask: sliding window and compressed attention.

Both branches are one kernel family. Key ``s`` has an *end position*
``e(s) = s * STRIDE + OFF`` (the last token it summarises) and query ``t`` sees it iff

    e(s) <= t   and   t - e(s) < WIN

- sliding window: STRIDE = 1, OFF = 0, WIN = window (keys ``t - window < s <= t``);
- compressed attention: STRIDE = d, OFF = l - 1, WIN = T + 1 (no lower bound): query t
  sees compressed token i iff ``i*d + l - 1 <= t`` (ops contract).

Each program computes the key range its query tile can see and splits it into *edge*
tiles (some query/key pair masked: the diagonal, the window's far end, the last partial
tile) and *interior* tiles that every query of the tile sees whole; interior tiles skip
the mask arithmetic (``e(s)`` compares and selects on every score) and the bounds checks.
Softmax runs in base 2: scores are scaled by ``scale * log2(e)`` once and exponentiated
with ``exp2``; the stored row log-sum-exp is in log2 units (``lse2 = lse / ln 2``).
Query tiles are launched last-first (the last ones see the most keys). Backward is
FlashAttention-2 style in two kernels, both without atomics: ``dq`` (one program per
query tile and head) and ``dk/dv`` (one program per key tile and KV group, looping over
the group's heads and the query tiles that can see the key tile; optionally split into
NSPLIT contiguous query ranges whose fp32 partials are summed afterwards, deterministic).
dK/dV programs run heaviest key tile first (a 1-D grid, key tile slowest).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops import poison

from . import tuning
from .glue import row_delta
from .tuning import launch, tunable

# Finite "minus infinity" for the running max: keeps exp(m_old - m_new) NaN-free. A
# tl.constexpr object: the compiler rejects plain module globals read in @triton.jit code
# (the interpreter does not), see bench/compile_check.py.
NEG = tl.constexpr(-1.0e30)
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E): the kernels fold it into the score scale
LN2 = 0.6931471805599453


@triton.jit
def _key_range(t0, t1, NK, STRIDE, OFF, WIN):
    """Keys visible to at least one query in [t0, t1): [lo, hi)."""
    last = t1 - 1
    hi = tl.where(last >= OFF, (tl.maximum(last - OFF, 0) // STRIDE) + 1, 0)
    hi = tl.minimum(hi, NK)
    num = t0 - WIN - OFF  # e(s) > t0 - WIN  <=>  s*STRIDE > t0 - WIN - OFF
    lo = tl.where(num >= 0, tl.maximum(num, 0) // STRIDE + 1, 0)
    return lo, hi


@triton.jit
def _interior_keys(lo, hi, t0, t1, NK, STRIDE, OFF, WIN, BN: tl.constexpr):
    """[f0, f1): the key tiles (BN-aligned from ``lo``) that every query in [t0, t1) sees
    whole: every key ended by t0, none out of t1 - 1's window, none past NK."""
    ended = tl.minimum(tl.where(t0 >= OFF, tl.maximum(t0 - OFF, 0) // STRIDE + 1, 0), NK)
    num = t1 - 1 - OFF - WIN
    first_in = tl.where(num >= 0, tl.maximum(num, 0) // STRIDE + 1, 0)
    f0 = tl.minimum(lo + tl.cdiv(tl.maximum(first_in - lo, 0), BN) * BN, hi)
    f1 = tl.maximum(lo + tl.maximum(ended - lo, 0) // BN * BN, f0)
    return f0, f1


@triton.jit
def _visible(offs_m, offs_n, NK, STRIDE, OFF, WIN):
    e = offs_n * STRIDE + OFF
    return (e[None, :] <= offs_m[:, None]) & (offs_m[:, None] - e[None, :] < WIN) & (offs_n < NK)[None, :]


@triton.jit
def _load_rows(base, offs, rmask, offs_d, stride, D: tl.constexpr, BD: tl.constexpr, TRANS: tl.constexpr,
               CHECK: tl.constexpr):
    """A [rows, BD] tile (``[BD, rows]`` if TRANS) of a row-major tensor; bounds checks only
    where they can fail (CHECK: rows; D < BD: columns)."""
    if TRANS:
        ptr = base + offs[None, :] * stride + offs_d[:, None]
        if CHECK:
            x = tl.load(ptr, mask=rmask[None, :] & (offs_d < D)[:, None], other=0.0)
        elif D != BD:
            x = tl.load(ptr, mask=(offs_d < D)[:, None], other=0.0)
        else:
            x = tl.load(ptr)
    else:
        ptr = base + offs[:, None] * stride + offs_d[None, :]
        if CHECK:
            x = tl.load(ptr, mask=rmask[:, None] & (offs_d < D)[None, :], other=0.0)
        elif D != BD:
            x = tl.load(ptr, mask=(offs_d < D)[None, :], other=0.0)
        else:
            x = tl.load(ptr)
    return x


@triton.jit
def _fwd_tile(q, kbase, vbase, s0, offs_m, offs_d, m_i, l_i, acc, skt, NK, qk_scale, STRIDE, OFF, WIN,
              D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr, PREC: tl.constexpr):
    offs_n = s0 + tl.arange(0, BN)
    nmask = offs_n < NK
    kt = _load_rows(kbase, offs_n, nmask, offs_d, skt, D, BD, True, MASKED)
    s = tl.dot(q, kt, input_precision=PREC) * qk_scale  # log2 units
    if MASKED:
        s = tl.where(_visible(offs_m, offs_n, NK, STRIDE, OFF, WIN), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_rows(vbase, offs_n, nmask, offs_d, skt, D, BD, False, MASKED)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


Tiles = dict[int, list[tuple[int, int, int]]]


def _table(table: Tiles, sm90: Tiles | None, cap: int) -> Tiles:
    """``table``, with ``sm90``'s head dims in its place on sm_90 or newer."""
    return {**table, **sm90} if sm90 and cap >= 90 else table


def _tiles_for(table: Tiles, sm90: Tiles | None = None):
    """An autotune prune: the (BM, BN, warps) configs listed for the launch's head-dim tile BD
    (``sm90``'s where it lists that head dim and the GPU is sm_90 or newer)."""
    def prune(configs: list[triton.Config], nargs: dict, **kwargs) -> list[triton.Config]:
        q = nargs.get("Q")
        chosen = _table(table, sm90, tuning.capability(q.device if q is not None else None))
        allowed = chosen[min(t for t in chosen if t >= kwargs["BD"])]
        by_tiles = {(c.kwargs["BM"], c.kwargs["BN"], c.num_warps): c for c in configs}
        return [by_tiles[t] for t in allowed]
    return prune


def _configs(*tables: Tiles | None) -> list[triton.Config]:
    tiles = dict.fromkeys(t for table in tables if table for ts in table.values() for t in ts)
    return [triton.Config({"BM": bm, "BN": bn}, num_warps=w) for bm, bn, w in tiles]


# Tiles (query rows BM, keys BN, warps) per head-dim tile BD, the default first. The *_SM90
# tables replace a head dim's list on sm_90 and newer (tuning.capability). Every entry for
# BD <= 128 compiles without spills for each arch that uses it (bench/compile_check.py
# compiles all of them; no shipped config has D > 128). Forward: 128-row tiles on 8 warps
# where D allows (D <= 64; at D = 128, 128 x 32 on 8 warps spilled 24-28 B on sm_80, so 64 x 32
# on 4 warps; at D = 64, 64 x 64 on 4 warps spilled 4 B, 128 x 64 on 4 warps 116-140 B on sm_80).
FWD_TILES = {64: [(128, 64, 8), (64, 32, 4)], 128: [(64, 32, 4), (64, 64, 4), (32, 32, 4)],
             256: [(32, 32, 4)]}
# On sm_90 at D = 128, 128 x 32 on 8 warps (189-193 registers, no spill; 4-24 B of spill on
# sm_80): each K/V tile serves twice the queries, halving the compressed branch's K/V traffic.
# At D = 64, 64 x 32 on 4 warps: on an H200 (bench.tiles, nsa-125m, 16k x 4) the compressed
# forward took 0.51 ms there against 0.62 for 128 x 64 on 8, with the same outputs.
FWD_TILES_SM90 = {64: [(64, 32, 4), (128, 64, 8)], 128: [(128, 32, 8), (64, 32, 4), (64, 64, 4), (32, 32, 4)]}
# Backward dQ (one program per BM queries stepping over BN keys). Every step reloads a K and
# a V tile, so their traffic is (queries / BM) times their size (the compressed branch's
# reaches twice its FLOP bound at 64k): 128 x 32 on 8 warps at D <= 64, and at D = 128 on
# sm_90 (it spilled 76-216 B on sm_80 there: 64 x 32 on 8). The forward's 64 x 64 on 4 warps
# spilled on sm_80 at D = 64.
DQ_TILES = {64: [(128, 32, 8), (64, 32, 8)], 128: [(64, 32, 8)], 256: [(32, 32, 4)]}
DQ_TILES_SM90 = {128: [(128, 32, 8), (64, 32, 8)]}
# dK/dV (one program per BN keys stepping over BM queries). Every step reloads a Q and a dO
# tile, so the query and dO traffic is (keys / BN) times their size: at 64k the compressed
# branch's re-reads need more time at HBM bandwidth than its FLOPs need at peak
# (bench.roofline). Hence wide key tiles and thin query steps, the dots' rows being keys
# (64 or 128: sm_90's wgmma), the accumulators [BN, D]. Everywhere: 64 x 16 on 4 warps at
# D <= 64, on 8 at D = 128. On sm_90: 128 x 16 on 8 warps at D 64 and 128 (on sm_80 it spilled
# 8-24 B at D 64 under Triton 3.6, 92-152 B at D 128). The former 32-key tiles stay as
# alternatives (64 x 32 on 8 warps: 64 keys on 8 warps spilled 92-152 B on sm_80; at
# D = 32, 64 x 32 spilled 8 B on sm_90).
DKDV_TILES = {32: [(64, 16, 4), (32, 32, 4)], 64: [(16, 64, 4), (64, 32, 8)],
              128: [(16, 64, 8), (64, 32, 8)], 256: [(32, 32, 4)]}
DKDV_TILES_SM90 = {64: [(16, 128, 8), (16, 64, 4), (64, 32, 8)],
                   128: [(16, 128, 8), (16, 64, 8), (64, 32, 8)]}
BAND_KEY = ["T", "NK", "HPG", "STRIDE", "OFF", "WIN", "D"]


@tunable(_configs(FWD_TILES, FWD_TILES_SM90), BAND_KEY, _tiles_for(FWD_TILES, FWD_TILES_SM90))
@triton.jit
def _band_fwd(Q, K, V, OUT, LSE,
              sqb, sqt, sqh, skb, skt, skh, sob, sot, soh,
              T, NK, H, HPG, qk_scale, STRIDE, OFF, WIN,
              D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              PREC: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # the last query tiles see the most keys
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    g = h // HPG
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    mmask = offs_m < T
    q = _load_rows(Q + b * sqb + h * sqh, offs_m, mmask, offs_d, sqt, D, BD, False, True)
    t0 = pid_m * BM
    t1 = tl.minimum(T, t0 + BM)
    lo, hi = _key_range(t0, t1, NK, STRIDE, OFF, WIN)
    lo = (lo // BN) * BN
    f0, f1 = _interior_keys(lo, hi, t0, t1, NK, STRIDE, OFF, WIN, BN)
    m_i = tl.full([BM], NEG, tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    kbase = K + b * skb + g * skh
    vbase = V + b * skb + g * skh
    for s0 in range(lo, f0, BN):  # the window's far edge
        m_i, l_i, acc = _fwd_tile(q, kbase, vbase, s0, offs_m, offs_d, m_i, l_i, acc, skt, NK, qk_scale,
                                  STRIDE, OFF, WIN, D, BD, BN, True, PREC)
    for s0 in range(f0, f1, BN):  # interior: no mask
        m_i, l_i, acc = _fwd_tile(q, kbase, vbase, s0, offs_m, offs_d, m_i, l_i, acc, skt, NK, qk_scale,
                                  STRIDE, OFF, WIN, D, BD, BN, False, PREC)
    for s0 in range(f1, hi, BN):  # the diagonal and the last partial tile
        m_i, l_i, acc = _fwd_tile(q, kbase, vbase, s0, offs_m, offs_d, m_i, l_i, acc, skt, NK, qk_scale,
                                  STRIDE, OFF, WIN, D, BD, BN, True, PREC)
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))
    tl.store(OUT + b * sob + offs_m[:, None] * sot + h * soh + offs_d[None, :],
             out.to(OUT.dtype.element_ty), mask=mmask[:, None] & (offs_d < D)[None, :])
    tl.store(LSE + pid_bh * T + offs_m, lse, mask=mmask)


@triton.jit
def _dq_tile(q, do, lse, delta, dq, kbase, vbase, s0, offs_m, offs_d, skt, NK, qk_scale, STRIDE, OFF, WIN,
             D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr, PREC: tl.constexpr):
    offs_n = s0 + tl.arange(0, BN)
    nmask = offs_n < NK
    kt = _load_rows(kbase, offs_n, nmask, offs_d, skt, D, BD, True, MASKED)
    vt = _load_rows(vbase, offs_n, nmask, offs_d, skt, D, BD, True, MASKED)
    s = tl.dot(q, kt, input_precision=PREC) * qk_scale - lse[:, None]
    if MASKED:
        s = tl.where(_visible(offs_m, offs_n, NK, STRIDE, OFF, WIN), s, float("-inf"))
    p = tl.exp2(s)
    dp = tl.dot(do, vt, input_precision=PREC)
    ds = p * (dp - delta[:, None])
    return dq + tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PREC)


@tunable(_configs(DQ_TILES, DQ_TILES_SM90), BAND_KEY, _tiles_for(DQ_TILES, DQ_TILES_SM90))
@triton.jit
def _band_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                 sqb, sqt, sqh, skb, skt, skh,
                 T, NK, H, HPG, qk_scale, scale, STRIDE, OFF, WIN,
                 D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 PREC: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    g = h // HPG
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    mmask = offs_m < T
    q = _load_rows(Q + b * sqb + h * sqh, offs_m, mmask, offs_d, sqt, D, BD, False, True)
    do = _load_rows(DO + b * sqb + h * sqh, offs_m, mmask, offs_d, sqt, D, BD, False, True)
    lse = tl.load(LSE + pid_bh * T + offs_m, mask=mmask, other=float("inf"))
    delta = tl.load(DELTA + pid_bh * T + offs_m, mask=mmask, other=0.0)
    t0 = pid_m * BM
    t1 = tl.minimum(T, t0 + BM)
    lo, hi = _key_range(t0, t1, NK, STRIDE, OFF, WIN)
    lo = (lo // BN) * BN
    f0, f1 = _interior_keys(lo, hi, t0, t1, NK, STRIDE, OFF, WIN, BN)
    dq = tl.zeros([BM, BD], tl.float32)
    kbase = K + b * skb + g * skh
    vbase = V + b * skb + g * skh
    for s0 in range(lo, f0, BN):
        dq = _dq_tile(q, do, lse, delta, dq, kbase, vbase, s0, offs_m, offs_d, skt, NK, qk_scale,
                      STRIDE, OFF, WIN, D, BD, BN, True, PREC)
    for s0 in range(f0, f1, BN):
        dq = _dq_tile(q, do, lse, delta, dq, kbase, vbase, s0, offs_m, offs_d, skt, NK, qk_scale,
                      STRIDE, OFF, WIN, D, BD, BN, False, PREC)
    for s0 in range(f1, hi, BN):
        dq = _dq_tile(q, do, lse, delta, dq, kbase, vbase, s0, offs_m, offs_d, skt, NK, qk_scale,
                      STRIDE, OFF, WIN, D, BD, BN, True, PREC)
    tl.store(DQ + b * sqb + offs_m[:, None] * sqt + h * sqh + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=mmask[:, None] & (offs_d < D)[None, :])


@triton.jit
def _dkdv_tile(k, v, dk, dv, Q, DO, LSE, DELTA, it, b, h, offs_n, offs_d, e, sqb, sqt, sqh, T, H,
               qk_scale, WIN, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, MASKED: tl.constexpr,
               PREC: tl.constexpr):
    offs_m = it * BM + tl.arange(0, BM)
    mmask = offs_m < T
    qt = _load_rows(Q + b * sqb + h * sqh, offs_m, mmask, offs_d, sqt, D, BD, True, MASKED)
    dot_ = _load_rows(DO + b * sqb + h * sqh, offs_m, mmask, offs_d, sqt, D, BD, True, MASKED)
    if MASKED:
        lse = tl.load(LSE + (b * H + h) * T + offs_m, mask=mmask, other=float("inf"))
        delta = tl.load(DELTA + (b * H + h) * T + offs_m, mask=mmask, other=0.0)
    else:
        lse = tl.load(LSE + (b * H + h) * T + offs_m)
        delta = tl.load(DELTA + (b * H + h) * T + offs_m)
    st = tl.dot(k, qt, input_precision=PREC) * qk_scale - lse[None, :]
    if MASKED:
        vis = (e[:, None] <= offs_m[None, :]) & (offs_m[None, :] - e[:, None] < WIN) & mmask[None, :]
        st = tl.where(vis, st, float("-inf"))
    pt = tl.exp2(st)
    dv += tl.dot(pt.to(dot_.dtype), tl.trans(dot_), input_precision=PREC)
    dpt = tl.dot(v, dot_, input_precision=PREC)
    dst = pt * (dpt - delta[None, :])
    dk += tl.dot(dst.to(qt.dtype), tl.trans(qt), input_precision=PREC)
    return dk, dv


@tunable(_configs(DKDV_TILES, DKDV_TILES_SM90), BAND_KEY, _tiles_for(DKDV_TILES, DKDV_TILES_SM90))
@triton.jit
def _band_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
                   sqb, sqt, sqh, skb, skt, skh, spart, spb, spt, sph,
                   T, NK, H, HPG, qk_scale, scale, STRIDE, OFF, WIN, BG,
                   NSPLIT: tl.constexpr,
                   D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   PREC: tl.constexpr):
    # 1-D grid, key tile slowest: the first key tiles (the most later queries to visit) of
    # every (batch, group, split) start first and the short ones fill in behind them
    pid = tl.program_id(0)
    pid_n = pid // (BG * NSPLIT)
    pid_bg = (pid // NSPLIT) % BG
    sp = pid % NSPLIT
    G = H // HPG
    b = pid_bg // G
    g = pid_bg % G
    offs_n = pid_n * BN + tl.arange(0, BN)
    nmask = offs_n < NK
    offs_d = tl.arange(0, BD)
    k = _load_rows(K + b * skb + g * skh, offs_n, nmask, offs_d, skt, D, BD, False, True)
    v = _load_rows(V + b * skb + g * skh, offs_n, nmask, offs_d, skt, D, BD, False, True)
    e = offs_n * STRIDE + OFF
    s_last = tl.minimum(pid_n * BN + BN, NK) - 1
    e_last = s_last * STRIDE + OFF
    t_hi = tl.minimum(T, e_last + WIN)
    first = (pid_n * BN * STRIDE + OFF) // BM
    n_tiles = tl.cdiv(t_hi, BM)
    # this split's contiguous share of the query tiles (equal work: every tile costs the same)
    per = tl.cdiv(tl.maximum(n_tiles - first, 0), NSPLIT)
    a = tl.minimum(first + sp * per, n_tiles)
    z = tl.minimum(a + per, n_tiles)
    # interior query tiles: every row sees every key of the tile (all keys real and ended,
    # all within the window, all rows < T)
    i0 = tl.where(pid_n * BN + BN <= NK, tl.cdiv(e_last, BM), n_tiles)
    last_row = pid_n * BN * STRIDE + OFF + WIN - BM  # first row of the last tile in every key's window
    i1 = tl.minimum(tl.where(last_row >= 0, tl.maximum(last_row, 0) // BM + 1, 0), T // BM)
    i0 = tl.minimum(tl.maximum(i0, a), z)
    i1 = tl.minimum(tl.maximum(i1, i0), z)
    dk = tl.zeros([BN, BD], tl.float32)
    dv = tl.zeros([BN, BD], tl.float32)
    for hh in range(0, HPG):
        h = g * HPG + hh
        for it in range(a, i0):
            dk, dv = _dkdv_tile(k, v, dk, dv, Q, DO, LSE, DELTA, it, b, h, offs_n, offs_d, e, sqb, sqt, sqh,
                                T, H, qk_scale, WIN, D, BD, BM, True, PREC)
        for it in range(i0, i1):
            dk, dv = _dkdv_tile(k, v, dk, dv, Q, DO, LSE, DELTA, it, b, h, offs_n, offs_d, e, sqb, sqt, sqh,
                                T, H, qk_scale, WIN, D, BD, BM, False, PREC)
        for it in range(i1, z):
            dk, dv = _dkdv_tile(k, v, dk, dv, Q, DO, LSE, DELTA, it, b, h, offs_n, offs_d, e, sqb, sqt, sqh,
                                T, H, qk_scale, WIN, D, BD, BM, True, PREC)
    poff = sp * spart + b * spb + offs_n[:, None] * spt + g * sph + offs_d[None, :]
    kvmask = nmask[:, None] & (offs_d < D)[None, :]
    tl.store(DK + poff, (dk * scale).to(DK.dtype.element_ty), mask=kvmask)
    tl.store(DV + poff, dv.to(DV.dtype.element_ty), mask=kvmask)


def _prec(x: torch.Tensor) -> str:
    """Exact products for fp32/fp64 inputs (no TF32: the 1e-5 checks), tensor cores for 16-bit."""
    return "tf32" if x.dtype in (torch.float16, torch.bfloat16) else "ieee"


def _bd(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def dkdv_key_tile(d: int, capability: int) -> int:
    """Keys per program of the default dK/dV config at head dim ``d`` on a GPU of that
    ``capability`` (sizes the compressed branch's split, ``_cmp_split``)."""
    table = _table(DKDV_TILES, DKDV_TILES_SM90, capability)
    return table[min(t for t in table if t >= _bd(d))][0][1]


def band_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stride: int, off: int, win: int,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Output [B,T,H,D] and row LSE [B,H,T] (fp32, log2 units, +inf for rows that see no key)."""
    B, T, H, D = q.shape
    NK, G = k.shape[1], k.shape[2]
    o = poison.empty_like(q)
    lse = poison.empty(B, H, T, device=q.device, dtype=torch.float32)
    if T == 0:
        return o, lse
    launch(_band_fwd, lambda meta: (triton.cdiv(T, meta["BM"]), B * H),
           q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *o.stride()[:3],
           T, NK, H, H // G, scale * LOG2E, stride, off, win, D=D, BD=_bd(D), PREC=_prec(q))
    return o, lse


def band_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                  do: torch.Tensor, stride: int, off: int, win: int, scale: float,
                  nsplit: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of the band attention (deterministic: no atomics)."""
    B, T, H, D = q.shape
    NK, G = k.shape[1], k.shape[2]
    do = do.contiguous()
    dq = poison.empty_like(q)
    prec = _prec(q)
    if T > 0:
        delta = row_delta(o, do, heads_major=True)  # [B,H,T]
        launch(_band_bwd_dq, lambda meta: (triton.cdiv(T, meta["BM"]), B * H),
               q, k, v, do, lse, delta, dq, *q.stride()[:3], *k.stride()[:3],
               T, NK, H, H // G, scale * LOG2E, scale, stride, off, win, D=D, BD=_bd(D), PREC=prec)
    if NK == 0 or T == 0:
        return dq, torch.zeros_like(k), torch.zeros_like(v)
    if nsplit == 1:  # written in place, in k's dtype: no partials, no sum
        dk, dv = poison.empty_like(k), poison.empty_like(v)
        dks, dvs = dk, dv
        strides = (0, *dk.stride()[:3])
    else:  # every element of every split is written: empty, not zeros
        dks = poison.empty(nsplit, B, NK, G, D, device=q.device, dtype=torch.float32)
        dvs = poison.empty_like(dks)
        strides = dks.stride()[:4]
    launch(_band_bwd_dkdv, lambda meta: (triton.cdiv(NK, meta["BN"]) * B * G * nsplit,),
           q, k, v, do, lse, delta, dks, dvs, *q.stride()[:3], *k.stride()[:3], *strides,
           T, NK, H, H // G, scale * LOG2E, scale, stride, off, win, B * G, NSPLIT=nsplit,
           D=D, BD=_bd(D), PREC=prec)
    if nsplit == 1:
        return dq, dk, dv
    return dq, dks.sum(0).to(k.dtype), dvs.sum(0).to(v.dtype)
