"""NSA attention ops: a PyTorch reference and (on GPU) Triton kernels with the same API.

``get_ops(backend, device)`` returns the module whose functions the model calls. See
docs/ops-contract.md for the shared signatures. ``choose_ops`` is what a training run
calls first: it runs the kernels once against the reference (``self_check``) and settles
which module ``get_ops`` returns from then on.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import warnings
from collections.abc import Callable
from types import ModuleType

import torch

from nsa.contract import AttentionOps, SelfCheck
from nsa.ops import flex, interpret, reference
from nsa.ops.self_check import AttentionShape, CheckReport, self_check

__all__ = ["AttentionShape", "CheckReport", "OpsChoice", "apply_rope", "choose_ops",
           "compressed_attention_and_selection", "gated_combine", "get_ops", "reference", "self_check",
           "triton_available", "window_attention"]

interpret.install()  # under TRITON_INTERPRET=1 only: the CPU interpreter, minus a needless cost


def _import_triton() -> ModuleType:
    return importlib.import_module("nsa.ops.triton")


def triton_available() -> bool:
    """True when ``nsa.ops.triton`` imports (it needs the triton package and our kernels)."""
    try:
        _import_triton()
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True


def compressed_attention_and_selection(ops: ModuleType, q: torch.Tensor, k_cmp: torch.Tensor,
                                       v_cmp: torch.Tensor, block: int, stride: int, select_block: int,
                                       n_kv_heads: int, num_selected: int, num_initial: int,
                                       num_local: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The compressed branch's output and the blocks its probabilities select, ``(out
    [B,T,H,D], idx [B,T,G,n])``, with ``ops``: its fused op where it has one (the Triton
    kernels pick the top-n inside the scores kernel: no [B,T,G,Ns] scores tensor), else
    ``compressed_attention_and_scores`` then ``select_blocks`` (the reference)."""
    fused = getattr(ops, "compressed_attention_and_selection", None)
    if fused is not None:
        return fused(q, k_cmp, v_cmp, block, stride, select_block, n_kv_heads, num_selected, num_initial,
                     num_local)
    out, scores = ops.compressed_attention_and_scores(q, k_cmp, v_cmp, block, stride, select_block,
                                                      n_kv_heads)
    return out, ops.select_blocks(scores, select_block, num_selected, num_initial, num_local)


def gated_combine(ops: ModuleType, g: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor,
                  o_win: torch.Tensor) -> torch.Tensor:
    """The gated sum of the branches, ``sum_c g[..., c] * o_c`` (``g [B,T,H,3]``), in the
    branches' dtype: one kernel where ``ops`` has it (Triton), else torch."""
    fused = getattr(ops, "gated_combine", None)
    if fused is not None:
        return fused(g, o_cmp, o_slc, o_win)
    g = g.to(o_cmp.dtype)
    return g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win


def window_attention(ops: ModuleType, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: int) -> torch.Tensor:
    """The sliding-window branch with ``ops``: FlexAttention's compiled kernels where they
    beat the band kernel (``nsa.ops.flex``: CUDA, a gradient wanted, 16-bit compute, the
    path not turned off) when ``ops`` are the kernels, else ``ops.window_attention``."""
    if ops is not reference and flex.suits(q, k, v):
        return flex.window_attention(q, k, v, window)
    return ops.window_attention(q, k, v, window)


