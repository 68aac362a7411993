"""The kernels' output buffers, and the poison the self-check fills them with.

Why: the kernel wrappers allocate what a kernel writes with ``torch.empty``, so a kernel
that leaves (part of) an output unwritten returns whatever the allocator hands back. In
the self-check that can be memory which held the reference's result a moment before, and
a kernel that computes nothing would pass the comparison. While ``poisoned()`` is on (the
self-check only), ``empty`` and ``empty_like`` fill each buffer with a bit pattern no
computed result holds, and ``unwritten`` counts the elements that still hold it. Off (a
training run), they are ``torch.empty``: one flag test per buffer, no fill.

The float poison is a signalling NaN with a payload: a kernel that does arithmetic on a
poisoned value gets a NaN with other bits (hardware quiets it), so an element that still
holds the exact pattern was never written, only copied at most. The flag is a module
global, not a context variable: autograd runs CUDA backward passes on its own threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

# dtype -> (the integer dtype of the same width, the bit pattern as that integer)
_PATTERN: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 0x7FF4_A5A5_A5A5_A5A5),
    torch.float32: (torch.int32, 0x7FA5_A5A5),
    torch.bfloat16: (torch.int16, 0x7FA5),
    torch.float16: (torch.int16, 0x7D5A),
    torch.int64: (torch.int64, -(2**63)),
    torch.int32: (torch.int32, -(2**31)),
}

_on = False


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Within: ``empty``/``empty_like`` return buffers filled with the poison (nests)."""
    global _on
    before, _on = _on, True
    try:
        yield
    finally:
        _on = before


def fill(t: torch.Tensor) -> torch.Tensor:
    """Overwrite every element of ``t`` with its dtype's poison; returns ``t``."""
    if t.dtype not in _PATTERN:
        raise TypeError(f"no poison for dtype {t.dtype}")
    as_int, bits = _PATTERN[t.dtype]
    t.view(as_int).fill_(bits)
    return t


def empty(*size: int | Sequence[int], device: torch.device | str | None = None,
          dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.empty(*size, device=, dtype=)``, poisoned within ``poisoned()``."""
    shape: list[int] = []
    for part in size:  # torch.empty's two spellings: empty(2, 3) and empty((2, 3))
        shape.extend([part] if isinstance(part, int) else part)
    t = torch.empty(shape, device=device, dtype=dtype)
    return fill(t) if _on else t


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like(x)``, poisoned within ``poisoned()``."""
    t = torch.empty_like(x)
    return fill(t) if _on else t


def unwritten(t: torch.Tensor) -> int:
    """How many elements of ``t`` hold its dtype's poison bits (0 for a dtype without one)."""
    if t.dtype not in _PATTERN or t.numel() == 0:
        return 0
    as_int, bits = _PATTERN[t.dtype]
    return int((t.detach().view(as_int) == bits).sum())
