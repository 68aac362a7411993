"""A decode step's compression: the block that ends at the new token through phi, in 3 launches.

When a sequence's new token at position p completes compressed token i = (p - l + 1) / d,
``NSACache._append_compressed`` (nsa/infer/cache.py) gathers the block's l raw keys and
values from their ring (slot ``p % l`` holds position p), runs the layer's phi on each
(``Compressor``: ``mean_r x[r] + W2 gelu(W1 flatten(x + P))``), rotates the key at p and
writes both at row i of the compressed caches, where the token completes a block. In
torch that is about 27 launches per layer: two gathers, two MLPs of six ops, a RoPE of
seven, two masked writes of three. A batch of sequences at different positions has some
sequence completing a block at nearly every step, so a batched decode runs it nearly
always. Here:

1. ``_compress_gather``: per (sequence, KV group) and K or V, the block in order from the
   ring, its mean and ``x + P`` flattened (in the weights' dtype, as torch rounds them);
2. phi's first matmul for K and V together (``torch.baddbmm`` on the stacked weights;
   ``avgpool`` mode has none);
3. ``_compress_finish``: the GELU and the second matmul (a ``[D, hidden]`` matrix by one
   vector per program, fp32 sums of the operands rounded as torch rounds them: the GELU's
   output to the weights' dtype), mean + MLP rounded to the cache dtype as torch's sum is,
   the key rotated at p (fp32, ``_rope_kernel``'s maths, the angles row p of RoPE's
   tables), both written at row i where p completes a block, nothing elsewhere. The GELU
   and the second matmul were two launches of their own (5 a layer), and at a batch of
   prompts at their own positions some sequence completes a block at nearly every step.

Positions are read on the device and the grids depend on shapes alone: no host sync, a
CUDA graph holds it. The torch ops stay the reference (the CPU's path) and the tests
compare them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops import poison


@triton.jit
def _compress_gather(KR, VR, POS, PE, Z, MEAN, BG, G, L, srb, srt, srg,
                     D: tl.constexpr, BL: tl.constexpr, BD: tl.constexpr, MLP: tl.constexpr):
    """Program (bg, kv): the block ending at sequence b's position, from ring K (kv 0) or V
    (kv 1) -> its mean ``MEAN[kv, bg]`` and, with MLP, ``Z[kv, bg] = flatten(x + PE[kv])``."""
    bg = tl.program_id(0)
    kv = tl.program_id(1)
    b = bg // G
    g = bg % G
    p = tl.load(POS + b).to(tl.int32)
    r = tl.arange(0, BL)
    d = tl.arange(0, BD)
    m = (r < L)[:, None] & (d < D)[None, :]
    slot = (p + 1 + r) % L  # the block's r-th token, position p - L + 1 + r, oldest first
    if kv == 0:
        ring = KR
    else:
        ring = VR
    x = tl.load(ring + b * srb + slot[:, None] * srt + g * srg + d[None, :], mask=m, other=0.0).to(tl.float32)
    row = kv * BG + bg
    tl.store(MEAN + row * D + d, (tl.sum(x, 0) / L).to(MEAN.dtype.element_ty), mask=d < D)
    if MLP:
        pe = tl.load(PE + kv * L * D + r[:, None] * D + d[None, :], mask=m, other=0.0)
        z = x + pe.to(Z.dtype.element_ty).to(tl.float32)
        tl.store(Z + row * L * D + r[:, None] * D + d[None, :], z.to(Z.dtype.element_ty), mask=m)


@triton.jit
def _mlp_half(A, W2, B2, row, kv, c, m, h0, HID, HALF: tl.constexpr, BH: tl.constexpr, BHID: tl.constexpr):
    """Rows ``h0 + c`` (c < HALF) of ``W2[kv] @ A[row] + B2[kv]``: fp32 sums of the hidden
    vector (GELU applied, rounded to the weights' dtype) against a ``[HALF, BHID]`` tile of
    the matrix at a time, the result rounded to the weights' dtype (torch's baddbmm output)."""
    acc = tl.zeros([BH], tl.float32)
    for j0 in range(0, HID, BHID):
        j = j0 + tl.arange(0, BHID)
        jm = j < HID
        a = tl.load(A + row * HID + j, mask=jm, other=0.0).to(tl.float32)
        a = 0.5 * a * (1.0 + tl.math.erf(a * 0.7071067811865476))  # exact GELU, as F.gelu
        a = a.to(W2.dtype.element_ty).to(tl.float32)
        w = tl.load(W2 + kv * 2 * HALF * HID + (h0 + c)[:, None] * HID + j[None, :],
                    mask=m[:, None] & jm[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(w * a[None, :], 1)
    acc += tl.load(B2 + kv * 2 * HALF + h0 + c, mask=m, other=0.0).to(tl.float32)
    return acc.to(W2.dtype.element_ty).to(tl.float32)


@triton.jit
def _compress_finish(HID1, W2, B2, MEAN, POS, COS, SIN, KC, VC, BG, G, NC, L, STRIDE, HID, scb, sct, scg,
                     HALF: tl.constexpr, BH: tl.constexpr, BHID: tl.constexpr, MLP: tl.constexpr):
    """Program (bg, kv): phi's output ``MEAN + W2 gelu(HID1) + b2`` (``HID1``: the first
    matmul's output; kv 0: rotated at the position) into row i of the compressed cache where
    the position completes compressed token i."""
    bg = tl.program_id(0)
    kv = tl.program_id(1)
    b = bg // G
    g = bg % G
    p = tl.load(POS + b).to(tl.int32)
    start = p - (L - 1)
    done = (start >= 0) & (start % STRIDE == 0)
    i = tl.minimum(tl.maximum(start, 0) // STRIDE, NC - 1)
    c = tl.arange(0, BH)
    m = (c < HALF) & (c * 0 + done.to(tl.int32) > 0)  # a vector mask (a scalar one broadcast is refused)
    row = kv * BG + bg
    x1 = tl.load(MEAN + row * 2 * HALF + c, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(MEAN + row * 2 * HALF + HALF + c, mask=m, other=0.0).to(tl.float32)
    if MLP:  # torch's sum of the two, rounded to the cache dtype, before the rotation
        x1 = x1 + _mlp_half(HID1, W2, B2, row, kv, c, m, 0, HID, HALF, BH, BHID)
        x2 = x2 + _mlp_half(HID1, W2, B2, row, kv, c, m, HALF, HID, HALF, BH, BHID)
    dst = b * scb + i * sct + g * scg + c
    if kv == 0:
        x1 = x1.to(KC.dtype.element_ty).to(tl.float32)
        x2 = x2.to(KC.dtype.element_ty).to(tl.float32)
        cos = tl.load(COS + p * HALF + c, mask=m, other=0.0)  # row p of RoPE's tables
        sin = tl.load(SIN + p * HALF + c, mask=m, other=0.0)
        tl.store(KC + dst, (x1 * cos - x2 * sin).to(KC.dtype.element_ty), mask=m)
        tl.store(KC + dst + HALF, (x1 * sin + x2 * cos).to(KC.dtype.element_ty), mask=m)
    else:
        tl.store(VC + dst, x1.to(VC.dtype.element_ty), mask=m)
        tl.store(VC + dst + HALF, x2.to(VC.dtype.element_ty), mask=m)


def decode_compress(k_raw: torch.Tensor, v_raw: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, stride: int,
                    pos_emb: torch.Tensor | None = None, w1: torch.Tensor | None = None,
                    b1: torch.Tensor | None = None, w2: torch.Tensor | None = None,
                    b2: torch.Tensor | None = None) -> None:
    """Write, for each sequence b whose token at ``pos[b]`` completes compressed token
    ``i = (pos - l + 1) / stride``, phi of that block into row i of ``k_cmp, v_cmp [B, Nc, G,
    D]`` (the key rotated at ``pos`` by RoPE's tables ``cos, sin [N, D/2]``, row p the angles of
    position p, every ``pos`` below N); other rows and
    sequences are left as they are. ``k_raw, v_raw [B, l, G, D]``: the raw rings (position p
    in slot ``p % l``, this step's token already written). phi's weights stacked for K then
    V: ``pos_emb [2, l, D]``, ``w1 [2, hidden, l*D]``, ``b1 [2, hidden]``, ``w2 [2, D,
    hidden]``, ``b2 [2, D]``; all None: average pooling."""
    B, L, G, D = k_raw.shape
    NC = k_cmp.shape[1]
    if v_raw.shape != k_raw.shape or k_cmp.shape != (B, NC, G, D) or v_cmp.shape != k_cmp.shape:
        raise ValueError(f"rings {tuple(k_raw.shape)}, {tuple(v_raw.shape)} and compressed caches "
                         f"{tuple(k_cmp.shape)}, {tuple(v_cmp.shape)}: want [B, l, G, D] and [B, Nc, G, D]")
    tables_ok = cos.dim() == 2 and cos.shape[1] == D // 2 and sin.shape == cos.shape
    if D % 2 or pos.shape != (B,) or not tables_ok:
        raise ValueError(f"pos {tuple(pos.shape)}, RoPE tables cos {tuple(cos.shape)}, sin "
                         f"{tuple(sin.shape)} for {B} sequences of head dim {D} (even; tables "
                         "[positions, D/2])")
    mlp = w1 is not None
    if mlp != (pos_emb is not None and b1 is not None and w2 is not None and b2 is not None):
        raise ValueError("phi's weights: all of pos_emb, w1, b1, w2, b2, or none (average pooling)")
    if B == 0 or NC == 0:
        return
    if k_cmp.stride() != v_cmp.stride() or k_cmp.stride(3) != 1:
        raise ValueError("the compressed caches must share strides, unit stride in the head dim")
    k_raw, v_raw, pos = k_raw.contiguous(), v_raw.contiguous(), pos.contiguous()
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    BG = B * G
    dtype = w1.dtype if w1 is not None else k_raw.dtype
    mean = poison.empty(2, BG, D, device=k_raw.device, dtype=k_raw.dtype)
    z = poison.empty(2, BG, L * D, device=k_raw.device, dtype=dtype) if mlp else mean
    bl, bd = max(16, triton.next_power_of_2(L)), max(16, triton.next_power_of_2(D))
    _compress_gather[(BG, 2)](k_raw, v_raw, pos, pos_emb if mlp else mean, z, mean, BG, G, L,
                              *k_raw.stride()[:3], D=D, BL=bl, BD=bd, MLP=mlp)
    hidden, w2_, b2_ = mean, mean, mean  # unused pointers without the MLP
    if mlp:
        assert pos_emb is not None and w1 is not None and b1 is not None and w2 is not None and b2 is not None
        hidden = torch.baddbmm(b1[:, None, :], z, w1.transpose(1, 2))  # [2, BG, hidden], before the GELU
        hidden = hidden if hidden.is_contiguous() else hidden.contiguous()
        w2_, b2_ = w2.contiguous(), b2.contiguous()
    n_hidden = hidden.shape[-1] if mlp else 1
    bh = max(16, triton.next_power_of_2(D // 2))
    bhid = max(16, min(triton.next_power_of_2(n_hidden), 4096 // bh))  # [BH, BHID] tiles of W2
    _compress_finish[(BG, 2)](hidden, w2_, b2_, mean, pos, cos, sin, k_cmp, v_cmp, BG, G, NC, L, stride,
                              n_hidden, k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2),
                              HALF=D // 2, BH=bh, BHID=bhid, MLP=mlp)
