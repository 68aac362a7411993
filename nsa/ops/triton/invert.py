"""The selection's inverted index for the selected dK/dV: which query positions chose each
block, and the chunks of those lists that the dK/dV programs take.

Why kernels: built from torch ops it was 20 ops with device work per layer and backward
(a stable sort of int64 keys with their positions gathered after, ``searchsorted`` for the
segments and for the chunks, a cumulative sum between), and a small model's train step is
bound by the host's ops. Here it is three launches and one sort:

1. ``_index_keys``: every selection slot's key ``((b G + g) Ns + j) T + t``, or the
   past-the-end key ``B G Ns T`` for an empty slot (-1). A query selects a block at most
   once, so the keys are distinct and any sort orders each block's queries ascending;
   int32 where the keys fit (half the radix passes of int64, no stable sort needed).
2. ``torch.sort`` of the keys.
3. ``_index_segments``: each query position (``key mod T``), and each segment's start: the
   element where the block of the key changes writes it for every block since the previous
   key's, empty blocks included.
4. ``_index_chunks`` (one program): each block's list cut into chunks of ``CH`` queries;
   a running sum of the chunk counts gives each block's first chunk, and each chunk's
   block is written over its block's range; the static bound's spare chunks get the
   past-the-end block.

Fixed shapes and no host sync, as before. ``inverted_index_torch`` and ``chunk_map_torch``
are the torch versions they replaced, kept as the tests' reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops import poison

BLOCK = 1024  # elements per program of the parallel kernels
KEYS_PER_TILE = 1024  # blocks per tile of the single chunk-planning program
INT32_KEYS = 2**31  # keys up to this (the past-the-end key below it) sort as int32


@triton.jit
def _index_keys(IDX, KEYS, sib, sit, sig, sis, N, T, G, NSEL, NS, NKEYS, BLOCK: tl.constexpr):
    """Keys of the slots in idx's own [B, T, G, n] order (coalesced loads)."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = e < N
    s = e % NSEL
    r = e // NSEL
    g = r % G
    bt = r // G
    t = bt % T
    b = bt // T
    j = tl.load(IDX + b * sib + t * sit + g * sig + s * sis, mask=m, other=-1).to(tl.int64)
    key = tl.where(j >= 0, ((b * G + g) * NS + j) * T + t, (e * 0 + NKEYS) * T)
    tl.store(KEYS + e, key.to(KEYS.dtype.element_ty), mask=m)


@triton.jit
def _index_segments(SKEYS, TLIST, OFFS, N, T, NKEYS, BLOCK: tl.constexpr):
    """Positions from the sorted keys, and segment starts: element e (e = N stands for the
    end, key ``NKEYS T``) starts every block after the previous element's up to its own."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    end = (e * 0 + NKEYS) * T  # int64 (NKEYS may be a constexpr 1)
    key = tl.load(SKEYS + e, mask=e < N, other=end).to(tl.int64)
    k = key // T
    tl.store(TLIST + e, (key - k * T).to(tl.int32), mask=e < N)
    prev = tl.load(SKEYS + e - 1, mask=(e > 0) & (e <= N), other=0).to(tl.int64)
    kp = tl.where(e > 0, prev // T, -1)
    gap = tl.where(e <= N, k - kp, 0)
    for i in range(0, tl.max(gap, axis=0)):
        tl.store(OFFS + kp + 1 + i, e, mask=i < gap)


@triton.jit
def _index_chunks(OFFS, CHUNK_START, KEY_OF_CHUNK, NKEYS, MAXC, CH, KB: tl.constexpr):
    """One program: chunk counts per block, their running sum, and each chunk's block."""
    carry = tl.sum(tl.zeros([KB], dtype=tl.int64), axis=0)
    tl.store(CHUNK_START, carry)
    for k0 in range(0, NKEYS, KB):
        k = k0 + tl.arange(0, KB)
        m = k < NKEYS
        lo = tl.load(OFFS + k, mask=m, other=0)
        hi = tl.load(OFFS + k + 1, mask=m, other=0)
        nc = (hi - lo + CH - 1) // CH
        incl = tl.cumsum(nc, axis=0) + carry
        tl.store(CHUNK_START + k + 1, incl, mask=m)
        first = incl - nc
        for i in range(0, tl.max(nc, axis=0)):
            tl.store(KEY_OF_CHUNK + first + i, k.to(tl.int64), mask=m & (i < nc))
        carry += tl.sum(nc, axis=0)
    for c0 in range(carry, MAXC, KB):
        c = c0 + tl.arange(0, KB)
        tl.store(KEY_OF_CHUNK + c, tl.zeros([KB], dtype=tl.int64) + NKEYS, mask=c < MAXC)


