"""Per-layer KV caches for incremental decoding: NSA's here, the shared pieces, ``make_cache``.

Layout: a batch of B sequences, each with its own length (right padding): sequence b
holds its tokens at positions ``0 .. lengths[b] - 1`` and its next token goes to position
``lengths[b]``. Every sequence's keys sit at their true positions, so RoPE, the
compression blocks and the selection blocks are the training forward's, whatever the
other sequences' lengths. A slot past a sequence's length may hold anything (the prefill's
padding); no query ever sees it, and it is overwritten before it is seen.

An NSA layer keeps, per sequence (``S`` = capacity, rounded up to whole selection blocks):

- the selected branch's rotated K/V, ``[B, S, G, D]``: any earlier block may be selected;
- the window branch's rotated K/V in a ring of ``min(w, S)`` slots (position p in slot
  ``p % size``): a query sees only the last w keys;
- the compressed branch's raw (un-rotated) K/V in a ring of l slots: phi's input for the
  block that completes next;
- the compressed K/V, ``[B, Nc(S), G, D]``: token i is written (phi, then RoPE at its
  last position) when its block ``[i*d, i*d + l)`` completes, i.e. when position
  ``i*d + l - 1`` is decoded, exactly when the training forward first lets a query see it.

The single new query's maths (``NSACache.step``) uses the reference ops' own primitives
(masked attention with probabilities, the selection rule ``select_blocks_at``, per-query
attention over gathered keys) and the layer's own projections, phi, RoPE, gates and
output projection: decoding is those functions applied to one query, not a second
implementation of them. One exception: Eq. 9 + 10 (block scores from the compressed
probabilities) goes through the nonzero band of the overlap matrix (``group_scores``),
O(Nc) per step instead of the dense ``[Nc, Ns]`` product, which took about a third of a
nsa-125m step's CPU time at 64k tokens; a test compares it with the reference's.

``step`` is ``project`` and ``_append`` (the cache writes; on CUDA one ``decode_write``
kernel does both, chosen by nsa/infer/fused.py), ``_append_compressed``, ``_branches`` (the
three branches' attention, reading the cache only: what the fused decode kernels replace)
and ``mix``. It is device work on fixed shapes with no host sync, no tensor built from host
data and no branch on a device value, and the index tensors it needs are built once by
``allocate``: a CUDA graph captures it (nsa/infer/graph.py).
"""

from __future__ import annotations

import torch

from nsa.infer import fused
from nsa.infer.cache_dense import DenseCache
from nsa.infer.step_shared import StepShared, angles_at
from nsa.model.attention import Angles, DenseAttention, NSAAttention
from nsa.model.compress import stacked_weights
from nsa.model.layers import RMSNorm, upcast_dtype
from nsa.ops.reference import (
    _acc_dtype,
    _attend,
    _masked_attention,
    num_compressed,
    num_select_blocks,
    select_blocks_at,
)
from nsa.ops.rope import rope_table


