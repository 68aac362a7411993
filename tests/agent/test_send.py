"""The agent's output path: the contract's encode gives the same bytes on its direct path as
through plain Python (non-finite floats as strings), and an unbuffered stdout (python -u,
PYTHONUNBUFFERED) still gets every line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from nsa.contract import Beat, encode
from nsa.contract.io import _ENCODER, to_builtins
from nsa.contract.protocol import EventMsg, LogLines
from nsa.contract.records import DeviceInfo, EpochMetric, EvalMetric, GateShares, Phase, TrainMetric

BEATS = [Beat(ts=1.5, run_id="r", rank=3, pid=12, host="h", device=DeviceInfo(type="cuda", index=1, uuid="u"),
              phase=Phase.BOOT, phase_since=1.5, step=10, source="step"), Beat(ts=2.0, run_id="r", rank=3)]
METRICS = [TrainMetric(ts=1.0, step=1, loss=2.5, lr=1e-3,
                       gate_shares=GateShares(compressed=.1, selected=.2, window=.7)),
           EvalMetric(ts=1.0, step=2, val_loss=3.0), EpochMetric(ts=2.0, step=3, message="x")]


@pytest.mark.parametrize("msg", [
    EventMsg(id=5, event="beats", run="r", stream="heartbeats/rank-3", offset=100, gen="g", data=BEATS),
    EventMsg(id="a", event="metrics", run="r", data=METRICS),
    EventMsg(id=1, event="log", data=LogLines(lines=["a\u00e9", "b\x00"])),
    {"hello": {"x": [1, 2.0, None, (3, float("inf"))]}},
    EventMsg(event="metrics", data=[TrainMetric(ts=1.0, step=1, loss=float("nan"))]),
    EventMsg(event="metrics", data=[TrainMetric(ts=1.0, step=1, loss=2.0, grad_norm=float("-inf"))]),
    EventMsg(event="x", data={"a": {"b": [float("nan")]}}),
    EventMsg(event="x", data={"p": Path("/x")}),
    {"version": torch.__version__, 1: 2, "phase": Phase.TRAIN},  # a str subclass, an int key, an enum
    # a null of its own, beside a NaN or not, and "null" as text: the fast path must look further
    EventMsg(event="metrics", data=[TrainMetric(ts=1.0, step=1, loss=float("nan"), lr=None)]),
    EventMsg(event="metrics", data=[EvalMetric(ts=1.0, step=2, val_loss=3.0)], stream=""),
    EventMsg(event="log", data=LogLines(lines=["null", "loss nan", "NaN"])),
    {"shares": GateShares(compressed=float("inf"), selected=0.0, window=0.0), "none": None},
])
def test_the_direct_encoding_equals_the_plain_python_one(msg: Any) -> None:
    assert encode(msg) == _ENCODER.encode(to_builtins(msg))


def test_unbuffered_stdout_still_gets_every_line(tmp_path: Path) -> None:
    reqs = "".join(f'{{"id":{i},"op":"ping"}}\n' for i in range(50))
    out = subprocess.run([sys.executable, "-u", "-m", "nsa_tui.agent", "--runs-root", str(tmp_path)],
                         input=reqs, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    msgs = [json.loads(line) for line in out.stdout.splitlines()]
    assert "hello" in msgs[0]
    assert sorted(m["id"] for m in msgs[1:]) == list(range(50))
