"""A decode step's new query, keys and values: rotated and written into the caches in one launch.

Per layer and token, a decode step rotates the query and some of the keys (RoPE) and writes
each key/value pair at the token's position into its cache or ring. In torch that is one
RoPE kernel per rotated tensor and one ``index_put`` per written tensor: nine launches per
NSA layer (three rotations, six writes), and for dense attention two rotations of about
nine kernels each plus two writes. A step replayed as a CUDA graph pays a few microseconds
per launch whatever the size, and these tensors hold one token, so the launches are the
whole cost. ``decode_write`` does all of it in one launch with the maths of
``glue.py``'s ``_rope_kernel`` (fp32 inside, the result in the cache's dtype), so it writes
what the separate ops write.

Two more launches per step and layer go the same way:

- **RoPE's angles** are rows of a table of every position the caches hold (computed once
  per prefill, ``nsa.infer.decode.rope_table``), read at ``pos``: a step no longer computes
  cos and sin of its positions (about eight small ops per step).
- **The attention's RMSNorm** (``norm``): the caller's GEMM projected the raw block input
  ``x`` with the norm's gain folded into its weights (``W * gain``), so its outputs lack
  only the row's ``1 / rms(x)``. Each program computes that scale from ``x`` (a few hundred
  values per row) and applies it as it loads, and program (b, 0) also finishes the gate
  logits in place (``gates``: scaled, plus the gate's bias). ``norm(x) @ W.T`` and
  ``(x @ (W * gain).T) / rms(x)`` differ only in where the products are rounded.

The reference is the ops it replaces: ``NSACache``/``DenseCache`` (nsa/infer/cache*.py)
keep them for the CPU, and tests compare the two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops import poison

from .glue import _inv_rms

MAX_PAIRS = 3  # NSA writes three pairs (the raw ring, the selected branch's cache, the window ring)


@triton.jit
def _rotated(src, scale, cos, sin, mask, HALF: tl.constexpr, ROPE: tl.constexpr):
    """The two halves of the rows at ``src`` (pointers to their first halves) times ``scale``
    (the norm's, or 1), rotated by (cos, sin) when ROPE; fp32."""
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32) * scale
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32) * scale
    if ROPE:
        return x1 * cos - x2 * sin, x1 * sin + x2 * cos
    return x1, x2


@triton.jit
def _write_pair(KV, K, V, b, p, skb, skr, skg, sb, st, sg, n, scale, cos, sin, i, G,
                PAIR: tl.constexpr, ROPE: tl.constexpr, HALF: tl.constexpr, C: tl.constexpr):
    """Rows ``2 * PAIR`` (keys, rotated when ROPE) and ``2 * PAIR + 1`` (values) of sequence
    b's new ``KV`` into slot ``p % n`` of the caches K and V, C heads at a time."""
    for g0 in range(0, G, C):
        g = g0 + tl.arange(0, C)
        m = (g < G)[:, None] & (i < HALF)[None, :]
        src = KV + b * skb + 2 * PAIR * skr + g[:, None] * skg + i[None, :]
        dst = b * sb + (p % n) * st + g[:, None] * sg + i[None, :]
        k1, k2 = _rotated(src, scale, cos, sin, m, HALF, ROPE)
        tl.store(K + dst, k1.to(K.dtype.element_ty), mask=m)
        tl.store(K + dst + HALF, k2.to(K.dtype.element_ty), mask=m)
        v1, v2 = _rotated(src + skr, scale, cos, sin, m, HALF, False)
        tl.store(V + dst, v1.to(V.dtype.element_ty), mask=m)
        tl.store(V + dst + HALF, v2.to(V.dtype.element_ty), mask=m)


