"""The alerts the panel detects itself (a run that no watchdog watches: started by hand) follow
the ``alerts:`` thresholds of this machine's settings, as the host's watchdogs follow the
host's."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from nsa.contract import Beat, Phase, RunInfo, RunStatus, write_json_atomic
from nsa.contract.io import encode
from nsa_tui.agent.procs import run_process
from nsa_tui.app.app import NsaApp
from tests.tui.helpers import wait_for

RID = "20261122-080000-byhand-0b48"


async def test_a_hand_runs_silent_rank_is_alerted_at_this_machines_threshold(runs_root: Path,
                                                                             tmp_path: Path) -> None:
    """A live rank (a real process of the run) beats once, then falls silent: the settings' 3 s
    ``no_heartbeat_s`` makes that an alert in the panel long before the default 30 s would."""
    (tmp_path / "settings.yaml").write_text("alerts:\n  no_heartbeat_s: 3\n")  # NSA_TUI_SETTINGS
    d = runs_root / RID
    (d / "heartbeats").mkdir(mode=0o700, parents=True)
    write_json_atomic(d / "run.json", RunInfo(run_id=RID, name="byhand", status=RunStatus.RUNNING, step=5,
                                              total_steps=100, world_size=1, started_at=time.time() - 60))
    rank = subprocess.Popen(["sleep", "600"], env=dict(os.environ, NSA_RUN_ID=RID, RANK="0"))
    try:
        deadline = time.monotonic() + 10
        while run_process(rank.pid, RID) is None:  # until exec: the environ is the parent's
            assert time.monotonic() < deadline
            time.sleep(0.01)
        now = time.time()
        beat = Beat(ts=now, run_id=RID, rank=0, step=5, pid=rank.pid, phase=Phase.TRAIN, phase_since=now - 5)
        (d / "heartbeats" / "rank-0.jsonl").write_bytes(encode(beat) + b"\n")
        app = NsaApp(["local"], offer_demo=False)
        async with app.run_test(size=(160, 45)) as pilot:
            def alerted() -> bool:
                return any(a.kind == "no_heartbeat" and a.run == RID and a.rank == 0
                           for a in app.state.alerts)

            await wait_for(pilot, alerted, 30, "the no_heartbeat alert of the hand run")
            assert time.time() - beat.ts < 30  # said before the default threshold could have said it
    finally:
        rank.kill()
        rank.wait()
