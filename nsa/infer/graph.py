"""Decode steps replayed from a CUDA graph: one launch per token instead of thousands.

A decode step of a small model is thousands of tiny kernels, and the host's time to launch
them, not the GPU's to run them, sets the speed. ``advance`` (nsa/infer/decode.py) makes a
step pure device work on fixed buffers: the caches are allocated once, the positions are a
device tensor moved on in place, and nothing reads a value back or uploads host data. So
the whole step, all layers plus choosing the next token (argmax, or a draw with a device
generator), is captured once into a ``torch.cuda.CUDAGraph`` and replayed for every token.

``DecodeRunner`` does that on CUDA, and runs the same functions eagerly on the CPU (or when
the graph is turned off: ``graph=False``, or ``NSA_DECODE_GRAPH=0`` in the environment),
which is the reference the graph must agree with. An NSA step comes in two kinds, decided
on the host from the positions it keeps (``compresses``): one that completes a compressed
block in some sequence, and one that completes none and skips the compression. Each kind has
its own graph. On CUDA the first ``warmup`` steps of a kind run eagerly on the stream that
then captures (lazy initialisation, kernel compilation and the per-stream cuBLAS state
happen there, not during capture); the next step of that kind is captured (which runs
nothing) and replayed, and every later one is one copy of the input tokens and one replay.
The host checks the caches' capacity from its own count of steps. When a capture fails, a
warning says why and the runner goes on eagerly.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings
from collections.abc import Callable

import torch

from nsa.infer.decode import DecodeState, advance, check_room, compresses
from nsa.model.transformer import Transformer

__all__ = ["CUDA_GRAPH", "EAGER", "GRAPH_ENV", "WARMUP", "DecodeRunner", "argmax", "decode_path"]

log = logging.getLogger(__name__)

CUDA_GRAPH = "cuda-graph"
EAGER = "eager"
GRAPH_ENV = "NSA_DECODE_GRAPH"  # "0": never capture (debugging, comparing against eager)
WARMUP = 2  # eager steps before the capture

Choose = Callable[[torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class _Captured:
    """One kind of step's graph and its static buffers: the input tokens it reads, the
    logits and next tokens it writes."""

    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor
    logits: torch.Tensor
    next: torch.Tensor


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy choice of the next token per row of ``logits [B, V]`` (fp32 comparison)."""
    return logits.float().argmax(dim=-1)


def decode_path(device: torch.device | str, graph: bool | None = None) -> tuple[str, str]:
    """``(path, why)``: ``"cuda-graph"`` or ``"eager"``, and the reason, for decoding on
    ``device``. ``graph`` None: a graph on CUDA unless ``NSA_DECODE_GRAPH=0``."""
    dev = torch.device(device)
    if graph is False:
        return EAGER, "graph turned off by the caller"
    if graph is None and os.environ.get(GRAPH_ENV, "1") == "0":
        return EAGER, f"{GRAPH_ENV}=0"
    if dev.type != "cuda":
        return EAGER, f"no CUDA graphs on {dev.type}"
    return CUDA_GRAPH, "the whole step captured once, replayed per token"


