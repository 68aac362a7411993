"""Learning-rate schedule: linear warmup, then cosine down to an explicit ``min_lr``.

Counted in optimizer steps, never micro-batches: ``lr_at(s)`` is the rate
used by optimizer step ``s`` (0-based), whatever the gradient accumulation.
"""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Step 0 gets ``lr / warmup``, step ``warmup - 1`` and ``warmup`` the peak ``lr``,
    the last step (``total_steps - 1``) exactly ``min_lr``; no hidden floor."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = total_steps - 1 - warmup_steps
    if decay_steps <= 0:
        return lr if step < total_steps - 1 or warmup_steps >= total_steps else min_lr
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
