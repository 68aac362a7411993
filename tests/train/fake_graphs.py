"""``FakeGraphs``: a GPU's CUDA-graph capture stood in for on the CPU, behind the small
``CudaGraphs`` interface (nsa/train/graphed.py): the one thing the graph tests fake."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from nsa.train.graphed import CudaGraphs


class FakeGraphs(CudaGraphs):
    """A GPU's capture, stood in for on the CPU: ``capture`` runs the body once (a real one runs
    nothing; ``prepare`` zeroes the gradients after it either way) and a replay runs it again
    into the same output tensor, adding into the same gradients, as a graph's replay does.
    ``fault`` plants what a bad graph would do: fail to capture, give another loss, overwrite
    the gradients instead of adding, or lose one parameter's."""

    def __init__(self, fault: str | None = None) -> None:
        self.fault, self.captures, self.replays = fault, 0, 0
        self.params: list[torch.nn.Parameter] = []  # the faults' victims

    def side_stream(self) -> Any:
        return None

    @contextlib.contextmanager
    def on(self, stream: Any) -> Iterator[None]:
        yield

    def capture(self, stream: Any, body: Any) -> tuple[Any, torch.Tensor]:
        if self.fault == "capture":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        self.captures += 1
        out = body()
        params = list(self.params)

        def replay() -> None:
            self.replays += 1
            if self.fault == "overwrite":
                for p in params:
                    p.grad.zero_()
            out.copy_(body() * (1.5 if self.fault == "loss" else 1.0))
            if self.fault == "lost":
                params[1].grad.zero_()

        return replay, out

    def settle(self) -> None:
        pass