def inverted_index(idx: torch.Tensor, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every (b, g, block j): the query positions that selected it, ascending.

    Returns (tlist int32 [B*T*G*n], offsets int64 [B*G*Ns + 1]); segment
    ``offsets[k]:offsets[k+1]`` with ``k = (b*G + g)*Ns + j``. Past ``offsets[-1]`` (the
    empty slots) ``tlist`` holds 0.
    """
    B, T, G, n = idx.shape
    N = B * T * G * n
    nkeys = B * G * n_blocks
    key_dtype = torch.int32 if nkeys * T < INT32_KEYS else torch.int64
    keys = torch.empty(N, device=idx.device, dtype=key_dtype)
    tlist = poison.empty(N, device=idx.device, dtype=torch.int32)
    offsets = poison.empty(nkeys + 1, device=idx.device, dtype=torch.int64)
    if N:
        _index_keys[(triton.cdiv(N, BLOCK),)](idx, keys, *idx.stride(), N, T, G, n, n_blocks, nkeys,
                                               BLOCK=BLOCK)
    sorted_keys = torch.sort(keys).values
    _index_segments[(triton.cdiv(N + 1, BLOCK),)](sorted_keys, tlist, offsets, N, T, nkeys, BLOCK=BLOCK)
    return tlist, offsets


def chunk_map(offsets: torch.Tensor, chunk: int, max_chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each block's list cut into chunks of at most ``chunk`` queries, in block order.

    Returns (chunk_start int64 [nkeys + 1]: block k's chunks are ``chunk_start[k]`` up to
    ``chunk_start[k+1]``; key_of_chunk int64 [max_chunks]: the block of each chunk, ``nkeys``
    past the last real one). ``max_chunks`` must bound the real chunks (``nkeys + N / chunk``).
    """
    nkeys = offsets.numel() - 1
    chunk_start = poison.empty(nkeys + 1, device=offsets.device, dtype=torch.int64)
    key_of_chunk = poison.empty(max_chunks, device=offsets.device, dtype=torch.int64)
    _index_chunks[(1,)](offsets, chunk_start, key_of_chunk, nkeys, max_chunks, chunk, KB=KEYS_PER_TILE)
    return chunk_start, key_of_chunk


def inverted_index_torch(idx: torch.Tensor, n_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``inverted_index`` from torch ops (a stable sort; past ``offsets[-1]`` ``tlist`` holds
    the empty slots' own positions)."""
    B, T, G, n = idx.shape
    sel = idx.permute(0, 2, 1, 3)  # [B,G,T,n]
    bg = torch.arange(B * G, device=idx.device).view(B, G, 1, 1)
    keys = torch.where(sel >= 0, bg * n_blocks + sel, B * G * n_blocks).reshape(-1)
    tpos = torch.arange(T, device=idx.device, dtype=torch.int32).view(1, 1, T, 1).expand(B, G, T, n)
    sorted_keys, order = torch.sort(keys, stable=True)
    tlist = tpos.reshape(-1)[order].contiguous()
    bounds = torch.arange(B * G * n_blocks + 1, device=idx.device, dtype=sorted_keys.dtype)
    return tlist, torch.searchsorted(sorted_keys, bounds)


def chunk_map_torch(offsets: torch.Tensor, chunk: int, max_chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk_map`` from torch ops."""
    n_chunks = (offsets[1:] - offsets[:-1] + chunk - 1) // chunk
    chunk_start = torch.zeros(offsets.numel(), device=offsets.device, dtype=torch.int64)
    chunk_start[1:] = torch.cumsum(n_chunks, 0)
    arange = torch.arange(max_chunks, device=offsets.device)
    return chunk_start, torch.searchsorted(chunk_start[1:], arange, right=True)
