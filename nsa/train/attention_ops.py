"""Which attention ops a run trains with, settled before anything trains and the same on every
rank.

Kept apart from the loop (trainer.py) because it is an agreement between ranks, not a step: on
CUDA the Triton kernels must pass a self-check first (``nsa.ops.choose_ops``), a rank whose
check fails makes every rank fall back to the reference ops (ranks must run the same ops; the
same for FlexAttention's window branch, which one failing rank turns off everywhere), an
error on one rank is raised on every rank (never a hang), and a fallback is said loudly, because
the reference ops are far slower.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nsa.config import ModelConfig
from nsa.contract import AttentionOps
from nsa.train import distributed as D
from nsa.train.telemetry import Heartbeat


def agree(m: ModelConfig, device: torch.device, bf16: bool, rank: int, hb: Heartbeat,
          log: Callable[[str], None]) -> AttentionOps:
    """The ops every rank trains with; returns run.json's ``attention_ops``."""
    if m.attention.kind != "nsa":
        return AttentionOps(backend="sdpa", requested="sdpa")
    from nsa.ops import AttentionShape, choose_ops, fall_back, flex

    requested = m.attention.backend
    dtype = torch.bfloat16 if bf16 else torch.float32
    choice, error = None, None
    checks = requested == "triton" or (requested == "auto" and device.type == "cuda")
    if checks:
        hb.set_phase("compile")  # the check compiles the kernels for this GPU
    try:
        choice = choose_ops(requested, device, dtype, AttentionShape.of_model(m))
    except Exception as exc:  # backend triton and a failing check: an error on every rank (no hang)
        error = str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"
    finally:
        if checks:
            hb.set_phase("boot")
    ranks = D.all_gather_objects((error, choice.record() if choice else None))
    for r, (err, _) in enumerate(ranks):
        if err:
            raise RuntimeError(err if r == rank else f"rank {r}: {err}")
    assert choice is not None
    if not choice.fallback_reason:
        for r, (_, rec) in enumerate(ranks):
            if rec.fallback_reason:  # every rank must run the same ops
                reason = f"rank {r}: {rec.fallback_reason}"
                choice = fall_back(requested, device, reason, choice.check)
                break
    if (other := window_veto(choice.window, [rec for _, rec in ranks])) is not None:
        choice.window, choice.window_reason = "triton", other
        flex.turn_off(other)
    if choice.window_reason and choice.backend == "triton" and device.type == "cuda":
        log(f"window branch on the Triton band kernel, not FlexAttention, because: {choice.window_reason}")
    if choice.fallback_reason:
        log(f"WARNING: attention backend {requested!r}: training on the PyTorch reference ops, far "
            f"slower than the Triton kernels, because: {choice.fallback_reason}")
    return choice.record()


def window_veto(window: str, ranks: list[AttentionOps]) -> str | None:
    """Why a rank that could train the window on FlexAttention must not: another rank cannot
    (every rank runs the same kernels, the window's too); None when all can, or this one cannot."""
    if window != "flexattention":
        return None
    for r, rec in enumerate(ranks):
        if rec.window != "flexattention":
            return f"rank {r}: {rec.window_reason}"
    return None
