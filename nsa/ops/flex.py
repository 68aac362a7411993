"""The sliding-window branch through FlexAttention (torch's compiled block-sparse attention).

Why: measured on one H200 (nsa-125m layout, 16k x 4, bf16), ``torch.compile(flex_attention)``
with a window block mask ran the window branch's forward and backward in 3.09 ms against
6.81 ms for our band kernel (the forward alone: 0.76 against 0.87 ms); its backward tiles
dK/dV 128 keys per program where ours holds 32. So when a run trains on the Triton kernels
on CUDA in 16-bit, its window branch runs here (``nsa.ops.window_attention`` decides);
everywhere else (no gradient wanted, fp32, the reference ops), and whenever this path is
turned off, the band kernel (``nsa.ops.triton.window_attention``) or the reference runs.

Both are deterministic: FlexAttention's backward gives every key block of a KV head to one
program, which loops over the group's query heads (no atomics), as ours does.

The block mask is built from the window's arithmetic (``window_block_mask``): which key
blocks each query block sees in part and which in full, O((T/128)^2) small integers, where
``create_block_mask`` would evaluate the mask at every (query, key) pair (T^2 booleans: 4 GiB
at 64k). A test holds it equal to ``create_block_mask``'s.

FlexAttention has no backward on CPU, so there only its forward can be compared (tests); its
backward is compared with the reference by the self-check (nsa/ops/self_check.py) on the GPU
before a run trains, and a failing check turns this path off for the run, not the Triton
kernels.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

# FlexAttention's sparse block (its default): the block mask's granularity.
BLOCK = 128
# Where it runs: its measured advantage is on CUDA in 16-bit (fp32 keeps the band kernel's
# exact dots); tests widen these to let the CPU stand in for a GPU.
DEVICES = ("cuda",)
DTYPES = (torch.float16, torch.bfloat16)
# Head dims its kernels take as they are (powers of two; others are padded by some torch
# releases and refused by others): the band kernel runs the rest.
HEAD_DIMS = (16, 32, 64, 128, 256)

_off_reason: str | None = None if os.environ.get("NSA_FLEX_WINDOW", "1") != "0" else (
    "NSA_FLEX_WINDOW=0 in the environment")


def off_reason() -> str | None:
    """Why this path is off in this process (None when it is on)."""
    return _off_reason


def turn_off(reason: str) -> None:
    """Run the band kernel instead from now on in this process (a failed check, or another
    rank's: every rank must run the same kernels)."""
    global _off_reason
    _off_reason = reason


def turn_on() -> None:
    """Undo ``turn_off`` (tests; a process that checks again)."""
    global _off_reason
    _off_reason = None


def unsuited(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why a training run on ``device`` computing in ``dtype`` keeps the band kernel for
    its window branch (None: this path runs it)."""
    if _off_reason is not None:
        return _off_reason
    if device.type not in DEVICES:
        return f"FlexAttention's kernels need CUDA, not {device.type}"
    if dtype not in DTYPES:
        return f"{str(dtype).replace('torch.', '')} compute (the band kernel's dots are exact in fp32)"
    if head_dim not in HEAD_DIMS:
        return f"head dim {head_dim} (FlexAttention is used for {', '.join(map(str, HEAD_DIMS))})"
    return None


def suits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True where the model's window branch should run here: a gradient wanted, at least
    one query, and ``unsuited`` has no objection (CUDA, 16-bit compute: the inputs' dtype
    or autocast's, a head dim FlexAttention takes whole, the path not turned off)."""
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if q.device.type not in DEVICES or q.shape[1] == 0 or not wants_grad:
        return False
    return unsuited(q.device, _compute_dtype(q), q.shape[-1]) is None


def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    dev = q.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return q.dtype


def _window_blocks(T: int, window: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partial, full)`` booleans ``[T/128, T/128]``: query block i sees key block j in
    part (some pair masked) or in full (every pair visible, both blocks complete)."""
    n = -(-T // BLOCK)
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    t_lo, t_hi = i * BLOCK, torch.clamp((i + 1) * BLOCK, max=T) - 1
    s_lo, s_hi = j * BLOCK, torch.clamp((j + 1) * BLOCK, max=T) - 1
    # query t sees key s iff 0 <= t - s < window; over the two blocks t - s spans
    # [t_lo - s_hi, t_hi - s_lo]
    some = (t_hi - s_lo >= 0) & (t_lo - s_hi <= window - 1)
    whole = (t_lo - s_hi >= 0) & (t_hi - s_lo <= window - 1)
    whole &= (t_hi - t_lo == BLOCK - 1) & (s_hi - s_lo == BLOCK - 1)
    return some & ~whole, whole


def _as_indices(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A [n, n] boolean block map -> (count [1,1,n], indices [1,1,n,n]) int32, each row's
    blocks first in ascending order (the layout ``create_block_mask`` gives)."""
    count = blocks.sum(-1, dtype=torch.int32)
    order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return count[None, None], order[None, None]


def _window_mask_mod(window: int) -> Callable[..., torch.Tensor]:
    def visible(b: Any, h: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    return visible


@functools.lru_cache(maxsize=16)
def window_block_mask(T: int, window: int, device: torch.device) -> Any:
    """FlexAttention's ``BlockMask`` of the sliding window over ``T`` tokens (query ``t``
    sees keys ``t - window < s <= t``), one for every batch and head; cached per shape."""
    from torch.nn.attention.flex_attention import BlockMask

    partial, full = _window_blocks(T, window, device)
    kv_num, kv_idx = _as_indices(partial)
    full_num, full_idx = _as_indices(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=BLOCK,
                                    mask_mod=_window_mask_mod(window), seq_lengths=(T, T))


def _flex_bthd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any, scale: float,
               enable_gqa: bool) -> torch.Tensor:
    """``flex_attention`` on ``[B, T, heads, D]`` tensors, the output in that layout too.

    The transposes to FlexAttention's ``[B, heads, T, D]`` are views inside the compiled graph,
    so what the graph returns is contiguous (its kernel lays the output out as the query is)
    and so is the gradient autograd hands its backward. With the transposes outside, the graph
    returned a transposed view, and torch 2.11's AOTAutograd, which expects a contiguous
    gradient for such an output, copied the incoming one into that layout before every
    backward: a strided copy the size of the output (0.19 ms of nsa-125m's 9.4 ms attention
    forward and backward at 2k x 32 on an H200)."""
    from torch.nn.attention.flex_attention import flex_attention

    out = flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask,
                         scale=scale, enable_gqa=enable_gqa)
    return out.transpose(1, 2)


@functools.cache
def _compiled() -> Callable[..., torch.Tensor]:
    """``_flex_bthd`` compiled (FlexAttention's fused Triton kernels; uncompiled it is a dense
    reference), one static graph per shape: no dynamic-shape kernels, and a run trains at
    one shape."""
    return torch.compile(_flex_bthd, dynamic=False)


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                     scale: float | None = None, compiled: bool | None = None) -> torch.Tensor:
    """Sliding-window attention (the ops contract's ``window_attention``) by FlexAttention:
    query t sees keys ``t - window < s <= t``; ``q [B,T,H,D]``, ``k, v [B,T,G,D]``, the
    output ``[B,T,H,D]`` in the compute dtype (autocast's on CUDA, else ``q``'s).
    ``compiled``: the compiled kernels (default on CUDA) or the uncompiled reference
    FlexAttention falls back to (default elsewhere; forward only on CPU)."""
    B, T, H, D = q.shape
    G = k.shape[2]
    if H % G:
        raise ValueError(f"{H} query heads do not split into {G} KV groups")
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    dt = _compute_dtype(q)
    mask = window_block_mask(T, window, q.device)
    run = _compiled() if (q.is_cuda if compiled is None else compiled) else _flex_bthd
    with torch.autocast(q.device.type, enabled=False):
        return run(q.to(dt), k.to(dt), v.to(dt), mask, D**-0.5 if scale is None else float(scale), H != G)
