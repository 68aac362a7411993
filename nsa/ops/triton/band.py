"""Flash-style attention with a "band" mask: sliding window and compressed attention.

Both branches are one kernel family. Key ``s`` has an *end position*
``e(s) = s * STRIDE + OFF`` (the last token it summarises) and query ``t`` sees it iff

    e(s) <= t   and   t - e(s) < WIN

- sliding window: STRIDE = 1, OFF = 0, WIN = window (keys ``t - window < s <= t``);
- compressed attention: STRIDE = d, OFF = l - 1, WIN = T + 1 (no lower bound): query t
  sees compressed token i iff ``i*d + l - 1 <= t`` (ops contract).

Each program computes the key range its query tile can see and loops only over those
key tiles (so the window kernel skips everything outside the band). Forward stores the
row log-sum-exp; backward is FlashAttention-2 style in two kernels, both without atomics:
``dq`` (one program per query tile and head) and ``dk/dv`` (one program per key tile and
KV group, looping over the group's heads and the query tiles that can see the key tile;
optionally split over NSPLIT programs that write fp32 partials summed afterwards, which
keeps it deterministic while giving the short compressed key axis enough programs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Finite "minus infinity" for the running max: keeps exp(m_old - m_new) NaN-free. A
# tl.constexpr object: the compiler rejects plain module globals read in @triton.jit code
# (the interpreter does not), see bench/compile_check.py.
NEG = tl.constexpr(-1.0e30)


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
def _band_fwd(Q, K, V, OUT, LSE,
              sqb, sqt, sqh, skb, skt, skh, sob, sot, soh,
              T, NK, H, HPG, scale, STRIDE, OFF, WIN,
              D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    g = h // HPG
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    q = tl.load(Q + b * sqb + offs_m[:, None] * sqt + h * sqh + offs_d[None, :],
                mask=(offs_m[:, None] < T) & dmask[None, :], other=0.0)
    t0 = pid_m * BM
    lo, hi = _key_range(t0, tl.minimum(T, t0 + BM), NK, STRIDE, OFF, WIN)
    lo = (lo // BN) * BN
    m_i = tl.full([BM], NEG, tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    kbase = K + b * skb + g * skh
    vbase = V + b * skb + g * skh
    for s0 in range(lo, hi, BN):
        offs_n = s0 + tl.arange(0, BN)
        nmask = offs_n < NK
        kt = tl.load(kbase + offs_n[None, :] * skt + offs_d[:, None],
                     mask=nmask[None, :] & dmask[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision=PREC) * scale
        e = offs_n * STRIDE + OFF
        vis = (e[None, :] <= offs_m[:, None]) & (offs_m[:, None] - e[None, :] < WIN) & nmask[None, :]
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vbase + offs_n[:, None] * skt + offs_d[None, :],
                    mask=nmask[:, None] & dmask[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("inf"))
    tl.store(OUT + b * sob + offs_m[:, None] * sot + h * soh + offs_d[None, :],
             out.to(OUT.dtype.element_ty), mask=(offs_m[:, None] < T) & dmask[None, :])
    tl.store(LSE + pid_bh * T + offs_m, lse, mask=offs_m < T)


@triton.jit
def _band_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                 sqb, sqt, sqh, skb, skt, skh,
                 T, NK, H, HPG, scale, STRIDE, OFF, WIN,
                 D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    g = h // HPG
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    qmask = (offs_m[:, None] < T) & dmask[None, :]
    qoff = b * sqb + offs_m[:, None] * sqt + h * sqh + offs_d[None, :]
    q = tl.load(Q + qoff, mask=qmask, other=0.0)
    do = tl.load(DO + qoff, mask=qmask, other=0.0)
    lse = tl.load(LSE + pid_bh * T + offs_m, mask=offs_m < T, other=float("inf"))
    delta = tl.load(DELTA + pid_bh * T + offs_m, mask=offs_m < T, other=0.0)
    t0 = pid_m * BM
    lo, hi = _key_range(t0, tl.minimum(T, t0 + BM), NK, STRIDE, OFF, WIN)
    lo = (lo // BN) * BN
    dq = tl.zeros([BM, BD], tl.float32)
    kbase = K + b * skb + g * skh
    vbase = V + b * skb + g * skh
    for s0 in range(lo, hi, BN):
        offs_n = s0 + tl.arange(0, BN)
        nmask = offs_n < NK
        kt = tl.load(kbase + offs_n[None, :] * skt + offs_d[:, None],
                     mask=nmask[None, :] & dmask[:, None], other=0.0)
        vt = tl.load(vbase + offs_n[None, :] * skt + offs_d[:, None],
                     mask=nmask[None, :] & dmask[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision=PREC) * scale
        e = offs_n * STRIDE + OFF
        vis = (e[None, :] <= offs_m[:, None]) & (offs_m[:, None] - e[None, :] < WIN) & nmask[None, :]
        p = tl.exp(tl.where(vis, s - lse[:, None], float("-inf")))
        dp = tl.dot(do, vt, input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PREC)
    tl.store(DQ + qoff, (dq * scale).to(DQ.dtype.element_ty), mask=qmask)


@triton.jit
def _band_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DKP, DVP,
                   sqb, sqt, sqh, skb, skt, skh, spart, spb, spt, sph,
                   T, NK, H, HPG, scale, STRIDE, OFF, WIN,
                   NSPLIT: tl.constexpr,
                   D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   PREC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_bg = tl.program_id(1)
    sp = tl.program_id(2)
    G = H // HPG
    b = pid_bg // G
    g = pid_bg % G
    offs_n = pid_n * BN + tl.arange(0, BN)
    nmask = offs_n < NK
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    kvmask = nmask[:, None] & dmask[None, :]
    kvoff = b * skb + offs_n[:, None] * skt + g * skh + offs_d[None, :]
    k = tl.load(K + kvoff, mask=kvmask, other=0.0)
    v = tl.load(V + kvoff, mask=kvmask, other=0.0)
    e = offs_n * STRIDE + OFF
    s_last = tl.minimum(pid_n * BN + BN, NK) - 1
    t_lo = pid_n * BN * STRIDE + OFF
    t_hi = tl.minimum(T, s_last * STRIDE + OFF + WIN)
    first = t_lo // BM
    n_tiles = tl.cdiv(t_hi, BM)
    dk = tl.zeros([BN, BD], tl.float32)
    dv = tl.zeros([BN, BD], tl.float32)
    for hh in range(0, HPG):
        h = g * HPG + hh
        for it in range(first + sp, n_tiles, NSPLIT):
            offs_m = it * BM + tl.arange(0, BM)
            mmask = offs_m < T
            qoff = b * sqb + offs_m[None, :] * sqt + h * sqh + offs_d[:, None]
            qt = tl.load(Q + qoff, mask=mmask[None, :] & dmask[:, None], other=0.0)
            dot_ = tl.load(DO + qoff, mask=mmask[None, :] & dmask[:, None], other=0.0)
            lse = tl.load(LSE + (b * H + h) * T + offs_m, mask=mmask, other=float("inf"))
            delta = tl.load(DELTA + (b * H + h) * T + offs_m, mask=mmask, other=0.0)
            st = tl.dot(k, qt, input_precision=PREC) * scale
            vis = (e[:, None] <= offs_m[None, :]) & (offs_m[None, :] - e[:, None] < WIN) & mmask[None, :]
            pt = tl.exp(tl.where(vis, st - lse[None, :], float("-inf")))
            dv += tl.dot(pt.to(dot_.dtype), tl.trans(dot_), input_precision=PREC)
            dpt = tl.dot(v, dot_, input_precision=PREC)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(qt.dtype), tl.trans(qt), input_precision=PREC)
    poff = sp * spart + b * spb + offs_n[:, None] * spt + g * sph + offs_d[None, :]
    tl.store(DKP + poff, dk * scale, mask=kvmask)
    tl.store(DVP + poff, dv, mask=kvmask)


def _prec(x: torch.Tensor) -> str:
    """Exact products for fp32/fp64 inputs (no TF32: the 1e-5 checks), tensor cores for 16-bit."""
    return "tf32" if x.dtype in (torch.float16, torch.bfloat16) else "ieee"


def _blocks(d: int) -> tuple[int, int, int]:
    """Forward tiles (BD, BM query rows, BN keys), 4 warps."""
    bd = max(16, triton.next_power_of_2(d))
    return bd, 64 if bd <= 64 else 32, 64 if bd <= 64 else 32


# Backward tiles: 64 query rows x 32 keys for every head dim, 8 warps (dq: one program per
# 64 queries stepping over 32 keys; dK/dV: one program per 32 keys stepping over 64
# queries). The forward's 64 x 64 on 4 warps spilled in both backward kernels on sm_80 at
# D = 64 (bench/compile_check.py; docs/kernels.md has the table).
BWD_BM, BWD_BN, BWD_WARPS = 64, 32, 8


def band_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stride: int, off: int, win: int,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Output [B,T,H,D] and row LSE [B,H,T] (fp32, +inf for rows that see no key)."""
    B, T, H, D = q.shape
    NK, G = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, device=q.device, dtype=torch.float32)
    if T == 0:
        return o, lse
    bd, bm, bn = _blocks(D)
    grid = (triton.cdiv(T, bm), B * H)
    _band_fwd[grid](q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *o.stride()[:3],
                    T, NK, H, H // G, scale, stride, off, win,
                    D=D, BD=bd, BM=bm, BN=bn, PREC=_prec(q))
    return o, lse


