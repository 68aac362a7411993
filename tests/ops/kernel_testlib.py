"""Shared helpers of the kernel tests: fresh seeds, relative error, the fp32 bar."""

from __future__ import annotations

import os

import torch

TOL = 1e-5  # the kernels' bar: relative error of outputs and gradients in fp32


def fresh_seed() -> int:
    """Seed torch from the OS so each run sees new inputs; the seed goes in failure messages."""
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` in fp64 (Frobenius norms)."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
