"""Strings from a host are text, never Rich markup: a run named ``x[/link]`` must not crash the panel.

Before the fix, ``nsa-tui launch --name 'x[/link]'`` made the panel raise ``MarkupError`` at
start-up, and again at every start for as long as that run directory existed. The run is
launched through the CLI as a user would; the panel then shows it everywhere (run list,
summary, header, log, alerts, the stop dialog) while it runs and after it crashed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from textual.widgets import Label

from nsa_tui.app.app import NsaApp
from nsa_tui.app.screens.dialogs import ConfirmScreen
from nsa_tui.app.screens.main import MainScreen
from tests.tui.helpers import plain, wait_for

REPO = Path(__file__).resolve().parents[2]
NAME = "x[/link]"  # short: the run list shows it whole (a long name is clipped, and hid the bug)


def _toast(app: NsaApp) -> bool:
    return any(NAME in str(n.message) and "nothing to stop" in str(n.message) for n in app._notifications)


async def nothing_to_stop(pilot: Any, app: NsaApp) -> None:
    """``k`` once the crashed run has no process left: the toast names the run. The crash shows
    before torchrun has torn its processes down (under load, seconds before): until then ``k``
    asks to stop what is left, in a dialog that names the run too; answer no and ask again."""
    for _ in range(30):
        await pilot.press("k")
        def answered() -> Any:
            return _toast(app) or (isinstance(app.screen, ConfirmScreen) and app.screen)

        got = await wait_for(pilot, answered, 30, "the toast or the stop dialog")
        if got is True:
            return
        assert NAME in plain(got.query_one(Label))
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 10)
        await pilot.pause(1.0)  # the processes' teardown: ask the host again
    raise AssertionError("the crashed run still had processes after 30 tries")


async def look_at(run_id: str) -> None:
    """Open the panel, watch the run until it crashed and its alert shows, open its stop dialog, quit."""
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        run = await wait_for(pilot, lambda: app.state.hosts["local"].runs.get(run_id), 30, "the run")
        await wait_for(pilot, lambda: app.state.selected == ("local", run_id), 10, "the run selected")
        assert run.name == NAME
        await wait_for(pilot, lambda: run.status.value in ("failed", "crashed") and app.state.shown_alerts(),
                       120, "the crash and its alert")
        await nothing_to_stop(pilot, app)
        await pilot.press("r")  # the resume dialog names the run (the host's plan: from step-6)
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, 30)
        assert NAME in plain(dialog.query_one(Label))
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 10)
        await pilot.pause(1.0)  # many redraws of every pane with that name in them
        await pilot.press("q")
    assert app.return_value is not None  # a clean exit, not a crash


async def test_a_run_named_like_markup_is_shown_as_text(runs_root: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "markup.yaml"
    cfg.write_text((REPO / "configs/smoke-cpu.yaml").read_text().replace("name: smoke-cpu", "name: cfg[/i]"))
    cmd = [sys.executable, "-m", "nsa_tui.cli", "launch", "local", "--config", str(cfg), "--name", NAME,
           "--runs-root", str(runs_root), "--json", "--set", "train.steps=40", "debug.crash_at_step=8",
           "train.eval_every=1000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout)["run_id"]
    await look_at(run_id)  # at start-up, while it runs and when it crashes
    await look_at(run_id)  # a later start: the run directory is still there
