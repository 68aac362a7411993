"""The alerts the panel detects itself (a run that no watchdog watches: started by hand) follow
the ``alerts:`` thresholds of this machine's settings, as the host's watchdogs follow the
host's."""

from __future__ import annotations

import time
from pathlib import Path

from nsa_tui.app.app import NsaApp
from tests.handrun import RID, hand_run, write_beat
from tests.tui.helpers import wait_for


async def test_a_hand_runs_silent_rank_is_alerted_at_this_machines_threshold(runs_root: Path,
                                                                             tmp_path: Path) -> None:
    """A live rank (a real process of the run) beats once, then falls silent: the settings' 3 s
    ``no_heartbeat_s`` makes that an alert in the panel long before the default 30 s would."""
    (tmp_path / "settings.yaml").write_text("alerts:\n  no_heartbeat_s: 3\n")  # NSA_TUI_SETTINGS
    with hand_run(runs_root) as rank:
        beat = write_beat(runs_root, rank, 0)
        app = NsaApp(["local"], offer_demo=False)
        async with app.run_test(size=(160, 45)) as pilot:
            def alerted() -> bool:
                return any(a.kind == "no_heartbeat" and a.run == RID and a.rank == 0
                           for a in app.state.alerts)

            await wait_for(pilot, alerted, 30, "the no_heartbeat alert of the hand run")
            assert time.time() - beat.ts < 30  # said before the default threshold could have said it
