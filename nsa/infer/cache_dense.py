"""A dense layer's KV cache for incremental decoding: rotated K and V at their positions.

The layout is ``nsa/infer/cache.py``'s (a batch of sequences of their own lengths, right
padding never seen); a step attends the new query to the keys ``<= pos``: on CUDA with
``dense_decode`` (one flash-decoding kernel; two when split many ways), else SDPA under a mask.
"""

from __future__ import annotations

import torch

from nsa.infer import fused
from nsa.infer.step_shared import StepShared, angles_at
from nsa.model.attention import Angles, DenseAttention
from nsa.model.layers import RMSNorm, add_linear_, upcast_dtype
from nsa.ops.rope import rope_table


class DenseCache:
    """One dense layer's cache: rotated K and V ``[B, S, G, D]`` at their positions."""

    def __init__(self, attn: DenseAttention, batch: int, capacity: int, rope: Angles | None = None) -> None:
        self.attn = attn
        self.batch = batch
        self.capacity = capacity
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.consts: dict[str, torch.Tensor] = {}  # index tensors every step uses (allocate)
        self.rope = rope  # RoPE's tables, as NSACache's
        self.joint: fused.JointProjection | None = None  # q and K/V as one GEMM (CUDA)
        self.folds: dict[str, fused.JointProjection] = {}  # the block's other folded GEMMs (decode_block)
        self.tickets: torch.Tensor | None = None  # dense_decode's merge counters (allocate), as NSACache's

    def prefill(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The layer's own forward over ``x [B, T, dim]``, keeping its K/V."""
        T = x.shape[1]
        if T > self.capacity:
            raise ValueError(f"prompt of {T} tokens exceeds the cache's capacity {self.capacity}")
        q, k, v = self.attn.project(x, torch.arange(T, device=x.device))
        if self.k is None or self.v is None:
            self.allocate(k.dtype, k.device)
        kc, vc = self._kv()
        kc[:, :T], vc[:, :T] = k, v
        return self.attn.attend(q, k, v, None)

    def allocate(self, dtype: torch.dtype, device: torch.device) -> None:
        """Zeroed K/V ``[B, S, G, D]`` (prefill calls this; a benchmark may fill them) and the
        step's constant index tensors (a step builds none)."""
        a = self.attn
        shape = (self.batch, self.capacity, a.n_kv_heads, a.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.consts = {"rows": torch.arange(self.batch, device=device),
                       "key_pos": torch.arange(self.capacity, device=device)[None, :]}
        self.tickets = torch.zeros(self.batch * a.n_kv_heads, dtype=torch.int32, device=device)
        if self.rope is None:
            self.rope = rope_table(self.capacity, a.head_dim, a.rope_theta, upcast_dtype(dtype), device)

    def cache_tensors(self) -> list[torch.Tensor]:
        """Everything the cache holds (for memory accounting)."""
        return [t for t in (self.k, self.v) if t is not None]

    def _kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None or self.v is None:
            raise RuntimeError("the cache is empty: prefill first")
        return self.k, self.v

    def step(self, x: torch.Tensor, pos: torch.Tensor, shared: StepShared | None = None,
             compress: bool = True, residual: torch.Tensor | None = None, norm: RMSNorm | None = None
             ) -> torch.Tensor:
        """One new token per sequence at positions ``pos [B]``: attention over keys ``<= pos``,
        projected (``residual``: plus it, in the projection's GEMM on the kernel's path).
        Device work only, as ``NSACache.step``, whose ``shared`` and ``norm`` these are. On
        CUDA one ``dense_decode`` kernel attends (two when split many ways); else SDPA under a mask
        that the step's first layer of this capacity computes and the others reuse from
        ``shared``. ``compress``: NSA's, nothing here."""
        kc, vc = self._kv()
        a = self.attn
        write = fused.fused_op("auto", x, "decode_write")
        if norm is not None and write is None:
            x, norm = norm(x), None
        if self.rope is None:
            raise RuntimeError("the cache is empty: prefill first")
        if write is not None:  # one GEMM for q and K/V; RoPE of q and k and both writes in one kernel
            H, G, D = a.n_heads, a.n_kv_heads, a.head_dim
            self.joint = fused.joint_for(self.joint, [a.q_proj, a.kv_proj], norm)
            q_in, kv_in = self.joint.project(x, [(H, D), (2, G, D)])
            q = write(q_in, kv_in, *self.rope, pos, [(kc, vc, True)],
                      norm=None if norm is None else (x, norm.eps))
        else:
            rows = self.consts["rows"]
            q, k, v = a.project(x, pos[:, None], angles_at(self.rope, pos, shared))
            kc[rows, pos], vc[rows, pos] = k[:, 0], v[:, 0]
        attend = fused.fused_op("auto", x, "dense_decode")
        if attend is not None:  # flash-decoding in 1-2 launches, where masked GQA SDPA takes a dozen
            o = attend(q, kc, vc, pos, tickets=self.tickets).reshape(x.shape[0], 1, a.n_heads * a.head_dim)
            return a.o_proj(o) if residual is None else add_linear_(residual, o, a.o_proj)
        key = ("dense", self.capacity)
        if shared is not None and key in shared:
            mask = shared[key]["mask"]
        else:
            mask = (self.consts["key_pos"] <= pos[:, None])[:, None, None, :]
            if shared is not None:
                shared[key] = {"mask": mask}
        out = self.attn.attend(q, kc, vc, mask)
        return out if residual is None else residual + out