def overlap_band(T: int, block: int, stride: int, select_block: int, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 9's overlap weights as a band: compressed token i (``[i*d, i*d + l)``) overlaps
    the selection blocks ``cols[i, k] = i*d // l' + k`` (k < K, the most blocks a span of l
    tokens can touch) with weight ``vals[i, k] = overlap length / d`` (0 past the last
    block). The nonzero entries of the reference's dense ``[Nc, Ns]`` overlap matrix
    (tests/model/test_decode.py compares them), in O(Nc) memory: a decode step then costs
    O(Nc) for the scores instead of O(Nc * Ns)."""
    nc, ns = num_compressed(T, block, stride), num_select_blocks(T, select_block)
    K = (block - 1) // select_block + 2
    c0 = (torch.arange(nc, device=device) * stride)[:, None]
    cols = c0 // select_block + torch.arange(K, device=device)
    s0 = cols * select_block
    lo, hi = torch.maximum(c0, s0), torch.minimum(c0 + block, s0 + select_block)
    vals = (hi - lo).clamp_min(0).to(torch.float64) / stride
    inside = cols < ns
    return torch.where(inside, cols, 0), torch.where(inside, vals, 0.0)


def group_scores(probs: torch.Tensor, n_kv_heads: int, cols: torch.Tensor, vals: torch.Tensor, n_blocks: int
                 ) -> torch.Tensor:
    """Block importance per KV group for ``probs [B, C, H, Nc]``: Eq. 10 (sum over the
    group's heads) then Eq. 9 through the band (``overlap_band``) -> ``[B, C, G, n_blocks]``.
    The reference's ``_scores_from_probs`` up to rounding (both are linear; it applies the
    dense overlap matrix per head first)."""
    B, C, H, Nc = probs.shape
    acc = vals.dtype
    pg = probs.to(acc).reshape(B, C, n_kv_heads, H // n_kv_heads, Nc).sum(dim=3)  # [B, C, G, Nc]
    contrib = (pg[..., None] * vals).reshape(B, C, n_kv_heads, -1)
    out = torch.zeros(B, C, n_kv_heads, n_blocks, dtype=acc, device=probs.device)
    return out.index_add_(-1, cols.reshape(-1), contrib)


def _ring_fill(ring: torch.Tensor, src: torch.Tensor, lengths: torch.Tensor) -> None:
    """Write the last ``ring.shape[1]`` positions before each sequence's length from
    ``src [B, T, G, D]`` into ``ring`` (position p in slot ``p % size``)."""
    size = ring.shape[1]
    slot = torch.arange(size, device=src.device)
    last = (lengths - 1)[:, None]
    pos = last - torch.remainder(last - slot, size)  # the newest position <= last in each slot
    pos = pos.clamp(0, src.shape[1] - 1)  # slots no position has reached yet: never visible
    ring.copy_(torch.gather(src, 1, pos[:, :, None, None].expand(-1, -1, *src.shape[2:])))


class NSACache:
    """One NSA layer's cache (see the module docstring) and its prefill and one-token step."""

    def __init__(self, attn: NSAAttention, batch: int, capacity: int, rope: Angles | None = None) -> None:
        c = attn.cfg
        self.attn = attn
        self.batch = batch
        self.capacity = num_select_blocks(capacity, c.select_block) * c.select_block
        self.tensors: dict[str, torch.Tensor] = {}
        self.consts: dict[str, torch.Tensor] = {}  # index tensors every step uses (allocate)
        # RoPE's tables over every position a step may write (shared by a model's layers; built
        # by allocate when not given)
        self.rope = rope
        self.joint: fused.JointProjection | None = None  # q, K/V and gates as one GEMM (CUDA)
        self.folds: dict[str, fused.JointProjection] = {}  # the block's other folded GEMMs (decode_block)
        self.phi_weights: list[torch.Tensor] | None = None  # phi's, stacked for decode_compress
        # the decode kernels' merge counters, one per (sequence, KV group): zero between launches
        self.tickets: torch.Tensor | None = None

    def allocate(self, dtype: torch.dtype, device: torch.device) -> None:
        """Zeroed cache tensors (prefill calls this with its K/V's dtype; a benchmark may
        call it and fill them with anything), and the step's constant index tensors: a step
        builds none (fewer ops per token, nothing a CUDA graph would have to re-create)."""
        c, a = self.attn.cfg, self.attn
        B, S, G, D = self.batch, self.capacity, a.n_kv_heads, a.head_dim
        sizes = {"slc": S, "win": min(c.window, S), "raw": c.compress_block,
                 "cmp": num_compressed(S, c.compress_block, c.compress_stride)}
        for name, n in sizes.items():
            for kv in "kv":
                self.tensors[kv + "_" + name] = torch.zeros(B, n, G, D, dtype=dtype, device=device)
        # Eq. 9's overlap weights of every compressed token there can be, as a band
        cols, vals = overlap_band(S, c.compress_block, c.compress_stride, c.select_block, device)
        self.band_cols, self.band_vals = cols, vals.to(_acc_dtype(self.tensors["k_slc"]))
        self.n_blocks = num_select_blocks(S, c.select_block)
        if self.rope is None:
            self.rope = rope_table(S, D, a.rope_theta, upcast_dtype(dtype), device)
        rows = torch.arange(B, device=device)
        bl = c.compress_block
        self.consts = {
            "rows": rows,  # [B]: each sequence's cache row
            "rows_col": rows[:, None],  # [B, 1]
            "rows_blk": rows[:, None, None],  # [B, 1, 1]
            "groups_blk": torch.arange(G, device=device)[None, :, None],  # [1, G, 1]
            # [l]: a block's tokens as offsets from its last one, oldest first
            "raw_back": torch.arange(bl, device=device) - (bl - 1),
            # [Nc]: the position at which compressed token i becomes visible, i*d + l - 1
            "cmp_ends": torch.arange(sizes["cmp"], device=device) * c.compress_stride + (bl - 1),
            "block_tok": torch.arange(c.select_block, device=device),  # [l']: offsets in a block
            "win_slots": torch.arange(sizes["win"], device=device),  # [w]: the window ring's slots
        }
        # the decode kernels' counters: the selected launch's tickets, or the one launch's four
        # per (sequence, group) (nsa/ops/triton/decode_fused.py's COUNTERS)
        self.tickets = torch.zeros(4 * B * G, dtype=torch.int32, device=device)
        if fused.fused_op(c.backend, self.tensors["k_raw"], "decode_compress") is not None:
            self._stacked_phi()  # before any step: a CUDA graph's capture must not build them

    def cache_tensors(self) -> list[torch.Tensor]:
        """Everything the cache holds (for memory accounting)."""
        return list(self.tensors.values())

    def prefill(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The layer's own forward over ``x [B, T, dim]`` (prompts right-padded to T), which
        also fills the cache with each sequence's first ``lengths[b]`` positions."""
        a, t = self.attn, self.tensors
        T = x.shape[1]
        if T > self.capacity:
            raise ValueError(f"prompt of {T} tokens exceeds the cache's capacity {self.capacity}")
        q, k_raw, v_raw, k_slc, v_slc, k_win, v_win = a.project(x, torch.arange(T, device=x.device))
        k_cmp, v_cmp = a.compress(k_raw, v_raw)
        out = a.attend(x, q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win)
        if not t:
            self.allocate(k_slc.dtype, k_slc.device)
        t["k_slc"][:, :T], t["v_slc"][:, :T] = k_slc, v_slc
        nc = k_cmp.shape[1]  # blocks past a sequence's end hold padding until they complete
        t["k_cmp"][:, :nc], t["v_cmp"][:, :nc] = k_cmp, v_cmp
        for name, k, v in (("win", k_win, v_win), ("raw", k_raw, v_raw)):
            _ring_fill(t["k_" + name], k, lengths)
            _ring_fill(t["v_" + name], v, lengths)
        return out

    def step(self, x: torch.Tensor, pos: torch.Tensor, shared: StepShared | None = None,
             compress: bool = True, residual: torch.Tensor | None = None, norm: RMSNorm | None = None
             ) -> torch.Tensor:
        """One new token per sequence, ``x [B, 1, dim]`` at positions ``pos [B]`` (``shared``:
        the step's index tensors and RoPE's angles, computed by its first layer for the others,
        see ``_slots``): write its keys (and, with ``compress``, the compressed token whose block
        it completes: the host passes False when no sequence completes one), then the three
        branches for its query (``_branches``), gated and projected -> ``[B, 1, dim]``
        (``residual``: added inside the projection's GEMM, in place: ``NSAAttention.mix``).
        ``norm``: x is the block's raw input and this its attention norm (on CUDA folded into
        the projection's GEMM and finished by ``decode_write``); None: x is normed already.
        Device work only: no host sync, no host data, no branch on a device value (a CUDA
        graph captures it)."""
        a, t = self.attn, self.tensors
        write = fused.fused_op(a.cfg.backend, x, "decode_write")
        phi = fused.fused_op(a.cfg.backend, x, "decode_compress")
        if norm is not None and write is None:
            x, norm = norm(x), None
        rope = self._rope()
        # the rings' slots and the block order, for the torch writes and phi (the kernels
        # compute their own from pos)
        torch_ops = write is None or phi is None
        slots = self._slots(pos, shared, compress and phi is None) if torch_ops else {}
        logits = None
        if write is not None:  # one GEMM for q, K/V and gates; RoPE and the six writes in one kernel
            H, G, D = a.n_heads, a.n_kv_heads, a.head_dim
            self.joint = fused.joint_for(self.joint, [a.q_proj, a.kv_proj, a.gate], norm)
            q_in, kv_in, logits = self.joint.project(x, [(H, D), (6, G, D), (H, 3)])
            fold = {} if norm is None else {"norm": (x, norm.eps), "gates": (logits, a.gate.bias)}
            pairs = [(t["k_raw"], t["v_raw"], False), (t["k_slc"], t["v_slc"], True),
                     (t["k_win"], t["v_win"], True)]
            q = write(q_in, kv_in, *rope, pos, pairs, **fold)
        else:
            angles = angles_at(rope, pos, shared)
            q, k_raw, v_raw, k_slc, v_slc, k_win, v_win = a.project(x, pos[:, None], angles)
            new = (u[:, 0] for u in (k_raw, v_raw, k_slc, v_slc, k_win, v_win))  # each [B, G, D]
            self._append(pos, slots, *new)
        if phi is not None and compress and t["k_cmp"].shape[1]:
            phi(t["k_raw"], t["v_raw"], pos, *rope, t["k_cmp"], t["v_cmp"], a.cfg.compress_stride,
                *self._stacked_phi())
        else:
            self._append_compressed(pos, rope, shared, slots)
        gated = fused.fused_op(a.cfg.backend, x, "nsa_decode_gated")
        if gated is not None and logits is not None and a.gate_override is None:
            # the three branches and their gated sum in the attention's own launches
            c = a.cfg
            o = gated(q, t["k_cmp"], t["v_cmp"], t["k_slc"], t["v_slc"], t["k_win"], t["v_win"], pos, logits,
                      c.compress_block, c.compress_stride, c.select_block, c.num_selected, c.num_initial,
                      c.num_local, tickets=self.tickets)
            return a.project_out(o.reshape(x.shape[0], 1, a.n_heads * a.head_dim), residual)
        o_cmp, o_slc, o_win = self._branches(q, pos)
        return a.mix(x, o_cmp, o_slc, o_win, track=False,
                     from_logits=fused.fused_op(a.cfg.backend, x, "gated_combine_logits"), gate_logits=logits,
                     residual=residual)

    def _rope(self) -> Angles:
        if self.rope is None:
            raise RuntimeError("the cache is empty: prefill (or allocate) first")
        return self.rope

    def _slots(self, pos: torch.Tensor, shared: StepShared | None, compress: bool = True
               ) -> dict[str, torch.Tensor]:
        """Where this step writes, from ``pos [B]`` and the cache's sizes alone: the rings'
        slots and, with ``compress``, the ring slots of the block that ends at ``pos`` (oldest
        first), the compressed token it would complete and whether it does. Every layer of a
        model has the same sizes, so the first layer of a step computes them (11 small ops)
        and the others reuse them from ``shared``."""
        c, t = self.attn.cfg, self.tensors
        bl, d, n_cmp = c.compress_block, c.compress_stride, t["k_cmp"].shape[1]
        key = ("nsa", t["k_win"].shape[1], bl, d, n_cmp, compress)
        if shared is not None and key in shared:
            return shared[key]
        slots = {"win": pos % t["k_win"].shape[1], "raw": pos % bl}
        if n_cmp and compress:
            slots["order"] = torch.remainder(pos[:, None] + self.consts["raw_back"], bl)  # [B, l]
            # compressed token i = (pos - l + 1) / d completes now when that is a whole number >= 0
            start = pos - (bl - 1)
            slots["done"] = ((start >= 0) & (start % d == 0))[:, None, None]
            slots["i"] = (start // d).clamp(0, n_cmp - 1)
        if shared is not None:
            shared[key] = slots
        return slots

    def _append(self, pos: torch.Tensor, slots: dict[str, torch.Tensor], k_raw: torch.Tensor,
                v_raw: torch.Tensor, k_slc: torch.Tensor, v_slc: torch.Tensor, k_win: torch.Tensor,
                v_win: torch.Tensor) -> None:
        """Write the new token's keys and values (each ``[B, G, D]``) at ``pos [B]``: the selected
        branch's cache and both rings (``slots``: from ``_slots``). What ``decode_write`` does
        in one kernel on CUDA."""
        t, rows = self.tensors, self.consts["rows"]
        t["k_slc"][rows, pos], t["v_slc"][rows, pos] = k_slc, v_slc
        for name, kn, vn in (("win", k_win, v_win), ("raw", k_raw, v_raw)):
            t["k_" + name][rows, slots[name]], t["v_" + name][rows, slots[name]] = kn, vn

    def _append_compressed(self, pos: torch.Tensor, rope: Angles, shared: StepShared | None,
                           slots: dict[str, torch.Tensor]) -> None:
        """Compressed token ``i`` when the token at ``pos`` (already in the raw ring) completes
        its block; what ``decode_compress`` does in three launches on CUDA (phi's weights
        stacked by ``_stacked_phi``)."""
        a, t, k = self.attn, self.tensors, self.consts
        rows = k["rows"]
        # phi runs for every sequence of a step that completes a block in any, and the write
        # keeps the old token where none completes: no branch on a device value. Without
        # "order" (no compression asked, or a capacity below l holds no compressed token:
        # both known on the host) nothing more is written.
        if "order" not in slots:
            return
        order, done, i = slots["order"], slots["done"], slots["i"]
        blk_k, blk_v = t["k_raw"][k["rows_col"], order], t["v_raw"][k["rows_col"], order]  # [B, l, G, D]
        # [B, 1, G, D] each: one block per sequence
        new_k, new_v = a.compress(blk_k, blk_v, pos[:, None], angles_at(rope, pos, shared))
        t["k_cmp"][rows, i] = torch.where(done, new_k[:, 0], t["k_cmp"][rows, i])
        t["v_cmp"][rows, i] = torch.where(done, new_v[:, 0], t["v_cmp"][rows, i])

    def _stacked_phi(self) -> list[torch.Tensor]:
        """phi's weights for ``decode_compress``, K's and V's stacked (none: average pooling);
        built once (``allocate`` does it where the kernel will run)."""
        if self.phi_weights is None:
            with torch.no_grad():
                self.phi_weights = stacked_weights(self.attn.compress_k, self.attn.compress_v)
        return self.phi_weights

    def _branches(self, q: torch.Tensor, pos: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The three branches' attention for the one new query per sequence, ``q [B, 1, H, D]``
        at ``pos [B]``, over what the cache holds (this token's keys already written) ->
        ``(o_cmp, o_slc, o_win)``, each ``[B, 1, H, D]`` in q's dtype. Reads the cache only:
        the part of a step that a fused decode kernel can take over whole."""
        a, c, t, k = self.attn, self.attn.cfg, self.tensors, self.consts
        # on CUDA with the Triton ops: the fused decode kernels (nsa/ops/triton/decode.py), a few
        # launches per layer instead of ~140 ops; these torch ops are their reference
        kernels = fused.fused_op(c.backend, q, "nsa_decode_branches")
        if kernels is not None:
            return kernels(q, t["k_cmp"], t["v_cmp"], t["k_slc"], t["v_slc"], t["k_win"], t["v_win"], pos,
                         c.compress_block, c.compress_stride, c.select_block, c.num_selected, c.num_initial,
                         c.num_local, tickets=self.tickets)
        B, H, G, D = q.shape[0], a.n_heads, a.n_kv_heads, a.head_dim
        lp = c.select_block
        n_cmp = t["k_cmp"].shape[1]
        scale = D**-0.5
        # Compressed branch (causal: token i visible iff i*d + l - 1 <= pos) and its probabilities.
        visible = (k["cmp_ends"] <= pos[:, None])[:, None, None, None, :]  # [B, 1, 1, 1, Nc]
        o_cmp, probs = _masked_attention(q, t["k_cmp"], t["v_cmp"], visible, scale)
        probs = probs.permute(0, 3, 1, 2, 4).reshape(B, 1, H, n_cmp)
        # Eq. 10 + 9, then the training forward's selection rule at each sequence's position.
        scores = group_scores(probs, G, self.band_cols, self.band_vals, self.n_blocks)  # [B, 1, G, Ns]
        idx = select_blocks_at(scores, pos[:, None], lp, c.num_selected, c.num_initial, c.num_local)

        acc = _acc_dtype(q)
        qg = q.reshape(B, 1, G, H // G, D).to(acc) * scale
        # Selected branch: the chosen blocks' tokens s <= pos (idx is a set; -1 slots unused).
        blk = idx[:, 0].clamp_min(0)  # [B, G, n]
        n = blk.shape[-1]
        k_blocks = t["k_slc"].view(B, -1, lp, G, D).permute(0, 3, 1, 2, 4)  # [B, G, Ns, l', D]
        v_blocks = t["v_slc"].view(B, -1, lp, G, D).permute(0, 3, 1, 2, 4)
        keys = k_blocks[k["rows_blk"], k["groups_blk"], blk].reshape(B, 1, G, n * lp, D)
        vals = v_blocks[k["rows_blk"], k["groups_blk"], blk].reshape(B, 1, G, n * lp, D)
        tok = blk[..., None] * lp + k["block_tok"]  # [B, G, n, l']
        seen = (idx[:, 0, :, :, None] >= 0) & (tok <= pos[:, None, None, None])
        o_slc = _attend(qg, keys, vals, seen.reshape(B, 1, G, n * lp)).reshape(B, 1, H, D).to(q.dtype)

        # Window branch: the ring holds exactly the positions pos - w < s <= pos that are >= 0;
        # slot s holds one once pos >= s (position s is the first written there).
        size = t["k_win"].shape[1]
        held = k["win_slots"] <= pos[:, None]  # [B, size]
        keys = t["k_win"].permute(0, 2, 1, 3)[:, None]  # [B, 1, G, size, D]
        vals = t["v_win"].permute(0, 2, 1, 3)[:, None]
        o_win = _attend(qg, keys, vals, held[:, None, None, :].expand(B, 1, G, size))
        o_win = o_win.reshape(B, 1, H, D).to(q.dtype)
        return o_cmp, o_slc, o_win


LayerCache = NSACache | DenseCache


def make_cache(attn: object, batch: int, capacity: int, rope: Angles | None = None) -> LayerCache:
    """The cache for one layer's attention module (NSAAttention or DenseAttention); ``rope``:
    RoPE's tables over at least ``capacity`` positions, shared by the model's layers (None:
    the cache builds its own)."""
    if isinstance(attn, NSAAttention):
        return NSACache(attn, batch, capacity, rope)
    if isinstance(attn, DenseAttention):
        return DenseCache(attn, batch, capacity, rope)
    raise TypeError(f"no KV cache for {type(attn).__name__}")
