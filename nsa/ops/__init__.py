"""NSA attention ops: a PyTorch reference and (on GPU) Triton kernels with the same API.

``get_ops(backend, device)`` returns the module whose functions the model calls. See
docs/ops-contract.md for the shared signatures.
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

import torch

from nsa.ops import reference

__all__ = ["get_ops", "reference", "triton_available"]


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
    else the reference.
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