class DecodeRunner:
    """Decode steps that also choose the next token, replayed from a CUDA graph on CUDA and
    run eagerly elsewhere (see the module docstring).

    ``choose(logits [B, V]) -> tokens [B]`` must itself be free of host syncs (``argmax``,
    or ``nsa.infer.sample.sample_next``); ``generator`` is the device generator it draws
    from, if any (registered with the graph, so every replay draws afresh)."""

    def __init__(self, model: Transformer, state: DecodeState, choose: Choose = argmax,
                 generator: torch.Generator | None = None, graph: bool | None = None,
                 warmup: int = WARMUP) -> None:
        self.model, self.state, self.choose, self.generator = model, state, choose, generator
        self.device = state.lengths.device
        self.path, self.why = decode_path(self.device, graph)
        self.warmup = max(0, warmup)
        self.steps = 0  # steps run, eager or replayed
        self.replays = 0
        self.capture_s: float | None = None  # all captures together
        # by kind of step (compresses or not): its graph, and its eager steps so far
        self.graphs: dict[bool, _Captured] = {}
        self._eager: dict[bool, int] = {True: 0, False: 0}
        self._stream: torch.cuda.Stream | None = None
        self._logits: torch.Tensor | None = None  # the last step's logits

    @property
    def warm_steps(self) -> int:
        """Eager steps run on the graph path before each kind's capture."""
        return sum(self._eager.values())

    @property
    def logits(self) -> torch.Tensor:
        """The logits ``[B, V]`` of the last step (on the graph path a static buffer that the
        next step overwrites: clone what must outlive it)."""
        if self._logits is None:
            raise RuntimeError("no step has run yet")
        return self._logits

    def describe(self) -> str:
        """One line for a log: the path and why."""
        warm = f", after {self.warmup} eager warm-up steps of each kind" if self.path == CUDA_GRAPH else ""
        return f"decode path: {self.path} ({self.why}{warm})"

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens [B]`` at each sequence's next position and return the next token
        per sequence ``[B]`` (a new tensor), chosen from the step's logits (``logits``)."""
        check_room(self.state)
        kind = compresses(self.model, self.state)
        if kind not in self.graphs and self.path == CUDA_GRAPH and self._eager[kind] >= self.warmup:
            self._capture(tokens, kind)
        captured = self.graphs.get(kind)
        if captured is not None:
            captured.tokens.copy_(tokens)
            captured.graph.replay()
            self.replays += 1
            self._logits = captured.logits
            nxt = captured.next.clone()
        elif self.path == CUDA_GRAPH:
            nxt = self._warm_step(tokens, kind)
            self._eager[kind] += 1
        else:
            self._logits, nxt = self._body(tokens, kind)
        self.state.moved_on()
        self.steps += 1
        return nxt

    def _body(self, tokens: torch.Tensor, kind: bool) -> tuple[torch.Tensor, torch.Tensor]:
        logits = advance(self.model, self.state.caches, self.state.lengths, tokens, compress=kind)
        return logits, self.choose(logits)

    def _capture_stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        return self._stream

    def _warm_step(self, tokens: torch.Tensor, kind: bool) -> torch.Tensor:
        """An eager step on the stream that will capture, ordered after the caller's stream
        and before its next work."""
        side, main = self._capture_stream(), torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            logits, nxt = self._body(tokens, kind)
        main.wait_stream(side)
        for t in (logits, nxt):  # made on the side stream, read on the caller's
            t.record_stream(main)
        self._logits = logits
        return nxt

    def _capture(self, tokens: torch.Tensor, kind: bool) -> None:
        """Record one step of this kind into a graph (nothing runs); the caller then replays
        it for this step. On failure: a warning, and eager steps from now on."""
        t0 = time.perf_counter()
        static = torch.empty_like(tokens)
        static.copy_(tokens)
        try:
            g = torch.cuda.CUDAGraph()
            if self.generator is not None:
                g.register_generator_state(self.generator)
            # thread_local: only this thread's capture-unsafe calls are errors; other threads of
            # the process (a trainer's checkpoint writer, a process group's watchdog) may use
            # CUDA meanwhile, as in torch.compile's own graph capture
            with torch.cuda.graph(g, stream=self._capture_stream(), capture_error_mode="thread_local"):
                logits, nxt = self._body(static, kind)
        except Exception as exc:  # noqa: BLE001 - decoding goes on, eagerly and loudly
            # an error inside the capture reaches here as what ending the capture raised
            # then; the first one, the cause, is its context
            cause = exc.__context__
            first = f" (first: {type(cause).__name__}: {cause})" if cause is not None else ""
            self.path, self.why = EAGER, f"CUDA graph capture failed: {type(exc).__name__}: {exc}{first}"
            self.graphs.clear()  # every kind eager from now on, as the path says
            warnings.warn(f"{self.why}; decoding eagerly", RuntimeWarning, stacklevel=3)
            return
        self.graphs[kind] = _Captured(g, static, logits, nxt)
        took = time.perf_counter() - t0
        self.capture_s = (self.capture_s or 0.0) + took
        log.info("captured the decode step (%s) as a CUDA graph after %d eager steps (%.0f ms)",
                 "compressing" if kind else "no block completes", self.steps, 1000 * took)
