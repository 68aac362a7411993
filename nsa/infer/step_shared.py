"""What every layer of one decode step shares: index tensors computed once per step, and
RoPE's angles as rows of a table computed once per prefill."""

from __future__ import annotations

import torch

from nsa.model.attention import Angles

# One decode step's index tensors that depend only on the positions and a cache's sizes,
# keyed by those sizes: computed by the first layer that needs them, reused by the others.
StepShared = dict[tuple[object, ...], dict[str, torch.Tensor]]


def angles_at(rope: Angles, pos: torch.Tensor, shared: StepShared | None) -> Angles:
    """RoPE's (cos, sin) ``[B, D/2]`` of positions ``pos [B]``: rows of the tables ``rope``
    (``[N, D/2]``, row p the angles of position p), read by the step's first layer that needs
    them and reused by the others (two index ops per step where computing them took eight).
    The kernels of a step on CUDA read the tables at ``pos`` themselves."""
    key = ("rope", id(rope[0]))
    if shared is not None and key in shared:
        got = shared[key]
        return got["cos"], got["sin"]
    cos, sin = rope[0][pos], rope[1][pos]
    if shared is not None:
        shared[key] = {"cos": cos, "sin": sin}
    return cos, sin
