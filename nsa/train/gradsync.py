"""Data-parallel gradients without DDP's wrapper: every parameter's gradient is a view of one
flat buffer, averaged over the ranks in one all-reduce per optimizer step.

Why: a micro-step replayed from a CUDA graph (graphed.py) cannot hold DDP's reducer, whose
autograd hooks start all-reduces in the middle of the backward. Here the backward only
adds into the gradients, as it does on one process, and the communication comes after the
last micro-step, outside any graph: one collective on a buffer that was already there (no
bucket copies, no extra gradient memory). What it gives up is DDP's overlap of the
all-reduce with the backward, which is worth little while the step is bound by the host
(docs/training.md says when it is).

The average equals DDP's: DDP divides each bucket by the world size before summing, this
sums and then divides; with a world size that is a power of two, both are exact scalings
of the same sum.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["FlatGrads"]


class FlatGrads:
    """Gradients of ``params`` as views of one flat buffer per dtype, zero at first; ``average``
    replaces them with their mean over the default process group's ranks."""

    def __init__(self, params: list[nn.Parameter], world_size: int) -> None:
        self.params = params
        self.world_size = world_size
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        self.groups = list(by_dtype.values())  # one flat buffer each, in this order
        self.flats: list[torch.Tensor] = []
        # where each view points: a gradient set to None or replaced no longer adds into the buffer
        self._ptrs: dict[int, int] = {}
        for group in self.groups:
            flat = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype, device=group[0].device)
            offset = 0
            for p in group:
                p.grad = flat[offset:offset + p.numel()].view(p.shape)
                self._ptrs[id(p)] = p.grad.data_ptr()
                offset += p.numel()
            self.flats.append(flat)

    @property
    def nbytes(self) -> int:
        return sum(f.numel() * f.element_size() for f in self.flats)

    def broadcast_parameters(self) -> None:
        """Rank 0's parameters on every rank, as DDP's constructor does (equal seeds already give
        equal weights; this makes it so whatever a rank loaded)."""
        with torch.no_grad():
            for group in self.groups:
                flat = torch.cat([p.detach().reshape(-1) for p in group])
                dist.broadcast(flat, 0)
                for p, part in zip(group, flat.split([p.numel() for p in group])):
                    p.copy_(part.view(p.shape))

    def average(self) -> None:
        """Every rank's gradients replaced by their mean over the ranks (a collective: every rank
        calls it once per optimizer step, after its last micro-step)."""
        for i, p in enumerate(self.params):
            if p.grad is None or p.grad.data_ptr() != self._ptrs[id(p)]:
                raise RuntimeError(
                    f"parameter {i} ({tuple(p.shape)}) no longer has its gradient in the flat buffer "
                    "(set to None or replaced, e.g. zero_grad(set_to_none=True)): its all-reduce would "
                    "average a stale buffer")
        for flat in self.flats:
            dist.all_reduce(flat)
            flat.div_(self.world_size)
