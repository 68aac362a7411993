"""The launch model of one NSA fwd+bwd, for ``bench.roofline``: every kernel (and torch op)
launch of ``bench.core.nsa_attention`` through ``nsa.ops.triton``, in order, with what each
of its programs does (dot FLOPs at tile size, tile bytes loaded and stored) and the launch's
useful FLOPs and minimum bytes; the selection model behind the selected kernels' work; the
dense FlashAttention-2 comparison.

It is a module of its own because it mirrors the kernels, not the devices: the launch
parameters come from the kernels' own tuning helpers (the default config through
``tuning.candidates``, ``selected._sizes``, ``topn._tiles``, ``glue._rows_per_program``,
the wrapper's compressed dK/dV split) and the tile counts follow their loop bounds
(``band.py``'s ``_key_range`` / ``_interior_keys`` and dK/dV ranges, ``topn.py``'s block
loop, the selected kernels' union and chunks), in one place each.
``tests/test_bench_roofline.py`` checks the grids and warps against the wrappers' real
launches and every program's dot FLOPs against the interpreter's count.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bench.core import NSA
from nsa.ops.triton import band, glue, invert, selected, topn, tuning

CAPABILITY = 90  # the devices modelled (H100, H200) are sm_90: the configs the wrappers choose there
E = 2  # bytes per element of q, k, v, o and their gradients (bf16, as bench.run)
F32 = 4
I64 = 8
I32 = 4


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
    """The default config of a tunable kernel for these constexprs: what ``tuning.launch`` runs
    on an H100 or H200."""
    with tuning.assumed_capability(CAPABILITY):
        config = tuning.candidates(kernel, (), kwargs)[0]
    return dict(config.kwargs), config.num_warps


def cmp_split(n_cmp: int, B: int, G: int, D: int, sms: int) -> int:
    """``nsa.ops.triton._cmp_split`` for a device with ``sms`` SMs (0: not a GPU)."""
    if sms == 0:
        return 1
    tiles = max(1, _cdiv(n_cmp, band.dkdv_key_tile(D, CAPABILITY))) * B * G
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


def _streaming(kernel: str, branch: str, phase: str, n: int, per_program: int, per_item: int,
               warps: int = 4, note: str = "") -> Launch:
    """A memory-only launch: ``per_program`` items (rows, elements) of ``per_item`` bytes per
    program, the last program the remainder of ``n``."""
    programs = _cdiv(n, per_program)
    r = np.full(programs, per_program)
    r[-1] = n - per_program * (programs - 1)
    tb = (r * per_item).astype(float)
    return Launch(kernel, branch, phase, (programs,), warps, np.zeros(programs), tb,
                  min_bytes=float(tb.sum()), note=note)


def _delta(s: Shape, branch: str, heads_major: bool) -> Launch:
    """``glue.row_delta``: one program per ``4096 // BD`` rows of O and dO."""
    _, br = glue._rows_per_program(s.D)
    return _streaming("_delta_kernel", branch, "bwd", s.B * s.T * s.H, br, 2 * s.D * E + F32,
                      note="heads-major" if heads_major else "")


def _combine(s: Shape) -> list[Launch]:
    """``GatedCombine`` forward (4 warps) and backward (8 warps)."""
    rows = s.B * s.T * s.H
    _, br = glue._rows_per_program(s.D)
    return [_streaming("_combine_fwd", "combine", "fwd", rows, br, 3 * E + 4 * s.D * E),
            _streaming("_combine_bwd", "combine", "bwd", rows, br, 3 * E + 3 * F32 + 7 * s.D * E, warps=8)]


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


def _selected_launches(s: Shape, sel: Selection, sms: int) -> tuple[list[Launch], list[Launch]]:
    """Forward and backward launches of ``selected_attention`` (selected.py) on a GPU of ``sms``
    SMs (its dK/dV chunk length)."""
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
    # the inverted index and chunk map (invert.py): the keys, their sort (4 radix passes over
    # 32-bit keys carrying int64 indices, read and written), the positions and segments
    N = B * T * G * s.n
    nkeys = B * G * s.ns
    kb = I32 if nkeys * T < invert.INT32_KEYS else I64
    bwd.append(_streaming("_index_keys", "selected", "bwd", N, invert.BLOCK, I64 + kb))
    passes = 4 if kb == I32 else 8
    sort_bytes = float(N * passes * 2 * (kb + I64))
    bwd.append(_torch("sort of the index keys", "selected", sort_bytes, launches=passes))
    bwd.append(_streaming("_index_segments", "selected", "bwd", N + 1, invert.BLOCK, 2 * kb + I32))
    ch = max(qc, selected.dkdv_chunk(N, s.n, s.select_block, sms))
    ch = _cdiv(ch, qc) * qc
    max_chunks = nkeys + _cdiv(N, ch)
    plan = float(nkeys * 3 * I64 + max_chunks * I64)
    tiles = _cdiv(nkeys, invert.KEYS_PER_TILE)
    bwd.append(Launch("_index_chunks", "selected", "bwd", (1,), 4, np.zeros(1), np.array([plan]),
                      min_bytes=plan, note=f"one program: {tiles} tiles of blocks"))
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


