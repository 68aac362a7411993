"""Autotuning wrappers (nsa.ops.triton.tuning) are built at the first timed launch, not at import.

Triton 3.2's ``triton.autotune`` asks for an active GPU driver when it builds its
autotuner ("0 active drivers" without one), so a decorator applied at import time made
``import nsa.ops.triton`` fail on every machine without a GPU under that Triton.
"""

from __future__ import annotations

from pathlib import Path

import torch
from triton.runtime.autotuner import Autotuner

from nsa.ops.triton import band, selected, topn, tuning
from tests.compiled import run_compiled

ROOT = Path(__file__).resolve().parents[2]

IMPORT_WITHOUT_DRIVER = """
import triton

def no_driver(*args, **kwargs):
    raise RuntimeError("0 active drivers ([]). There should only be one.")

triton.autotune = no_driver  # what building an autotuner does under Triton 3.2 without a GPU
import nsa.ops.triton
from nsa.ops.triton import band, selected, topn
print(type(band._band_fwd).__name__, type(selected._sel_fwd).__name__, type(topn._scores_topn).__name__)
"""


def test_importing_the_kernels_builds_no_autotuner() -> None:
    out = run_compiled(["-c", IMPORT_WITHOUT_DRIVER], timeout=300)  # the compiled kernels' import
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["Tunable", "Tunable", "Tunable"]


def test_the_autotuner_is_built_once_with_the_kernels_configs() -> None:
    kernel = tuning.Tunable(band._band_fwd.fn, band._band_fwd.configs, band._band_fwd.key,
                            band._band_fwd.early_config_prune)
    assert kernel._autotuner is None
    tuner = kernel.autotuner()
    assert isinstance(tuner, Autotuner) and tuner is kernel.autotuner()
    assert tuner.fn is band._band_fwd.fn and list(tuner.configs) == band._band_fwd.configs
    assert tuner.early_config_prune is band._band_fwd.early_config_prune


def test_without_autotuning_a_launch_takes_the_first_config_its_prune_keeps() -> None:
    for kernel in (band._band_fwd, band._band_bwd_dq, selected._sel_fwd, topn._scores_topn):
        assert isinstance(kernel, tuning.Tunable) and kernel.configs
    kernel = band._band_fwd
    args = [None] * len(kernel.arg_names)
    for bd in (16, 64, 128):
        kept = tuning.candidates(kernel, tuple(args), {"BD": bd})
        assert kept and all(c in kernel.configs for c in kept)


def _tiles(cap: int | None, d: int, device: str = "meta", kernel: tuning.Tunable = band._band_bwd_dkdv
           ) -> list[tuple[int, int, int]]:
    args = dict.fromkeys(kernel.arg_names)
    args["Q"] = torch.empty(1, device=device)
    bd = max(16, d)
    if cap is None:
        kept = tuning.candidates(kernel, tuple(args.values()), {"BD": bd})
    else:
        with tuning.assumed_capability(cap):
            kept = tuning.candidates(kernel, tuple(args.values()), {"BD": bd})
    return [(c.kwargs["BM"], c.kwargs["BN"], c.num_warps) for c in kept]


def test_dkdv_tiles_follow_the_architecture() -> None:
    """sm_90 gets its own band tiles where it lists the head dim; sm_80 and anything
    off a GPU (the interpreter, meta tensors) the ones every architecture compiles."""
    assert tuning.capability(torch.device("cpu")) == 0
    assert _tiles(None, 64, "cpu") == _tiles(80, 64) == band.DKDV_TILES[64]
    assert _tiles(90, 64) == band.DKDV_TILES_SM90[64]
    assert _tiles(90, 128) == band.DKDV_TILES_SM90[128]
    assert _tiles(80, 128) == band.DKDV_TILES[128]
    assert _tiles(90, 32) == _tiles(80, 32) == band.DKDV_TILES[32]
    assert band.dkdv_key_tile(64, 90) == band.DKDV_TILES_SM90[64][0][1]
    assert band.dkdv_key_tile(64, 80) == band.DKDV_TILES[64][0][1]
    dq = band._band_bwd_dq
    assert _tiles(90, 128, kernel=dq) == band.DQ_TILES_SM90[128]
    assert _tiles(80, 128, kernel=dq) == _tiles(None, 128, "cpu", dq) == band.DQ_TILES[128]
    assert _tiles(90, 64, kernel=dq) == _tiles(80, 64, kernel=dq) == band.DQ_TILES[64]
    fwd = band._band_fwd
    assert _tiles(90, 128, kernel=fwd) == band.FWD_TILES_SM90[128]
    assert _tiles(80, 128, kernel=fwd) == band.FWD_TILES[128]
    with tuning.assumed_capability(90):
        assert tuning.capability(torch.device("cpu")) == 90
    assert tuning.capability(None) == 0
