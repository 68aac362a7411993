"""Bad input from a host never blinds the panel: garbage in every telemetry stream of a run.

A run started by hand (no launch.json, so no watchdog: the panel detects its alerts itself)
gets, between its good lines, random bytes, truncated lines, wrong types, invalid UTF-8 and
huge lines in its heartbeats, metrics and log. Through the real agent and the real panel:
every good line arrives, and a rank that then freezes is still alerted in time (before the
fix, one ``{"step": "abc"}`` froze the run's chart and heartbeats, and a 75 s freeze raised
no alert).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from nsa.contract import Beat, Phase, TrainMetric, encode
from nsa_tui.app.app import NsaApp
from nsa_tui.app.widgets.alerts import AlertsPane
from nsa_tui.health.alerts import Thresholds
from tests.tui.helpers import plain, wait_for

RID = "20260101-000000-fuzzed-0001"
STEPS = 40


def garbage(rng: random.Random, good: str) -> list[bytes]:
    return [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))).replace(b"\n", b" "),
            good[: rng.randint(1, len(good) - 1)].encode(),
            b'{"kind":"train","ts":1,"step":"abc","loss":2.0}',
            b'{"kind":"train","ts":1,"step":3,"loss":"abc"}',
            b'{"ts":"x","rank":"zero","run_id":7}', b'{"rank": 1, "step": 99999}', b"[1, 2, 3]", b"null",
            b"\xff\xfe\xfd not utf-8", b"{" * 50_000, b"y" * rng.choice([100, 300_000, 1_500_000])]


def append(path: Path, lines: list[bytes | str]) -> None:
    with open(path, "ab") as fh:
        fh.write(b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines))


async def test_garbage_in_every_stream_keeps_every_good_line_and_the_alerts(runs_root: Path) -> None:
    d = runs_root / RID
    (d / "heartbeats").mkdir(parents=True)
    now = time.time()
    (d / "run.json").write_text(json.dumps({"run_id": RID, "name": "x[/link] [bold]fuzz", "status": "running",
                                            "started_at": now, "world_size": 2, "total_steps": 1000}))
    th = Thresholds(train_floor_s=4.0, train_factor=1.0, no_heartbeat_s=6.0, first_step_s=30.0)
    app = NsaApp(["local"], offer_demo=False, alert_thresholds=th)
    rng = random.Random(7)
    hb = [d / "heartbeats" / f"rank-{r}.jsonl" for r in range(2)]

    def beat(rank: int, step: int) -> str:
        return encode(Beat(ts=time.time(), run_id=RID, rank=rank, step=step, phase=Phase.TRAIN,
                           phase_since=now, source="step", pid=None)).decode()

    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        run = await wait_for(pilot, lambda: app.state.hosts["local"].runs.get(RID), 30, "the run")
        await wait_for(pilot, lambda: app.state.selected == ("local", RID), 10, "the run selected")
        for step in range(1, STEPS + 1):
            for r in range(2):
                good = beat(r, step)
                append(hb[r], [good, *rng.sample(garbage(rng, good), 2)])
            good = encode(TrainMetric(ts=time.time(), step=step, loss=3.0 - step / 100, step_time_s=0.05,
                                      tokens_per_s=1000.0)).decode()
            append(d / "metrics.jsonl", [good, *rng.sample(garbage(rng, good), 3)])
            append(d / "train.log", [f"step {step}", *rng.sample(garbage(rng, good), 2)])
            if step % 10 == 0:
                await pilot.pause(0.05)
        # every good line, in order, nothing invented from the garbage
        await wait_for(pilot, lambda: len(run.metrics.series("loss")[0]) == STEPS, 60, "every metric line")
        assert run.metrics.series("loss")[0] == list(range(1, STEPS + 1))
        await wait_for(pilot, lambda: {k: b.step for k, b in run.beats.items()} == {0: STEPS, 1: STEPS}, 30,
                       "both ranks' newest beats")
        # the log's garbage (lines of up to 1.5 MB) may take a few more reads than the beats'
        await wait_for(pilot, lambda: any(line == f"step {STEPS}" for line in run.log.lines), 30,
                       "the log's last good line")
        pane = app.screen.query_one(AlertsPane)
        assert "No alerts" in plain(pane)
        # rank 1 freezes (no beats at all), rank 0 waits for it in a collective (beats, step frozen)
        frozen_at = time.monotonic()
        deadline = frozen_at + 60
        while time.monotonic() < deadline and not ("no_heartbeat" in plain(pane) and "stall" in plain(pane)):
            append(hb[0], [beat(0, STEPS), b'{"step": "abc"}', b"x" * 100_000])
            append(d / "metrics.jsonl", [b'{"kind": "train", "step": "abc"}'])
            await pilot.pause(0.5)
        waited = time.monotonic() - frozen_at
        text = plain(pane)
        assert "no_heartbeat" in text and "stall" in text, text
        print(f"\nMEASURE panel alerts through garbage: {waited:.1f} s after the freeze (thresholds 4, 6 s)")
        assert waited < 6.0 + 10.0
        await pilot.press("q")