def scores_programs(s: Shape, P: int, BN: int, BJ: int) -> dict[str, np.ndarray]:
    """Per position tile ``pid_m`` of ``_scores_topn`` (index = pid_m): key tiles over its
    selection-block tiles (each tile's main range; its halo is the previous tile's), block
    tiles, compressed keys loaded. Mirrors its loops."""
    T, blk, st, sb = s.T, s.block, s.stride, s.select_block
    t0 = np.arange(_cdiv(T, P), dtype=np.int64) * P
    last = np.minimum(T, t0 + P) - 1
    i_vis = np.minimum(np.where(last >= blk - 1, np.maximum(last - blk + 1, 0) // st + 1, 0), s.nc)
    ns_hi = last // sb + 1
    j0 = np.arange(_cdiv(int(ns_hi.max()), BJ), dtype=np.int64)[None, :] * BJ
    on = j0 < ns_hi[:, None]
    i_main = (j0 * sb + st - 1) // st
    i_end = np.minimum((j0 * sb + BJ * sb + st - 1) // st, i_vis[:, None])
    main = np.where(on, _cdiv0(i_end - i_main, BN), 0).sum(1)
    keys = np.where(on, np.maximum(i_end - i_main, 0), 0).sum(1)
    return dict(main=main, tiles=on.sum(1), keys=keys, positions=last + 1 - t0)


def _scores_launch(s: Shape) -> Launch:
    """``_scores_topn`` in its top-n mode (``selection_from_lse``)."""
    c = topn._tiles(s.hpg, s.D, s.block, s.stride, s.select_block, s.n)
    P, hpgp, bd, BN, BJ = c["P"], c["HPGP"], c["BD"], c["BN"], c["BJ"]
    R = P * hpgp
    _, w = _tiles(topn._scores_topn, TOPN=True)
    p = scores_programs(s, P, BN, BJ)
    wdot = 2.0 * P * BJ if P >= 16 else 0.0  # the Eq. 9 weights as an fp32 dot
    per = p["main"] * (2.0 * R * bd * BN + wdot * BN)
    rows = p["positions"] * s.hpg
    tb = rows * (s.D * E + F32) + p["keys"] * s.D * E + p["positions"] * s.n * I64
    rev = slice(None, None, -1)
    BG = s.B * s.G
    cmp_pairs = band_pairs(s.T, s.nc, s.stride, s.block - 1, s.T + 1) * s.B * s.H
    min_bytes = s.B * s.T * s.H * (s.D * E + F32) + s.B * s.nc * s.G * s.D * E + s.B * s.T * s.G * s.n * I64
    return Launch("_scores_topn", "compressed", "fwd", (_cdiv(s.T, P), BG), w, np.tile(per[rev], BG),
                  np.tile(tb[rev], BG).astype(float), 0.0, 2.0 * s.D * cmp_pairs, min_bytes,
                  f"P={P} BN={BN} BJ={BJ} MC={c['MC']}", min(R, P) if P >= 16 else R)


# ----------------------------------------------------------------------------- one fwd+bwd


def nsa_launches(s: Shape, sms: int, sel: Selection | None = None, union: str = "random") -> list[Launch]:
    """Every launch of one ``bench.core.nsa_attention`` fwd+bwd through ``nsa.ops.triton``, in
    order (the backward in autograd's order: combine, window, selected, compressed)."""
    R, P = selected._sizes(s.hpg, s.D, s.select_block, None)[:2]
    sel = sel or selection_model(s, P, union)
    cmp = _band_launches(s, "compressed", s.nc, s.stride, s.block - 1, s.T + 1,
                         cmp_split(s.nc, s.B, s.G, s.D, sms))
    win = _band_launches(s, "window", s.T, 1, 0, s.window, 1)
    sel_fwd, sel_bwd = _selected_launches(s, sel, sms)
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
