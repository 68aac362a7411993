"""NSA decode attention in one launch per layer: ``decode.py``'s phases as roles of one grid
(``decode_roles.py``), whose programs wait for each other instead of for the end of a launch.

At batch 1 a decode step replayed from a CUDA graph is a chain of small launches, and each
boundary costs a launch's latency plus the drain of the one before: on an H200 (2026-11-28)
nsa-125m's three decode launches took 14 us a layer at 8k where dense's one took 5.5, the
gap that kept NSA's step behind dense's. Here the programs of one (sequence, KV group)
are, on axis 1 of one grid:

- ``[0, SC + SW)``: the compressed and window partials (``_partial_share``), each counted
  when stored (``_publish``);
- the next SS: the scoring programs (``_score_share``), once every partial of their
  (sequence, group) is in (``_wait_for``): their candidate lists, counted in turn;
- the next 2: the compressed and window partials merged for all heads (``_merge_branch``);
- the last SSEL: the selected shares (``_selected_share``), once every candidate list is in;
  the last of them to finish merges the shares (``_last_to_finish``) and, once both merges
  are counted, writes the output (or the gated sum) and zeroes the counters for the next
  launch: every program that waits on them has passed its wait by then.

A program waits only for programs before it on axis 1, which come first in the
interpreter's order (it runs programs one after the other). On a GPU a waiting program holds
its SM, so the launch must fit on the GPU at once: ``plan_splits`` asks for one launch only
when the grid is at most half the SMs (one program per SM always fits; the half leaves room
for a GPU shared with another process). The counters are the caller's (``COUNTERS`` per
(sequence, group), zero between launches), as the selected launch's tickets are.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .decode_flash import (
    _combine_rows,
    _group_of_program,
    _last_to_finish,
    _publish,
    _store_gated,
    _store_out,
    _store_partial,
    _wait_for,
)
from .decode_roles import _merge_branch, _partial_share, _score_share, _selected_share

# Counters per (sequence, group): partials stored, candidate lists stored, selected shares
# stored (their tickets), branches merged.
COUNTERS = 4


@triton.jit
def _decode_fused(Q, KC, VC, KS, VS, KW, VW, POS, PM, PL, PACC, CAND, PSUM, IDX, OS, OC, OW, GATE, CNT,
                  sqb, sqh, scb, sct, sch, ssb, sst, ssh, swb, swt, swh, sib, sig, sob, soh, sgb,
                  G, NBG, HPG, NC, NW, S, NS, qk_scale, STRIDE, BLK, SBLK, NI, NL, NSEL,
                  SC, SW, SS, SSEL, SP, PCAP,
                  R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, BJ: tl.constexpr,
                  BT: tl.constexpr, M: tl.constexpr, CM: tl.constexpr, CA: tl.constexpr, CS: tl.constexpr,
                  LS: tl.constexpr, LOGN: tl.constexpr, SSP: tl.constexpr, FINAL: tl.constexpr,
                  GATED: tl.constexpr, PREC: tl.constexpr):
    """Every phase of ``decode._decode``'s launches for the (sequence, group) on axis 0, by
    the part on axis 1 (the module docstring); ``CNT``: ``COUNTERS`` rows of NBG counters."""
    pid = tl.program_id(1)
    bg, b, g, p = _group_of_program(POS, G)
    parts = CNT + bg
    lists = CNT + NBG + bg
    merged = CNT + 3 * NBG + bg
    scores0 = SC + SW
    merges0 = scores0 + SS
    sel0 = merges0 + 2
    if pid < scores0:
        _partial_share(Q, KC, VC, KW, VW, PM, PL, PACC, bg, b, g, p, pid,
                       sqb, sqh, scb, sct, sch, swb, swt, swh, HPG, NC, NW, qk_scale, STRIDE, BLK, SC, SW, SP,
                       R, D, BD, BN, PREC)
        _publish(parts)
    elif pid < merges0:
        _wait_for(parts, SC + SW)
        _score_share(Q, KC, PM, PL, CAND, PSUM, bg, b, g, p, pid - scores0, sqb, sqh, scb, sct, sch,
                     HPG, NC, NS, qk_scale, STRIDE, BLK, SBLK, NI, NL, SC, SP, SS, PCAP,
                     R, D, BD, BJ, BT, BN, M, CM, PREC)
        _publish(lists)
    elif pid < sel0:
        _wait_for(parts, SC + SW)
        _merge_branch(PM, PL, PACC, OC, OW, bg, b, g, pid - merges0, HPG, SC, SW, SP, sob, soh, R, D, BD, CA)
        _publish(merged)
    else:
        share = pid - sel0
        _wait_for(lists, SS)
        m_i, l_i, acc, r, offs_d, valid = _selected_share(
            Q, KS, VS, CAND, IDX, bg, b, g, p, share, sqb, sqh, ssb, sst, ssh, sib, sig,
            HPG, S, NS, qk_scale, SBLK, NSEL, SS, SSEL, R, D, BD, LS, BJ, LOGN, SSP, PREC)
        last = True
        if not FINAL:  # a share of several: the last to finish merges them
            slot0 = SC + SW
            _store_partial(PM, PL, PACC, bg * SP + slot0 + share, m_i, l_i, acc, r, offs_d, R, BD)
            last = _last_to_finish(CNT + 2 * NBG, bg, SSEL)
            if last:
                m_i, l_i, acc = _combine_rows(PM, PL, PACC, bg * SP, slot0, slot0 + SSEL, r, offs_d, R, BD,
                                              CS)
        if last:
            _wait_for(merged, 2)
            if GATED:
                _store_gated(OS, OC, OW, GATE, sgb, acc, l_i, b, g, HPG, sob, soh, r, valid, offs_d, D)
            else:
                _store_out(OS, acc, l_i, b, g, HPG, sob, soh, r, valid, offs_d, D)
            tl.store(parts, 0)
            tl.store(lists, 0)
            tl.store(merged, 0)

