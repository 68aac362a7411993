"""NSA decode attention: the three branches of one new query per sequence, in 3 launches (4 at most)
(``nsa_decode_branches``), their gated sum inside the last of them (``nsa_decode_gated``); at a
small batch all of it in one launch (``decode_fused.py``), from the same pieces.

``NSACache.step`` (nsa/infer/cache.py) computes, for the query of each sequence b at
position ``pos[b]``, the compressed branch (token i visible iff ``i*d + l - 1 <= pos``) and
its probabilities, the block scores (Eq. 10: summed over a KV group's heads; Eq. 9:
spread over the selection blocks by overlap / d), the top-n rule of
``nsa.ops.reference.select_blocks_at``, the selected branch (the chosen blocks' keys
``<= pos``) and the window branch (the ring's slots that hold a position ``>= 0``), in over
a hundred small torch ops per layer (bench/decode_kernel.py counts them). Here the same
maths runs in three kernels (four at most), each with one program per (split, sequence, KV group)
whose rows are the group's query heads, so every K/V row is loaded once for the whole group:

1. ``_decode_partials``: flash-decoding partials (running max, sum, unnormalised output)
   of the compressed keys and of the window ring, each cut into equal chunks of what
   ``pos`` makes visible;
2. ``_decode_scores``: the compressed branch's per-head log-sum-exp from those partials,
   each compressed token's probability summed over the group's heads (once per token, from
   contiguous key tiles, into a scratch row), then the scores of the program's share of
   the eligible selection blocks and their running top-n (topn.py's packed keys: forced
   blocks +inf, higher score first, ties to the lower block), stored as a candidate list;
   one more program per head merges ``o_cmp``'s partials, and one per head ``o_win``'s
   (at a large batch one program per branch merges all heads);
3. ``_decode_selected``: the candidate lists merged give the chosen blocks (the top n that
   beat -inf: the reference's choice, -1 for slots nothing fills); attention over its
   share of them; when split, the last program of the (sequence, group) to finish merges
   the shares into ``o_slc`` (or the gated sum) itself (``decode_flash.py``'s tickets);
4. ``_decode_combine`` (only when the selected branch is split more than
   ``MAX_FUSED_SLOTS`` ways): its partials -> ``o_slc``, one program per (sequence, head).

Each kernel is a thin shell over its role (``decode_roles.py``: ``_partial_share``,
``_score_share`` and ``_merge_branch``, ``_selected_share``), so that ``decode_fused.py``'s
one launch runs the same code: where the whole grid fits on half the GPU's SMs (``plan_splits``: nsa-125m at
batch 1 on an H100 or H200, a cache of up to about 75k tokens), its programs wait for each
other's counters instead of for the end of a launch, and a layer costs one launch instead
of three.

Why split at all: at batch 1 a 64k context has ~4k compressed tokens and 1024 selection
blocks per KV group, and one program per (sequence, group) would stream them through one
SM while the rest idle; the splits (``plan_splits``, from the batch, the groups and the
SM count) spread each phase over many programs, and the cross-program steps (the
log-sum-exp, the top-n, the softmax combine) are what costs the extra launches.

A block's score sums its overlapping compressed tokens one at a time in ascending token
order, exactly as the reference's ``index_add_`` does, so blocks whose contributions are
equal (a uniform compressed attention) tie exactly here as they do there, and the tie
goes to the lower block in both.

No host sync and no data-dependent shape: every bound that depends on ``pos`` is computed
inside the kernels, the grids depend on shapes only, so a decode step can be captured as
a CUDA graph. Scratch (the partials, the token sums, the candidate lists) is allocated per
call; inside a graph capture it comes from the graph's pool. The selected launch's merge
counters are the caller's (a cache's, zero between launches: ``decode_tickets``).

Under ``TRITON_INTERPRET=1`` the kernels run on CPU in fp32 (bf16 ``tl.dot`` is wrong in
the interpreter); fp32/fp16/bf16 inputs, not fp64.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

from nsa.ops import poison

from .band import LOG2E, _prec
from .decode_flash import (
    MAX_FUSED_SLOTS,
    PROGRAMS_PER_SM,
    _combine_row,
    _combine_rows,
    _decode_combine,
    _group_of_program,
    _last_to_finish,
    _store_gated,
    _store_out,
    _store_partial,
    check_tickets,
    merge_tile,
    row_merge_tile,
)
from .decode_fused import COUNTERS, _decode_fused
from .decode_roles import _merge_branch, _partial_share, _score_share, _selected_share
from .tuning import sm_count as _sm_count

# Keys per program below which splitting a branch further costs more (launch, partial
# stores, the combine) than it spreads. A design estimate, not a measurement.
MIN_CMP_KEYS = 128  # compressed tokens per chunk
MIN_WIN_KEYS = 128  # window slots per chunk
MIN_SCORE_BLOCKS = 32  # selection blocks scored per program
MIN_SEL_BLOCKS = 2  # selected blocks attended per program
# Scoring programs per (sequence, KV group) at most: their candidate lists are merged by a
# tree of constexpr depth (``_decode_selected``); past this each program scores more blocks.
MAX_SCORE_SPLITS = 64
# Compressed chunks per (sequence, KV group) at most. Every chunk's partial is read by each
# scoring program (the log-sum-exp) and by the output's merge; on an H200 at batch 1 and 64k
# (2026-11-28 sweep) a layer's decode attention took 30.7, 30.3, 33.6, 38.8 and 50.9 us with
# 8, 16, 31 (the plan without this cap), 62 and 124 chunks.
MAX_CMP_SPLITS = 16
# Blocks a scoring program scores and merges into its running top-n at once (its whole share
# up to this): a merge's cost is mostly its cross-warp reductions, a barrier each, the same for
# 16 candidates as for 64, while its compares ([64, 64] at most) stay a few per thread.
MAX_SCORE_TILE = 64
# Set to 0: never one launch (``DecodeSplits.one_launch``), the phases in their own launches.
ONE_LAUNCH_ENV = "NSA_DECODE_ONE_LAUNCH"


@dataclasses.dataclass(frozen=True)
class DecodeSplits:
    """Programs per (sequence, KV group) of each phase: compressed chunks, window chunks,
    scoring programs, selected-attention programs (> 1: a fourth launch combines them).
    ``head_merges``: the scores launch merges the compressed and window partials one
    program per head (a short chain of loads each, in parallel: what a small batch wants);
    False, one program per branch for all the group's heads (two per sequence and group,
    where a large batch's per-head merges were most of the launch's programs).
    ``one_launch``: every phase in one launch (``decode_fused.py``), its programs waiting on
    each other (the partials then always merged per branch); only where they all fit on the
    GPU at once (``plan_splits``)."""

    cmp: int = 1
    win: int = 1
    scores: int = 1
    selected: int = 1
    head_merges: bool = True
    one_launch: bool = False

    def __post_init__(self) -> None:
        if min(self.cmp, self.win, self.scores, self.selected) < 1:
            raise ValueError(f"every split must be >= 1, got {self}")
        if self.scores > MAX_SCORE_SPLITS:
            raise ValueError(f"at most {MAX_SCORE_SPLITS} scoring programs, got {self}")
        if self.one_launch and self.selected > MAX_FUSED_SLOTS:
            raise ValueError(f"one launch merges at most {MAX_FUSED_SLOTS} selected partials, got {self}")

    def programs(self) -> int:
        """Programs per (sequence, KV group) of the one launch: every phase's, and the two
        merges of the compressed and window partials."""
        return self.cmp + self.win + self.scores + self.selected + 2

    def fits_one_launch(self, pairs: int, sms: int) -> bool:
        """Whether one launch may run these splits for ``pairs`` (sequence, group) pairs on a GPU
        of ``sms`` SMs: its last selected program merges every selected partial, and all its
        programs fit on half the SMs (a waiting program holds its SM while it spins)."""
        return self.selected <= MAX_FUSED_SLOTS and pairs * self.programs() <= sms // 2


def plan_splits(batch: int, groups: int, n_cmp: int, window: int, n_blocks: int, num_selected: int,
                device: torch.device, *, heads_per_group: int) -> DecodeSplits:
    """Splits that give about ``PROGRAMS_PER_SM`` programs per SM in each phase, no program
    with less than the ``MIN_*`` keys (a capacity-sized bound: shapes only, no sync). No
    split off CUDA (the interpreter: fewer programs, faster tests) or once the batch's
    (sequence, group) pairs fill the GPU on their own. The partials' merges go per branch
    instead of per head once per-head merges alone would outnumber those programs per SM
    (each branch with at most ``MAX_FUSED_SLOTS`` partials: one program reads them all at once,
    as the selected launch's own merge does). All of it in one launch when that launch's
    programs fit on half the GPU's SMs (``decode_fused.py``: a small batch), unless
    ``NSA_DECODE_ONE_LAUNCH=0``."""
    sms = _sm_count(device)
    if sms == 0:
        return DecodeSplits()
    pairs = max(1, batch * groups)
    per = max(1, -(-PROGRAMS_PER_SM * sms // pairs))

    def cap(units: int, least: int) -> int:
        return max(1, min(per, units // least))

    cmp, win = min(MAX_CMP_SPLITS, cap(n_cmp, MIN_CMP_KEYS)), cap(window, MIN_WIN_KEYS)
    head_merges = 2 * heads_per_group * pairs <= PROGRAMS_PER_SM * sms or max(cmp, win) > MAX_FUSED_SLOTS
    sp = DecodeSplits(cmp=cmp, win=win, scores=min(MAX_SCORE_SPLITS, cap(n_blocks, MIN_SCORE_BLOCKS)),
                      selected=cap(num_selected, MIN_SEL_BLOCKS), head_merges=head_merges)
    if os.environ.get(ONE_LAUNCH_ENV, "1") != "0" and sp.fits_one_launch(pairs, sms):
        return dataclasses.replace(sp, one_launch=True)
    return sp


@triton.jit
def _decode_partials(Q, KC, VC, KW, VW, POS, PM, PL, PACC,
                     sqb, sqh, scb, sct, sch, swb, swt, swh,
                     G, HPG, NC, NW, qk_scale, STRIDE, BLK, SC, SW, SP,
                     R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr,
                     PREC: tl.constexpr):
    """Programs ``[0, SC + SW)``: ``_partial_share``."""
    bg, b, g, p = _group_of_program(POS, G)
    _partial_share(Q, KC, VC, KW, VW, PM, PL, PACC, bg, b, g, p, tl.program_id(1),
                   sqb, sqh, scb, sct, sch, swb, swt, swh, HPG, NC, NW, qk_scale, STRIDE, BLK, SC, SW, SP,
                   R, D, BD, BN, PREC)


@triton.jit
def _decode_scores(Q, KC, POS, PM, PL, PACC, OC, OW, CAND, PSUM,
                   sqb, sqh, scb, sct, sch, sob, soh,
                   G, HPG, NC, NS, qk_scale, STRIDE, BLK, SBLK, NI, NL, SC, SW, SP, SS, PCAP,
                   R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BJ: tl.constexpr, BT: tl.constexpr,
                   BN: tl.constexpr, M: tl.constexpr, CM: tl.constexpr, CA: tl.constexpr,
                   HEADS: tl.constexpr, PREC: tl.constexpr):
    """Programs ``[0, SS)``: ``_score_share``. Then the merges of the branches' partials into
    the compressed output ``OC`` and the window's ``OW``: with HEADS, one program per head of
    the group for each (CA partials a load); without, one program per branch for all the
    heads (``_merge_branch``, CA partials of every row a load)."""
    pid = tl.program_id(1)
    bg, b, g, p = _group_of_program(POS, G)
    offs_d = tl.arange(0, BD)
    if pid >= SS:
        if HEADS:
            h = (pid - SS) % HPG
            rr = h + tl.zeros([1], tl.int32)
            if pid - SS < HPG:
                m_o, l_o, acc_o = _combine_row(PM, PL, PACC, bg * SP, 0, SC, h, offs_d, R, BD, CA)
                _store_out(OC, acc_o, l_o, b, g, HPG, sob, soh, rr, rr < HPG, offs_d, D)
            else:
                m_o, l_o, acc_o = _combine_row(PM, PL, PACC, bg * SP, SC, SC + SW, h, offs_d, R, BD, CA)
                _store_out(OW, acc_o, l_o, b, g, HPG, sob, soh, rr, rr < HPG, offs_d, D)
        else:
            _merge_branch(PM, PL, PACC, OC, OW, bg, b, g, pid - SS, HPG, SC, SW, SP, sob, soh, R, D, BD, CA)
    else:
        _score_share(Q, KC, PM, PL, CAND, PSUM, bg, b, g, p, pid, sqb, sqh, scb, sct, sch,
                     HPG, NC, NS, qk_scale, STRIDE, BLK, SBLK, NI, NL, SC, SP, SS, PCAP,
                     R, D, BD, BJ, BT, BN, M, CM, PREC)


@triton.jit
def _decode_selected(Q, KS, VS, POS, CAND, IDX, PM, PL, PACC, OS, OC, OW, GATE, TICKETS,
                     sqb, sqh, ssb, sst, ssh, sib, sig, sob, soh, sgb,
                     G, HPG, S, NS, qk_scale, SBLK, NSEL, SS, SSEL, SP, SLOT0,
                     R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, LS: tl.constexpr,
                     NR: tl.constexpr, LOGN: tl.constexpr, SSP: tl.constexpr, FINAL: tl.constexpr,
                     GATED: tl.constexpr, FUSED: tl.constexpr, CS: tl.constexpr, PREC: tl.constexpr):
    """Program ``pid``'s share of the selected branch (``_selected_share``); the output itself
    when FINAL (one program: with GATED, the three branches' gated sum, ``_store_gated``),
    else a partial in slot ``SLOT0 + pid``, which with FUSED the last of the SSEL programs
    merges into the output."""
    pid = tl.program_id(1)
    bg, b, g, p = _group_of_program(POS, G)
    m_i, l_i, acc, r, offs_d, valid = _selected_share(
        Q, KS, VS, CAND, IDX, bg, b, g, p, pid, sqb, sqh, ssb, sst, ssh, sib, sig,
        HPG, S, NS, qk_scale, SBLK, NSEL, SS, SSEL, R, D, BD, LS, NR, LOGN, SSP, PREC)
    if FINAL:
        if GATED:
            _store_gated(OS, OC, OW, GATE, sgb, acc, l_i, b, g, HPG, sob, soh, r, valid, offs_d, D)
        else:
            _store_out(OS, acc, l_i, b, g, HPG, sob, soh, r, valid, offs_d, D)
    else:
        _store_partial(PM, PL, PACC, bg * SP + SLOT0 + pid, m_i, l_i, acc, r, offs_d, R, BD)
        if FUSED:
            if _last_to_finish(TICKETS, bg, SSEL):
                m_o, l_o, acc_o = _combine_rows(PM, PL, PACC, bg * SP, SLOT0, SLOT0 + SSEL, r, offs_d, R, BD,
                                                CS)
                if GATED:
                    _store_gated(OS, OC, OW, GATE, sgb, acc_o, l_o, b, g, HPG, sob, soh, r, valid, offs_d, D)
                else:
                    _store_out(OS, acc_o, l_o, b, g, HPG, sob, soh, r, valid, offs_d, D)


def _tokens_per_block(block: int, stride: int, select_block: int) -> int:
    """The most compressed tokens ``[i*d, i*d + l)`` that can overlap one selection block:
    the integers in an open interval of length ``(l' + l) / d``."""
    return -(-(select_block + block) // stride)


def nsa_decode_with_selection(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor,
                              k_slc: torch.Tensor, v_slc: torch.Tensor, k_win: torch.Tensor,
                              v_win: torch.Tensor, pos: torch.Tensor, block: int, stride: int,
                              select_block: int, num_selected: int, num_initial: int, num_local: int,
                              scale: float | None = None, splits: DecodeSplits | None = None,
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``nsa_decode_branches`` and the chosen blocks ``idx [B, G, n]`` (int64, ascending, -1
    after), the choice ``select_blocks_at`` makes on the cache's scores (tests, debugging)."""
    o_cmp, o_slc, o_win, idx = _decode(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, pos, block, stride,
                                       select_block, num_selected, num_initial, num_local, scale, splits)
    return o_cmp, o_slc, o_win, idx


def _gate_stride(logits: torch.Tensor, q: torch.Tensor) -> int:
    """Sequence stride of the gate logits ``[B, 1, H, 3]``, each sequence's ``H x 3`` contiguous
    (a slice of the step's joint projection is); ValueError otherwise."""
    B, _, H, _ = q.shape
    if logits.shape != (B, 1, H, 3) or logits.stride(3) != 1 or logits.stride(2) != 3:
        raise ValueError(f"gate logits of shape {tuple(logits.shape)} and strides {logits.stride()}: want "
                         f"[{B}, 1, {H}, 3] with each sequence's {H} x 3 contiguous")
    return logits.stride(0)


def _decode(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, k_slc: torch.Tensor,
            v_slc: torch.Tensor, k_win: torch.Tensor, v_win: torch.Tensor, pos: torch.Tensor, block: int,
            stride: int, select_block: int, num_selected: int, num_initial: int, num_local: int,
            scale: float | None, splits: DecodeSplits | None, gate_logits: torch.Tensor | None = None,
            tickets: torch.Tensor | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The launches: ``(o_cmp, o_slc, o_win, idx)``; with ``gate_logits`` the second is the
    three branches' gated sum (in ``o_cmp``'s dtype) instead of ``o_slc``. ``tickets``: the
    selected launch's merge counters (``decode_tickets(B * G)``)."""
    B, one, H, D = q.shape
    S, G = k_slc.shape[1], k_slc.shape[2]
    NC, NW = k_cmp.shape[1], k_win.shape[1]
    if one != 1:
        raise ValueError(f"one query per sequence, got q of shape {tuple(q.shape)}")
    if H % G or pos.shape != (B,):
        raise ValueError(f"{H} heads over {G} groups, pos {tuple(pos.shape)} for a batch of {B}")
    if q.dtype == torch.float64:
        raise TypeError("the decode kernels compute in fp32 / fp16 / bf16, not fp64")
    kvs = [k_cmp, v_cmp, k_slc, v_slc, k_win, v_win]
    for x in kvs:
        if x.shape[0] != B or x.shape[2:] != (G, D):
            raise ValueError(f"cache tensor of shape {tuple(x.shape)} for q {tuple(q.shape)}")
        if x.numel() >= 2**31:
            raise ValueError(f"cache tensor of shape {tuple(x.shape)} has >= 2**31 elements: the kernels "
                             "use 32-bit offsets; split the batch")
    kvs = [x.contiguous() for x in kvs]  # the cache's own tensors are: no copy
    k_cmp, v_cmp, k_slc, v_slc, k_win, v_win = kvs
    pos = pos.contiguous()
    out_dtype = q.dtype  # the step's o_slc / o_win dtype
    q = q.to(k_slc.dtype).contiguous()  # one tl.dot dtype; a [B, 1, H, D] copy at most
    hpg = H // G
    n_blocks = triton.cdiv(S, select_block)
    sp = splits if splits is not None else plan_splits(B, G, NC, NW, n_blocks, num_selected, q.device,
                                                       heads_per_group=hpg)
    qk_scale = (D**-0.5 if scale is None else float(scale)) * LOG2E
    R = max(16, triton.next_power_of_2(hpg))
    BD = max(16, triton.next_power_of_2(D))
    NR = max(16, triton.next_power_of_2(max(num_selected, 1)))
    slots = sp.cmp + sp.win + sp.selected
    dev = q.device
    pm = poison.empty(B * G, slots, R, device=dev, dtype=torch.float32)
    pl = poison.empty_like(pm)
    pacc = poison.empty(B * G, slots, R, BD, device=dev, dtype=torch.float32)
    cand = poison.empty(B * G, sp.scores, NR, device=dev, dtype=torch.int64)
    gated = gate_logits is not None
    sgb = _gate_stride(gate_logits, q) if gate_logits is not None else 0
    o_cmp = poison.empty(B, 1, H, D, device=dev, dtype=v_cmp.dtype)
    o_slc = poison.empty(B, 1, H, D, device=dev, dtype=v_cmp.dtype if gated else out_dtype)
    o_win = poison.empty(B, 1, H, D, device=dev, dtype=out_dtype)
    logits = gate_logits if gate_logits is not None else o_win  # unused pointer when not gated
    idx = poison.empty(B, G, num_selected, device=dev, dtype=torch.int64)
    if B == 0:
        return o_cmp, o_slc, o_win, idx
    prec = _prec(q)
    sq = (q.stride(0), q.stride(2))
    sc = (k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2))
    so = (o_slc.stride(0), o_slc.stride(2))
    warps = 4 if R * BD <= 64 * 64 else 8
    # the scoring programs' log-sum-exp: a branch's (max, sum) partials in [CM, R] loads (up to
    # 32 slots, or 512 floats)
    cm = min(32, max(1, 512 // R), triton.next_power_of_2(max(sp.cmp, sp.win, sp.selected)))
    ca = row_merge_tile(max(sp.cmp, sp.win, sp.selected), BD)  # the per-row merges' slots a load
    m_tok = _tokens_per_block(block, stride, select_block)
    # the scoring programs' scratch rows: the most tokens a program's share of blocks can reach
    share = triton.cdiv(triton.cdiv(n_blocks, NR), sp.scores) * NR
    pcap = -(-(share - 1) * select_block // stride) + m_tok + 1
    psum = poison.empty(B * G * sp.scores * pcap, device=dev, dtype=torch.float32)
    bt = min(max(MAX_SCORE_TILE, NR), triton.next_power_of_2(share))  # blocks a merge: the share, or 64
    # a per-branch merge's partials a load: [CA, R, BD] tiles of at most 2k floats, so that it
    # needs no more registers than the scoring programs (the launch's allocation is the larger:
    # nsa-125m at batch 64 on sm_90, 78 at 8k and 95 at 64k as with per-head merges; 4k: 85, 120)
    branch_tile = max(1, min(triton.next_power_of_2(max(sp.cmp, sp.win)), 2048 // (R * BD)))
    sel_consts = dict(LS=max(16, triton.next_power_of_2(select_block)), LOGN=NR.bit_length() - 1,
                      SSP=triton.next_power_of_2(sp.scores), FINAL=sp.selected == 1, GATED=gated,
                      CS=merge_tile(sp.selected, R, BD), PREC=prec)
    if sp.one_launch:
        sms = _sm_count(dev) if q.is_cuda else 0
        if sms and not sp.fits_one_launch(B * G, sms):  # its waiting programs could hold every SM
            raise ValueError(f"one launch of {B * G} x {sp.programs()} programs ({sp}) does not fit on half "
                             f"of this GPU's {sms} SMs: plan_splits' splits run it in several launches")
        cnt = check_tickets(tickets, COUNTERS * B * G, dev)
        _decode_fused[(B * G, sp.programs())](
            q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, pos, pm, pl, pacc, cand, psum, idx, o_slc, o_cmp,
            o_win, logits, cnt, *sq, *sc, *k_slc.stride()[:3], *k_win.stride()[:3], idx.stride(0),
            idx.stride(1), *so, sgb, G, B * G, hpg, NC, NW, S, n_blocks, qk_scale, stride, block,
            select_block, num_initial, num_local, num_selected, sp.cmp, sp.win, sp.scores, sp.selected, slots,
            pcap, R=R, D=D, BD=BD, BN=64, BJ=NR, BT=bt, M=m_tok, CM=cm,
            # its merges per branch read as many partials a load as the selected shares' merge
            CA=merge_tile(max(sp.cmp, sp.win), R, BD), **sel_consts,
            # the scoring programs' warps and registers (below): the roles share one allocation
            num_warps=4 if R * BD < 64 * 64 else 8, maxnreg=255)
        return o_cmp, o_slc, o_win, idx
    _decode_partials[(B * G, sp.cmp + sp.win)](
        q, k_cmp, v_cmp, k_win, v_win, pos, pm, pl, pacc, *sq, *sc, *k_win.stride()[:3],
        G, hpg, NC, NW, qk_scale, stride, block, sp.cmp, sp.win, slots,
        R=R, D=D, BD=BD, BN=64, PREC=prec, num_warps=warps)
    # after the scoring programs, the merges of o_cmp's and o_win's partials: one program per
    # head each, or (a large batch: per-head merges would be most of the launch's programs, more
    # than the SMs hold at once) one per branch for all heads. With the sequence on axis 0
    # every scoring program is handed out before any merge.
    merges = 2 * hpg if sp.head_merges else 2
    _decode_scores[(B * G, sp.scores + merges)](
        q, k_cmp, pos, pm, pl, pacc, o_cmp, o_win, cand, psum, *sq, *sc, *so,
        G, hpg, NC, n_blocks, qk_scale, stride, block, select_block, num_initial, num_local,
        sp.cmp, sp.win, slots, sp.scores, pcap,
        R=R, D=D, BD=BD, BJ=NR, BT=bt, BN=64, M=m_tok, CM=cm,
        CA=ca if sp.head_merges else branch_tile, HEADS=sp.head_merges,
        # its group's queries stay in registers through the block loop: 8 warps from 32 x 128
        # (on 4, Triton 3.6 spilled 8 B at D 128 with 32 heads per group on sm_80); maxnreg: ptxas
        # trimmed it to 168 registers (an occupancy step) with 8 B of spill when the partials are
        # merged 32 at a time (Triton 3.6); a decode launch has too few programs to need occupancy
        PREC=prec, num_warps=4 if R * BD < 64 * 64 else 8, maxnreg=255)
    final = sp.selected == 1
    # split a few ways, the selected launch merges its own partials (one launch fewer per layer)
    fused = not final and sp.selected <= MAX_FUSED_SLOTS
    tk = check_tickets(tickets, B * G, dev) if fused else pos  # an unused pointer otherwise
    _decode_selected[(B * G, sp.selected)](
        q, k_slc, v_slc, pos, cand, idx, pm, pl, pacc, o_slc, o_cmp, o_win, logits, tk, *sq,
        *k_slc.stride()[:3],
        idx.stride(0), idx.stride(1), *so, sgb,
        G, hpg, S, n_blocks, qk_scale, select_block, num_selected, sp.scores, sp.selected, slots,
        sp.cmp + sp.win,
        R=R, D=D, BD=BD, NR=NR, FUSED=fused, **sel_consts,
        # maxnreg: on sm_80 ptxas held the 8-warp variant (64 heads per group, D 128) to 128
        # registers and spilled 8 B once the gated store joined it (Triton 3.9); a decode
        # launch has too few programs to need the occupancy, as _decode_scores above
        num_warps=warps, maxnreg=255)
    if not final and not fused:
        _decode_combine[(B * G, hpg)](pm, pl, pacc, o_slc, o_cmp, o_win, logits, *so, sgb, G, hpg, slots,
                                      sp.cmp + sp.win, slots, R=R, D=D, BD=BD, CA=ca, GATED=gated,
                                      num_warps=4)
    return o_cmp, o_slc, o_win, idx


def nsa_decode_branches(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, k_slc: torch.Tensor,
                        v_slc: torch.Tensor, k_win: torch.Tensor, v_win: torch.Tensor, pos: torch.Tensor,
                        block: int, stride: int, select_block: int, num_selected: int, num_initial: int,
                        num_local: int, scale: float | None = None, splits: DecodeSplits | None = None,
                        tickets: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three branch outputs ``(o_cmp, o_slc, o_win)``, each ``[B, 1, H, D]``, that
    ``NSACache.step`` hands to ``NSAAttention.mix`` for ``q [B, 1, H, D]`` (rotated) at
    positions ``pos [B]``, over the cache's tensors once this step's keys are written:
    ``k_cmp, v_cmp [B, Nc, G, D]`` (rotated compressed tokens), ``k_slc, v_slc [B, S, G, D]``
    (S: the capacity, whole selection blocks), ``k_win, v_win [B, min(w, S), G, D]`` (the
    ring, position p in slot ``p % size``). ``o_cmp`` in ``v_cmp``'s dtype, the others in
    the caches'; fp32 accumulation. ``splits``: programs per phase (default
    ``plan_splits``). ``tickets``: zeroed counters the caller keeps across steps
    (``decode_tickets(B * G)``) for the selected launch's own merge; fresh ones when not
    given."""
    o_cmp, o_slc, o_win, _ = _decode(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, pos, block, stride,
                                     select_block, num_selected, num_initial, num_local, scale, splits,
                                     tickets=tickets)
    return o_cmp, o_slc, o_win


def nsa_decode_gated(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, k_slc: torch.Tensor,
                     v_slc: torch.Tensor, k_win: torch.Tensor, v_win: torch.Tensor, pos: torch.Tensor,
                     gate_logits: torch.Tensor, block: int, stride: int, select_block: int, num_selected: int,
                     num_initial: int, num_local: int, scale: float | None = None,
                     splits: DecodeSplits | None = None, tickets: torch.Tensor | None = None) -> torch.Tensor:
    """``gated_combine_logits(gate_logits, *nsa_decode_branches(...))`` with the gated sum
    inside the branches' last launch (one launch fewer per layer and token; the selected
    branch's output never rounded to the cache dtype): ``[B, 1, H, D]`` in ``v_cmp``'s dtype.
    ``gate_logits [B, 1, H, 3]``: each sequence's ``H x 3`` contiguous (the step's slice of
    its joint projection is). ``tickets``: as ``nsa_decode_branches``'."""
    _, o, _, _ = _decode(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, pos, block, stride, select_block,
                         num_selected, num_initial, num_local, scale, splits, gate_logits, tickets)
    return o
