"""Flash-decoding pieces that both decoders' kernels are built from: NSA's three branches
(``decode.py``) and dense attention (``decode_dense.py``), one new query per sequence.

A program serves one (sequence, KV group) and one part of its work (a split, or a role
such as a head's merge), its rows the group's query heads, so each K/V row is loaded once
for the group (GQA): ``_group_of_program`` and ``_group_queries`` read the (sequence,
group) from axis 0 of the grid, the part from axis 1; ``_flash_chunk`` runs the online
softmax over an equal chunk of the visible keys and ``_store_partial`` keeps its (max,
sum, unnormalised output). Merging partials: ``_combine_lse`` gives each row's
log-sum-exp (``[32, heads]`` loads), ``_combine_row`` one head's output (``[32, D]``
tiles, one pass), and ``_decode_combine`` is that merge as a launch, one program per
(sequence, head), writing the output or, gated, the three NSA branches' sum
(``_store_gated``). ``PROGRAMS_PER_SM`` is what both decoders' split plans aim at.

A split launch with few partials per (sequence, group) merges them itself, without that
second launch: each program stores its partial and takes a ticket (``_last_to_finish``, one
counter per (sequence, group) that the caller keeps zeroed: ``decode_tickets``), and the
last one merges every row (``_combine_rows``). It is the split-K "semaphore": the
program's threads meet at a barrier after their stores, one thread's acquire-release atomic
publishes them and sees the others', a barrier hands that on, and the merge reads the
partials from L2 (``.cg``), never from a stale L1 line. Past ``MAX_FUSED_SLOTS`` partials the
merge launch, one program per head, is faster: one program's chain of loads over hundreds
of partials was what cost 128 us per layer (``_combine_row``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .band import NEG

PROGRAMS_PER_SM = 2
# Partials per (sequence, group) up to which the last program of a split launch merges them
# (two loads of a [slots, heads, D] tile at most for nsa-125m); beyond, ``_decode_combine``.
MAX_FUSED_SLOTS = 16


def decode_tickets(n: int, device: torch.device) -> torch.Tensor:
    """Zeroed ticket counters for ``n`` (sequence, group) pairs: a cache allocates them once
    and passes them to every step (each launch leaves them zeroed again), so a CUDA graph
    holds no allocation and no memset for them."""
    return torch.zeros(max(1, n), dtype=torch.int32, device=device)


def check_tickets(tickets: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    """The caller's counters (int32, contiguous, at least ``n``, on ``device``), or fresh
    zeroed ones (one memset more per call) when it gives none."""
    if tickets is None:
        return decode_tickets(n, device)
    if (tickets.dtype != torch.int32 or tickets.dim() != 1 or tickets.numel() < n
            or tickets.device != device or not tickets.is_contiguous()):
        raise ValueError(f"tickets of dtype {tickets.dtype}, shape {tuple(tickets.shape)} on "
                         f"{tickets.device}: want a contiguous int32 vector of at least {n} on {device} "
                         "(decode_tickets)")
    return tickets


def row_merge_tile(slots: int, bd: int) -> int:
    """Partials ``_combine_row`` reads per load (its CA): up to 32, in ``[CA, bd]`` tiles of at
    most 4k floats."""
    return max(1, min(32, 4096 // bd, triton.next_power_of_2(slots)))


def merge_tile(slots: int, rows: int, bd: int) -> int:
    """Partials a fused merge reads per load: a ``[slots, rows, bd]`` fp32 tile of at most 8k
    floats beside an output of at most 1k (``rows x bd``: nsa-125m's 16 x 64), of 4k beside
    a larger one, whose accumulator shares the registers (Triton 3.6 spilled a [2, 32, 128]
    tile beside a [32, 128] output on 4 warps); at least one."""
    budget = 8192 if rows * bd <= 1024 else 4096
    return max(1, min(triton.next_power_of_2(slots), budget // (rows * bd)))


@triton.jit
def _group_of_program(POS, G):
    """Axis 0 of every decode grid is (sequence, KV group): ``bg``, ``b``, ``g`` and the
    sequence's position. Axis 1 is the program's part: the GPU hands out programs in the
    order of their linear index (axis 0 fastest), so every sequence's first part starts
    before any sequence's second. A launch whose parts differ in length puts the long ones
    first (the scoring programs before the per-head merges, the compressed chunks before
    the window's), and once its programs outnumber what the SMs hold at once, no sequence's
    long program waits behind the others' short ones."""
    bg = tl.program_id(0)
    b = bg // G
    g = bg % G
    return bg, b, g, tl.load(POS + b).to(tl.int32)


@triton.jit
def _group_queries(Q, b, g, sqb, sqh, HPG, R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """The new query of each of group ``g``'s heads, ``[R, BD]`` (rows past HPG and columns
    past D zero): GQA, one program serves the whole group."""
    r = tl.arange(0, R)
    offs_d = tl.arange(0, BD)
    q = tl.load(Q + b * sqb + (g * HPG + r)[:, None] * sqh + offs_d[None, :],
                mask=(r < HPG)[:, None] & (offs_d < D)[None, :], other=0.0)
    return r, offs_d, q


@triton.jit
def _flash(q, kbase, vbase, skt, lo, hi, m_i, l_i, acc, qk_scale, offs_d,
           D: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """Online softmax of the rows ``q`` over the key rows ``[lo, hi)`` (log2 units)."""
    for s0 in range(lo, hi, BN):
        offs_n = s0 + tl.arange(0, BN)
        m_i, l_i, acc = _online(q, kbase, vbase, skt, offs_n, offs_n < hi, m_i, l_i, acc, qk_scale, offs_d,
                                D, PREC)
    return m_i, l_i, acc


@triton.jit
def _flash_chunk(q, kbase, vbase, skt, n, part, parts, qk_scale, offs_d, R: tl.constexpr, D: tl.constexpr,
                 BD: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """Chunk ``part`` of ``parts`` equal BN-aligned chunks of the key rows ``[0, n)``, from a
    fresh running softmax: its (max, sum, unnormalised output), a flash-decoding partial."""
    per = tl.cdiv(tl.cdiv(n, BN), parts) * BN
    lo = tl.minimum(part * per, n)
    hi = tl.minimum(lo + per, n)
    m_i = tl.full([R], NEG, tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BD], tl.float32)
    return _flash(q, kbase, vbase, skt, lo, hi, m_i, l_i, acc, qk_scale, offs_d, D, BN, PREC)


@triton.jit
def _online(q, kbase, vbase, skt, offs_n, nmask, m_i, l_i, acc, qk_scale, offs_d,
            D: tl.constexpr, PREC: tl.constexpr):
    """One tile of keys ``offs_n`` (``nmask``: those that count) into the running softmax
    (max ``m_i``, sum ``l_i``, unnormalised output ``acc``; log2 units)."""
    dmask = offs_d < D
    kt = tl.load(kbase + offs_n[None, :] * skt + offs_d[:, None], mask=nmask[None, :] & dmask[:, None],
                 other=0.0)
    s = tl.where(nmask[None, :], tl.dot(q, kt, input_precision=PREC) * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(vbase + offs_n[:, None] * skt + offs_d[None, :], mask=nmask[:, None] & dmask[None, :],
                other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _store_partial(PM, PL, PACC, slot, m_i, l_i, acc, r, offs_d, R: tl.constexpr, BD: tl.constexpr):
    """One partial (max, sum, unnormalised output) into its slot of the workspace."""
    row = slot * R + r
    tl.store(PM + row, m_i)
    tl.store(PL + row, l_i)
    tl.store(PACC + row[:, None] * BD + offs_d[None, :], acc)


@triton.jit
def _combine_lse(PM, PL, base, c0, c1, r, R: tl.constexpr, CM: tl.constexpr):
    """Slots ``base + [c0, c1)`` of the partials' (max, sum) merged per row: what each scoring
    program needs of the compressed branch (its log-sum-exp). The slots are read CM at a
    time, not one by one: a chain of dependent loads, one per slot, was what made this step
    grow with the number of splits. Written by other programs: read from L2 (``.cg``)."""
    cm = tl.arange(0, CM)
    m_i = tl.full([R], NEG, tl.float32)
    for c in range(c0, c1, CM):
        ok = (c + cm < c1)[:, None]
        rows = (base + c + cm)[:, None] * R + r[None, :]  # [CM, R]
        m_i = tl.maximum(m_i, tl.max(tl.load(PM + rows, mask=ok, other=NEG, cache_modifier=".cg"), 0))
    l_i = tl.zeros([R], tl.float32)
    for c in range(c0, c1, CM):
        ok = (c + cm < c1)[:, None]
        rows = (base + c + cm)[:, None] * R + r[None, :]
        pm = tl.load(PM + rows, mask=ok, other=NEG, cache_modifier=".cg")
        beta = tl.where(ok, tl.exp2(pm - m_i[None, :]), 0.0)
        l_i += tl.sum(tl.load(PL + rows, mask=ok, other=0.0, cache_modifier=".cg") * beta, 0)
    return m_i, l_i


@triton.jit
def _combine_row(PM, PL, PACC, base, c0, c1, h, offs_d, R: tl.constexpr, BD: tl.constexpr,
                 CA: tl.constexpr):
    """Slots ``base + [c0, c1)`` of row ``h``'s partials merged in one pass, CA slots per load:
    its (max ``[1]``, sum ``[1]``, unnormalised output ``[1, BD]``). One program per row: a
    program merging all R rows at once held ``[slots, R, BD]`` tiles of two slots, and at
    batch 1 its chain of loads over a long context's hundreds of partials took 128 us of an
    H200 per layer."""
    ca = tl.arange(0, CA)
    m_i = tl.full([1], NEG, tl.float32)
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([1, BD], tl.float32)
    for c in range(c0, c1, CA):
        ok = c + ca < c1
        rows = (base + c + ca) * R + h
        pm = tl.load(PM + rows, mask=ok, other=NEG)
        m_new = tl.maximum(m_i, tl.max(pm, 0))
        alpha = tl.exp2(m_i - m_new)
        beta = tl.where(ok, tl.exp2(pm - m_new), 0.0)
        l_i = l_i * alpha + tl.sum(tl.load(PL + rows, mask=ok, other=0.0) * beta, 0)
        part = tl.load(PACC + rows[:, None] * BD + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.sum(part * beta[:, None], 0)[None, :]
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _last_to_finish(TICKETS, bg, N):
    """True in the last of the N programs of (sequence, group) ``bg`` to get here, each after
    storing its partial; that one also zeroes the counter for the next launch. The barrier
    orders every thread's stores before the ticket; Triton issues the atomic from one thread
    (acquire-release, GPU scope) and hands its result on through a barrier of its own."""
    tl.debug_barrier()
    ticket = tl.atomic_add(TICKETS + bg, 1, sem="acq_rel", scope="gpu")
    last = ticket == N - 1
    if last:
        tl.store(TICKETS + bg, 0)
    return last


@triton.jit
def _publish(COUNTER):
    """One more of what ``COUNTER`` counts is stored: the barrier orders every thread's stores
    before the count, which one thread adds with release semantics at GPU scope."""
    tl.debug_barrier()
    tl.atomic_add(COUNTER, 1, sem="release", scope="gpu")


@triton.jit
def _wait_for(COUNTER, n):
    """Spin until ``COUNTER`` reaches ``n`` (acquire at GPU scope: what the publishers stored
    is then visible; a barrier hands that on to every thread). Only for a launch whose
    programs are all on the GPU at once, or whose publishers come first in the
    interpreter's order: a waiting program holds its SM."""
    seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
    while seen < n:
        seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _combine_rows(PM, PL, PACC, base, c0, c1, r, offs_d, R: tl.constexpr, BD: tl.constexpr,
                  CS: tl.constexpr):
    """Slots ``base + [c0, c1)`` merged for every row at once, CS slots per load: (max ``[R]``,
    sum ``[R]``, unnormalised output ``[R, BD]``). For the program that ``_last_to_finish``
    chose, and NSA's per-branch merges at a large batch: the partials were written by other
    programs (of this launch, or the one before), so they are read from L2 (``.cg``)."""
    cs = tl.arange(0, CS)
    m_i = tl.full([R], NEG, tl.float32)
    l_i = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BD], tl.float32)
    for c in range(c0, c1, CS):
        ok = (c + cs < c1)[:, None]
        rows = (base + c + cs)[:, None] * R + r[None, :]  # [CS, R]
        pm = tl.load(PM + rows, mask=ok, other=NEG, cache_modifier=".cg")
        m_new = tl.maximum(m_i, tl.max(pm, 0))
        alpha = tl.exp2(m_i - m_new)
        beta = tl.where(ok, tl.exp2(pm - m_new[None, :]), 0.0)
        l_i = l_i * alpha + tl.sum(tl.load(PL + rows, mask=ok, other=0.0, cache_modifier=".cg") * beta, 0)
        part = tl.load(PACC + rows[:, :, None] * BD + offs_d[None, None, :], mask=ok[:, :, None], other=0.0,
                       cache_modifier=".cg")
        acc = acc * alpha[:, None] + tl.sum(part * beta[:, :, None], 0)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _store_out(OUT, acc, l_i, b, g, HPG, sob, soh, r, valid, offs_d, D: tl.constexpr):
    """``acc / l`` (0 for a row that saw no key) into ``OUT [B, 1, H, D]``."""
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(OUT + b * sob + (g * HPG + r)[:, None] * soh + offs_d[None, :], out.to(OUT.dtype.element_ty),
             mask=valid[:, None] & (offs_d < D)[None, :])


@triton.jit
def _store_gated(OUT, OC, OW, GATE, sgb, acc, l_i, b, g, HPG, sob, soh, r, valid, offs_d, D: tl.constexpr):
    """The selected branch's rows (``acc / l``) gated with the compressed and window outputs
    (already in ``OC`` and ``OW``, same layout as ``OUT``) by the sigmoid of the gate logits
    ``GATE [B, 1, H, 3]`` (a sequence's ``H x 3`` contiguous, sequences ``sgb`` apart), fp32
    inside: ``gated_combine_logits`` of the three branches, written to ``OUT``. The two outputs
    were written by other programs: read from L2 (``.cg``)."""
    o_slc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    heads = g * HPG + r
    m = valid[:, None] & (offs_d < D)[None, :]
    off = b * sob + heads[:, None] * soh + offs_d[None, :]
    gate = GATE + b * sgb + heads * 3
    g0 = tl.sigmoid(tl.load(gate, mask=valid, other=0.0).to(tl.float32))
    g1 = tl.sigmoid(tl.load(gate + 1, mask=valid, other=0.0).to(tl.float32))
    g2 = tl.sigmoid(tl.load(gate + 2, mask=valid, other=0.0).to(tl.float32))
    o_cmp = tl.load(OC + off, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    o_win = tl.load(OW + off, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    out = g0[:, None] * o_cmp + g1[:, None] * o_slc + g2[:, None] * o_win
    tl.store(OUT + off, out.to(OUT.dtype.element_ty), mask=m)


@triton.jit
def _decode_combine(PM, PL, PACC, OUT, OC, OW, GATE, sob, soh, sgb, G, HPG, SP, C0, C1,
                    R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, CA: tl.constexpr,
                    GATED: tl.constexpr):
    """Slots ``[C0, C1)`` of a (sequence, group)'s partials -> head ``program_id(1)``'s row of
    ``OUT`` (with GATED: gated with the other two branches, ``_store_gated``)."""
    bg = tl.program_id(0)
    h = tl.program_id(1)
    b = bg // G
    g = bg % G
    r = h + tl.zeros([1], tl.int32)
    offs_d = tl.arange(0, BD)
    m_i, l_i, acc = _combine_row(PM, PL, PACC, bg * SP, C0, C1, h, offs_d, R, BD, CA)
    if GATED:
        _store_gated(OUT, OC, OW, GATE, sgb, acc, l_i, b, g, HPG, sob, soh, r, r < HPG, offs_d, D)
    else:
        _store_out(OUT, acc, l_i, b, g, HPG, sob, soh, r, r < HPG, offs_d, D)
