"""The NSA attention core that the benchmarks time, and its random inputs.

One layer's attention without projections: compressed branch and block scores, top-n
selection, selected and window branches, gated sum; with nsa-125m's NSA hyperparameters.
"""

from __future__ import annotations

from typing import Any

import torch

from nsa.ops import compressed_attention_and_selection, gated_combine, window_attention

NSA = dict(block=32, stride=16, select_block=64, num_selected=16, num_initial=1, num_local=2, window=512)


def nsa_attention(ops: Any, q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, gates,
                  idx: torch.Tensor | None = None,
                  trace: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The NSA attention core of one layer through ``ops`` (a module of the ops contract).

    ``idx``: use this block selection instead of the top-n of this call's scores (to
    compare two implementations on the same blocks: near-tied scores may rank apart).
    ``trace``: receives this call's ``scores`` and ``idx``. Without either, the model's own path:
    the top-n fused into the scores kernel (no scores tensor) and the gated sum as one kernel,
    where ``ops`` has them."""
    G = k_slc.shape[2]
    if idx is None and trace is None:  # what the model runs: the fused selection where ops has it
        o_cmp, idx = compressed_attention_and_selection(
            ops, q, k_cmp, v_cmp, NSA["block"], NSA["stride"], NSA["select_block"], G, NSA["num_selected"],
            NSA["num_initial"], NSA["num_local"])
    else:
        o_cmp, scores = ops.compressed_attention_and_scores(q, k_cmp, v_cmp, NSA["block"], NSA["stride"],
                                                            NSA["select_block"], G)
        if idx is None:
            idx = ops.select_blocks(scores, NSA["select_block"], NSA["num_selected"], NSA["num_initial"],
                                    NSA["num_local"])
        if trace is not None:
            trace.update(scores=scores, idx=idx)
    o_slc = ops.selected_attention(q, k_slc, v_slc, idx, NSA["select_block"])
    o_win = window_attention(ops, q, k_win, v_win, NSA["window"])
    return gated_combine(ops, gates, o_cmp, o_slc, o_win)


def num_compressed(T: int) -> int:
    return (T - NSA["block"]) // NSA["stride"] + 1 if T >= NSA["block"] else 0


def attention_inputs(impl: str, B: int, T: int, H: int, G: int, D: int, dev: str = "cuda",
                     dt: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """Random inputs of one case: dense q, k, v ([B, heads, T, D]); or NSA q, compressed
    and branch K/V, gates (the ``nsa_attention`` argument order)."""
    if impl.startswith("dense"):
        return [torch.randn(B, H, T, D, device=dev, dtype=dt), torch.randn(B, G, T, D, device=dev, dtype=dt),
                torch.randn(B, G, T, D, device=dev, dtype=dt)]
    nc = num_compressed(T)
    shapes = [(B, T, H, D), (B, nc, G, D), (B, nc, G, D)] + [(B, T, G, D)] * 4
    xs = [torch.randn(*s, device=dev, dtype=dt) for s in shapes]
    return xs + [torch.rand(B, T, H, 3, device=dev, dtype=dt)]


def prefix_inputs(xs: list[torch.Tensor], T: int) -> list[torch.Tensor]:
    """The NSA inputs of the first T positions (by causality, the outputs of those
    positions are the full run's first T rows)."""
    nc = num_compressed(T)
    return [x[:, :nc] if i in (1, 2) else x[:, :T] for i, x in enumerate(xs)]
