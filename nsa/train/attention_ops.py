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

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from nsa.config import ModelConfig
from nsa.contract import AttentionOps
from nsa.train import distributed as D
from nsa.train.telemetry import Heartbeat

if TYPE_CHECKING:
    from nsa.ops import OpsChoice


def agree(m: ModelConfig, device: torch.device, bf16: bool, rank: int, hb: Heartbeat,
          log: Callable[[str], None]) -> AttentionOps:
    """The ops every rank trains with; returns run.json's ``attention_ops``."""
    if m.attention.kind != "nsa":
        return _agree_dense(m, device, bf16, rank, hb, log)
    from nsa.ops import flex

    requested = m.attention.backend
    choice, ranks = _settle(m, device, bf16, rank, hb, rope_only=False)
    if (other := window_veto(choice.window, ranks)) is not None:
        choice.window, choice.window_reason = "triton", other
        flex.turn_off(other)
    if choice.window_reason and choice.backend == "triton" and device.type == "cuda":
        log(f"window branch on the Triton band kernel, not FlexAttention, because: {choice.window_reason}")
    if choice.fallback_reason:
        log(f"WARNING: attention backend {requested!r}: training on the PyTorch reference ops, far "
            f"slower than the Triton kernels, because: {choice.fallback_reason}")
    return choice.record()


def _agree_dense(m: ModelConfig, device: torch.device, bf16: bool, rank: int, hb: Heartbeat,
                 log: Callable[[str], None]) -> AttentionOps:
    """A dense model attends with SDPA; its RoPE runs through the ops of ``attention.backend``
    (on CUDA the kernel NSA's layers use: one launch where torch's formula took a dozen), which
    pass their check first as NSA's kernels do: a failing check on any rank puts every rank on
    torch's formula (``triton``: an error)."""
    if not _checks(m.attention.backend, device):
        return AttentionOps(backend="sdpa", requested="sdpa")
    choice, _ = _settle(m, device, bf16, rank, hb, rope_only=True)
    if choice.fallback_reason:
        log(f"WARNING: RoPE on torch's formula (more ops a step), not the Triton kernel, because: "
            f"{choice.fallback_reason}")
    return AttentionOps(backend="sdpa", requested="sdpa", self_check=choice.record().self_check)


def _checks(backend: str, device: torch.device) -> bool:
    """Whether ``backend`` runs the kernels on ``device``, which must pass their check first."""
    return backend == "triton" or (backend == "auto" and device.type == "cuda")


def _settle(m: ModelConfig, device: torch.device, bf16: bool, rank: int, hb: Heartbeat, rope_only: bool
            ) -> tuple[OpsChoice, list[AttentionOps]]:
    """``choose_ops`` on every rank (its check: every op, or RoPE's alone), then the same
    choice everywhere: an error on one rank raised on all, one rank's fallback everyone's.
    Returns the choice and every rank's record."""
    from nsa.ops import AttentionShape, choose_ops, fall_back
    from nsa.ops.self_check import self_check

    requested = m.attention.backend
    dtype = torch.bfloat16 if bf16 else torch.float32
    choice, error = None, None
    checks = _checks(requested, device)
    if checks:
        hb.set_phase("compile")  # the check compiles the kernels for this GPU
    try:
        choice = choose_ops(requested, device, dtype, AttentionShape.of_model(m),
                            functools.partial(self_check, rope_only=rope_only))
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
    return choice, [rec for _, rec in ranks]


def window_veto(window: str, ranks: list[AttentionOps]) -> str | None:
    """Why a rank that could train the window on FlexAttention must not: another rank cannot
    (every rank runs the same kernels, the window's too); None when all can, or this one cannot."""
    if window != "flexattention":
        return None
    for r, rec in enumerate(ranks):
        if rec.window != "flexattention":
            return f"rank {r}: {rec.window_reason}"
    return None
