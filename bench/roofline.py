"""Where one NSA fwd+bwd spends its time, bounded from the kernels' own tiling, without a GPU.

    python -m bench.roofline [--layouts nsa-125m paper] [--seqs 2048 16384 65536] [--batch B]
                             [--devices H100 H200] [--union random|disjoint|shared]
                             [--measured RESULTS.json] [--mma] [--json OUT]

For every kernel launch of one attention fwd+bwd of ``bench.core.nsa_attention`` through
``nsa.ops.triton`` (what ``bench.run`` times: compressed attention with the fused top-n,
selected and window attention, the gated combine; no RoPE, no projections), at the
launch parameters the wrappers choose (tiles and warps from ``tuning.candidates``, i.e.
the default config; the selected kernels' ``_sizes``, the scores kernel's ``_tiles``),
it reports:

- **grid**: programs, programs per SM, waves (programs / (SMs x resident programs per
  SM; residency from the compile gate's sm_90 record of registers, shared memory and
  warps)), and **balance**: the mean SM load over the busiest SM's when programs are
  handed, in launch order, to the least-loaded SM, a program's cost being its dot FLOPs
  (its bytes for kernels without dots). 1.0 = no SM waits on another; a grid smaller
  than the SM count caps it at programs / SMs.
- **FLOPs executed**: every ``tl.dot`` the programs run, at tile size (masked rows and
  keys inside a visited tile included, 2 FLOPs per multiply-add); **useful**: 4 * D per
  visible (query, key) pair and head in the forward and in each backward kernel (dQ;
  dK/dV), which sums to ``nsa.stats``' 3x-forward convention; **masked**: what neither
  the useful work nor the kernel's recomputation (the backward's QK^T and dP, the scores
  kernel's QK^T) needs. Non-dot work (exp2, masks, the top-n's int64 sorts) is not counted.
- **dot M**: the fewest rows of the kernel's dots. sm_90's warp-group MMA
  (``wgmma.mma_async.m64nNk16``) multiplies 64-row tiles; smaller dots take the older
  ``mma.sync`` (every 32-row dot of these kernels did, compiled for sm_90 with Triton
  3.9: docs/kernels.md), which the peak below does not describe.
- **bytes**: ``min`` = each input read once and each output written once (a true lower
  bound); ``tiles`` = every program's tile loads and stores, every re-read across
  programs counted (what reaches HBM if L2 caught nothing); ``re-read`` = tiles / min;
  ``tiles at HBM`` = tiles / bandwidth.
- **bound** = max(FLOPs executed / peak, min bytes / bandwidth) per device, and that
  bound / balance. Kernels run one after another, so the sums are the fwd+bwd's bound.
  Torch ops between the kernels (the selected backward's inverted index, the split
  dK/dV sum, autograd's sum of the three dQ) are rows of bytes only, estimated.
- **dense**: causal FlashAttention-2 at the same shapes (forward 2 matmuls, backward 5,
  over the T(T+1)/2 visible pairs per head; Q, K, V, O, dO, dQ, dK, dV and the row
  statistics moved once), the same bound formula.
- ``--measured``: a ``bench.run`` results JSON; its per-kernel profile and fwd+bwd rows of
  the same case are shown beside the bounds. ``--mma``: each kernel compiled for sm_90
  (the compile gate's machinery), and whether its PTX uses wgmma or mma.sync.

Peaks (bf16 dense tensor-core math, HBM bandwidth; both parts have 132 SMs, 64K
registers and 228 KiB of shared memory per SM), from NVIDIA's published H100 SXM and H200
SXM specifications, which list BF16 tensor-core throughput "with sparsity" (1,979
TFLOP/s): dense is half, 989.4 TFLOP/s; HBM3 3.35 TB/s (H100), HBM3e 4.8 TB/s (H200).

The selected kernels' work depends on which blocks were chosen. Without a real selection
the model takes the forced blocks (initial, local) and the rest spread uniformly over the
eligible blocks (what random inputs, as in ``bench.run``, give); ``--union`` says how
the positions that share a forward/dQ program overlap: independent picks (``random``,
the default), none in common (``disjoint``, the most work) or the same (``shared``).

Everything here is a formula over the launch parameters: nothing is launched and no
GPU is needed. The tile counts mirror the kernels' loop bounds (``band.py``'s
``_key_range`` / ``_interior_keys`` and dK/dV ranges, ``topn.py``'s block loop, the
selected kernels' union and chunks) in one place each; ``tests/test_bench_roofline.py``
checks the grids against the wrappers' real launches and the dot FLOPs against the
interpreter's count, program by program.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.core import NSA  # noqa: E402
from bench.run import EXTRA_LAYOUTS, LAYOUTS  # noqa: E402
from nsa.ops.triton import band, glue, selected, topn, tuning  # noqa: E402

E = 2  # bytes per element of q, k, v, o and their gradients (bf16, as bench.run)
F32 = 4
I64 = 8
RECORDS = ROOT / "bench" / "results"


@dataclasses.dataclass(frozen=True)
class Device:
    """Peak bf16 dense tensor-core FLOP/s, HBM bytes/s and SMs (module docstring: sources)."""

    name: str
    sms: int
    flops: float
    bandwidth: float


DEVICES = {
    "H100": Device("H100 SXM", 132, 989.4e12, 3.35e12),
    "H200": Device("H200 SXM", 132, 989.4e12, 4.8e12),
}
# Per-SM limits of sm_90 (both parts): what bounds the resident programs of a kernel.
SM_REGS = 65536
SM_SMEM = 228 * 1024
SM_WARPS = 64
SM_BLOCKS = 32
SMEM_RESERVED = 1024  # per resident block
WGMMA_ROWS = 64  # sm_90's warp-group MMA (wgmma.mma_async.m64nNk16) multiplies 64-row tiles


@dataclasses.dataclass(frozen=True)
class Shape:
    """One attention case: batch, sequence, heads, KV groups, head dim and the NSA settings."""

    B: int
    T: int
    H: int
    G: int
    D: int
    block: int = NSA["block"]
    stride: int = NSA["stride"]
    select_block: int = NSA["select_block"]
    n: int = NSA["num_selected"]
    n_init: int = NSA["num_initial"]
    n_local: int = NSA["num_local"]
    window: int = NSA["window"]

    @property
    def hpg(self) -> int:
        return self.H // self.G

    @property
    def nc(self) -> int:
        """Compressed tokens (``nsa.ops.reference.num_compressed``)."""
        return (self.T - self.block) // self.stride + 1 if self.T >= self.block else 0

    @property
    def ns(self) -> int:
        return -(-self.T // self.select_block)


@dataclasses.dataclass
class Launch:
    """One kernel (or torch op) launch: per-program dot FLOPs and tile bytes in launch order."""

    kernel: str
    branch: str
    phase: str  # fwd | bwd
    grid: tuple[int, ...]
    warps: int
    flops: np.ndarray  # per program, executed dot FLOPs
    tile_bytes: np.ndarray  # per program, loads + stores
    useful: float = 0.0
    ideal: float = 0.0  # useful + the recomputation the kernel's algorithm needs
    min_bytes: float = 0.0
    note: str = ""
    dot_rows: int = 0  # the fewest rows (M) of the kernel's dots; 0: no dot

    @property
    def programs(self) -> int:
        return int(self.flops.size)


def _cdiv(a: Any, b: int) -> Any:
    return -(-a // b)


def _cdiv0(a: np.ndarray, b: int) -> np.ndarray:
    """Iterations of ``range(x, x + a, b)``: ceil(max(a, 0) / b)."""
    return _cdiv(np.maximum(a, 0), b)


def _np2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _tiles(kernel: Any, **kwargs: Any) -> tuple[dict[str, Any], int]:
    """The default config of a tunable kernel for these constexprs: what ``tuning.launch`` runs."""
    config = tuning.candidates(kernel, (), kwargs)[0]
    return dict(config.kwargs), config.num_warps


def cmp_split(n_cmp: int, B: int, G: int, sms: int) -> int:
    """``nsa.ops.triton._cmp_split`` for a device with ``sms`` SMs (0: not a GPU)."""
    if sms == 0:
        return 1
    tiles = max(1, _cdiv(n_cmp, band.BWD_BN)) * B * G
    return max(1, min(16, _cdiv(2 * sms, tiles)))


# ----------------------------------------------------------------------------- band kernels


def band_programs(T: int, NK: int, stride: int, off: int, win: int, BM: int,
                  BN: int) -> dict[str, np.ndarray]:
    """Per query tile ``pid_m`` of ``_band_fwd`` / ``_band_bwd_dq`` (index = pid_m): key
    tiles visited (``tiles``), of which masked (``edge``), keys loaded, query rows.
    Mirrors ``_key_range``, the BN alignment of ``lo`` and ``_interior_keys``."""
    t0 = np.arange(_cdiv(T, BM), dtype=np.int64) * BM
    t1 = np.minimum(T, t0 + BM)
    last = t1 - 1
    hi = np.minimum(np.where(last >= off, np.maximum(last - off, 0) // stride + 1, 0), NK)
    num = t0 - win - off
    lo = np.where(num >= 0, np.maximum(num, 0) // stride + 1, 0)
    lo = lo // BN * BN
    ended = np.minimum(np.where(t0 >= off, np.maximum(t0 - off, 0) // stride + 1, 0), NK)
    num = t1 - 1 - off - win
    first_in = np.where(num >= 0, np.maximum(num, 0) // stride + 1, 0)
    f0 = np.minimum(lo + _cdiv(np.maximum(first_in - lo, 0), BN) * BN, hi)
    f1 = np.maximum(lo + np.maximum(ended - lo, 0) // BN * BN, f0)
    edge = _cdiv0(f0 - lo, BN) + _cdiv0(hi - f1, BN)
    tiles = edge + _cdiv0(f1 - f0, BN)
    keys = np.where(tiles > 0, np.minimum(lo + tiles * BN, NK) - lo, 0)
    return dict(tiles=tiles, edge=edge, keys=keys, rows=t1 - t0)


def band_dkdv_programs(T: int, NK: int, stride: int, off: int, win: int, BM: int, BN: int,
                       nsplit: int) -> dict[str, np.ndarray]:
    """Per (key tile, split) of ``_band_bwd_dkdv`` (shape [key tiles, nsplit]): query tiles
    visited per head (``tiles``), masked ones (``edge``), query rows loaded per head, keys."""
    pid_n = np.arange(_cdiv(NK, BN), dtype=np.int64)[:, None]
    sp = np.arange(nsplit, dtype=np.int64)[None, :]
    s_last = np.minimum(pid_n * BN + BN, NK) - 1
    e_last = s_last * stride + off
    t_hi = np.minimum(T, e_last + win)
    first = (pid_n * BN * stride + off) // BM
    n_tiles = _cdiv(t_hi, BM)
    per = _cdiv(np.maximum(n_tiles - first, 0), nsplit)
    a = np.minimum(first + sp * per, n_tiles)
    z = np.minimum(a + per, n_tiles)
    i0 = np.where(pid_n * BN + BN <= NK, _cdiv(e_last, BM), n_tiles)
    last_row = pid_n * BN * stride + off + win - BM
    i1 = np.minimum(np.where(last_row >= 0, np.maximum(last_row, 0) // BM + 1, 0), T // BM)
    i0 = np.minimum(np.maximum(i0, a), z)
    i1 = np.minimum(np.maximum(i1, i0), z)
    tiles = np.maximum(z - a, 0)
    rows = np.where(tiles > 0, np.minimum(z * BM, T) - a * BM, 0)
    keys = np.broadcast_to(np.minimum(pid_n * BN + BN, NK) - pid_n * BN, tiles.shape)
    return dict(tiles=tiles, edge=(i0 - a) + (z - i1), rows=rows, keys=keys)


def band_pairs(T: int, NK: int, stride: int, off: int, win: int) -> int:
    """Visible (query, key) pairs of one head: ``e(s) <= t`` and ``t - e(s) < win``."""
    t = np.arange(T, dtype=np.int64)
    hi = np.minimum(np.where(t >= off, (t - off) // stride + 1, 0), NK)
    num = t - win + 1 - off  # e(s) >= t - win + 1
    lo = np.where(num > 0, _cdiv(num, stride), 0)
    return int(np.maximum(hi - lo, 0).sum())


def _band_launches(s: Shape, branch: str, NK: int, stride: int, off: int, win: int,
                   nsplit: int) -> list[Launch]:
    """``_band_fwd`` and, for the backward, ``_delta_kernel``, ``_band_bwd_dq``,
    ``_band_bwd_dkdv`` (and the split's torch sum) of one band branch."""
    B, T, H, G, D = s.B, s.T, s.H, s.G, s.D
    bd = max(16, _np2(D))
    pairs = band_pairs(T, NK, stride, off, win) * B * H
    qbytes = B * T * H * D * E
    kbytes = B * NK * G * D * E
    rows_lse = B * H * T * F32
    useful = 4.0 * D * pairs
    fwd_cfg, fwd_w = _tiles(band._band_fwd, BD=bd)
    BM, BN = fwd_cfg["BM"], fwd_cfg["BN"]
    p = band_programs(T, NK, stride, off, win, BM, BN)
    rev = slice(None, None, -1)  # program_id(0) = 0 runs the last query tile
    flops = np.tile((p["tiles"] * 4.0 * BM * BN * bd)[rev], B * H)
    tb = np.tile((p["rows"] * (2 * D * E + F32) + p["keys"] * 2 * D * E)[rev], B * H).astype(float)
    out = [Launch("_band_fwd", branch, "fwd", (_cdiv(T, BM), B * H), fwd_w, flops, tb, useful, useful,
                  2 * qbytes + 2 * kbytes + rows_lse, f"BM={BM} BN={BN}", BM)]
    out.append(_delta(s, branch, heads_major=True))
    dq_cfg, dq_w = _tiles(band._band_bwd_dq, BD=bd)
    BM, BN = dq_cfg["BM"], dq_cfg["BN"]
    p = band_programs(T, NK, stride, off, win, BM, BN)
    flops = np.tile((p["tiles"] * 6.0 * BM * BN * bd)[rev], B * H)
    tb = np.tile((p["rows"] * (3 * D * E + 2 * F32) + p["keys"] * 2 * D * E)[rev], B * H).astype(float)
    out.append(Launch("_band_bwd_dq", branch, "bwd", (_cdiv(T, BM), B * H), dq_w, flops, tb, useful,
                      1.5 * useful, 3 * qbytes + 2 * kbytes + 2 * rows_lse, f"BM={BM} BN={BN}", BM))
    if NK == 0:  # band_backward returns zeros for dK/dV: no launch
        return out
    kv_cfg, kv_w = _tiles(band._band_bwd_dkdv, BD=bd)
    BM, BN = kv_cfg["BM"], kv_cfg["BN"]
    p = band_dkdv_programs(T, NK, stride, off, win, BM, BN, nsplit)
    hpg = H // G
    out_e = E if nsplit == 1 else F32
    per_flops = p["tiles"] * hpg * 8.0 * BM * BN * bd  # [key tiles, nsplit]
    per_bytes = p["keys"] * 2 * D * (E + out_e) + p["rows"] * hpg * (2 * D * E + 2 * F32)
    flops = np.repeat(per_flops[:, None, :], B * G, axis=1).reshape(-1)
    tb = np.repeat(per_bytes[:, None, :], B * G, axis=1).reshape(-1).astype(float)
    written = 2 * B * NK * G * D * out_e * nsplit
    out.append(Launch("_band_bwd_dkdv", branch, "bwd", (_cdiv(NK, BN) * B * G * nsplit,), kv_w, flops, tb,
                      useful, 2 * useful, 2 * qbytes + 2 * kbytes + 2 * rows_lse + written,
                      f"BM={BM} BN={BN} NSPLIT={nsplit}", BN))
    if nsplit > 1:  # dks.sum(0).to(k.dtype), dvs likewise: fp32 sum, then the cast
        moved = 2.0 * (nsplit * B * NK * G * D * F32 + B * NK * G * D * (2 * F32 + E))
        out.append(_torch("dK/dV split sum", branch, moved, launches=4))
    return out


# ----------------------------------------------------------------------------- glue and torch


def _delta(s: Shape, branch: str, heads_major: bool) -> Launch:
    """``glue.row_delta``: one program per ``4096 // BD`` rows of O and dO."""
    rows = s.B * s.T * s.H
    _, br = glue._rows_per_program(s.D)
    n = _cdiv(rows, br)
    r = np.full(n, br)
    r[-1] = rows - br * (n - 1)
    tb = (r * (2 * s.D * E + F32)).astype(float)
    return Launch("_delta_kernel", branch, "bwd", (n,), 4, np.zeros(n), tb, min_bytes=float(tb.sum()),
                  note="heads-major" if heads_major else "")


def _combine(s: Shape) -> list[Launch]:
    """``GatedCombine`` forward (4 warps) and backward (8 warps)."""
    rows = s.B * s.T * s.H
    _, br = glue._rows_per_program(s.D)
    n = _cdiv(rows, br)
    r = np.full(n, br)
    r[-1] = rows - br * (n - 1)
    fwd = (r * (3 * E + 4 * s.D * E)).astype(float)
    bwd = (r * (3 * E + 3 * F32 + 7 * s.D * E)).astype(float)
    return [Launch("_combine_fwd", "combine", "fwd", (n,), 4, np.zeros(n), fwd, min_bytes=float(fwd.sum())),
            Launch("_combine_bwd", "combine", "bwd", (n,), 8, np.zeros(n), bwd, min_bytes=float(bwd.sum()))]


def _torch(what: str, branch: str, moved: float, launches: int = 1) -> Launch:
    """torch ops between the kernels: bytes only (estimated), no grid of ours."""
    return Launch(f"torch: {what}", branch, "bwd", (), 0, np.zeros(0), np.array([moved]), min_bytes=moved,
                  note=f"{launches} torch launches")


# ----------------------------------------------------------------------------- selection


@dataclasses.dataclass
class Selection:
    """What the selected kernels' work depends on, per (batch, group) ``bg``: the distinct
    blocks of each forward/dQ program (``union [BG, programs]``), the queries that
    selected each block (``seg [BG, Ns]``), and the selected (query, key) pairs of all
    rows of one head (``pairs``: keys <= t inside the chosen blocks, summed over b, t, g)."""

    union: np.ndarray
    seg: np.ndarray
    pairs: float


def _forced(o: np.ndarray, s: Shape) -> np.ndarray:
    """Forced blocks (initial + local, distinct, eligible) of queries whose own block is ``o``."""
    init = np.minimum(s.n_init, o + 1)
    local_lo = np.maximum(o - s.n_local + 1, 0)
    overlap = np.maximum(np.minimum(init, o + 1) - local_lo, 0)
    return init + (o + 1 - local_lo) - overlap


UNIONS = ("random", "disjoint", "shared")


def selection_model(s: Shape, positions: int, union: str = "random") -> Selection:
    """The selection's shape without data: forced blocks exactly, the free picks uniform
    over the eligible non-forced blocks. ``union``, for the positions that share a
    forward/dQ program: ``random`` (independent picks: the expected number of distinct
    blocks, what random inputs give), ``disjoint`` (no free block in common: the most
    work) or ``shared`` (the same free blocks: the least)."""
    T, lb = s.T, s.select_block
    t = np.arange(T, dtype=np.int64)
    o = t // lb
    elig = o + 1
    k = np.minimum(s.n, elig)
    forced = np.minimum(_forced(o, s), k)
    free = k - forced
    # forward/dQ programs: positions t0 .. t0 + P - 1
    P = positions
    nprog = _cdiv(T, P)
    t0 = np.arange(nprog, dtype=np.int64) * P
    tl_ = np.minimum(t0 + P, T) - 1
    o0, o1 = t0 // lb, tl_ // lb
    init = np.minimum(s.n_init, o1 + 1)
    local_lo = np.maximum(o0 - s.n_local + 1, 0)
    f_union = init
    if s.n_local > 0:  # the positions' local blocks: one run [o0 - n_local + 1, o1]
        f_union = init + (o1 + 1 - local_lo) - np.maximum(init - local_lo, 0)
    pad = np.zeros(nprog * P - T, dtype=np.int64)
    free_p = np.concatenate([free, pad]).reshape(nprog, P)
    room = o1 + 1 - f_union  # eligible blocks the union may still take
    if union == "random":
        miss = 1.0 - free / np.maximum(elig - forced, 1)  # a given free block not picked by t
        picks = room * (1.0 - np.concatenate([miss, pad + 1.0]).reshape(nprog, P).prod(1))
    elif union == "disjoint":
        picks = free_p.sum(1)
    elif union == "shared":
        picks = free_p.max(1)
    else:
        raise ValueError(f"union must be one of {UNIONS}, not {union!r}")
    u = f_union + np.minimum(picks, room)
    # queries per block: forced exactly, free picks in expectation
    ns = s.ns
    j = np.arange(ns, dtype=np.int64)
    in_init = j < s.n_init
    seg = np.where(in_init, T - j * lb, 0).astype(float)
    local_end = np.minimum((j + s.n_local) * lb, T)
    seg += np.where(in_init, 0, np.maximum(local_end - j * lb, 0))
    choices = np.maximum(elig - forced, 1)
    p_free = np.bincount(o, weights=free / choices, minlength=ns)  # sum over queries of block o
    suffix = np.concatenate([np.cumsum(p_free[::-1])[::-1], [0.0]])  # sum over o' >= o
    first_o = np.minimum(j + s.n_local, ns)
    seg += np.where(in_init, 0.0, suffix[first_o])
    keys = np.where(elig <= s.n, t + 1, (k - 1) * lb + t % lb + 1)
    BG = s.B * s.G
    return Selection(np.tile(u, (BG, 1)), np.tile(np.round(seg), (BG, 1)), float(keys.sum()) * BG)


def selection_from_idx(idx: Any, positions: int, select_block: int) -> Selection:
    """The same statistics from a real selection ``idx [B, T, G, n]`` (torch, -1 = unused)."""
    import torch

    B, T, G, n = idx.shape
    ns = _cdiv(T, select_block)
    sel = idx.permute(0, 2, 1, 3).reshape(B * G, T, n).cpu()
    nprog = _cdiv(T, positions)
    union = np.zeros((B * G, nprog), dtype=np.int64)
    seg = np.zeros((B * G, ns))
    for bg in range(B * G):
        for p in range(nprog):
            x = sel[bg, p * positions:(p + 1) * positions].reshape(-1)
            union[bg, p] = int(torch.unique(x[x >= 0]).numel())
        x = sel[bg][sel[bg] >= 0]
        seg[bg] = np.bincount(x.numpy(), minlength=ns)
    t = torch.arange(T).view(1, T, 1)
    keys = torch.clamp(t - sel * select_block + 1, 0, select_block) * (sel >= 0)
    return Selection(union, seg, float(keys.sum()))


def _selected_launches(s: Shape, sel: Selection) -> tuple[list[Launch], list[Launch]]:
    """Forward and backward launches of ``selected_attention`` (selected.py)."""
    B, T, H, G, D = s.B, s.T, s.H, s.G, s.D
    hpg = s.hpg
    R, P, hpgp, qc, bd, ls = selected._sizes(hpg, D, s.select_block, None)
    npos = _cdiv(T, P)
    grid = (npos, B * G)
    pos_valid = np.minimum(np.arange(npos) * P + P, T) - np.arange(npos) * P
    rows = pos_valid * hpg  # real (position, head) rows of each program
    np_ = _np2(max(s.n, 1))
    u = sel.union.reshape(-1)  # launch order: program_id(0) fastest
    rows_l = np.tile(rows, B * G)
    scratch = 4 * P * np_ * 4  # the union's int32 scratch row: written three times, read once
    blk = s.select_block * D * E
    useful = 4.0 * D * sel.pairs * hpg
    qbytes = B * T * H * D * E
    kbytes = B * T * G * D * E
    idx_bytes = B * T * G * s.n * I64
    lse = B * T * H * F32
    scr_bytes = float(npos * B * G * P * np_ * 4 * 2)
    cfg, w = _tiles(selected._sel_fwd, R=R, BD=bd)
    fwd_flops = u * 4.0 * R * ls * bd
    fwd_bytes = (rows_l * (2 * D * E + F32 + s.n * I64) + np.tile(pos_valid * s.n * I64 + scratch, B * G)
                 + u * 2 * blk).astype(float)
    fwd = [Launch("_sel_fwd", "selected", "fwd", grid, w, fwd_flops, fwd_bytes, useful, useful,
                  2 * qbytes + 2 * kbytes + idx_bytes + lse + scr_bytes,
                  f"R={R} P={P} STAGES={cfg['STAGES']}", R)]
    bwd = [_delta(s, "selected", heads_major=False)]
    cfg, w = _tiles(selected._sel_bwd_dq, R=R, BD=bd)
    dq_bytes = (rows_l * (3 * D * E + 2 * F32 + s.n * I64) + np.tile(pos_valid * s.n * I64 + scratch, B * G)
                + u * 2 * blk).astype(float)
    bwd.append(Launch("_sel_bwd_dq", "selected", "bwd", grid, w, u * 6.0 * R * ls * bd, dq_bytes, useful,
                      1.5 * useful, 3 * qbytes + 2 * kbytes + idx_bytes + 2 * lse + scr_bytes,
                      f"R={R} P={P} STAGES={cfg['STAGES']}", R))
    # the inverted index and chunk map (torch): where + copy, sort (8 radix passes over
    # 64-bit keys with int64 indices), the gather of positions; the searchsorted are small
    N = B * T * G * s.n
    nkeys = B * G * s.ns
    bwd.append(_torch("inverted index", "selected", float(N * (8 + 8 + 16 + 4 + 8 * 32 + 16)), launches=8))
    ch = max(qc, 4 * s.n * s.select_block)
    ch = _cdiv(ch, qc) * qc
    max_chunks = nkeys + _cdiv(N, ch)
    hc = selected._dkdv_heads(hpgp)
    htiles = _cdiv(hpgp, hc)
    seg = sel.seg.reshape(-1).astype(np.int64)
    n_chunks = _cdiv(seg, ch)
    real = int(n_chunks.sum())
    # queries of every real chunk, in key order: full chunks, then the remainder
    counts = np.repeat(np.minimum(ch, seg), n_chunks)
    last = np.cumsum(n_chunks) - 1
    rem = seg - (n_chunks - 1) * ch
    counts[last[n_chunks > 0]] = rem[n_chunks > 0]
    steps = _cdiv(counts, qc)
    flops = np.zeros(max_chunks)
    flops[:real] = steps * htiles * 8.0 * ls * bd * qc * hc
    tb = np.full(max_chunks, 2.0 * blk + 3 * I64)  # every program loads its (clamped) block's K/V
    tb[:real] += steps * qc * 4 + counts * hpg * (2 * D * E + 2 * F32) + 2 * ls * bd * F32
    partials = 2.0 * real * ls * bd * F32
    w = selected._warps(qc * hc, bd, 32 * 64)
    bwd.append(Launch("_sel_bwd_dkdv", "selected", "bwd", (max_chunks,), w, flops, tb, useful, 2 * useful,
                      2 * qbytes + 2 * kbytes + 2 * lse + N * 4 + partials,
                      f"CH={ch} QC={qc} HC={hc}; {real} of {max_chunks} programs have a chunk", ls))
    rb = np.full(nkeys, 2.0 * blk) + n_chunks * 2 * ls * bd * F32
    bwd.append(Launch("_sel_bwd_reduce", "selected", "bwd", (nkeys,), selected._warps(ls, bd, 64 * 64),
                      np.zeros(nkeys), rb, min_bytes=partials + 2 * kbytes))
    return fwd, bwd


def scores_programs(s: Shape, P: int, BN: int, BH: int, BJ: int) -> dict[str, np.ndarray]:
    """Per position tile ``pid_m`` of ``_scores_topn`` (index = pid_m): halo and main key
    tiles over its selection-block tiles, compressed keys loaded. Mirrors its loops."""
    T, blk, st, sb = s.T, s.block, s.stride, s.select_block
    t0 = np.arange(_cdiv(T, P), dtype=np.int64) * P
    last = np.minimum(T, t0 + P) - 1
    i_vis = np.minimum(np.where(last >= blk - 1, np.maximum(last - blk + 1, 0) // st + 1, 0), s.nc)
    ns_hi = last // sb + 1
    j0 = np.arange(_cdiv(int(ns_hi.max()), BJ), dtype=np.int64)[None, :] * BJ
    on = j0 < ns_hi[:, None]
    num = j0 * sb - blk + 1
    i_start = np.where(num > 0, (np.maximum(num, 0) + st - 1) // st, 0)
    i_main = (j0 * sb + st - 1) // st
    i_end = np.minimum((j0 * sb + BJ * sb + st - 1) // st, i_vis[:, None])
    i_halo = np.minimum(i_main, i_end)
    halo = np.where(on, _cdiv0(i_halo - i_start, BH), 0).sum(1)
    main = np.where(on, _cdiv0(i_end - i_main, BN), 0).sum(1)
    keys = np.where(on, np.maximum(i_halo - i_start, 0) + np.maximum(i_end - i_main, 0), 0).sum(1)
    return dict(halo=halo, main=main, keys=keys, positions=last + 1 - t0)


def _scores_launch(s: Shape) -> Launch:
    """``_scores_topn`` in its top-n mode (``selection_from_lse``)."""
    c = topn._tiles(s.hpg, s.D, s.block, s.stride, s.select_block, s.n)
    P, hpgp, bd, BN, BH, BJ = c["P"], c["HPGP"], c["BD"], c["BN"], c["BH"], c["BJ"]
    R = P * hpgp
    _, w = _tiles(topn._scores_topn, TOPN=True)
    p = scores_programs(s, P, BN, BH, BJ)
    wdot = 2.0 * P * BJ if P >= 16 else 0.0  # the Eq. 9 weights as an fp32 dot
    per = p["halo"] * (2.0 * R * bd * BH + wdot * BH) + p["main"] * (2.0 * R * bd * BN + wdot * BN)
    rows = p["positions"] * s.hpg
    tb = rows * (s.D * E + F32) + p["keys"] * s.D * E + p["positions"] * s.n * I64
    rev = slice(None, None, -1)
    BG = s.B * s.G
    cmp_pairs = band_pairs(s.T, s.nc, s.stride, s.block - 1, s.T + 1) * s.B * s.H
    min_bytes = s.B * s.T * s.H * (s.D * E + F32) + s.B * s.nc * s.G * s.D * E + s.B * s.T * s.G * s.n * I64
    return Launch("_scores_topn", "compressed", "fwd", (_cdiv(s.T, P), BG), w, np.tile(per[rev], BG),
                  np.tile(tb[rev], BG).astype(float), 0.0, 2.0 * s.D * cmp_pairs, min_bytes,
                  f"P={P} BN={BN} BH={BH} BJ={BJ}", min(R, P) if P >= 16 else R)


# ----------------------------------------------------------------------------- one fwd+bwd


def nsa_launches(s: Shape, sms: int, sel: Selection | None = None, union: str = "random") -> list[Launch]:
    """Every launch of one ``bench.core.nsa_attention`` fwd+bwd through ``nsa.ops.triton``, in
    order (the backward in autograd's order: combine, window, selected, compressed)."""
    R, P = selected._sizes(s.hpg, s.D, s.select_block, None)[:2]
    sel = sel or selection_model(s, P, union)
    cmp = _band_launches(s, "compressed", s.nc, s.stride, s.block - 1, s.T + 1,
                         cmp_split(s.nc, s.B, s.G, sms))
    win = _band_launches(s, "window", s.T, 1, 0, s.window, 1)
    sel_fwd, sel_bwd = _selected_launches(s, sel)
    comb = _combine(s)
    dq_sum = _torch("dq sum (autograd)", "combine", 2.0 * 3 * s.B * s.T * s.H * s.D * E, launches=2)
    fwd = [cmp[0], _scores_launch(s), *sel_fwd, win[0], comb[0]]
    bwd = [comb[1], *win[1:], *sel_bwd, *cmp[1:], dq_sum]
    return fwd + bwd


def dense_flash(s: Shape) -> tuple[float, float]:
    """(FLOPs, bytes) of a causal FlashAttention-2 fwd+bwd at these shapes (GQA K/V once)."""
    pairs = s.T * (s.T + 1) / 2 * s.B * s.H
    flops = (4.0 + 10.0) * s.D * pairs
    q = s.B * s.T * s.H * s.D * E
    kv = s.B * s.T * s.G * s.D * E
    rows = s.B * s.T * s.H * F32
    fwd = 2 * q + 2 * kv + rows  # Q, K, V in; O, LSE out
    bwd = 3 * q + 2 * kv + 2 * rows + q + 2 * kv + rows  # Q, O, dO, K, V, LSE in; dQ, dK, dV, delta
    return flops, float(fwd + bwd)


# ----------------------------------------------------------------------------- occupancy and balance


def balance(cost: np.ndarray, sms: int) -> float:
    """Mean SM load / busiest SM's, programs handed in launch order to the least-loaded SM."""
    total = float(cost.sum())
    if cost.size == 0 or total <= 0:
        return 1.0
    hi, lo = float(cost.max()), float(cost.min())
    if hi - lo <= 1e-9 * hi:
        makespan = _cdiv(cost.size, sms) * hi
    else:
        loads = [0.0] * sms
        for c in cost.tolist():
            heapq.heapreplace(loads, loads[0] + c)
        makespan = max(loads)
    return total / (sms * makespan)


def latest_record() -> Path | None:
    """The newest passing compile-gate record (bench/results/compile-triton-*.json)."""
    best: tuple[tuple[int, ...], Path] | None = None
    for path in RECORDS.glob("compile-triton-*.json"):
        try:
            data = json.loads(path.read_text())
            version = tuple(int(x) for x in str(data["triton"]).split("."))
        except (ValueError, KeyError, OSError):
            continue
        if data.get("passed") and (best is None or version > best[0]):
            best = (version, path)
    return best[1] if best else None


_LINE = re.compile(r"^OK\s+sm_(\d+)\s+(\w+)\s+regs\s+(\d+)\s.*?smem\s+(\d+) B\s+warps\s+(\d+)"
                   r"\s+stages\s+\d+\s*(\((default|alt)[^)]*\))?\s*\[(.*)\]\s*$")


def read_record(path: Path | None, arch: int = 90) -> dict[tuple[str, str], tuple[int, int, int]]:
    """``(kernel, case label) -> (registers, shared bytes, warps)`` of the default configs."""
    if path is None:
        return {}
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    for line in json.loads(path.read_text()).get("lines", []):
        m = _LINE.match(" ".join(line.split()))
        if not m or int(m.group(1)) != arch or m.group(7) == "alt":
            continue
        for case in m.group(8).split(", "):
            out.setdefault((m.group(2), case.strip()), (int(m.group(3)), int(m.group(4)), int(m.group(5))))
    return out


def resident(regs: int, smem: int, warps: int) -> int:
    """Programs of one kernel an sm_90 SM holds at once (registers in 8s per thread)."""
    by_regs = SM_REGS // (_cdiv(regs, 8) * 8 * 32 * warps)
    by_smem = SM_SMEM // (smem + SMEM_RESERVED)
    return max(0, min(SM_BLOCKS, SM_WARPS // warps, by_regs, by_smem))


_OP = {"compressed": "compressed+selection", "window": "window", "selected": "selected",
       "combine": "gated combine"}


def _residency(record: dict, labels: Sequence[str], launch: Launch) -> int | None:
    op = f"{_OP[launch.branch]} {launch.phase}"
    for label in labels:
        got = record.get((launch.kernel, f"{label} {op}"))
        if got:
            return resident(*got)
    return None


# ----------------------------------------------------------------------------- analysis


@dataclasses.dataclass
class Row:
    """One launch's numbers (no per-program arrays): what the table and the JSON show."""

    kernel: str
    branch: str
    phase: str
    grid: list[int]
    programs: int
    warps: int
    resident: int | None
    balance: float
    flops: float
    useful: float
    ideal: float
    min_bytes: float
    tile_bytes: float
    note: str
    dot_rows: int
    ms: dict[str, float]  # device -> bound
    balanced_ms: dict[str, float]
    mma: str | None = None  # with --mma: the MMA instructions its sm_90 PTX uses


@dataclasses.dataclass
class Case:
    layout: str
    shape: Shape
    rows: list[Row]
    dense: dict[str, float]  # device -> bound ms
    dense_flops: float
    dense_bytes: float
    measured: dict[str, Any] = dataclasses.field(default_factory=dict)

    def total(self, key: str, device: str | None = None) -> float:
        if device is None:
            return sum(getattr(r, key) for r in self.rows)
        return sum(getattr(r, key)[device] for r in self.rows)


def bound_ms(flops: float, nbytes: float, dev: Device) -> float:
    """max(FLOPs / peak, bytes / bandwidth), in ms."""
    return 1e3 * max(flops / dev.flops, nbytes / dev.bandwidth)


def analyse(layout: str, s: Shape, devices: Sequence[str], union: str = "random",
            record: dict | None = None) -> Case:
    """The launches of one case with their bounds on each device (same SM count assumed)."""
    sms = {DEVICES[d].sms for d in devices}
    if len(sms) != 1:
        raise ValueError("devices with different SM counts launch different grids: analyse them apart")
    n_sm = sms.pop()
    labels = [layout, f"D{s.D}-hpg{s.hpg}"]
    rows = []
    for launch in nsa_launches(s, n_sm, union=union):
        flops, tb = float(launch.flops.sum()), float(launch.tile_bytes.sum())
        cost = launch.flops if flops > 0 else launch.tile_bytes
        bal = balance(cost, n_sm) if launch.grid else 1.0
        ms = {d: bound_ms(flops, launch.min_bytes, DEVICES[d]) for d in devices}
        res = _residency(record or {}, labels, launch) if launch.grid else None
        rows.append(Row(launch.kernel, launch.branch, launch.phase, list(launch.grid), launch.programs,
                        launch.warps, res, bal, flops, launch.useful, launch.ideal, launch.min_bytes, tb,
                        launch.note, launch.dot_rows, ms, {d: v / bal for d, v in ms.items()}))
    dflops, dbytes = dense_flash(s)
    return Case(layout, s, rows, {d: bound_ms(dflops, dbytes, DEVICES[d]) for d in devices}, dflops, dbytes)


def mma_kinds(layout: str, s: Shape, sms: int) -> dict[tuple[str, str], str]:
    """``(kernel, branch) -> "wgmma" | "mma.sync" | "-"``: each default-config launch of the
    case compiled for sm_90 by the compile gate's machinery (Triton's real compiler, no
    GPU; minutes where Triton's cache lacks them), read from its PTX. Needs the compiled
    kernels: not under ``TRITON_INTERPRET=1``."""
    from bench.compile_check import _compile
    from bench.compile_launches import Shape as GateShape
    from bench.compile_launches import drive_ops

    branch = {"compressed+selection": "compressed", "selected": "selected", "window": "window",
              "gated combine": "combine"}
    gate = GateShape(layout, s.B, s.T, s.H, s.G, s.D, s.block, s.stride, s.select_block, s.n, s.window)
    out: dict[tuple[str, str], str] = {}
    for la in drive_ops(gate, sms):
        key = (la.name, branch.get(la.case[len(layout) + 1:].rsplit(" ", 1)[0], ""))
        if not key[1] or la.config.startswith("alt") or key in out:
            continue
        ptx = _compile(la, 90)[0].asm["ptx"]
        out[key] = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "-"
    return out


# ----------------------------------------------------------------------------- measured times


def load_measured(path: Path, case: Case) -> dict[str, Any]:
    """From a ``bench.run`` results JSON: the case's per-kernel device ms (``kernels``), the
    nsa_triton and fastest dense fwd+bwd ms (``attn_fwd_train`` + ``attn_bwd``) and the device."""
    data = json.loads(path.read_text())
    s = case.shape
    key = (case.layout, s.T, s.B)
    kernels: dict[str, float] = {}
    for k in data.get("kernels", []):
        if k.get("impl") == "nsa_triton" and (k.get("layout"), k.get("seq_len"), k.get("batch")) == key:
            if k.get("device_ms") is not None:
                kernels[k["kernel"]] = kernels.get(k["kernel"], 0.0) + float(k["device_ms"])
    ms: dict[str, dict[str, float]] = {}
    device = ""
    for r in data.get("rows", []):
        same = (r.get("layout"), r.get("seq_len"), r.get("batch")) == key
        if same and r.get("ms") and r.get("status") == "ok":
            ms.setdefault(r["impl"], {})[r["op"]] = float(r["ms"])
            device = device or str(r.get("device") or "")
    fwd_bwd = {impl: ops.get("attn_fwd_train", ops.get("attn_fwd", 0.0)) + ops["attn_bwd"]
               for impl, ops in ms.items() if "attn_bwd" in ops}
    dense = {k: v for k, v in fwd_bwd.items() if k.startswith("dense")}
    out: dict[str, Any] = dict(kernels=kernels, device=device, nsa_ms=fwd_bwd.get("nsa_triton"))
    if dense:
        best = min(dense, key=lambda k: dense[k])
        out.update(dense_impl=best, dense_ms=dense[best])
    return out


# ----------------------------------------------------------------------------- output


def _g(x: float) -> str:
    return f"{x / 1e9:,.1f}" if x >= 1e8 else f"{x / 1e9:.3f}"


def _mb(x: float) -> str:
    return f"{x / 1e6:,.0f}" if x >= 1e7 else f"{x / 1e6:.2f}"


def _ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _pct(a: float, b: float) -> str:
    return f"{100 * a / b:.0f}%" if b > 0 else "-"


def _which(d: str, device: str) -> bool:
    return d.lower() in device.lower()


def case_markdown(c: Case, devices: Sequence[str]) -> list[str]:
    """The per-launch table of one case, its totals and what stands out."""
    s = c.shape
    n_sm = DEVICES[devices[0]].sms
    head = (f"## {c.layout}, T {s.T}, batch {s.B} (H {s.H}, G {s.G}, D {s.D}; l {s.block}, d {s.stride}, "
            f"l' {s.select_block}, n {s.n}, w {s.window})")
    dev_cols = " | ".join(f"{d} ms | {d} / balance | {d} tiles at HBM" for d in devices)
    mma = any(r.mma for r in c.rows)
    measured = bool(c.measured.get("kernels") or c.measured.get("nsa_ms"))
    out = ["", head, "",
           "| # | kernel | branch | tiles | dot M | grid | programs/SM | resident/SM (warps) | waves | "
           f"balance | GFLOP | useful | masked | MB min | re-read | {dev_cols} |" + (" MMA |" if mma else ""),
           "|" + "---|" * (15 + 3 * len(devices) + mma)]
    for i, r in enumerate(c.rows, 1):
        grid = " x ".join(str(g) for g in r.grid) or "-"
        per_sm = f"{r.programs / n_sm:,.1f}" if r.grid else "-"
        res = "-" if r.resident is None else f"{r.resident} ({r.resident * r.warps}w)"
        waves = "-" if r.resident in (None, 0) or not r.grid else f"{r.programs / (n_sm * r.resident):,.1f}"
        masked = _pct(r.flops - r.ideal, r.flops) if r.flops > 0 else "-"
        reread = f"{r.tile_bytes / r.min_bytes:.1f}x" if r.min_bytes > 0 else "-"
        times = " | ".join(f"{_ms(r.ms[d])} | {_ms(r.balanced_ms[d])} | "
                           f"{_ms(1e3 * r.tile_bytes / DEVICES[d].bandwidth)}" for d in devices)
        useful = _pct(r.useful, r.flops) if r.flops else "-"
        line = (f"| {i} | `{r.kernel}` | {r.branch} {r.phase} | {r.note} | {r.dot_rows or '-'} | {grid} | "
                f"{per_sm} | {res} | {waves} | "
                f"{r.balance:.2f} | {_g(r.flops)} | {useful} | {masked} | "
                f"{_mb(r.min_bytes)} | {reread} | {times} |" + (f" {r.mma or '-'} |" if mma else ""))
        out.append(line)
    tf, tu, ti = c.total("flops"), c.total("useful"), c.total("ideal")
    tmin, ttile = c.total("min_bytes"), c.total("tile_bytes")
    totals = " | ".join(f"**{_ms(c.total('ms', d))}** | **{_ms(c.total('balanced_ms', d))}** | "
                        f"{_ms(1e3 * ttile / DEVICES[d].bandwidth)}" for d in devices)
    out.append(f"| | **sum** | fwd+bwd | | | {sum(1 for r in c.rows if r.grid)} kernels | | | | | {_g(tf)} | "
               f"{_pct(tu, tf)} | {_pct(tf - ti, tf)} | {_mb(tmin)} | {ttile / tmin:.1f}x | {totals} |")
    dense = " | ".join(f"{_ms(c.dense[d])} | {_ms(c.dense[d])} | -" for d in devices)
    out.append(f"| | dense flash (bound) | fwd+bwd | | | | | | | | {_g(c.dense_flops)} | "
               f"{_pct(c.dense_flops * 3 / 3.5, c.dense_flops)} | | {_mb(c.dense_bytes)} | | {dense} |")
    if measured:
        out += _measured_lines(c, devices)
    out += ["", *findings(c, devices)]
    return out


def _measured_lines(c: Case, devices: Sequence[str]) -> list[str]:
    """Bound vs measured per kernel name (the profiler sums the launches of a name); the
    profiled kernels that are none of ours (torch's) in one line, beside our torch rows."""
    m = c.measured
    dev = next((d for d in devices if _which(d, m.get("device", ""))), devices[-1])
    by: dict[str, float] = {}
    for r in c.rows:
        if r.grid:
            by[r.kernel] = by.get(r.kernel, 0.0) + r.balanced_ms[dev]
    got: dict[str, float] = {}
    other = 0.0
    for name, ms in m["kernels"].items():
        mine = next((k for k in by if name == k or name.startswith(k + "_")), None)
        if mine is None:
            other += ms
        else:
            got[mine] = got.get(mine, 0.0) + ms
    out = ["", f"Measured ({m.get('device') or 'device not named'}) beside the {dev} bound / balance:", "",
           "| kernel | bound / balance ms | measured ms | measured / bound |", "|---|---|---|---|"]

    def line(name: str, bound: float, ms: float | None) -> str:
        ratio = f"{ms / bound:.1f}x" if ms and bound > 0 else "-"
        return f"| {name} | {_ms(bound)} | {'-' if ms is None else _ms(ms)} | {ratio} |"

    for name in sorted(by, key=lambda k: -got.get(k, 0.0)):
        out.append(line(f"`{name}`", by[name], got.get(name)))
    torch_rows = sum(r.balanced_ms[dev] for r in c.rows if not r.grid)
    out.append(line("other kernels (torch)", torch_rows, other if m["kernels"] else None))
    if m.get("nsa_ms"):
        out.append(line("NSA fwd+bwd (bench rows)", c.total("balanced_ms", dev), m["nsa_ms"]))
    if m.get("dense_ms"):
        out.append(line(f"{m['dense_impl']} fwd+bwd (bench rows)", c.dense[dev], m["dense_ms"]))
    return out


def findings(c: Case, devices: Sequence[str]) -> list[str]:
    """Plain sentences: the biggest bounds, small grids, imbalance, masked work, re-reads."""
    dev = devices[-1]
    n_sm = DEVICES[dev].sms
    total = c.total("balanced_ms", dev)
    kern = [r for r in c.rows if r.grid]
    top = sorted(kern, key=lambda r: -r.balanced_ms[dev])[:4]
    lines = [f"- {dev}: NSA fwd+bwd bound {_ms(c.total('ms', dev))} ms, {_ms(total)} ms with each kernel's "
             f"imbalance; dense flash bound {_ms(c.dense[dev])} ms (dense / NSA "
             f"{c.dense[dev] / total:.2f}x). Largest: "
             + ", ".join(f"`{r.kernel}` {r.branch} {_pct(r.balanced_ms[dev], total)}" for r in top) + "."]
    small = [r for r in kern if r.programs < n_sm and r.flops > 0]
    if small:
        lines.append("- Fewer programs than SMs: " + ", ".join(
            f"`{r.kernel}` {r.branch} ({r.programs} for {n_sm})" for r in small) + ".")
    slow = [r for r in kern if r.balance < 0.8 and r.balanced_ms[dev] > 0.02 * total]
    if slow:
        lines.append("- Imbalance (balance < 0.8, > 2% of the time): " + ", ".join(
            f"`{r.kernel}` {r.branch} {r.balance:.2f}" for r in slow) + ".")
    waste = [r for r in kern if r.flops > 0 and (r.flops - r.ideal) > 0.3 * r.flops
             and r.balanced_ms[dev] > 0.02 * total]
    if waste:
        lines.append("- Masked work > 30% of a kernel's dot FLOPs: " + ", ".join(
            f"`{r.kernel}` {r.branch} {_pct(r.flops - r.ideal, r.flops)}" for r in waste) + ".")
    narrow = [r for r in kern if 0 < r.dot_rows < WGMMA_ROWS]
    if narrow:
        names = ", ".join(f"`{r.kernel}` {r.branch} (M={r.dot_rows})" for r in narrow)
        lines.append(f"- Dots of fewer than {WGMMA_ROWS} rows (sm_90's wgmma is m{WGMMA_ROWS}: these take "
                     f"the older mma.sync path): {names}, "
                     f"{_pct(sum(r.balanced_ms[dev] for r in narrow), total)} of the bound.")
    peak, bw = DEVICES[dev].flops, DEVICES[dev].bandwidth
    flop_bound = sum(r.ms[dev] for r in kern if r.flops / peak >= r.min_bytes / bw)
    lines.append(f"- FLOP-bound launches hold {_pct(flop_bound, c.total('ms', dev))} of the bound; executed "
                 f"dot FLOPs are {c.total('flops') / max(c.total('useful'), 1):.1f}x the useful ones "
                 f"(recompute {c.total('ideal') / max(c.total('useful'), 1):.1f}x); tile traffic is "
                 f"{c.total('tile_bytes') / c.total('min_bytes'):.1f}x the minimum bytes "
                 "(what L2 must absorb).")
    return lines


def summary_markdown(cases: Sequence[Case], devices: Sequence[str]) -> list[str]:
    out = ["", "## Summary: one attention fwd+bwd", "",
           "| layout | T | batch | device | NSA bound ms | NSA bound / balance ms | "
           "NSA useful FLOPs at peak ms | dense flash bound ms | dense / NSA | measured NSA ms | "
           "measured dense ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        for d in devices:
            m = c.measured if _which(d, c.measured.get("device", "")) else {}
            nsa_bal = c.total("balanced_ms", d)
            useful_ms = 1e3 * c.total("useful") / DEVICES[d].flops
            out.append(f"| {c.layout} | {c.shape.T} | {c.shape.B} | {d} | {_ms(c.total('ms', d))} | "
                       f"{_ms(nsa_bal)} | {_ms(useful_ms)} | {_ms(c.dense[d])} | "
                       f"{c.dense[d] / nsa_bal:.2f}x | {_ms(m['nsa_ms']) if m.get('nsa_ms') else '-'} | "
                       f"{_ms(m['dense_ms']) if m.get('dense_ms') else '-'} |")
    return out


def format_markdown(cases: Sequence[Case], devices: Sequence[str], record: Path | None, union: str) -> str:
    peaks = "; ".join(f"{d}: {DEVICES[d].flops / 1e12:.1f} TFLOP/s, {DEVICES[d].bandwidth / 1e12:.2f} TB/s, "
                      f"{DEVICES[d].sms} SMs" for d in devices)
    out = ["# Roofline of one NSA attention fwd+bwd (nsa.ops.triton, bf16)", "",
           f"Peaks: {peaks}. Residency: {record.name if record else 'no compile record'} (sm_90). "
           f"Selection model: {union}. Times are lower bounds: max(GFLOP / peak, MB min / bandwidth), "
           "then / balance. `useful`: share of the dot FLOPs that nsa.stats counts; `masked`: share that "
           "neither it nor the kernel's recomputation needs; `re-read`: tile loads / minimum bytes."]
    for c in cases:
        out += case_markdown(c, devices)
    out += summary_markdown(cases, devices)
    return "\n".join(out) + "\n"


def case_json(c: Case) -> dict[str, Any]:
    return dict(layout=c.layout, shape=dataclasses.asdict(c.shape), dense_ms=c.dense,
                dense_flops=c.dense_flops, dense_bytes=c.dense_bytes, measured=c.measured,
                launches=[dataclasses.asdict(r) for r in c.rows])


def main(argv: Sequence[str] | None = None) -> int:
    layouts = {**LAYOUTS, **EXTRA_LAYOUTS}
    ap = argparse.ArgumentParser(prog="python -m bench.roofline", description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(layouts))
    ap.add_argument("--seqs", nargs="+", type=int, default=[2048, 16384, 65536])
    ap.add_argument("--batch", type=int, default=None,
                    help="batch (default: max(1, --tokens // seq), as bench.run)")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--devices", nargs="+", default=list(DEVICES), choices=list(DEVICES))
    ap.add_argument("--union", choices=UNIONS, default="random",
                    help="free blocks of the positions sharing a selected forward/dQ program: independent "
                         "random picks (as bench.run's random inputs), disjoint (the most work) or shared "
                         "(the least)")
    ap.add_argument("--record", type=Path, default=None, help="compile-gate record for residency "
                    "(default: the newest passing bench/results/compile-triton-*.json)")
    ap.add_argument("--measured", type=Path, default=None,
                    help="a bench.run results JSON to show beside the bounds")
    ap.add_argument("--mma", action="store_true",
                    help="compile each kernel for sm_90 (Triton's compiler, no GPU) and show whether its PTX "
                         "uses wgmma or mma.sync")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = ap.parse_args(argv)
    if args.batch is not None and args.batch < 1 or any(t < 1 for t in args.seqs):
        ap.error("--batch and --seqs must be positive")
    if args.mma and os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("--mma compiles the kernels: unset TRITON_INTERPRET")
    record_path = args.record or latest_record()
    record = read_record(record_path)
    cases = []
    for layout in args.layouts:
        H, G, D = layouts[layout]
        for T in args.seqs:
            B = args.batch or max(1, args.tokens // T)
            c = analyse(layout, Shape(B, T, H, G, D), args.devices, args.union, record)
            if args.measured:
                c.measured = load_measured(args.measured, c)
            if args.mma:
                kinds = mma_kinds(layout, c.shape, DEVICES[args.devices[0]].sms)
                for r in c.rows:
                    r.mma = kinds.get((r.kernel, r.branch)) if r.grid else None
            cases.append(c)
    print(format_markdown(cases, args.devices, record_path, args.union), end="")
    if args.json:
        data = dict(devices={d: dataclasses.asdict(DEVICES[d]) for d in args.devices}, union=args.union,
                    record=str(record_path) if record_path else None, cases=[case_json(c) for c in cases])
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
