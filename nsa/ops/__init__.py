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
from nsa.ops import reference
from nsa.ops.self_check import AttentionShape, CheckReport, self_check

__all__ = ["AttentionShape", "CheckReport", "OpsChoice", "choose_ops", "get_ops", "reference", "self_check",
           "triton_available"]


def _import_triton() -> ModuleType:
    return importlib.import_module("nsa.ops.triton")


def triton_available() -> bool:
    """True when ``nsa.ops.triton`` imports (it needs the triton package and our kernels)."""
    try:
        _import_triton()
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True


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

    def record(self) -> AttentionOps:
        """run.json's ``attention_ops`` (docs/run-directory.md)."""
        check = None
        if self.check is not None:
            check = SelfCheck(ok=self.check.ok, device=self.check.device, dtype=self.check.dtype,
                              ops=list(self.check.checked), failures=list(self.check.failures),
                              seconds=round(self.check.seconds, 3))
        return AttentionOps(backend=self.backend, requested=self.requested,
                            fallback_reason=self.fallback_reason, self_check=check)


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
        return OpsChoice(backend, "triton", check=report)
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
