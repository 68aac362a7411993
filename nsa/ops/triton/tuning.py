"""Autotuning of tile sizes, warps and pipeline stages, off unless asked for.

Each tunable kernel carries its list of configs, the first being the default, keyed on
the launch's shapes; an optional ``prune`` function drops the configs that do not suit a
launch's constexprs (e.g. tiles too large for its head dim). ``triton.autotune`` (with
Triton's on-disk cache of the timings where this Triton has one, ``cache_results``) is
applied lazily, at the first launch that times configs: Triton 3.2's autotuner asks for
an active GPU driver when it is built, so decorating at import time would make
``import nsa.ops.triton`` fail on a machine without a GPU (the compile gate, the CPU
tests). Launches go through ``launch``:

- by default, and always in the interpreter, the first config that survives pruning
  runs, without benchmarking: results are the same bit for bit from run to run and
  machine to machine (a timing-based choice could pick other tiles on another run,
  which reorders floating-point sums, so training would not be bitwise reproducible);
- with ``NSA_TRITON_AUTOTUNE=1`` (or ``AUTOTUNE = True``) on a GPU, Triton times every
  surviving config once per key and keeps the fastest.

The compile gate (bench/compile_check.py) compiles every surviving config of every
launch, so whichever the autotuner picks has passed ptxas without spills.

A prune may also depend on the GPU's architecture (``capability``): a tile that compiles
cleanly for sm_90 may spill on sm_80. Off a GPU (the interpreter, meta tensors) the
capability is 0, the configs every architecture compiles; the compile gate and the
roofline stand in their target's with ``assumed_capability``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import triton
from triton.runtime.jit import KernelInterface

AUTOTUNE = os.environ.get("NSA_TRITON_AUTOTUNE", "0") == "1"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


_ASSUMED: list[int] = []


def capability(device: torch.device | None) -> int:
    """10 * major + minor of a CUDA device's compute capability (90: H100, H200), 0 for
    anything else; inside ``assumed_capability(c)``, ``c`` whatever the device."""
    if _ASSUMED:
        return _ASSUMED[-1]
    if device is None or device.type != "cuda" or _interpreting():
        return 0
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device, 0 elsewhere: what the split launches size
    their grids from (the compile gate and the benchmarks stand in a GPU's count)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


@contextlib.contextmanager
def assumed_capability(cap: int) -> Iterator[None]:
    """Prunes choose configs as on a GPU of capability ``cap`` (the compile gate, the roofline)."""
    _ASSUMED.append(cap)
    try:
        yield
    finally:
        _ASSUMED.pop()


class Tunable(KernelInterface):
    """A ``@triton.jit`` kernel with its autotune configs; the ``triton.autotune`` wrapper
    is built on the first timed launch (``run``), never at import."""

    def __init__(self, fn: Any, configs: list[triton.Config], key: list[str],
                 prune: Callable[..., list[triton.Config]] | None = None) -> None:
        self.fn = fn
        self.configs = list(configs)
        self.key = list(key)
        self.early_config_prune = prune
        self.arg_names = list(fn.arg_names)
        self._autotuner: Any = None

    def autotuner(self) -> Any:
        """Triton's autotuner over this kernel's configs (built once, on first use)."""
        if self._autotuner is None:
            kwargs: dict[str, Any] = dict(configs=self.configs, key=self.key)
            if self.early_config_prune is not None:
                kwargs["prune_configs_by"] = {"early_config_prune": self.early_config_prune}
            if "cache_results" in inspect.signature(triton.autotune).parameters:
                kwargs["cache_results"] = True
            self._autotuner = triton.autotune(**kwargs)(self.fn)
        return self._autotuner

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        """``kernel[grid](...)``: Triton times the surviving configs and keeps the fastest."""
        return self.autotuner().run(*args, grid=grid, warmup=warmup, **kwargs)


def tunable(configs: list[triton.Config], key: list[str],
            prune: Callable[..., list[triton.Config]] | None = None) -> Callable[[Any], Tunable]:
    """Decorator: the kernel with ``configs`` (default first), autotuned on ``key`` when asked."""
    return lambda fn: Tunable(fn, configs, key, prune)


def candidates(kernel: Tunable, args: tuple, kwargs: dict) -> list[triton.Config]:
    """The configs of a tunable ``kernel`` that suit this launch (its prune applied)."""
    if kernel.early_config_prune is None:
        return list(kernel.configs)
    return list(kernel.early_config_prune(kernel.configs, dict(zip(kernel.arg_names, args)), **kwargs))


def launch(kernel: Tunable, grid: Any, *args: Any, **kwargs: Any) -> None:
    """Launch a tunable kernel: timed choice with AUTOTUNE on a GPU, else the default."""
    if AUTOTUNE and not _interpreting():
        kernel[grid](*args, **kwargs)
        return
    config = candidates(kernel, args, kwargs)[0]
    kernel.fn[grid](*args, **kwargs, **config.all_kwargs())
