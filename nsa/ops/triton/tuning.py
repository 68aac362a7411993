"""Autotuning of tile sizes, warps and pipeline stages, off unless asked for.

Each tunable kernel is wrapped in ``triton.autotune`` with its list of configs, the
first being the default, keyed on the launch's shapes, with Triton's on-disk cache of
the timings where this Triton has one (``cache_results``); an optional ``prune``
function drops the configs that do not suit a launch's constexprs (e.g. tiles too large
for its head dim). Launches go through ``launch``:

- by default, and always in the interpreter, the first config that survives pruning
  runs, without benchmarking: results are the same bit for bit from run to run and
  machine to machine (a timing-based choice could pick other tiles on another run,
  which reorders floating-point sums, so training would not be bitwise reproducible);
- with ``NSA_TRITON_AUTOTUNE=1`` (or ``AUTOTUNE = True``) on a GPU, Triton times every
  surviving config once per key and keeps the fastest.

The compile gate (bench/compile_check.py) compiles every surviving config of every
launch, so whichever the autotuner picks has passed ptxas without spills.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import triton

AUTOTUNE = os.environ.get("NSA_TRITON_AUTOTUNE", "0") == "1"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def tunable(configs: list[triton.Config], key: list[str],
            prune: Callable[..., list[triton.Config]] | None = None) -> Callable[[Any], Any]:
    """``triton.autotune`` over ``configs`` (default first), keyed on ``key``."""
    kwargs: dict[str, Any] = dict(configs=configs, key=key)
    if prune is not None:
        kwargs["prune_configs_by"] = {"early_config_prune": prune}
    if "cache_results" in inspect.signature(triton.autotune).parameters:
        kwargs["cache_results"] = True
    return triton.autotune(**kwargs)


def candidates(kernel: Any, args: tuple, kwargs: dict) -> list[triton.Config]:
    """The configs of an autotuned ``kernel`` that suit this launch (its prune applied)."""
    prune = getattr(kernel, "early_config_prune", None)
    if prune is None:
        return list(kernel.configs)
    return list(prune(kernel.configs, dict(zip(kernel.arg_names, args)), **kwargs))


def launch(kernel: Any, grid: Any, *args: Any, **kwargs: Any) -> None:
    """Launch an autotuned kernel: timed choice with AUTOTUNE on a GPU, else the default."""
    if AUTOTUNE and not _interpreting():
        kernel[grid](*args, **kwargs)
        return
    config = candidates(kernel, args, kwargs)[0]
    kernel.fn[grid](*args, **kwargs, **config.all_kwargs())
