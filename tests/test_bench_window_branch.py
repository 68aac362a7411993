"""bench.window_branch: on a machine without CUDA it refuses, saying why, and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_a_gpu_it_refuses_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    r = subprocess.run([sys.executable, "-m", "bench.window_branch", "--seqs", "2048", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "needs a CUDA GPU" in r.stderr and "no backward on CPU" in r.stderr
    assert not out.exists()


def test_its_table_gives_the_speed_up_and_the_largest_distance() -> None:
    from bench.window_branch import markdown

    row = {"layout": "nsa-125m", "T": 16384, "B": 4, "band": {"fwd_ms": 0.874, "fwd_bwd_ms": 6.814},
           "flex": {"fwd_ms": 0.762, "fwd_bwd_ms": 3.09},
           "sdpa_causal_full": {"fwd_ms": 4.78, "fwd_bwd_ms": 17.4},
           "flex_vs_band": {"out": 1e-3, "d0": 4e-3, "d1": 2e-3, "d2": 1e-3}, "flex_first_call_s": 21.5}
    line = markdown([row]).splitlines()[-1]
    assert "| 16384 x 4 |" in line and "| 2.21x |" in line and "| 4.0e-03 |" in line
