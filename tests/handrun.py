"""A run started by hand, as the agent sees one: run.json says running, one rank is a real
live process of the run (``NSA_RUN_ID`` in its environment), and no supervisor or watchdog
exists. The test writes the rank's beats (``write_beat``) as it needs them old or fresh."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from nsa.contract import Beat, Phase, RunInfo, RunStatus, write_json_atomic
from nsa.contract.io import encode

RID = "20261122-080000-byhand-0b48"


@contextlib.contextmanager
def hand_run(root: Path, run_id: str = RID) -> Iterator[subprocess.Popen[bytes]]:
    """The run's directory under ``root`` and its rank 0 (a ``sleep``), killed afterwards."""
    from nsa_tui.agent.procs import run_process

    d = root / run_id
    (d / "heartbeats").mkdir(mode=0o700, parents=True)
    write_json_atomic(d / "run.json", RunInfo(run_id=run_id, name="byhand", status=RunStatus.RUNNING, step=5,
                                              total_steps=100, world_size=1, started_at=time.time() - 60))
    rank = subprocess.Popen(["sleep", "600"], env=dict(os.environ, NSA_RUN_ID=run_id, RANK="0"))
    try:
        deadline = time.monotonic() + 10
        while run_process(rank.pid, run_id) is None:  # until exec: the environ is the parent's
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield rank
    finally:
        rank.kill()
        rank.wait()


def write_beat(root: Path, rank: subprocess.Popen[bytes], age_s: float, run_id: str = RID) -> Beat:
    """Rank 0's only beat, ``age_s`` old, in the train phase at step 5."""
    now = time.time()
    beat = Beat(ts=now - age_s, run_id=run_id, rank=0, step=5, pid=rank.pid, phase=Phase.TRAIN,
                phase_since=now - age_s - 5)
    (root / run_id / "heartbeats" / "rank-0.jsonl").write_bytes(encode(beat) + b"\n")
    return beat