@triton.jit
def _step_write(Q, KV, COS, SIN, POS, QOUT, K0, V0, K1, V1, K2, V2, X, GATE, GB,
                sqb, sqh, skb, skr, skg, sob, soh, sxb, sgb,
                sb0, st0, sg0, n0, sb1, st1, sg1, n1, sb2, st2, sg2, n2, H, G, DIM, NG, EPS,
                NP: tl.constexpr, ROPE0: tl.constexpr, ROPE1: tl.constexpr, ROPE2: tl.constexpr,
                HALF: tl.constexpr, BH: tl.constexpr, C: tl.constexpr, NORM: tl.constexpr,
                BX: tl.constexpr, GATES: tl.constexpr, GBIAS: tl.constexpr):
    """Program (b, 0): sequence b's query heads rotated into QOUT (with GATES, its gate logits
    finished in place too); program (b, 1 + j): its key/value pair j written into (K_j, V_j);
    C heads at a time (a tile of <= 1k elements). With NORM everything it loads from the
    projection is first scaled by ``1 / rms(X[b])``."""
    b = tl.program_id(0)
    job = tl.program_id(1)
    i = tl.arange(0, BH)
    im = i < HALF
    p = tl.load(POS + b)
    cos = tl.load(COS + p * HALF + i, mask=im, other=0.0)[None, :]  # row p of the tables
    sin = tl.load(SIN + p * HALF + i, mask=im, other=0.0)[None, :]
    if NORM:
        scale = _inv_rms(X + b * sxb, DIM, EPS, BX)
    else:
        scale = 1.0
    if job == 0:
        for h0 in range(0, H, C):
            h = h0 + tl.arange(0, C)
            m = (h < H)[:, None] & im[None, :]
            q1, q2 = _rotated(Q + b * sqb + h[:, None] * sqh + i[None, :], scale, cos, sin, m, HALF, True)
            dst = QOUT + b * sob + h[:, None] * soh + i[None, :]
            tl.store(dst, q1.to(QOUT.dtype.element_ty), mask=m)
            tl.store(dst + HALF, q2.to(QOUT.dtype.element_ty), mask=m)
        if GATES:  # the gate logits, raw like q: scaled, plus the bias, in place
            for c0 in range(0, NG, BX):
                c = c0 + tl.arange(0, BX)
                cm = c < NG
                logit = tl.load(GATE + b * sgb + c, mask=cm, other=0.0).to(tl.float32) * scale
                if GBIAS:
                    logit += tl.load(GB + c, mask=cm, other=0.0).to(tl.float32)
                tl.store(GATE + b * sgb + c, logit.to(GATE.dtype.element_ty), mask=cm)
    elif job == 1:
        _write_pair(KV, K0, V0, b, p, skb, skr, skg, sb0, st0, sg0, n0, scale, cos, sin, i, G, 0, ROPE0,
                    HALF, C)
    elif job == 2:
        if NP > 1:
            _write_pair(KV, K1, V1, b, p, skb, skr, skg, sb1, st1, sg1, n1, scale, cos, sin, i, G, 1, ROPE1,
                        HALF, C)
    else:
        if NP > 2:
            _write_pair(KV, K2, V2, b, p, skb, skr, skg, sb2, st2, sg2, n2, scale, cos, sin, i, G, 2, ROPE2,
                        HALF, C)


