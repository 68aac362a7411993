"""Is a benchmarked NSA output right? The kernels against the reference ops on the same inputs.

The reference gets the same input values in fp32 (the kernels' bf16 inputs upcast
exactly, so only the kernels' rounding differs) and replays the kernels' block selection
(near-tied scores may rank differently in two correct implementations; the scores
themselves are compared). Errors are relative Frobenius norms ``|a - b| / |b|``.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.core import nsa_attention, prefix_inputs
from nsa.ops import reference

# Bars of the kernel tests (tests/ops): fp32 1e-5, 16-bit 1e-2.
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
INPUT_NAMES = ("q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win", "gates")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _run(ops: Any, xs: list[torch.Tensor], dtype: torch.dtype | None, grad_out: torch.Tensor | None,
         idx: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[torch.Tensor]]:
    leaves = [(x.detach().to(dtype) if dtype else x.detach().clone()).requires_grad_(grad_out is not None)
              for x in xs]
    trace: dict[str, torch.Tensor] = {}
    with torch.set_grad_enabled(grad_out is not None):
        out = nsa_attention(ops, *leaves, idx=idx, trace=trace)
        if grad_out is not None:
            out.backward(grad_out.to(out.dtype))
    return out.detach(), trace, [x.grad for x in leaves] if grad_out is not None else []


def compare_to_reference(ops: Any, xs: list[torch.Tensor], grad_out: torch.Tensor | None) -> dict[str, float]:
    """Relative errors of ``ops`` vs the reference on ``xs``: ``out``, ``scores`` and, with a
    ``grad_out``, the gradient of every input (``d<name>``)."""
    out, trace, grads = _run(ops, xs, None, grad_out, None)
    acc = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    ref, ref_trace, ref_grads = _run(reference, xs, acc, grad_out, trace["idx"])
    errs = {"out": rel_err(out, ref), "scores": rel_err(trace["scores"], ref_trace["scores"])}
    for name, g, r in zip(INPUT_NAMES, grads, ref_grads):
        errs[f"d{name}"] = rel_err(g, r)
    return errs


def check_nsa(ops: Any, xs: list[torch.Tensor], grad_out: torch.Tensor | None,
              max_len: int | None = None) -> dict[str, Any]:
    """The correctness verdict of one benchmark case.

    Runs ``compare_to_reference`` on the whole sequence; if that runs out of memory (or T
    exceeds ``max_len``), on the first positions (halving until it fits: by causality
    their outputs are rows of the full run, and their gradients those of a shorter
    sequence). Returns ``errors`` (as above), ``checked_len``, ``tolerance`` and, per
    quantity group, the largest error: ``fwd_err`` (out, scores), ``bwd_err`` (gradients)."""
    T = xs[0].shape[1]
    n = min(T, max_len or T)
    while True:
        try:
            sub = xs if n == T else prefix_inputs(xs, n)
            g = None if grad_out is None else (grad_out if n == T else grad_out[:, :n])
            errs = compare_to_reference(ops, sub, g)
            break
        except torch.cuda.OutOfMemoryError:
            if n <= 256:
                raise
            torch.cuda.empty_cache()
            n //= 2
    bwd = [v for k, v in errs.items() if k.startswith("d")]
    return dict(errors=errs, checked_len=n, tolerance=TOLERANCE[xs[0].dtype],
                fwd_err=max(errs["out"], errs["scores"]), bwd_err=max(bwd) if bwd else None)


def verdict(err: float | None, tol: float, what: str) -> str:
    """Row status: ``ok``, or ``mismatch: ...`` when the error is over the bar (or not finite)."""
    if err is None:
        return "ok"
    if not err <= tol:  # NaN fails too
        return f"mismatch: {what} rel err {err:.2e} > {tol:.0e}"
    return "ok"
