"""The morning after: a panel started after a night of alerts lists them all, in order, open
ones first, from the hosts' records, without any run being selected or watched; and it
learns a new alert of a run it does not watch as soon as the host records it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from nsa.contract import Alert, ExitInfo, LaunchInfo, RunInfo, RunStatus, write_json_atomic
from nsa_tui.app.app import NsaApp
from nsa_tui.app.widgets.alerts import AlertsPane
from nsa_tui.health.ledger import ALERTS_FILE, AlertLedger
from tests.tui.helpers import plain, wait_for


def ended_run(root: Path, run_id: str, t0: float) -> Path:
    """A run that ended in the night, its watchdog's record complete (exit.json: watchdog)."""
    d = root / run_id
    d.mkdir(parents=True)
    write_json_atomic(d / "launch.json", LaunchInfo(run_id=run_id, name=run_id[-6:], created=t0))
    write_json_atomic(d / "run.json", RunInfo(run_id=run_id, name=run_id[-6:], status=RunStatus.FAILED))
    write_json_atomic(d / "exit.json", ExitInfo(exit_code=1, watchdog=True))
    return d


def alert(kind: str, run: str, severity: str = "critical", rank: int | None = None) -> Alert:
    return Alert(kind=kind, severity=severity, host="h", run=run, rank=rank,  # type: ignore[arg-type]
                 message=f"{kind} of {run[-6:]}")


async def test_a_panel_started_in_the_morning_lists_the_night(runs_root: Path) -> None:
    night = time.time() - 8 * 3600
    a = ended_run(runs_root, "20260101-010000-night-aaaa", night)
    b = ended_run(runs_root, "20260101-020000-night-bbbb", night)
    led_a = AlertLedger(a / ALERTS_FILE, a.name, resolve_after_s=0)
    led_a.step([alert("stall", a.name, rank=1)], now=night + 100)
    led_a.step([], now=night + 200)  # resolved
    led_a.step([alert("crash", a.name, rank=1)], now=night + 300)
    led_b = AlertLedger(b / ALERTS_FILE, b.name, resolve_after_s=0)
    led_b.step([alert("disk", b.name, "warning")], now=night + 400)
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=(160, 45)) as pilot:
        # the recorded alerts and the run list come as two subscriptions: wait for both
        host = app.state.hosts["local"]
        await wait_for(pilot, lambda: len(host.recorded) == 3 and {a.name, b.name} <= set(host.runs), 30,
                       "the night's alerts and runs")
        items = app.state.shown_alerts()
        assert [(s.alert.kind, s.state) for s in items] == [("disk", "open"), ("crash", "open"),
                                                              ("stall", "resolved")]
        assert not app.state.hosts["local"].runs[a.name].synced  # nothing was watched for it
        pane = app.screen.query_one(AlertsPane)
        await wait_for(pilot, lambda: "alerts (2 open)" in str(pane.border_title), 10, "the pane")
        text = plain(pane)
        assert text.index("disk of") < text.index("crash of") < text.index("stall of") and "resolved" in text
        assert any("3 alert(s) recorded" in str(n.message) and "2 still open" in str(n.message)
                   for n in app._notifications)
        # old news is shown, not rung: only what comes now is announced
        assert not any((n.title or "").startswith("alert:") for n in app._notifications)
        led_b.step([alert("disk", b.name, "warning"), alert("orphan_rank", b.name, rank=0)], now=time.time())
        await wait_for(pilot, lambda: "orphan_rank" in plain(pane), 10, "a new alert of an unwatched run")
        toasted = lambda: any((n.title or "") == "alert: orphan_rank" for n in app._notifications)  # noqa: E731
        await wait_for(pilot, toasted, 5,
                       "its toast")
        await pilot.press("q")
    lines = [json.loads(x)["action"] for x in (b / ALERTS_FILE).read_text().splitlines()]
    assert lines == ["raised", "raised"]
