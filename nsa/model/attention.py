"""Attention layers: NSAAttention (three gated branches) and DenseAttention (SDPA baseline).

NSA (arXiv 2502.11089, Sec. 3): every query attends over three views of the past,
compressed blocks, selected full-resolution blocks and a sliding window, and a per-head
sigmoid gate from the input mixes them (Eq. 5). Each branch has its own K and V
projection (the paper: independent keys/values keep the branches from learning
shortcuts through one another); the query is shared. The tensor maths of each branch
lives in ``nsa.ops`` (reference or Triton, same API); parameters live here.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nsa.config import AttentionConfig
from nsa.model.compress import Compressor, compress_pair
from nsa.model.layers import add_linear_, upcast, upcast_dtype
from nsa.ops import apply_rope as ops_rope
from nsa.ops import compressed_attention_and_selection, gated_combine, get_ops, window_attention
from nsa.ops.rope import RopeCache, rope_angles

BRANCHES = ("compressed", "selected", "window")


Angles = tuple[torch.Tensor, torch.Tensor]  # RoPE's (cos, sin) ``[T, D/2]`` of some positions


def _per_sequence(fn: Callable[..., object], x: torch.Tensor, pos: torch.Tensor, *args: object
                  ) -> tuple[torch.Tensor, ...]:
    """``fn(x, pos, *args)`` for ``x [B, 1, ...]`` with one position per sequence ``pos [B, 1]``:
    the B tokens are handed to ``fn`` as one sequence ``[1, B, ...]`` at positions ``pos[:, 0]``
    (every per-token map, RoPE included, then sees each token at its own position)."""
    if x.shape[1] != 1:
        raise ValueError(f"per-sequence positions need one token per sequence, got {x.shape[1]}")
    out = fn(x.transpose(0, 1), pos[:, 0], *args)
    return tuple(t.transpose(0, 1) for t in (out if isinstance(out, tuple) else (out,)))


def _resolve_ops(backend: str) -> None:
    """Resolve (and cache) a layer's ops when it is built, so that its forward does no import
    (torch.compile) and a bad backend fails at build time."""
    if backend != "triton" or os.environ.get("TRITON_INTERPRET") == "1":
        get_ops(backend, "cpu")
    if backend == "triton" or torch.cuda.is_available():
        get_ops(backend, "cuda")


def _token_angles(cache: RopeCache, x: torch.Tensor) -> Angles:
    """RoPE's angles of the positions ``0 .. T-1`` of ``x [B, T, ...]``, from the model's cache."""
    return cache.angles(x.shape[1], x.device, upcast_dtype(x.dtype))


class NSAAttention(nn.Module):
    """Native Sparse Attention over ``x [B, T, dim]`` for any T (blocks may be partial)."""

    gate_mean: torch.Tensor  # a buffer (register_buffer): the last forward's mean gate per branch

    def __init__(
        self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, cfg: AttentionConfig, rope_theta: float,
        rope_cache: RopeCache | None = None,
    ) -> None:
        """``rope_cache``: the angles' cache the model's layers share (a cache of its own by default)."""
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.cfg = cfg
        self.rope_theta = rope_theta
        self.rope_cache = rope_cache if rope_cache is not None else RopeCache(head_dim, rope_theta)
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
        # rows: k_cmp, v_cmp, k_slc, v_slc, k_win, v_win (each n_kv_heads * head_dim)
        self.kv_proj = nn.Linear(dim, 6 * n_kv_heads * head_dim, bias=False)
        self.compress_k = Compressor(head_dim, cfg.compress_block, cfg.compress_stride, cfg.compress_mode)
        self.compress_v = Compressor(head_dim, cfg.compress_block, cfg.compress_stride, cfg.compress_mode)
        self.gate = nn.Linear(dim, 3 * n_heads)  # per head: compressed, selected, window
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)
        # For ablations and tests: a fixed (compressed, selected, window) gate instead of the learned one.
        self.gate_override: tuple[float, float, float] | None = None
        # Mean gate per branch over the last forward, written in place (no host sync; a
        # buffer so that it follows .to() and stays legal under torch.compile together
        # with activation checkpointing, where rebinding an attribute is not). NaN until
        # the first forward.
        self.register_buffer("gate_mean", torch.full((3,), float("nan")), persistent=False)
        _resolve_ops(cfg.backend)  # modules are not stored: the layer stays picklable and deep-copyable

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # RoPE's angles from the model's cache, no op per layer (a small model's train step
        # is bound by the host's ops, not by the GPU)
        q, kv_raw, k_slc, v_slc, k_win, v_win = self._project(x, _token_angles(self.rope_cache, x), pair=True)
        # Compressed branch: phi over raw keys/values (both maps in one pass), then RoPE at
        # each block's last token (the first position allowed to see it), so scores stay relative.
        k_cmp, v_cmp = compress_pair(self.compress_k, self.compress_v, kv_raw)
        k_cmp, v_cmp = self._rotate_compressed(k_cmp, v_cmp, x.shape[1])
        return self.attend(x, q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win)

    def block_ends(self, T: int, device: torch.device) -> torch.Tensor:
        """The last position of each compressed block of a sequence of ``T`` tokens that
        starts at position 0: ``i*d + l - 1`` for the ``(T - l) // d + 1`` whole blocks."""
        c = self.cfg
        n = (T - c.compress_block) // c.compress_stride + 1 if T >= c.compress_block else 0
        first = c.compress_block - 1
        return torch.arange(first, first + n * c.compress_stride, c.compress_stride, device=device)

    # The pieces of forward, also called one token at a time by the KV-cache decoder
    # (nsa/infer/), so that decoding and training share every projection, RoPE, phi and gate.

    def rotate(self, x: torch.Tensor, pos: torch.Tensor, angles: Angles | None = None) -> torch.Tensor:
        """RoPE on ``x [B, T, heads, D]`` at positions ``pos [T]`` (or ``[B, 1]``: one token per
        sequence, each at its own position), in the compute dtype (the kernels: one pass,
        fp32 maths inside). ``angles``: ``rope_angles`` of those positions when the caller
        already has them (a decode step computes them once for all its layers)."""
        if pos.dim() == 2:
            return _per_sequence(self.rotate, x, pos, angles)[0]
        cos, sin = angles if angles is not None else \
            rope_angles(pos, self.head_dim, self.rope_theta, upcast_dtype(x.dtype))
        return ops_rope(get_ops(self.cfg.backend, x.device.type), x, cos, sin)

    def project(self, x: torch.Tensor, pos: torch.Tensor, angles: Angles | None = None
                ) -> tuple[torch.Tensor, ...]:
        """``x [B, T, dim]`` at positions ``pos [T]`` -> ``(q, k_raw, v_raw, k_slc, v_slc,
        k_win, v_win)``: q ``[B,T,H,D]`` and the selected/window keys rotated, the
        compressed branch's keys/values raw (phi sees un-rotated keys), all ``[B,T,G,D]``.
        ``pos [B, 1]``: one token per sequence at its own position (decoding). ``angles``:
        as for ``rotate``."""
        if pos.dim() == 2:
            return _per_sequence(self.project, x, pos, angles)
        if angles is None:  # fp32 angles (fp64 in tests)
            angles = rope_angles(pos, self.head_dim, self.rope_theta, upcast_dtype(x.dtype))
        return self._project(x, angles)

    def _project(self, x: torch.Tensor, angles: Angles, pair: bool = False) -> tuple[torch.Tensor, ...]:
        """``project`` of the positions whose RoPE ``angles`` are given; with ``pair`` the
        compressed branch's raw keys and values side by side, ``(q, kv_raw [B,T,2,G,D], k_slc,
        v_slc, k_win, v_win)``, for phi's one pass over both (``compress_pair``)."""
        B, T, _ = x.shape
        H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, H, D)
        kv = self.kv_proj(x).view(B, T, 6, G, D)
        cos, sin = angles
        ops = get_ops(self.cfg.backend, x.device.type)
        # q is rotated once and shared by the three branches
        q = ops_rope(ops, q, cos, sin)
        # one split or unbind, not six selects: its backward is one cat or stack, where six
        # selects' were six zero-filled copies of the whole projection summed
        if pair:
            kv_raw, *singles = kv.split([2, 1, 1, 1, 1], 2)
            raw: tuple[torch.Tensor, ...] = (kv_raw,)
            k_slc, v_slc, k_win, v_win = (t.squeeze(2) for t in singles)
        else:
            *raw, k_slc, v_slc, k_win, v_win = kv.unbind(2)
        k_slc, k_win = ops_rope(ops, k_slc, cos, sin), ops_rope(ops, k_win, cos, sin)
        return q, *raw, k_slc, v_slc.contiguous(), k_win, v_win.contiguous()

    def compress(self, k_raw: torch.Tensor, v_raw: torch.Tensor, ends: torch.Tensor | None = None,
                 angles: Angles | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """phi over the raw compressed-branch keys and values ``[B,T,G,D]`` -> ``[B,Nc,G,D]``
        each, the keys rotated at their block's last token ``ends`` (default: the blocks of a
        sequence that starts at position 0, ``i*d + l - 1``, whose angles are rows of the
        layers' cache; ``angles``: theirs, as for ``rotate``)."""
        k_cmp, v_cmp = self.compress_k(k_raw), self.compress_v(v_raw).contiguous()
        return self._rotate_compressed(k_cmp, v_cmp, k_raw.shape[1], ends, angles)

    def _rotate_compressed(self, k_cmp: torch.Tensor, v_cmp: torch.Tensor, T: int,
                           ends: torch.Tensor | None = None, angles: Angles | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """``compress``'s RoPE of the compressed keys ``[B,Nc,G,D]`` of ``T`` raw tokens at
        their blocks' ends."""
        if ends is None and angles is None:  # a sequence from position 0: rows of the cache
            c = self.cfg
            angles = self.rope_cache.angles(k_cmp.shape[1], k_cmp.device, upcast_dtype(k_cmp.dtype),
                                            start=c.compress_block - 1, step=c.compress_stride)
            return ops_rope(get_ops(c.backend, k_cmp.device.type), k_cmp, *angles), v_cmp
        if ends is None:
            ends = self.block_ends(T, k_cmp.device)
        return self.rotate(k_cmp, ends, angles), v_cmp

    def attend(self, x: torch.Tensor, q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor,
               k_slc: torch.Tensor, v_slc: torch.Tensor, k_win: torch.Tensor, v_win: torch.Tensor
               ) -> torch.Tensor:
        """The three branches over a whole sequence (positions 0..T-1), gated and projected."""
        c, G = self.cfg, self.n_kv_heads
        ops = get_ops(c.backend, x.device.type)
        # Its probabilities rank the selection blocks (Eqs. 8-10; no gradient through
        # the ranking): the top-n blocks per (query, KV group). The kernels pick them
        # inside the scores pass, without [T, Nc] probabilities or [T, Ns] scores.
        o_cmp, idx = compressed_attention_and_selection(
            ops, q, k_cmp, v_cmp, c.compress_block, c.compress_stride, c.select_block, G, c.num_selected,
            c.num_initial, c.num_local
        )

        # Selected branch: attention over those blocks.
        o_slc = ops.selected_attention(q, k_slc, v_slc, idx, c.select_block)

        # Sliding window: FlexAttention's kernels when training on a GPU (nsa/ops/flex.py).
        o_win = window_attention(ops, q, k_win, v_win, c.window)
        return self.mix(x, o_cmp, o_slc, o_win)

    def mix(self, x: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor, o_win: torch.Tensor,
            track: bool = True, from_logits: Callable[..., torch.Tensor] | None = None,
            gate_logits: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
        """Eq. 5: per-head sigmoid gates from ``x`` weigh the branch outputs ``[B,T,H,D]``,
        then the output projection. ``track``: keep the gates' mean for the training metrics
        (``gate_shares``); a decode step does not (two kernels per layer and token for nothing).
        ``from_logits``: a combine that takes the gate logits and applies the sigmoid itself
        (a decode step on CUDA: one kernel instead of three; no gradient, no tracking), of
        ``gate_logits [B,T,H,3]`` when the caller computed them (else ``self.gate(x)``).
        ``residual``: returns ``residual + output``, added inside the output projection's GEMM,
        in place into ``residual`` (a decode step on CUDA; no gradient)."""
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        if from_logits is not None and self.gate_override is None:
            logits = gate_logits if gate_logits is not None else self.gate(x).view(B, T, H, 3)
            o = from_logits(logits, o_cmp, o_slc, o_win)
            return self.project_out(o.reshape(B, T, H * D), residual)
        adt = upcast_dtype(x.dtype)
        if self.gate_override is None:
            g = torch.sigmoid(upcast(self.gate(x))).view(B, T, H, 3)
        else:  # fills, not torch.tensor(..., device=): no host-to-device copy per call
            g = torch.cat([x.new_full((B, T, H, 1), v, dtype=adt) for v in self.gate_override], -1)
        if track:
            with torch.no_grad():
                self.gate_mean.copy_(g.detach().mean(dim=(0, 1, 2)))
        # the gated sum in the branches' dtype (the kernels: one fused pass, fp32 inside)
        o = gated_combine(get_ops(self.cfg.backend, x.device.type), g, o_cmp, o_slc, o_win)
        return self.project_out(o.reshape(B, T, H * D), residual)

    def project_out(self, o: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The output projection of the heads' combined output ``o [B, T, H*D]``; with
        ``residual``, ``residual + o_proj(o)`` added inside the GEMM, in place into it."""
        return self.o_proj(o) if residual is None else add_linear_(residual, o, self.o_proj)


class DenseAttention(nn.Module):
    """Dense causal attention with GQA through ``F.scaled_dot_product_attention``.

    Always full T x T with ``is_causal=True`` (T_q == T_k, so PyTorch's top-left aligned
    causal mask is the right one; with one query it would see key 0 only).
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, rope_theta: float,
                 rope_cache: RopeCache | None = None, backend: str = "auto") -> None:
        """``rope_cache``: as for ``NSAAttention``. ``backend``: whose RoPE (``nsa.ops.get_ops``;
        the config's ``attention.backend``): on CUDA by default the kernel NSA's layers use, one
        launch each way where torch's formula took about eight forward and a dozen backward
        per tensor, so that the baseline's step pays no more host ops for RoPE than NSA's."""
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.rope_theta = rope_theta
        self.backend = backend
        _resolve_ops(backend)
        self.rope_cache = rope_cache if rope_cache is not None else RopeCache(head_dim, rope_theta)
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.kv_proj = nn.Linear(dim, 2 * n_kv_heads * head_dim, bias=False)  # rows: k, v
        self.o_proj = nn.Linear(n_heads * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._project(x, _token_angles(self.rope_cache, x))
        return self.attend(q, k, v, None)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
               ) -> torch.Tensor:
        """Attention of ``q [B,Tq,H,D]`` over ``k, v [B,Tk,G,D]`` then the output projection:
        causal (Tq == Tk) when ``mask`` is None, else under the bool ``mask [B, 1, Tq, Tk]``
        (the KV-cache decoder's visible keys)."""
        B, T = q.shape[:2]
        H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if mask is not None:  # decoding: GQA in SDPA, no copy of the whole cache per head
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=G != H)
            return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D))
        if G != H:  # repeat K/V per query head: keeps the fused (flash) kernels usable
            k = k.repeat_interleave(H // G, dim=1)
            v = v.repeat_interleave(H // G, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D))

    def project(self, x: torch.Tensor, pos: torch.Tensor, angles: Angles | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, T, dim]`` at positions ``pos [T]`` -> rotated q ``[B,T,H,D]``, rotated k and
        v ``[B,T,G,D]`` (shared with the KV-cache decoder, nsa/infer/; ``pos [B, 1]``: one
        token per sequence at its own position; ``angles``: ``rope_angles`` of ``pos`` when
        the caller has them)."""
        if pos.dim() == 2:
            q, k, v = _per_sequence(self.project, x, pos, angles)
            return q, k, v
        if angles is None:
            angles = rope_angles(pos, self.head_dim, self.rope_theta, upcast_dtype(x.dtype))
        return self._project(x, angles)

    def _project(self, x: torch.Tensor, angles: Angles) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``project`` of the positions whose RoPE ``angles`` are given."""
        B, T, _ = x.shape
        H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, H, D)
        kv = self.kv_proj(x).view(B, T, 2, G, D)
        cos, sin = angles
        k, v = kv.unbind(2)  # one stack in the backward, not two zero-filled copies summed
        ops = get_ops(self.backend, x.device.type)
        return ops_rope(ops, q, cos, sin), ops_rope(ops, k, cos, sin), v
