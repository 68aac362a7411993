"""Every tile config of the band kernels computes the right answer, not only the default.

The launches take the first config their prune keeps (tuning.launch); with
``NSA_TRITON_AUTOTUNE=1`` on a GPU the autotuner may pick any other one the prune keeps,
and the compile gate only proves that those compile without spills. Here each config of
``band.FWD_TILES``, ``DQ_TILES``, ``DKDV_TILES`` and the sm_90 tables (head-dim tiles up
to 128, those the shipped configs use) is made the only one its prune keeps (off a GPU the
prune reads the tables every architecture uses), and window attention, forward
and backward, is checked against the reference ops in the interpreter, on a sequence long
enough for far-edge, interior and diagonal tiles; each dK/dV config also on the compressed
branch, whole and split.
"""

from __future__ import annotations

import pytest
import torch

import nsa.ops.triton as T_OPS
from nsa.ops import reference as R
from nsa.ops.triton import band
from tests.ops.kernel_testlib import TOL, fresh_seed, rel_err

TABLES = {"fwd": band.FWD_TILES, "dq": band.DQ_TILES, "dkdv": band.DKDV_TILES}
LISTED = {"fwd": [band.FWD_TILES, band.FWD_TILES_SM90], "dq": [band.DQ_TILES, band.DQ_TILES_SM90],
          "dkdv": [band.DKDV_TILES, band.DKDV_TILES_SM90]}
CASES = list(dict.fromkeys((name, bd, tile) for name, tables in LISTED.items() for table in tables
                           for bd, tiles in table.items() if bd <= 128 for tile in tiles))


IDS = [f"{n}-BD{bd}-{'x'.join(map(str, t))}" for n, bd, t in CASES]


@pytest.mark.parametrize("name,bd,tile", CASES, ids=IDS)
def test_each_band_tile_config_matches_the_reference(monkeypatch: pytest.MonkeyPatch, name: str, bd: int,
                                                      tile: tuple[int, int, int]) -> None:
    monkeypatch.setitem(TABLES[name], bd, [tile])  # the prune now keeps this config only
    kernel = {"fwd": band._band_fwd, "dq": band._band_bwd_dq, "dkdv": band._band_bwd_dkdv}[name]
    kept = kernel.early_config_prune(kernel.configs, {}, BD=bd)
    assert [(c.kwargs["BM"], c.kwargs["BN"], c.num_warps) for c in kept] == [tile]
    seed = fresh_seed()
    bm, bn = tile[0], tile[1]
    # a window wider than a query tile plus a key tile: every kernel takes its far-edge,
    # interior and diagonal loops; two key tiles past the window's reach
    B, H, G, D = 1, 2, 1, bd  # D = bd: the launch's head-dim tile is bd
    window = bm + bn + bm + 13
    T = window + 2 * bn + 37
    q, do = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    k, v = torch.randn(B, T, G, D), torch.randn(B, T, G, D)
    mine = [x.clone().requires_grad_() for x in (q, k, v)]
    theirs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = T_OPS.window_attention(*mine, window)
    out.backward(do)
    ref = R.window_attention(*theirs, window)
    ref.backward(do)
    assert rel_err(out, ref) <= TOL, f"seed={seed} {name} {tile} out"
    for x, y, g in zip(mine, theirs, "qkv"):
        assert rel_err(x.grad, y.grad) <= TOL, f"seed={seed} {name} {tile} d{g}"


DKDV = [(bd, t) for name, bd, t in CASES if name == "dkdv"]


@pytest.mark.parametrize("nsplit", [1, 3])
@pytest.mark.parametrize("bd,tile", DKDV, ids=[f"BD{bd}-{'x'.join(map(str, t))}" for bd, t in DKDV])
def test_each_dkdv_tile_config_on_the_compressed_branch(monkeypatch: pytest.MonkeyPatch, bd: int,
                                                        tile: tuple[int, int, int], nsplit: int) -> None:
    """The compressed branch is where the dK/dV tiles matter most (its keys are few, its
    queries all later ones): each config, whole and split over query ranges, against the
    reference, with more than two key tiles of compressed tokens."""
    monkeypatch.setitem(band.DKDV_TILES, bd, [tile])
    seed = fresh_seed()
    B, H, G, D, blk, d = 1, 2, 1, bd, 8, 2
    T = 2 * (2 * tile[1] + 21)
    nc = R.num_compressed(T, blk, d)
    q, do = torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    k, v = torch.randn(B, nc, G, D), torch.randn(B, nc, G, D)
    o, lse = band.band_forward(q, k, v, d, blk - 1, T + 1, D**-0.5)
    got = band.band_backward(q, k, v, o, lse, do, d, blk - 1, T + 1, D**-0.5, nsplit)
    theirs = [x.clone().requires_grad_() for x in (q, k, v)]
    R.compressed_attention(*theirs, blk, d)[0].backward(do)
    for g, y, name in zip(got, theirs, "qkv"):
        assert rel_err(g, y.grad) <= TOL, f"seed={seed} {tile} split {nsplit} d{name}"
