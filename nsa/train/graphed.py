"""A training micro-step (forward, loss, backward into the gradients) replayed from a CUDA graph.

Why: at the shapes small models are trained at, the step is bound by the host. On an H200,
nsa-125m's bare step at batch 8 x 2,048 dispatched about 4,900 aten ops and Triton launches
at about 25 us of host time each, 123 ms in all, while the GPU waited; dense-125m's took
63 ms for 2,600 ops. A graph records those launches once and replays them in one call, so
the step takes what the GPU needs.

What makes it correct: the micro-step is already pure device work on fixed shapes (no host
sync, no host data, the same ops every time: ``tests/model/test_train_ops.py`` and
``tests/train/test_graphed.py`` check it on the CPU). The batch is copied into one static
input; the gradients exist before the capture and are never set to None, so the captured
backward adds into them in place, as an eager one does, and gradient accumulation over
micro-steps works unchanged (the optimizer zeroes them in place instead of freeing them).
The optimizer step, clipping and the trainer's one read stay eager: a handful of launches.

``GraphedMicroStep.prepare`` proves the graph on the run's own model before training: two
eager micro-steps warm up (Triton and FlexAttention compile, cuBLAS sets up) on the stream
that then captures; one more gives the reference loss and per-parameter gradient norms; the
capture's replay must give the same, and a second replay must double the gradients (they
accumulate, not overwrite). The gradients are zeroed after. Any failure (a capture error, a
mismatch) is logged with its reason and the run trains eagerly, as it would have.

Several processes: DDP's reducer cannot be captured (its hooks start all-reduces in the middle
of the backward), so a DDP run with graphs trains without the wrapper and averages its
gradients in one all-reduce after the last micro-step (gradsync.py). FSDP's hooks gather and
free parameters around every block: refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["CudaGraphs", "GraphedMicroStep", "graph_refusal"]

WARMUP = 2  # eager micro-steps before the capture
# replay against eager: equal but for the order of floating-point sums in the kernels that
# accumulate with atomics (cuBLAS split-K, flash attention's dQ), well below a real mismatch
# (a gradient missing, overwritten, or read from a freed buffer differs by 100 %)
RTOL = 2e-2


def graph_refusal(device: torch.device, strategy: str, nan_at_step: int | None) -> str | None:
    """Why this run's micro-steps cannot be replayed from a CUDA graph; None when they can (one
    process, or DDP over several: gradsync.py)."""
    if device.type != "cuda":
        return f"no CUDA graphs on {device.type}"
    if strategy == "fsdp":
        return "strategy fsdp: its hooks gather and free parameters around every block"
    if nan_at_step is not None:
        return "debug.nan_at_step injects its NaN into eager micro-steps only"
    return None


class CudaGraphs:
    """The CUDA calls a capture makes, in one small interface: a machine without a GPU has none,
    and a test stands a fake in for them (tests/train/test_graphed.py) to check the proof."""

    def side_stream(self) -> Any:
        return torch.cuda.Stream()

    @contextlib.contextmanager
    def on(self, stream: Any) -> Iterator[None]:
        """Run the block on ``stream``, ordered after the current stream's work and before its next."""
        main = torch.cuda.current_stream()
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            yield
        main.wait_stream(stream)

    def capture(self, stream: Any, body: Callable[[], torch.Tensor]
                ) -> tuple[Callable[[], None], torch.Tensor]:
        """Record ``body`` into a graph on ``stream`` (nothing runs): (replay, its output tensor)."""
        graph = torch.cuda.CUDAGraph()
        # on the stream that warmed up; thread_local: only this thread's capture-unsafe calls are
        # errors, while the loader thread pins the next batches and the heartbeat thread beats
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            out = body()
        return graph.replay, out  # the bound method keeps the graph alive

    def settle(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the warm-up's eager activations: the graph has its own pool


class GraphedMicroStep:
    """``step(tokens)`` runs ``loss_fn(tokens)``, adds the gradient of the loss over
    ``divisor`` (the gradient accumulation) into the parameters' ``.grad`` and returns the loss
    (detached): replayed from a CUDA graph once ``prepare`` has proved it, else eagerly (``why``
    says which and why)."""

    def __init__(self, loss_fn: Callable[[torch.Tensor], torch.Tensor], params: list[nn.Parameter],
                 divisor: int = 1, graphs: CudaGraphs | None = None) -> None:
        self.loss_fn, self.params, self.divisor = loss_fn, params, divisor
        self.graphs = graphs or CudaGraphs()
        self.replay: Callable[[], None] | None = None
        self.tokens: torch.Tensor | None = None  # the static input the graph reads
        self.loss: torch.Tensor | None = None  # the static output it writes
        self.why = "not prepared"

    @property
    def graphed(self) -> bool:
        return self.replay is not None

    def _eager(self, tokens: torch.Tensor) -> torch.Tensor:
        loss = self.loss_fn(tokens)
        (loss / self.divisor).backward()
        return loss.detach()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.replay is None or self.tokens is None or self.loss is None:
            return self._eager(tokens)
        self.tokens.copy_(tokens, non_blocking=True)
        self.replay()
        return self.loss

    def _zero_grads(self) -> None:
        """Every gradient allocated (the capture adds into it) and zero, in place."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()

    def _norms(self) -> torch.Tensor:
        grads = [p.grad for p in self.params if p.grad is not None]
        return torch.stack(torch._foreach_norm(grads)).float()

    def prepare(self, example: torch.Tensor) -> bool:
        """Capture the micro-step on ``example``'s shape (a batch of random tokens) and check it
        against eager (module docstring); True when steps will replay the graph. The gradients
        are zero on return either way."""
        try:
            why = self._capture_and_check(example)
        except Exception as exc:  # noqa: BLE001 - any failure: eager, with the reason
            # an error inside a capture surfaces as what ending the capture raised; the first
            # one, the cause, is its context
            cause = exc.__context__
            first = f" (first: {type(cause).__name__}: {cause})" if cause is not None else ""
            why = f"the capture failed: {type(exc).__name__}: {exc}{first}".replace("\n", " ")[:400]
        if why is not None:
            self.replay = self.tokens = self.loss = None
            self.why = why
        self._zero_grads()
        self.graphs.settle()
        return self.replay is not None

    def _capture_and_check(self, example: torch.Tensor) -> str | None:
        self.tokens = example.clone()
        self._zero_grads()
        side = self.graphs.side_stream()
        with self.graphs.on(side):
            for _ in range(WARMUP):
                self._eager(self.tokens)
            self._zero_grads()
            want_loss = self._eager(self.tokens).clone()
            want = self._norms()
            self._zero_grads()
        tokens = self.tokens
        replay, loss = self.graphs.capture(side, lambda: self._eager(tokens))
        self._zero_grads()  # the capture ran nothing; zeroed all the same
        replay()
        got_loss, got = loss.clone(), self._norms()
        replay()
        twice = self._norms()
        if not torch.allclose(got_loss, want_loss, rtol=RTOL, atol=0.0):
            return f"the replayed loss {float(got_loss):.6g} differs from eager's {float(want_loss):.6g}"
        atol = RTOL * float(want.max()) * 1e-3
        if not torch.allclose(got, want, rtol=RTOL, atol=atol):
            worst = int(((got - want).abs() / want.clamp_min(atol)).argmax())
            return (f"the replayed gradient of parameter {worst} has norm {float(got[worst]):.6g}, "
                    f"eager's {float(want[worst]):.6g}")
        if not torch.allclose(twice, 2 * want, rtol=RTOL, atol=2 * atol):
            return "a second replay did not add to the gradients (they must accumulate)"
        self.replay, self.loss = replay, loss
        self.why = (f"one CUDA graph per micro-step (checked against eager: loss {float(got_loss):.4f}, "
                    f"{len(want)} gradients)")
        return None