def decode_write(q: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
                 pairs: list[tuple[torch.Tensor, torch.Tensor, bool]],
                 norm: tuple[torch.Tensor, float] | None = None,
                 gates: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
    """One decode step's new token per sequence, at positions ``pos [B]``: returns the query
    ``q [B, 1, H, D]`` rotated by RoPE, and writes pair j of ``kv [B, 1, 2 * len(pairs), G,
    D]`` (keys in row 2j, rotated when the pair says so; values in row 2j + 1) into slot
    ``pos % n`` of its caches ``(k, v)``, each ``[B, n, G, D]``: a cache with room for every
    position, or a ring of n slots. ``cos, sin [N, D/2]``: RoPE's tables, row p the angles
    of position p (every ``pos`` below N: the caller's capacity check).

    ``norm = (x, eps)``: q and kv are projections of the raw block input ``x [B, 1, dim]`` by
    weights with the RMSNorm's gain folded in; they are scaled by ``1 / sqrt(mean(x**2) +
    eps)`` (fp32) before anything else. ``gates = (logits, bias)``: with ``norm``, the gate
    logits ``[B, ...]`` (each sequence's contiguous, e.g. the joint projection's slice),
    projected the same way, are scaled and their ``bias`` (or None) added, in place."""
    B, one, H, D = q.shape
    if one != 1 or kv.dim() != 5 or kv.shape[:2] != (B, 1) or kv.shape[-1] != D or D % 2:
        raise ValueError(f"one token per sequence: q {tuple(q.shape)}, kv {tuple(kv.shape)} (even D)")
    if not 1 <= len(pairs) <= MAX_PAIRS or kv.shape[2] != 2 * len(pairs):
        raise ValueError(f"{len(pairs)} cache pairs for {kv.shape[2]} rows of kv (1 to {MAX_PAIRS} pairs)")
    G = kv.shape[3]
    half = D // 2
    if cos.dim() != 2 or cos.shape[1] != half or sin.shape != cos.shape or pos.shape != (B,):
        raise ValueError(f"RoPE tables cos {tuple(cos.shape)}, sin {tuple(sin.shape)} (want [positions, "
                         f"{half}]), pos {tuple(pos.shape)} for {B} sequences of head size {D}")
    for k, v, _ in pairs:
        if k.shape != v.shape or k.stride() != v.stride() or k.shape[0] != B or k.shape[2:] != (G, D) \
                or k.stride(-1) != 1:
            raise ValueError(f"cache pair {tuple(k.shape)} / {tuple(v.shape)} for {B} sequences of {G} x {D}")
        if k.numel() >= 2**31:
            raise ValueError(f"cache of shape {tuple(k.shape)} has >= 2**31 elements: the kernel uses 32-bit "
                             "offsets; split the batch")
    if q.stride(-1) != 1 or kv.stride(-1) != 1:
        raise ValueError("q and kv need a unit last stride")
    x, eps = norm if norm is not None else (q, 0.0)  # q: an unused pointer without the norm
    if norm is not None:
        if x.shape[0] != B or x.numel() != B * x.shape[-1] or x.stride(-1) != 1:
            raise ValueError(f"the norm's input x of shape {tuple(x.shape)}: want [{B}, 1, dim], unit last "
                             "stride")
        x = x.reshape(B, -1)
    logits, bias = gates if gates is not None else (q, None)
    if gates is not None:
        if norm is None:
            raise ValueError("gates are finished in place only with the norm (they are raw like q)")
        if logits.shape[0] != B or not logits[0].is_contiguous():
            raise ValueError(f"gate logits of shape {tuple(logits.shape)} and strides {logits.stride()}: "
                             f"want {B} sequences, each one's logits contiguous")
        if bias is not None and (bias.numel() != logits[0].numel() or not bias.is_contiguous()):
            raise ValueError(f"gate bias of shape {tuple(bias.shape)} for {logits[0].numel()} logits")
    # no copy for the step's own tables and positions (fp32, contiguous)
    cos, sin, pos = cos.float().contiguous(), sin.float().contiguous(), pos.contiguous()
    out = poison.empty(B, 1, H, D, device=q.device, dtype=q.dtype)
    if B == 0:
        return out
    padded = pairs + [pairs[0]] * (MAX_PAIRS - len(pairs))  # unused pointers: never read
    caches = [t for k, v, _ in padded for t in (k, v)]
    strides = [n for k, _, _ in padded for n in (k.stride(0), k.stride(1), k.stride(2), k.shape[1])]
    rope = [bool(r) for _, _, r in padded]
    bh = max(16, triton.next_power_of_2(half))
    ng = logits[0].numel() if gates is not None else 0
    # maxnreg: with the norm and the gates, ptxas held the kernel to 32 registers on sm_80 (40 on
    # sm_90: full occupancy for 4 warps) and spilled 8-24 B; a launch of B x 4 programs needs
    # no occupancy
    _step_write[(B, 1 + len(pairs))](
        q, kv, cos, sin, pos, out, *caches, x, logits, bias if bias is not None else logits,
        q.stride(0), q.stride(2), kv.stride(0), kv.stride(2), kv.stride(3), out.stride(0), out.stride(2),
        x.stride(0), logits.stride(0), *strides, H, G, x.shape[-1], ng, float(eps),
        NP=len(pairs), ROPE0=rope[0], ROPE1=rope[1], ROPE2=rope[2], HALF=half, BH=bh,
        C=min(triton.next_power_of_2(max(H, G)), max(1, 1024 // bh)), NORM=norm is not None,
        BX=min(1024, max(16, triton.next_power_of_2(max(x.shape[-1] if norm is not None else 1, ng)))),
        GATES=gates is not None, GBIAS=bias is not None, num_warps=4, maxnreg=255)
    return out