def band_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                  do: torch.Tensor, stride: int, off: int, win: int, scale: float,
                  nsplit: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of the band attention (deterministic: no atomics)."""
    B, T, H, D = q.shape
    NK, G = k.shape[1], k.shape[2]
    do = do.contiguous()
    delta = (do.float() * o.float()).sum(-1).permute(0, 2, 1).contiguous()  # [B,H,T]
    dq = torch.empty_like(q)
    bd, bm, bn = _blocks(D)[0], BWD_BM, BWD_BN
    prec = _prec(q)
    if T > 0:
        _band_bwd_dq[(triton.cdiv(T, bm), B * H)](
            q, k, v, do, lse, delta, dq, *q.stride()[:3], *k.stride()[:3],
            T, NK, H, H // G, scale, stride, off, win, D=D, BD=bd, BM=bm, BN=bn, PREC=prec,
            num_warps=BWD_WARPS)
    dkp = torch.zeros(nsplit, B, NK, G, D, device=q.device, dtype=torch.float32)
    dvp = torch.zeros_like(dkp)
    if NK > 0 and T > 0:
        _band_bwd_dkdv[(triton.cdiv(NK, bn), B * G, nsplit)](
            q, k, v, do, lse, delta, dkp, dvp, *q.stride()[:3], *k.stride()[:3], *dkp.stride()[:4],
            T, NK, H, H // G, scale, stride, off, win, NSPLIT=nsplit,
            D=D, BD=bd, BM=bm, BN=bn, PREC=prec, num_warps=BWD_WARPS)
    return dq, dkp.sum(0).to(k.dtype), dvp.sum(0).to(v.dtype)
