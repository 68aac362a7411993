"""``bench.sass``: loops and hot loops of a kernel's SASS listing, and the issue bound.

The listing below has the shape of ``nvdisasm -c`` output (addresses in comments, labels on
lines of their own, predicated instructions): an outer loop around an inner one that holds
the MMA instructions, a loop without MMA, and a forward branch. Compiling real kernels and
reading their SASS is ``tests/test_bench_roofline.py``'s ``--sass`` test.
"""

from __future__ import annotations

import pytest

from bench import sass

LISTING = """
        .text._kernel:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0020*/                   IMAD R4, R2, R3, RZ ;
        /*0030*/                   ISETP.GE.AND P0, PT, R4, R5, PT ;
        /*0040*/               @P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0050*/                   LDG.E.128 R8, desc[UR4][R6.64] ;
        /*0060*/                   WARPGROUP.ARRIVE ;
        /*0070*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
        /*0080*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0090*/                   MUFU.EX2 R10, R10 ;
        /*00a0*/                   SHFL.BFLY PT, R11, R10, 0x1, 0x1f ;
        /*00b0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00c0*/              @!P1 BRA `(.L_x_2) ;
.L_x_1:
        /*00d0*/                   FADD R12, R12, R11 ;
        /*00e0*/                   SHFL.IDX PT, R13, R12, 0x2, 0x1f ;
        /*00f0*/               @P2 BRA `(.L_x_0) ;
.L_x_3:
        /*0100*/                   STG.E desc[UR4][R6.64], R12 ;
        /*0110*/                   IADD3 R6, R6, 0x4, RZ ;
        /*0120*/               @P3 BRA `(.L_x_3) ;
        /*0130*/                   EXIT ;
"""


def test_loops_are_backward_branches_and_the_hot_loop_is_the_innermost_with_mma() -> None:
    found = sass.loops(LISTING)
    assert [(lp.start, lp.end, lp.instructions) for lp in found] == [
        (0x20, 0xF0, 14), (0x50, 0xC0, 8), (0x100, 0x120, 3)]
    outer, inner, store = found
    assert outer.contains(inner) and not inner.contains(outer) and not outer.contains(store)
    assert inner.mma_flops == 2 * (2 * 64 * 64 * 16) and inner.warp_group_mma
    assert (inner.count("mma"), inner.count("mufu"), inner.count("shfl"), inner.count("bar"),
            inner.count("global")) == (2, 1, 1, 1, 1)
    assert sass.hot_loops(found) == [inner]  # the outer loop holds MMA only through the inner one
    assert sass.mnemonic("@!P1 BRA `(.L_x_2)") == "BRA"


def test_summary_counts_warp_groups_and_the_issue_bound_follows() -> None:
    hot = sass.summarise(sass.loops(LISTING), warps=8)
    assert hot is not None
    assert (hot.loops, hot.instructions, hot.outer, hot.most) == (1, 8, 6, 8)
    # 8 warps are two warp groups, each doing the iteration's two HGMMAs on its own rows
    flops_per_iteration = 2 * 2 * (2 * 64 * 64 * 16)
    assert hot.warp_instructions_per_flop == pytest.approx(8 * 8 / flops_per_iteration)
    iterations = 1000
    # 1000 iterations of 8 warps x 8 instructions, 4 per SM and cycle, on 2 SMs at 1 GHz
    assert hot.issue_ms(iterations * flops_per_iteration, sms=2, clock_hz=1e9) == pytest.approx(
        1e3 * iterations * 64 / (4 * 2 * 1e9))


def test_the_bound_takes_the_leanest_of_several_hot_loops() -> None:
    """A masked loop beside an unmasked one (most iterations): the issue bound is the lean
    loop's, and the fuller one's size is reported beside it."""
    masked = LISTING.replace(
        "        /*0100*/                   STG.E desc[UR4][R6.64], R12 ;",
        "        /*0100*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;\n"
        "        /*0104*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;\n"
        "        /*0108*/                   FSEL R1, R2, -INF , P0 ;\n"
        "        /*010c*/                   FSEL R3, R4, -INF , P0 ;")
    found = sass.loops(masked)
    assert [lp.instructions for lp in sass.hot_loops(found)] == [8, 6]
    hot = sass.summarise(found, warps=4)
    assert hot is not None and (hot.loops, hot.instructions, hot.most) == (2, 6, 8)
    assert hot.warp_instructions_per_flop == pytest.approx(6 * 4 / (2 * 2 * 64 * 64 * 16))


BRANCHED = """
.L_x_5:
        /*0200*/                   LDG.E.128 R8, desc[UR4][R6.64] ;
        /*0210*/               @P0 BRA `(.L_x_6) ;
        /*0220*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
        /*0230*/                   BRA `(.L_x_7) ;
.L_x_6:
        /*0240*/                   FSEL R1, R2, -INF , P1 ;
        /*0250*/                   FSEL R3, R4, -INF , P1 ;
        /*0260*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
.L_x_7:
        /*0270*/               @P2 BRA `(.L_x_9) ;
        /*0280*/                   EXIT ;
.L_x_9:
        /*0290*/               @P3 BRA `(.L_x_5) ;
"""


def test_an_iteration_takes_the_shorter_side_of_a_branch_inside_the_loop() -> None:
    """A loop whose body branches to a masked variant: the lean way skips it (and the exit);
    its instructions and dot FLOPs are those of the way taken, not the body's."""
    (lp,) = sass.loops(BRANCHED)
    assert lp.instructions == 10 and lp.mma_flops == 2 * (2 * 64 * 64 * 16)
    assert [lp.mnemonics[i] for i in lp.lean] == ["LDG", "BRA", "HGMMA", "BRA", "BRA", "BRA"]
    assert lp.lean_flops == 2 * 64 * 64 * 16 and lp.count("mma", lean=True) == 1
    hot = sass.summarise([lp], warps=4)
    assert hot is not None and (hot.instructions, hot.most) == (6, 10)
    assert hot.warp_instructions_per_flop == pytest.approx(6 * 4 / (2 * 64 * 64 * 16))


def test_mma_sync_flops_are_per_warp_and_no_mma_means_no_hot_loop() -> None:
    listing = LISTING.replace("HGMMA.64x64x16.F32.BF16", "HMMA.16816.F32.BF16")
    hot = sass.summarise(sass.loops(listing), warps=4)
    assert hot is not None
    assert hot.warp_instructions_per_flop == pytest.approx(8 * 4 / (4 * 2 * (2 * 16 * 8 * 16)))
    plain = LISTING.replace("HGMMA.64x64x16.F32.BF16", "FFMA")
    assert sass.summarise(sass.loops(plain), warps=4) is None
