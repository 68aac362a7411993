"""Small kernels around the attention kernels: the backward's ``delta``, the gated
combine of the three branches (of gates, or in decoding of gate logits), and RoPE.

``delta[b, t, h] = sum_d dO * O`` (fp32) feeds every FlashAttention-style backward. In
torch it was three passes over fp32 copies (``do.float()``, ``o.float()``, the product)
plus the sum: about 14 bytes moved per element of a bf16 O. Here one program reads a tile
of rows of O and dO once in their own dtype and writes one fp32 per row: 4 bytes per
element plus 4 per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops import poison


@triton.jit
def _delta_kernel(OUT, DOUT, DELTA, n_rows, T, H, sdb, sdt, sdh,
                  D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    offs_d = tl.arange(0, BD)
    m = (r < n_rows)[:, None] & (offs_d < D)[None, :]
    off = r[:, None] * D + offs_d[None, :]
    o = tl.load(OUT + off, mask=m, other=0.0).to(tl.float32)
    do = tl.load(DOUT + off, mask=m, other=0.0).to(tl.float32)
    h = r % H
    t = (r // H) % T
    b = r // (H * T)
    tl.store(DELTA + b * sdb + t * sdt + h * sdh, tl.sum(o * do, 1), mask=r < n_rows)


def row_delta(o: torch.Tensor, do: torch.Tensor, heads_major: bool) -> torch.Tensor:
    """``rowsum(dO * O)`` of ``[B,T,H,D]`` tensors in fp32: ``[B,H,T]`` when ``heads_major``
    (the band kernels' layout), else ``[B,T,H]`` (the selected kernels')."""
    B, T, H, D = o.shape
    o, do = o.contiguous(), do.contiguous()
    delta = poison.empty((B, H, T) if heads_major else (B, T, H), device=o.device, dtype=torch.float32)
    n_rows = B * T * H
    if n_rows == 0:
        return delta
    sdb, sdt, sdh = (H * T, 1, T) if heads_major else (T * H, H, 1)
    bd = max(16, triton.next_power_of_2(D))
    br = max(1, 4096 // bd)  # ~4k elements of each input per program
    _delta_kernel[(triton.cdiv(n_rows, br),)](o, do, delta, n_rows, T, H, sdb, sdt, sdh, D=D, BD=bd, BR=br)
    return delta


@triton.jit
def _gate(GATE, r, rmask, H, SG, C: tl.constexpr, LOGITS: tl.constexpr):
    """Gate C of rows r (row = position x H + head) in fp32: as stored, or the sigmoid of a
    stored logit. A position's H x 3 gates are contiguous, positions SG apart."""
    g = tl.load(GATE + (r // H) * SG + (r % H) * 3 + C, mask=rmask, other=0.0).to(tl.float32)
    if LOGITS:
        g = tl.sigmoid(g)
    return g[:, None]


@triton.jit
def _combine_fwd(GATE, A, B, C, OUT, n_rows, H, SG, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr,
                 LOGITS: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = r < n_rows
    offs_d = tl.arange(0, BD)
    m = rmask[:, None] & (offs_d < D)[None, :]
    off = r[:, None] * D + offs_d[None, :]
    g0 = _gate(GATE, r, rmask, H, SG, 0, LOGITS)
    g1 = _gate(GATE, r, rmask, H, SG, 1, LOGITS)
    g2 = _gate(GATE, r, rmask, H, SG, 2, LOGITS)
    out = (g0 * tl.load(A + off, mask=m, other=0.0).to(tl.float32)
           + g1 * tl.load(B + off, mask=m, other=0.0).to(tl.float32)
           + g2 * tl.load(C + off, mask=m, other=0.0).to(tl.float32))
    tl.store(OUT + off, out.to(OUT.dtype.element_ty), mask=m)


@triton.jit
def _combine_grad(GATE, X, DX, DGATE, do, r, rmask, off, m, C: tl.constexpr):
    """Branch C's share of the backward: dX = g_C * dOut, dg_C = rowsum(dOut * X)."""
    g = tl.load(GATE + r * 3 + C, mask=rmask, other=0.0).to(tl.float32)
    tl.store(DX + off, (g[:, None] * do).to(DX.dtype.element_ty), mask=m)
    x = tl.load(X + off, mask=m, other=0.0).to(tl.float32)
    tl.store(DGATE + r * 3 + C, tl.sum(do * x, 1), mask=rmask)


@triton.jit
def _combine_bwd(GATE, A, B, C, DOUT, DA, DB, DC, DGATE, n_rows,
                 D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = r < n_rows
    offs_d = tl.arange(0, BD)
    m = rmask[:, None] & (offs_d < D)[None, :]
    off = r[:, None] * D + offs_d[None, :]
    do = tl.load(DOUT + off, mask=m, other=0.0).to(tl.float32)
    _combine_grad(GATE, A, DA, DGATE, do, r, rmask, off, m, 0)
    _combine_grad(GATE, B, DB, DGATE, do, r, rmask, off, m, 1)
    _combine_grad(GATE, C, DC, DGATE, do, r, rmask, off, m, 2)


def _rows_per_program(d: int) -> tuple[int, int]:
    bd = max(16, triton.next_power_of_2(d))
    return bd, max(1, 4096 // bd)


def _combine(g: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, logits: bool
             ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The combine's forward launch (``g [B, T, H, 3]``: gates, or gate logits): the output,
    and the contiguous inputs it read (what the backward needs). Gate logits are read in
    place when each position's ``H x 3`` are contiguous (a decode step's slice of its joint
    projection: no copy, one launch fewer per layer and token)."""
    a, b, c = a.contiguous(), b.to(a.dtype).contiguous(), c.to(a.dtype).contiguous()
    H = g.shape[-2]
    sg = _position_stride(g) if logits else None
    if sg is None:
        g, sg = g.contiguous(), H * 3
    out = poison.empty_like(a)
    n_rows = a.numel() // a.shape[-1] if a.numel() else 0
    if n_rows:
        bd, br = _rows_per_program(a.shape[-1])
        _combine_fwd[(triton.cdiv(n_rows, br),)](g, a, b, c, out, n_rows, H, sg, D=a.shape[-1], BD=bd, BR=br,
                                                 LOGITS=logits)
    return out, (g, a, b, c)


def _position_stride(g: torch.Tensor) -> int | None:
    """The distance between positions of ``g [B, T, H, 3]`` when each position's ``H x 3``
    values are contiguous and the positions evenly spaced (B and T merge), else None."""
    B, T, H, _ = g.shape
    if g.stride(3) != 1 or g.stride(2) != 3:
        return None
    if T == 1:
        return g.stride(0)
    if B == 1 or g.stride(0) == T * g.stride(1):
        return g.stride(1)
    return None


class GatedCombine(torch.autograd.Function):
    """``out = g[..., 0] * a + g[..., 1] * b + g[..., 2] * c`` for gates ``g [B,T,H,3]`` and
    branch outputs ``a, b, c [B,T,H,D]``: one kernel reads each input once and writes
    ``out`` in the branches' dtype (bf16 in training), fp32 arithmetic inside. torch's
    expression made five passes with rounded bf16 temporaries, and autograd six more."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        out, inputs = _combine(g, a, b, c, logits=False)
        ctx.save_for_backward(*inputs)
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        g, a, b, c = ctx.saved_tensors
        dout = dout.contiguous()
        da, db, dc = poison.empty_like(a), poison.empty_like(b), poison.empty_like(c)
        dg = poison.empty(g.shape, device=g.device, dtype=torch.float32)
        n_rows = a.numel() // a.shape[-1] if a.numel() else 0
        if n_rows:
            bd, br = _rows_per_program(a.shape[-1])  # 8 warps: 4 spilled at D = 128 on sm_90 (Triton 3.6)
            _combine_bwd[(triton.cdiv(n_rows, br),)](g, a, b, c, dout, da, db, dc, dg, n_rows,
                                                    D=a.shape[-1], BD=bd, BR=br, num_warps=8)
        return dg.to(g.dtype), da, db, dc


def gated_combine_logits(logits: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor
                         ) -> torch.Tensor:
    """``GatedCombine`` of ``sigmoid(logits)`` without a gradient (decoding): the sigmoid
    inside the same kernel, in fp32, where the model's own ``torch.sigmoid(upcast(...))``
    took two more launches per layer and token."""
    return _combine(logits, a, b, c, logits=True)[0]


@triton.jit
def _rope_kernel(X, COS, SIN, Y, n_rows, T, H, sxb, sxt, sxh, syb, syt, syh, SIGN: tl.constexpr,
                 HALF: tl.constexpr, BH: tl.constexpr, BR: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    rmask = r < n_rows
    h = r % H
    t = (r // H) % T
    b = r // (H * T)
    i = tl.arange(0, BH)
    m = rmask[:, None] & (i < HALF)[None, :]
    xp = X + (b * sxb + t * sxt + h * sxh)[:, None] + i[None, :]
    x1 = tl.load(xp, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(xp + HALF, mask=m, other=0.0).to(tl.float32)
    ang = t[:, None] * HALF + i[None, :]
    cos = tl.load(COS + ang, mask=m, other=0.0)
    sin = tl.load(SIN + ang, mask=m, other=0.0) * SIGN
    yp = Y + (b * syb + t * syt + h * syh)[:, None] + i[None, :]
    tl.store(yp, (x1 * cos - x2 * sin).to(Y.dtype.element_ty), mask=m)
    tl.store(yp + HALF, (x1 * sin + x2 * cos).to(Y.dtype.element_ty), mask=m)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    B, T, H, D = x.shape
    y = poison.empty(B, T, H, D, device=x.device, dtype=x.dtype)
    n_rows = B * T * H
    if n_rows == 0:
        return y
    if x.stride(-1) != 1:
        x = x.contiguous()
    half = D // 2
    bh = max(16, triton.next_power_of_2(half))
    br = max(1, 2048 // bh)
    _rope_kernel[(triton.cdiv(n_rows, br),)](x, cos, sin, y, n_rows, T, H, *x.stride()[:3], *y.stride()[:3],
                                             SIGN=sign, HALF=half, BH=bh, BR=br)
    return y


class Rope(torch.autograd.Function):
    """RoPE (half-split layout, as ``nsa.ops.rope.apply_rope``) in one pass: reads ``x
    [B,T,heads,D]`` (any strides with unit last stride: the model's slices of its fused
    K/V projection need no copy) in its own dtype, rotates in fp32, writes a contiguous
    result in ``x``'s dtype. torch's version made ~10 fp32 passes over the tensor."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cos = cos.float().contiguous()
        sin = sin.float().contiguous()
        ctx.save_for_backward(cos, sin)
        return _rope(x, cos, sin, 1)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        cos, sin = ctx.saved_tensors
        return _rope(dy, cos, sin, -1), None, None


@triton.jit
def _inv_rms(XROW, DIM, EPS, BX: tl.constexpr):
    """``1 / sqrt(mean(x**2) + eps)`` of the row at ``XROW`` (fp32, DIM values, BX at a time):
    RMSNorm's scale, for a decode step whose GEMM has the norm's gain folded into its weights
    (``decode_write``, ``silu_mul``)."""
    acc = tl.zeros([BX], tl.float32)
    for d0 in range(0, DIM, BX):
        d = d0 + tl.arange(0, BX)
        x = tl.load(XROW + d, mask=d < DIM, other=0.0).to(tl.float32)
        acc += x * x
    return tl.rsqrt(tl.sum(acc, 0) / DIM + EPS)


@triton.jit
def _silu_mul_kernel(X, Y, XN, HID, sxr, syr, sxn, DIM, EPS, BH: tl.constexpr, NORM: tl.constexpr,
                     BX: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    m = cols < HID
    g = tl.load(X + row * sxr + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(X + row * sxr + HID + cols, mask=m, other=0.0).to(tl.float32)
    if NORM:
        scale = _inv_rms(XN + row * sxn, DIM, EPS, BX)
        g *= scale
        u *= scale
    tl.store(Y + row * syr + cols, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=m)


def silu_mul(x: torch.Tensor, norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """``silu(gate) * up`` of ``x [..., 2 * hidden]`` (gate then up, SwiGLU's joint matmul)
    -> ``[..., hidden]`` in x's dtype, fp32 inside, one launch and no gradient (decoding:
    torch's two ops rounded a bf16 temporary between them). ``norm = (xn, eps)``: x is the
    projection of the raw ``xn [..., dim]`` (same rows) by weights with the RMSNorm's gain
    folded in; gate and up are first scaled by ``1 / sqrt(mean(xn**2) + eps)`` (no norm
    launch before the GEMM)."""
    if x.shape[-1] % 2:
        raise ValueError(f"the last dim holds gate and up halves, got {x.shape[-1]}")
    hid = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1]) if x.numel() else x.new_empty(0, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    xn, eps = norm if norm is not None else (rows, 0.0)  # rows: an unused pointer without the norm
    if norm is not None:
        if xn.shape[:-1] != x.shape[:-1]:
            raise ValueError(f"the norm's input {tuple(xn.shape)} for rows {tuple(x.shape[:-1])}")
        xn = xn.reshape(-1, xn.shape[-1]) if xn.numel() else xn.new_empty(0, xn.shape[-1])
        if xn.stride(-1) != 1:
            xn = xn.contiguous()
    y = poison.empty(rows.shape[0], hid, device=x.device, dtype=x.dtype)
    if rows.shape[0] and hid:
        bh = min(1024, max(16, triton.next_power_of_2(hid)))
        grid = (rows.shape[0], triton.cdiv(hid, bh))
        dim = xn.shape[-1] if norm is not None else 1
        bx = min(1024, max(16, triton.next_power_of_2(dim)))
        _silu_mul_kernel[grid](rows, y, xn, hid, rows.stride(0), y.stride(0), xn.stride(0), dim, float(eps),
                               BH=bh, NORM=norm is not None, BX=bx)
    return y.view(*x.shape[:-1], hid)
