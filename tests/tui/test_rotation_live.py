"""A real run whose heartbeat files rotate every few KiB, under a real agent and a Textual pilot
panel: every rank's view stays fresh through the rotations, no alert is raised, and a dropped
connection heals. A rotated file must never be taken for old data (a byte offset alone cannot
tell the fresh file from the one it replaced)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from nsa_tui.app.app import NsaApp
from nsa_tui.health.alerts import Thresholds
from tests.tui.helpers import wait_for
from tests.tui.test_panel_live import SIZE, launch_through_dialog

ROTATE = 8192  # a generation every 2-3 s: three beats per step, 4 steps a second
STALE_S = 15.0  # the panel's newest beat of a rank may trail the file's newest by this much
ROTATIONS = 3  # per rank, before the reconnect and again after it


def _first_and_last(path: Path) -> tuple[bytes, dict | None]:
    """The file's first line (what tells one generation from the next) and its newest beat."""
    try:
        data = path.read_bytes()
    except OSError:
        return b"", None
    first = data.split(b"\n", 1)[0] if b"\n" in data else b""
    lines = data[:data.rfind(b"\n")].split(b"\n") if b"\n" in data else []
    for line in reversed(lines):
        try:
            return first, json.loads(line)
        except ValueError:
            continue
    return first, None


class Watcher:
    """What the test sees of each rank's heartbeat file (rotations, newest beat) next to what
    the panel shows; every look checks that the panel keeps up and raises nothing."""

    def __init__(self, app: NsaApp, run_dir: Path, run_id: str, ranks: int) -> None:
        self.app, self.run_dir, self.run_id, self.ranks = app, run_dir, run_id, ranks
        self.heads: dict[int, bytes] = {}
        self.rotations = dict.fromkeys(range(ranks), 0)
        self.since: dict[int, float] = {}  # rank -> when the panel last matched the file's beat
        self.worst = 0.0

    def look(self) -> None:
        run = self.app.state.hosts["local"].runs[self.run_id]
        now = time.monotonic()
        for rank in range(self.ranks):
            head, newest = _first_and_last(self.run_dir / "heartbeats" / f"rank-{rank}.jsonl")
            if head and head != self.heads.get(rank):
                if rank in self.heads:
                    self.rotations[rank] += 1
                self.heads[rank] = head
            shown = run.beats.get(rank)
            if newest is None or shown is None:
                continue
            if shown.ts >= newest["ts"] - 1.0:  # the panel has (about) the file's newest beat
                self.since[rank] = now
            behind = now - self.since.setdefault(rank, now)
            self.worst = max(self.worst, behind)
            assert behind < STALE_S, (
                f"rank {rank}: the panel shows step {shown.step}, the file is at step {newest['step']} "
                f"and has not been caught up with for {behind:.0f} s (rotations so far: {self.rotations})")
        self.no_alerts()

    def no_alerts(self) -> None:
        shown = [a for a in self.app.state.alerts if a.run == self.run_id]
        assert not shown, [f"{a.kind}: {a.message}" for a in shown]
        svc = self.app.services["local"]  # the panel's own detector, as for a run without a watchdog
        own = [a for a in svc.alerts.detector.check(time.time()) if a.run == self.run_id]
        if own:
            det = svc.alerts.detector.runs[self.run_id]
            hist = {k: list(r.history)[-40:] for k, r in det.ranks.items()}
            assert not own, ([f"{a.kind}: {a.message}" for a in own], hist)

    def rotated(self, n: int) -> bool:
        self.look()
        return all(r >= n for r in self.rotations.values())

    def caught_up(self) -> bool:
        """Every rank's panel view holds the file's newest beat (of the current generation)."""
        self.look()
        run = self.app.state.hosts["local"].runs[self.run_id]
        for rank in range(self.ranks):
            _, newest = _first_and_last(self.run_dir / "heartbeats" / f"rank-{rank}.jsonl")
            shown = run.beats.get(rank)
            if newest is None or shown is None or shown.step < newest["step"]:
                return False
            if shown.ts < newest["ts"] - 1.0:
                return False
        return True


@pytest.mark.slow
async def test_rotating_heartbeats_keep_the_panel_fresh_and_a_reconnect_heals(
        runs_root: Path, make_config, settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NSA_ROTATE_BYTES", str(ROTATE))  # the agent, its runs and their ranks inherit it
    # a view frozen by a rotation would raise these within the test (the defaults take 30 s)
    settings({"alerts": {"no_heartbeat_s": 12}})
    config = make_config("rotating", train__steps=100000, train__save_every=100000, train__eval_every=100000,
                         debug__slow_data_s=0.25)
    app = NsaApp(["local"], offer_demo=False, alert_thresholds=Thresholds(no_heartbeat_s=12))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        run_id = await launch_through_dialog(app, pilot, config, nproc="2")
        run_dir = runs_root / run_id

        def training(rank: int) -> bool:
            beat = _first_and_last(run_dir / "heartbeats" / f"rank-{rank}.jsonl")[1]
            return beat is not None and beat["phase"] == "train" and beat["step"] > 0

        await wait_for(pilot, lambda: training(0) and training(1), 120, "both ranks training")
        w = Watcher(app, run_dir, run_id, 2)  # from now on every look checks the panel against the files
        await wait_for(pilot, w.caught_up, 2 * STALE_S, "the panel to show every rank's newest beat")
        await wait_for(pilot, lambda: w.rotated(ROTATIONS), 120, "rotations of every rank's file")
        await wait_for(pilot, w.caught_up, 2 * STALE_S, "the panel to show every rank's newest beat")
        # the connection drops (the agent dies, as in a crash); the client reconnects on its own
        # and every watch resumes from the positions the panel saw
        client = app.services["local"].client
        before = dict(w.rotations)
        client.drop_connection()
        await wait_for(pilot, lambda: app.state.hosts["local"].conn != "connected", 10, "the drop")
        w.since.clear()  # no beat can arrive while the link is down
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 60, "the reconnect")
        await wait_for(pilot, lambda: all(w.rotated(0) and w.rotations[r] >= before[r] + ROTATIONS
                                          for r in range(2)), 120, f"{ROTATIONS} more rotations")
        await wait_for(pilot, w.caught_up, 2 * STALE_S, "the panel to show every rank's newest beat again")
        w.no_alerts()
        print(f"\nMEASURE rotation at {ROTATE} B: rotations per rank {w.rotations}; the panel trailed "
              f"the files by at most {w.worst:.1f} s")