def apply_rope(ops: ModuleType, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [B,T,heads,D]`` in ``x``'s dtype: one kernel where ``ops`` has it (Triton),
    else ``nsa.ops.rope.apply_rope`` (fp32 maths in torch, fp64 stays fp64)."""
    fused = getattr(ops, "apply_rope", None)
    if fused is not None and x.dtype != torch.float64:
        return fused(x, cos, sin)
    from nsa.ops.rope import apply_rope as torch_rope

    return torch_rope(x, cos, sin)


_RESOLVED: dict[tuple[str, str], ModuleType] = {}


def get_ops(backend: str, device: torch.device | str) -> ModuleType:
    """The ops module for ``backend`` on ``device`` (cached: cheap to call in a forward).

    ``"reference"``: PyTorch. ``"triton"``: the kernels (on CPU only under
    TRITON_INTERPRET=1), an error if they cannot be imported. ``"auto"``: the kernels
    on CUDA when they import (a RuntimeWarning names the import error when they do not),
    else the reference. After ``choose_ops`` for the same backend and device type, the
    module it chose (a training run: the reference when the kernels failed the self-check).
    """
    dev_type = device if isinstance(device, str) else device.type
    key = (backend, dev_type)
    ops = _RESOLVED.get(key)
    if ops is None:
        ops = _RESOLVED[key] = _resolve(backend, dev_type)
    return ops


def _resolve(backend: str, dev_type: str) -> ModuleType:
    if backend == "reference":
        return reference
    if backend == "triton":
        if dev_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                f"attention backend 'triton' on device {dev_type!r} needs CUDA or TRITON_INTERPRET=1"
            )
        try:
            return _import_triton()
        except Exception as exc:
            msg = f"attention backend 'triton' requested but nsa.ops.triton fails to import: {exc}"
            raise RuntimeError(msg) from exc
    if backend == "auto":
        if dev_type == "cuda":
            try:
                return _import_triton()
            except Exception as exc:  # noqa: BLE001 - fall back to the reference, by contract, loudly
                warnings.warn(
                    f"attention backend 'auto': the Triton kernels fail to import on CUDA ({exc}); "
                    "using the PyTorch reference ops, which are far slower. Set "
                    "model.attention.backend=triton to make this an error.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return reference
        return reference
    raise ValueError(f"unknown attention backend {backend!r} (expected auto, reference or triton)")


@dataclasses.dataclass
class OpsChoice:
    """The ops a run trains on, what was asked for, and why they differ (if they do)."""

    requested: str  # attention.backend: auto, reference or triton
    backend: str  # what runs: triton or reference
    fallback_reason: str | None = None
    check: CheckReport | None = None
    window: str = "reference"  # the window branch in training: flexattention, triton or reference
    window_reason: str | None = None  # why the kernels' run keeps the band kernel for it

    def record(self) -> AttentionOps:
        """run.json's ``attention_ops`` (docs/run-directory.md)."""
        check = None
        if self.check is not None:
            check = SelfCheck(ok=self.check.ok, device=self.check.device, dtype=self.check.dtype,
                              ops=list(self.check.checked), failures=list(self.check.failures),
                              seconds=round(self.check.seconds, 3))
        return AttentionOps(backend=self.backend, requested=self.requested,
                            fallback_reason=self.fallback_reason, self_check=check, window=self.window,
                            window_reason=self.window_reason)


def _window_choice(device: torch.device, dtype: torch.dtype, head_dim: int,
                   report: CheckReport | None) -> tuple[str, str | None]:
    """The kernels' run: which kernel trains the window branch, and why not FlexAttention.
    A failed FlexAttention check turns that path off for this process (the band kernel,
    which passed, runs instead)."""
    if report is not None and report.flex_failure is not None:
        flex.turn_off(f"FlexAttention failed the self-check on {report.device} ({report.dtype}): "
                      f"{report.flex_failure}")
    why_not = flex.unsuited(device, dtype, head_dim)
    return ("triton", why_not) if why_not is not None else ("flexattention", None)


def choose_ops(backend: str, device: torch.device | str, dtype: torch.dtype, shape: AttentionShape,
               check: Callable[..., CheckReport] = self_check) -> OpsChoice:
    """Settle the ops of a training run on ``device`` before it starts.

    ``reference``, and ``auto`` off CUDA: the reference, no check. ``triton`` anywhere
    and ``auto`` on CUDA: ``check`` runs every op once (compiling the kernels for this
    GPU, at the model's shapes, in ``dtype``) against the reference. On failure ``auto``
    falls back to the reference and the choice says why; ``triton`` raises. The result
    also decides what ``get_ops(backend, device)`` returns from now on in this process.
    """
    dev = torch.device(device)
    if backend not in ("auto", "reference", "triton"):
        raise ValueError(f"unknown attention backend {backend!r} (expected auto, reference or triton)")
    if backend == "reference" or (backend == "auto" and dev.type != "cuda"):
        _RESOLVED[(backend, dev.type)] = reference
        return OpsChoice(backend, "reference")
    if backend == "triton":
        _resolve(backend, dev.type)  # raises when the kernels cannot run here at all
    report = check(dev, dtype, shape)
    if report.ok:
        _RESOLVED[(backend, dev.type)] = _import_triton()
        window, why_not = _window_choice(dev, dtype, shape.head_dim, report)
        return OpsChoice(backend, "triton", check=report, window=window, window_reason=why_not)
    if backend == "triton":
        raise RuntimeError(f"attention backend 'triton': the kernels failed their self-check on {dev} "
                           f"({report.dtype}): {report.reason()}. Set model.attention.backend=auto to fall "
                           "back to the (much slower) reference ops instead")
    return fall_back(backend, dev, f"Triton self-check failed on {dev} ({report.dtype}): {report.reason()}",
                     report)


def fall_back(backend: str, device: torch.device | str, reason: str,
              report: CheckReport | None = None) -> OpsChoice:
    """Use the reference ops for ``backend`` on ``device`` from now on (e.g. because
    another rank's check failed: every rank must run the same ops)."""
    dev = torch.device(device)
    _RESOLVED[(backend, dev.type)] = reference
    return OpsChoice(backend, "reference", reason, report)
