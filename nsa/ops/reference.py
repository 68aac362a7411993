"""Reference NSA attention ops in plain PyTorch (the CPU path and the kernels' oracle).

Every function follows the ops contract (docs/ops-contract.md): ``q [B, T, H, D]``,
``k, v [B, T, G, D]`` with query head h in KV group ``h // (H // G)``. They are
vectorized: no Python loop over positions, tokens, heads or rows and no host sync, so
they trace under ``torch.compile(fullgraph=True)``.

Memory is linear in T for everything the model calls. Each query of the selected branch
attends over the ``n * l'`` keys of its own selected blocks, gathered per query; a chunk
of C window queries attends over the ``C + w - 1`` keys that any of them can see, under a
band mask. Queries are processed in chunks whose length depends on the layout, never on T
(a Python loop over chunks, not positions), each under ``torch.utils.checkpoint`` when
autograd records, so that neither the forward's temporaries nor the tensors saved for the
backward grow faster than T. The compressed branch (``T x Nc`` scores, Nc ~ T/d: quadratic
work, 1/d of dense attention's) is chunked the same way in
``compressed_attention_and_scores``; only the contract's ``compressed_attention``, which
must return the ``[B, T, H, Nc]`` probabilities, holds them all. The Triton kernels are
the fast path; this is the one that is obviously right.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = [
    "block_view",
    "num_compressed",
    "num_select_blocks",
    "compressed_attention",
    "compressed_attention_and_scores",
    "selection_scores",
    "select_blocks",
    "select_blocks_at",
    "selected_attention",
    "window_attention",
]


def num_compressed(T: int, block: int, stride: int) -> int:
    """Number of compressed tokens: token i covers ``[i*stride, i*stride + block)``."""
    return (T - block) // stride + 1 if T >= block else 0


def num_select_blocks(T: int, select_block: int) -> int:
    """Number of selection blocks ``ceil(T / l')`` (the last one may be partial)."""
    return (T + select_block - 1) // select_block


def block_view(x: torch.Tensor, block: int, stride: int) -> torch.Tensor:
    """``x [B, T, G, D] -> [B, Nc, block, G, D]``: the overlapping blocks, as a view (no copy)."""
    B, T, G, D = x.shape
    if T < block:
        return x.new_zeros(B, 0, block, G, D)
    # unfold puts the window last: [B, Nc, G, D, block]
    return x.unfold(1, block, stride).permute(0, 1, 4, 2, 3)


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: fp64 stays fp64 (tests), everything else computes in fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q [B,T,H,D]`` over ``k, v [B,S,G,D]`` where ``mask`` (bool,
    broadcastable to ``[B, G, R, T, S]``) says which keys a query may see, with the
    probabilities (for the compressed branch, whose probabilities rank the blocks).

    Rows with no visible key give output 0 and probabilities 0, never NaN. Softmax in
    fp32 (fp64 for fp64 inputs). Returns (out [B,T,H,D], probs [B,G,R,T,S]).
    """
    B, T, H, D = q.shape
    G = k.shape[2]
    R = H // G
    acc = _acc_dtype(q)
    qg = q.reshape(B, T, G, R, D).to(acc) * scale
    scores = torch.einsum("btgrd,bsgd->bgrts", qg, k.to(acc))
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # finfo.min (not -inf) keeps fully masked rows finite; they are zeroed by row below
    probs = torch.softmax(scores, dim=-1) * mask.any(dim=-1, keepdim=True)
    out = torch.einsum("bgrts,bsgd->btgrd", probs.to(v.dtype), v)
    return out.reshape(B, T, H, v.shape[-1]), probs


# Elements of the largest per-chunk temporary (gathered keys or scores) the chunked
# branches aim at: on CPU 2**22 (16 MiB in fp32), on a GPU 2**26 (256 MiB: fewer, larger
# chunks, fewer kernel launches). The chunk length follows from these, the batch and the
# head layout, never from T, so peak memory stays linear in T.
CHUNK_ELEMS = 1 << 22
CHUNK_ELEMS_GPU = 1 << 26
WHOLE_CALL_CHUNKS = 8


def _chunk_len(T: int, per_query: int, device: torch.device, whole: int | None = None) -> int:
    """Queries per chunk so that a chunk's largest temporary has about ``CHUNK_ELEMS``
    (``CHUNK_ELEMS_GPU`` off the CPU) elements, with ``per_query`` elements per query
    position; at least 1, at most T. A call whose whole temporary (``whole``, default
    ``T * per_query``) stays within ``WHOLE_CALL_CHUNKS`` budgets runs as one chunk (no
    loop, no checkpoint: small calls are faster that way, and their memory is bounded by
    that constant)."""
    budget = _budget(device)
    if (T * per_query if whole is None else whole) <= WHOLE_CALL_CHUNKS * budget:
        return T
    return max(1, min(T, budget // max(1, per_query)))


def _budget(device: torch.device) -> int:
    return CHUNK_ELEMS if device.type == "cpu" else CHUNK_ELEMS_GPU


def _over_chunks(
    fn: Callable[..., tuple[torch.Tensor, ...]], T: int, chunk: int, *args: object
) -> tuple[torch.Tensor, ...]:
    """``fn(t0, t1, *args)`` for each query chunk ``[t0, t1)``, outputs concatenated on dim 1.

    With more than one chunk and autograd recording, each chunk runs under a
    non-reentrant checkpoint: its temporaries are recomputed in the backward one chunk
    at a time instead of being saved for all chunks. ``fn`` gets everything as
    arguments (no closure over the loop variable: recompute would see its last value)."""
    ckpt = torch.is_grad_enabled() and chunk < T
    outs = []
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        if ckpt:
            outs.append(checkpoint(fn, t0, t1, *args, use_reentrant=False, preserve_rng_state=False))
        else:
            outs.append(fn(t0, t1, *args))
    if len(outs) == 1:
        return outs[0]
    return tuple(torch.cat(parts, dim=1) for parts in zip(*outs))


def _attend(qg: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-query attention over per-query key sets, in the accumulation dtype.

    ``qg [B, C, G, R, D]`` (already scaled), ``keys [B, C, G, K, D]``, ``vals [B, C, G, K, Dv]``,
    ``mask [B | 1, C, G, K]`` (bool). A row with no visible key gives 0, never NaN.
    Returns ``[B, C, G, R, Dv]``. Scores are kept as ``[keys, heads]`` per query: the
    backward's products then read contiguous operands (measured ~15% faster on CPU)."""
    B, C, G, R, D = qg.shape
    K = keys.shape[3]
    scores = torch.bmm(keys.to(qg.dtype).reshape(-1, K, D), qg.reshape(-1, R, D).transpose(1, 2))
    mask = mask[..., None]  # [B | 1, C, G, K, 1]
    scores = scores.view(B, C, G, K, R).masked_fill(~mask, torch.finfo(scores.dtype).min)
    # finfo.min (not -inf) keeps fully masked rows finite; they are zeroed by row below
    probs = torch.softmax(scores, dim=-2) * mask.any(dim=-2, keepdim=True)
    out = torch.bmm(probs.reshape(-1, K, R).transpose(1, 2), vals.to(qg.dtype).reshape(-1, K, vals.shape[-1]))
    return out.view(B, C, G, R, -1)


def compressed_attention(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    block: int,
    stride: int,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention over compressed tokens ``k_cmp, v_cmp [B, Nc, G, D]``.

    Query t sees compressed token i iff its block has ended: ``i*stride + block - 1 <= t``
    (docs/lessons.md#causal-selection). Returns (out [B,T,H,D], probs [B,T,H,Nc]); the probabilities feed the
    block selection.
    """
    B, T, H, D = q.shape
    Nc = k_cmp.shape[1]
    scale = D**-0.5 if scale is None else scale
    t = torch.arange(T, device=q.device)
    ends = torch.arange(Nc, device=q.device) * stride + (block - 1)
    mask = ends[None, :] <= t[:, None]  # [T, Nc]
    out, probs = _masked_attention(q, k_cmp, v_cmp, mask, scale)
    probs = probs.permute(0, 3, 1, 2, 4).reshape(B, T, H, Nc)
    return out, probs


def _overlap_matrix(T: int, block: int, stride: int, select_block: int, device: torch.device) -> torch.Tensor:
    """``W[i, j] = |[i*d, i*d+l) ∩ [j*l', (j+1)*l')| / d`` (Eq. 9 as overlap lengths)."""
    Nc = num_compressed(T, block, stride)
    Ns = num_select_blocks(T, select_block)
    c0 = torch.arange(Nc, device=device) * stride
    s0 = torch.arange(Ns, device=device) * select_block
    lo = torch.maximum(c0[:, None], s0[None, :])
    hi = torch.minimum(c0[:, None] + block, s0[None, :] + select_block)
    return (hi - lo).clamp_min(0).to(torch.float64) / stride


def selection_scores(
    probs: torch.Tensor, n_kv_heads: int, block: int, stride: int, select_block: int
) -> torch.Tensor:
    """Block importance per KV group: ``probs [B,T,H,Nc] -> [B,T,G,Ns]``.

    Eq. 9: the compressed probabilities spread over the selection blocks they overlap,
    weighted by overlap length / stride. Eq. 10: summed over the query heads of a group,
    so all heads of a group select the same blocks.
    """
    W = _overlap_matrix(probs.shape[1], block, stride, select_block, probs.device)
    return _scores_from_probs(probs, n_kv_heads, W)


def _scores_from_probs(probs: torch.Tensor, n_kv_heads: int, W: torch.Tensor) -> torch.Tensor:
    """Eq. 9 + 10 for ``probs [B, C, H, Nc]`` (any run of queries) with the overlap matrix
    ``W [Nc, Ns]`` of the whole sequence."""
    B, C, H, _ = probs.shape
    acc = _acc_dtype(probs)
    p_slc = torch.matmul(probs.to(acc), W.to(acc))  # [B, C, H, Ns]
    return p_slc.reshape(B, C, n_kv_heads, H // n_kv_heads, -1).sum(dim=3)


def select_blocks(
    scores: torch.Tensor, select_block: int, num_selected: int, num_initial: int, num_local: int
) -> torch.Tensor:
    """Top-n selection blocks per (query, group): ``scores [B,T,G,Ns] -> idx [B,T,G,n]``.

    Never a block that starts after the query; the first ``num_initial`` blocks and the
    ``num_local`` blocks ending with the query's own block are always in (when they
    exist); the rest by score, ties towards the lower block index. Ascending block order,
    unused slots -1 (last). In query chunks (no gradient): the sort's temporaries are a
    few times the chunk's scores, not the whole ``T x Ns``.
    """
    B, T, G, Ns = scores.shape
    chunk = _chunk_len(T, 4 * B * G * max(Ns, 1), scores.device)
    args = (scores.detach(), select_block, num_selected, num_initial, num_local)
    with torch.no_grad():
        parts = [_select_chunk(t0, min(T, t0 + chunk), *args) for t0 in range(0, T, chunk)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _select_chunk(
    t0: int, t1: int, scores: torch.Tensor, select_block: int, num_selected: int, num_initial: int,
    num_local: int,
) -> torch.Tensor:
    """``select_blocks`` of the queries ``[t0, t1)``."""
    t = torch.arange(t0, t1, device=scores.device)[None, :]
    return select_blocks_at(scores[:, t0:t1], t, select_block, num_selected, num_initial, num_local)


def select_blocks_at(
    scores: torch.Tensor, t: torch.Tensor, select_block: int, num_selected: int, num_initial: int,
    num_local: int,
) -> torch.Tensor:
    """The selection rule of ``select_blocks`` for queries at positions ``t [B | 1, C]``
    with scores ``[B, C, G, Ns]`` -> ``idx [B, C, G, n]``: the one rule, used by the
    training forward (``t`` = its query range) and by the KV-cache decoder (``t`` = each
    sequence's position). ``Ns`` may exceed the blocks that exist yet: blocks that start
    after the query are never chosen."""
    Ns = scores.shape[-1]
    dev = scores.device
    t = t[..., None]  # [B | 1, C, 1]
    j = torch.arange(Ns, device=dev)
    own = t // select_block
    eligible = j <= own  # j*l' <= t; [B | 1, C, Ns]
    forced = eligible & ((j < num_initial) | (j > own - num_local))
    # +-inf as Python scalars, not torch.tensor(inf, device=...): a tensor built from host
    # data is a host-to-device copy per call, which a CUDA graph of the decode step cannot hold
    inf = float("inf")
    key = torch.where(eligible[:, :, None, :], scores.to(_acc_dtype(scores)), -inf)
    key = torch.where(forced[:, :, None, :], inf, key)  # [B, C, G, Ns]
    k = min(num_selected, Ns)
    # stable descending sort: equal keys keep ascending block order
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :k]
    chosen = torch.gather(key, -1, order) > -inf
    idx = torch.where(chosen, order, Ns)  # Ns sorts after every real block
    idx = torch.sort(idx, dim=-1).values
    idx = torch.where(idx == Ns, -1, idx)
    if k < num_selected:
        idx = F.pad(idx, (0, num_selected - k), value=-1)
    return idx


# Selected branch: per-query gather of the n blocks, or a masked scan (fused SDPA) of the
# keys before each chunk's end, whichever costs less. Measured on CPU, one thread
# (nsa-125m's layout at T = 1k..8k, tiny-cpu's at 256): a scanned key costs about 0.6 of
# a gathered key's R*D multiply-adds, and a gathered key carries a further ~192 (the
# gather, small per-query products): the scan wins below T ~ 4k at nsa-125m's layout,
# far longer with few heads per group or a small head dim. SELECTED_PATH forces one way
# ("gather" / "prefix"; None: by that estimate).
GATHER_KEY_OVERHEAD = 192
SELECTED_PATH: str | None = None


def _scan_limit(R: int, D: int, n: int, lp: int) -> int:
    """The length below which scanning the prefix is cheaper than gathering n blocks."""
    return 10 * n * lp * (R * D + GATHER_KEY_OVERHEAD) // (3 * R * D) + 1


def _use_gather(T: int, R: int, D: int, n: int, lp: int) -> bool:
    if SELECTED_PATH is not None:
        return SELECTED_PATH == "gather"
    return T >= _scan_limit(R, D, n, lp)


def selected_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    select_block: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of each query (all heads of group g) over the tokens ``s <= t`` of its
    selected blocks ``idx [B,T,G,n]`` (-1 slots ignored; ``idx`` is a set: a block listed
    twice counts once). A query whose blocks hold no token ``<= t`` gets 0.

    Long sequences: per query the n blocks (``n * l'`` keys) are gathered and masked
    causally inside the query's own block, O(T * n * l') work and memory. Short ones (see
    ``_use_gather``): each chunk of queries scans the keys before its end in one fused
    SDPA call under a mask of its selected blocks, O(T^2) work that costs less there.
    Both in chunks whose length does not depend on T."""
    B, T, H, D = q.shape
    G, n = idx.shape[2], idx.shape[3]
    scale = D**-0.5 if scale is None else scale
    lp = select_block
    width = max(D, H // G, v.shape[-1])
    if not _use_gather(T, H // G, D, n, lp):
        # a chunk's largest temporary: scores [B, H, C, t1] if SDPA materialises them; this
        # path means t1 <= T < _scan_limit, a bound that does not grow with T
        per_query = B * H * _scan_limit(H // G, D, n, lp)
        chunk = _chunk_len(T, per_query, q.device, whole=B * H * T * T)
        return _over_chunks(_selected_prefix_chunk, T, chunk, q, k, v, idx, lp, scale)[0]
    kb, vb = _as_blocks(k, lp), _as_blocks(v, lp)
    chunk = _chunk_len(T, B * G * n * lp * width, q.device)
    return _over_chunks(_selected_chunk, T, chunk, q, kb, vb, idx, lp, scale)[0]


def _selected_prefix_chunk(
    t0: int, t1: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, lp: int,
    scale: float,
) -> tuple[torch.Tensor]:
    """Selected attention of the queries ``[t0, t1)`` over the keys ``[0, t1)``: key s is
    visible to query t iff ``s <= t`` and t selected the block ``s // l'``."""
    B, G, C, dev = q.shape[0], idx.shape[2], t1 - t0, q.device
    nb = (t1 + lp - 1) // lp  # blocks that hold the keys [0, t1)
    sel = idx[:, t0:t1]
    slot = torch.where((sel >= 0) & (sel < nb), sel, nb)  # -1 and blocks past t1 -> a dropped column
    chosen = torch.zeros(B, C, G, nb + 1, dtype=torch.bool, device=dev).scatter(-1, slot, True)
    s = torch.arange(t1, device=dev)
    t = torch.arange(t0, t1, device=dev)
    mask = chosen[..., s // lp] & (s[None, :] <= t[:, None])[None, :, None, :]  # [B, C, G, t1]
    out = _sdpa_chunk(q[:, t0:t1], k[:, :t1], v[:, :t1], mask.permute(0, 2, 1, 3), scale)
    return (out.to(q.dtype),)


def _sdpa_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Fused masked attention (``F.scaled_dot_product_attention``) of a chunk of queries
    ``q [B, C, H, D]`` over ``k, v [B, L, G, D]``; ``mask`` (bool, ``[C, L]`` or
    ``[B, G, C, L]``) says which keys a query sees. In the accumulation dtype (fp32, fp64
    for fp64 inputs). A row that sees no key gives 0: it is shown key 0 (so the fused
    kernel never meets an empty row, whose result differs between backends) and its
    output is zeroed, which zeroes its gradients too."""
    B, C, H, D = q.shape
    L, G = k.shape[1], k.shape[2]
    R = H // G
    acc = _acc_dtype(q)
    empty = ~mask.any(dim=-1, keepdim=True)  # [..., C, 1]
    mask = mask | (empty & (torch.arange(L, device=q.device) == 0))
    # the group joins the batch, so a per-group mask is shared by the group's R heads
    qb = q.reshape(B, C, G, R, D).permute(0, 2, 3, 1, 4).reshape(B * G, R, C, D).to(acc)
    kb = k.permute(0, 2, 1, 3).reshape(B * G, 1, L, D).to(acc)
    vb = v.permute(0, 2, 1, 3).reshape(B * G, 1, L, v.shape[-1]).to(acc)
    per_group = mask.dim() == 4
    mb = mask.reshape(B * G, 1, C, L) if per_group else mask
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mb, scale=scale, enable_gqa=True)
    out = out.masked_fill(empty.reshape(B * G, 1, C, 1) if per_group else empty, 0.0)
    return out.reshape(B, G, R, C, -1).permute(0, 3, 1, 2, 4).reshape(B, C, H, -1)


def _as_blocks(x: torch.Tensor, lp: int) -> torch.Tensor:
    """``x [B, T, G, D] -> [B*G*Ns, l', D]``: one row per (batch, group, selection block).
    The last block is zero-padded; the padding is never visible (it lies after every query)."""
    B, T, G, D = x.shape
    Ns = num_select_blocks(T, lp)
    x = F.pad(x, (0, 0, 0, 0, 0, Ns * lp - T))
    return x.reshape(B, Ns, lp, G, D).permute(0, 3, 1, 2, 4).reshape(B * G * Ns, lp, D)


def _selected_chunk(
    t0: int, t1: int, q: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, idx: torch.Tensor, lp: int,
    scale: float,
) -> tuple[torch.Tensor]:
    """Selected attention of the queries ``[t0, t1)``; ``kb, vb [B*G*Ns, l', D]``."""
    B, _, H, D = q.shape
    G, n = idx.shape[2], idx.shape[3]
    R, C, dev = H // G, t1 - t0, q.device
    Ns = kb.shape[0] // (B * G)
    sel = idx[:, t0:t1]  # [B, C, G, n]
    slot = torch.arange(n, device=dev)
    earlier = slot[None, :] < slot[:, None]  # [n, n]: slot j comes before slot i
    repeat = ((sel[..., :, None] == sel[..., None, :]) & earlier).any(dim=-1)
    valid = (sel >= 0) & ~repeat  # [B, C, G, n]
    blk = sel.clamp_min(0)
    row = (torch.arange(B, device=dev)[:, None] * G + torch.arange(G, device=dev)[None, :]) * Ns
    flat = (row[:, None, :, None] + blk).reshape(-1)
    keys = kb.index_select(0, flat).reshape(B, C, G, n * lp, D)
    vals = vb.index_select(0, flat).reshape(B, C, G, n * lp, vb.shape[-1])
    t = torch.arange(t0, t1, device=dev)
    pos = blk[..., None] * lp + torch.arange(lp, device=dev)  # [B, C, G, n, l']
    mask = valid[..., None] & (pos <= t[None, :, None, None, None])
    mask = mask.reshape(B, C, G, n * lp)
    acc = _acc_dtype(q)
    qg = q[:, t0:t1].reshape(B, C, G, R, D).to(acc) * scale
    out = _attend(qg, keys, vals, mask)
    return (out.reshape(B, C, H, -1).to(q.dtype),)


def window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float | None = None
) -> torch.Tensor:
    """Sliding-window attention: query t sees keys ``t - window < s <= t``.

    Queries in chunks of C: chunk ``[t0, t0 + C)`` attends over the ``C + w - 1`` keys
    ``[t0 - w + 1, t0 + C)`` under a band mask (K/V padded with ``w - 1`` zero rows in
    front). O(T * (w + C)) work and memory; one GEMM per chunk and KV group."""
    B, T, H, D = q.shape
    G = k.shape[2]
    scale = D**-0.5 if scale is None else scale
    w = max(1, min(window, T))  # a window past the start sees the same keys as one of length T
    kp = F.pad(k, (0, 0, 0, 0, w - 1, 0))  # key s is row s + w - 1
    vp = F.pad(v, (0, 0, 0, 0, w - 1, 0))
    # C = max(64, w/4): few chunks, and the band's wasted corner (C / w) stays small; the
    # budget bounds B * H * C * (C + w)
    width = B * max(H, G * D)
    c = max(64, w // 4)
    chunk = _chunk_len(T, width * (c + w), q.device, whole=width * T * (T + w))
    chunk = chunk if chunk == T else min(c, chunk)
    return _over_chunks(_window_chunk, T, chunk, q, kp, vp, w, scale)[0]


def _window_chunk(
    t0: int, t1: int, q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, w: int, scale: float
) -> tuple[torch.Tensor]:
    """Window attention of the queries ``[t0, t1)``: key column j of the chunk is row
    ``t0 + j`` of the padded ``kp, vp``, i.e. position ``s = t0 - w + 1 + j``."""
    C, L, dev = t1 - t0, t1 - t0 + w - 1, q.device
    i = torch.arange(C, device=dev)[:, None]
    j = torch.arange(L, device=dev)[None, :]
    # s <= t: j <= i + w - 1; s > t - w: j >= i; s >= 0: j >= w - 1 - t0
    mask = (j >= i) & (j <= i + (w - 1)) & (j >= w - 1 - t0)  # [C, L]; row i always sees j = i + w - 1
    out = _sdpa_chunk(q[:, t0:t1], kp[:, t0 : t0 + L], vp[:, t0 : t0 + L], mask, scale)
    return (out.to(q.dtype),)


def compressed_attention_and_scores(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    block: int,
    stride: int,
    select_block: int,
    n_kv_heads: int,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B,T,H,D], scores [B,T,G,Ns])``: compressed attention and the selection
    scores it implies (Eq. 9 + 10), without gradient through the scores.

    Same maths as ``compressed_attention`` then ``selection_scores``, in query chunks so
    that the ``T x Nc`` probabilities never exist at once (the work stays O(T * Nc)). The
    Triton backend computes the same pair without materialising them either."""
    B, T, H, D = q.shape
    scale = D**-0.5 if scale is None else scale
    W = _overlap_matrix(T, block, stride, select_block, q.device).to(_acc_dtype(q))
    # a chunk holds a few [B, H, C, Nc] tensors: C from the layout and a nominal Nc of
    # 1024 (not T), so memory per chunk grows with Nc = T/d and the total stays O(T * Nc)
    chunk = _chunk_len(T, B * H * 1024, q.device)
    out, scores = _over_chunks(_compressed_chunk, T, chunk, q, k_cmp, v_cmp, W, block, stride, n_kv_heads,
                               scale)
    return out, scores


def _compressed_chunk(
    t0: int, t1: int, q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, W: torch.Tensor,
    block: int, stride: int, n_kv_heads: int, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compressed attention ``[B, C, H, Dv]`` and selection scores ``[B, C, G, Ns]``
    (no gradient) of the queries ``[t0, t1)``."""
    B, _, H, _ = q.shape
    Nc = k_cmp.shape[1]
    t = torch.arange(t0, t1, device=q.device)
    ends = torch.arange(Nc, device=q.device) * stride + (block - 1)
    out, probs = _masked_attention(q[:, t0:t1], k_cmp, v_cmp, ends[None, :] <= t[:, None], scale)
    probs = probs.detach().permute(0, 3, 1, 2, 4).reshape(B, t1 - t0, H, Nc)
    return out, _scores_from_probs(probs, n_kv_heads, W)
