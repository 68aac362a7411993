"""Bitonic sorting of small register tiles, for the top-n merge, the selected kernels' union and
the decode kernels' candidate lists.

``tl.sort`` finds each element's partner with an xor-reduction, which Triton's
interpreter runs element by element in Python (minutes per call in the CPU tests); these
helpers use min/max reductions over each compare-exchange pair instead, which both the
compiler and the interpreter handle as ordinary reductions. Rows are sorted
independently: ``x [P, N]`` with N a power of two.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Sorts after every block index (block indices are below 2**31 - 1).
NO_BLOCK = tl.constexpr(2**31 - 1)


@triton.jit
def _swap(x, RUN: tl.constexpr, DESC: tl.constexpr, P: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """One compare-exchange step on the columns of ``x [P, N]``: in every aligned block of
    2S columns (S = 2**K), columns c and c + S get (min, max). The direction flips with
    bit RUN of the column (runs of 2**RUN alternate) unless RUN == log2(N), where all
    blocks go one way (descending if DESC). Min/max over the pair: no partner gather."""
    S: tl.constexpr = 1 << K
    y = tl.reshape(x, [P, N // (2 * S), 2, S])
    lo = tl.min(y, 2, keep_dims=True)
    hi = tl.max(y, 2, keep_dims=True)
    if (1 << RUN) == N:
        down = tl.zeros([N // (2 * S)], tl.int32) + DESC
    else:
        down = ((tl.arange(0, N // (2 * S)) * (2 * S)) >> RUN) & 1
    right = (tl.arange(0, 2) == 1)[None, None, :, None]
    y = tl.where(right != (down != 0)[None, :, None, None], hi, lo)
    return tl.reshape(y, [P, N])


@triton.jit
def _bitonic_sort(x, DESC: tl.constexpr, P: tl.constexpr, N: tl.constexpr, LOGN: tl.constexpr):
    """Sort every row of ``x [P, N]`` (N = 2**LOGN), ascending or descending."""
    for m in tl.static_range(1, LOGN + 1):  # sorted runs of 2**m, alternating direction
        for i in tl.static_range(m):
            x = _swap(x, m, DESC, P, N, m - 1 - i)
    return x


@triton.jit
def _bitonic_merge(x, P: tl.constexpr, N: tl.constexpr, LOGN: tl.constexpr):
    """Sort every row of a bitonic ``x [P, N]`` ascending (log N steps)."""
    for i in tl.static_range(LOGN):
        x = _swap(x, LOGN, 0, P, N, LOGN - 1 - i)
    return x


@triton.jit
def _half_clean_rows(x, ALT: tl.constexpr, P: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """One compare-exchange step on every row of ``x [P, N]``: in every aligned block of 2S
    columns (S = 2**K), columns c and c + S get (min, max), or with ALT (max, min) in the odd
    rows (rows of alternating direction)."""
    S: tl.constexpr = 1 << K
    y = tl.reshape(x, [P, N // (2 * S), 2, S])
    lo = tl.min(y, 2, keep_dims=True)
    hi = tl.max(y, 2, keep_dims=True)
    right = (tl.arange(0, 2) == 1)[None, None, :, None]
    if ALT:
        down = (tl.arange(0, P) % 2 == 1)[:, None, None, None]
        y = tl.where(right != down, hi, lo)
    else:
        y = tl.where(right, hi, lo)
    return tl.reshape(y, [P, N])


@triton.jit
def _merge_row_pairs(x, K: tl.constexpr, N: tl.constexpr, LOGN: tl.constexpr):
    """K sorted rows ``x [K, N]``, the even ones ascending and the odd ones descending ->
    ``[K // 2, N]``: row i the N largest of rows 2i and 2i + 1. Their elementwise max holds
    those N and is bitonic, so log N half-cleaning steps sort it; while K // 2 > 1 the odd
    rows come out descending again, so the result pairs up the same way, and the last row
    ascending."""
    a, b = tl.split(tl.permute(tl.reshape(x, [K // 2, 2, N]), (0, 2, 1)))
    c = tl.maximum(a, b)
    for i in tl.static_range(LOGN):
        c = _half_clean_rows(c, K > 2, K // 2, N, LOGN - 1 - i)
    return c
