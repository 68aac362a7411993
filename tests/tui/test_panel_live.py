"""Pilot tests of every key path against the local transport running REAL tiny runs.

Each test drives the real panel (NsaApp) whose service starts the real agent as a
subprocess; runs are real `nsa-train` runs of configs/smoke-cpu.yaml variants.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nsa_tui.app.app import NsaApp
from nsa_tui.app.screens.dialogs import ConfirmScreen, StacksScreen
from nsa_tui.app.screens.launch import LaunchScreen
from nsa_tui.app.screens.main import MainScreen
from nsa_tui.app.widgets.alerts import AlertsPane
from nsa_tui.app.widgets.header import PanelHeader
from nsa_tui.app.widgets.logview import LogView
from nsa_tui.app.widgets.summary import RunSummary
from tests.tui.helpers import info, plain, points, run_alive_on_host, wait_for

SIZE = (100, 30)


def on(app: NsaApp, cls: type):
    """A condition: the app shows a screen of `cls` (returns that screen)."""
    return lambda: isinstance(app.screen, cls) and app.screen


def stacks_shown(app: NsaApp):
    """A condition: the stack viewer is up with its text (returns the screen)."""
    return lambda: isinstance(app.screen, StacksScreen) and app.screen.query("#stacks-text") and app.screen


async def launch_through_dialog(app: NsaApp, pilot, config: str, nproc: str | None = None,
                                name: str | None = None) -> str:
    """l, type the config path (uploaded), optional nproc/name, ctrl+s; returns the new run id."""
    before = {r.run_id for r in app.state.all_runs()}
    await pilot.press("l")
    dialog = await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen, 5, "dialog")
    dialog.query_one("#config-path").value = config
    if nproc is not None:
        dialog.query_one("#nproc").value = nproc
    if name is not None:
        dialog.query_one("#name").value = name
    await pilot.press("ctrl+s")
    await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 30, "the dialog to close")
    run = await wait_for(pilot, lambda: (r := app.state.selected_run()) and r.run_id not in before and r, 10,
                         "the new run to be selected")
    return run.run_id


@pytest.mark.slow
async def test_launch_watch_search_dump_quit_leaves_run_alive(runs_root: Path, make_config) -> None:
    config = make_config("watched", train__steps=5000, train__save_every=5000)
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        await pilot.press("l")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen, 5)
        assert dialog.query_one("#nproc").value == "1"  # no GPU here: nproc defaults to max(1, gpus)
        await pilot.press("escape")
        run_id = await launch_through_dialog(app, pilot, config)
        run = app.state.selected_run()
        await wait_for(pilot, lambda: points(run) >= 3 and run.log.total > 0, 90, "metrics to arrive")
        # the phase flips between train and eval on this fast run: wait for a train moment
        header = await wait_for(pilot, lambda: (h := plain(app.screen.query_one(PanelHeader)))
                                and "running" in h and "train" in h and h, 30,
                                "the header to say running in phase train")
        assert "watched" in header
        summary = app.screen.query_one(RunSummary)
        text = plain(summary)
        assert "watched.yaml" in str(info(run).config_path) or "watched" in text
        assert info(run).param_count and info(run).global_batch == 2
        chart = app.screen.query_one("#chart0")
        await wait_for(pilot, lambda: chart.data.lines and len(chart.data.lines[0].points) >= 3, 10,
                       "the loss chart to have points")
        # search the log, then follow again
        log = app.screen.query_one(LogView)
        await pilot.press("slash")
        await pilot.pause(0.1)
        for ch in "step":
            await pilot.press(ch)
        await pilot.press("enter")
        await wait_for(pilot, lambda: log.pattern == "step" and not log.follow
                       and log.current_match is not None, 10, "the search to find a match and stop following")
        await pilot.press("t")
        await wait_for(pilot, lambda: log.follow and log.pattern is None, 10, "follow mode back on")
        # dump stacks into the viewer
        await pilot.press("d")
        viewer = await wait_for(pilot, stacks_shown(app), 30, "stacks")
        stacks = viewer.query_one("#stacks-text").text
        assert "rank-0" in stacks and "File" in stacks
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 5)
        await pilot.press("q")
    assert "keep going" in app.return_value and run_id in app.return_value
    assert run_alive_on_host(runs_root, run_id), "quitting the panel must not stop the run"


@pytest.mark.slow
async def test_fallback_kill_resume(runs_root: Path, make_config) -> None:
    config = make_config("twogpu", train__steps=5000, train__save_every=2)
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        parent_id = await launch_through_dialog(app, pilot, config, nproc="2")
        parent = app.state.selected_run()
        ckpt = runs_root / parent_id / "checkpoints" / "latest"
        await wait_for(pilot, lambda: ckpt.exists() and points(parent) >= 3, 120, "a checkpoint")
        assert info(parent).world_size == 2
        # f: one confirmation (what the host's plan says), then the new run is selected by itself
        await pilot.press("f")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, "the fallback confirmation")
        await pilot.press("y")
        child = await wait_for(
            pilot, lambda: (r := app.state.selected_run()) and r.run_id != parent_id and r, 90, "fallback")
        assert child.parent_run == parent_id
        # run.json gains global_batch after boot; its update may reach the panel after the first metric
        await wait_for(pilot, lambda: points(child) >= 1 and info(child).world_size == 1
                       and info(child).global_batch is not None, 120,
                       "the fallback run's first steps")
        assert info(child).global_batch == info(parent).global_batch  # accumulation keeps it
        steps, _ = app.state.chart_series(child, "loss")
        own_first = child.metrics.series("loss")[0][0]
        assert own_first > 1 and steps[0] == 1, "the chart continues from the parent's steps"
        assert not run_alive_on_host(runs_root, parent_id)
        # a save of its own first, so that the resume below goes on from the fallback's steps (a run
        # stopped before its first save resumes from the checkpoint it started from: test_describe)
        own_ckpt = runs_root / child.run_id / "checkpoints" / "latest"
        await wait_for(pilot, own_ckpt.exists, 120, "the fallback run's own checkpoint")
        # k: confirm, the whole group stops
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5)
        await pilot.press("y")
        await wait_for(pilot, lambda: not child.alive and child.status in ("stopped", "finished"), 90, "stop")
        assert not run_alive_on_host(runs_root, child.run_id)
        # r: one confirmation naming the checkpoint, then the new linked run is selected by itself
        await pilot.press("r")
        ask = await wait_for(pilot, on(app, ConfirmScreen), 30, "the resume confirmation")
        body = plain(ask.query_one("#confirm-body"))
        assert "from step-" in body and "started from" not in body, body
        await pilot.press("y")
        resumed = await wait_for(
            pilot, lambda: (r := app.state.selected_run()) and r.run_id != child.run_id and r, 30, "resume")
        assert resumed.parent_run == child.run_id
        await wait_for(pilot, lambda: points(resumed) >= 1, 120, "the resumed run's steps")
        assert resumed.metrics.series("loss")[0][0] > own_first
        await pilot.press("q")
    assert resumed.run_id in app.return_value


async def test_stalled_run_alert_then_dump_evidence_and_ack(runs_root: Path, make_config, settings) -> None:
    """The host's watchdog raises the stall (thresholds from settings.yaml) and captures every rank's
    stack; the panel shows it, `d` on the alert shows that evidence, `a` acknowledges it on the host."""
    settings({"alerts": {"stall_floor_s": 3.0, "stall_factor": 3.0, "first_step_s": 60.0}})
    config = make_config("stuck", train__steps=50, debug__hang_at_step=3)
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        run_id = await launch_through_dialog(app, pilot, config)
        pane = app.screen.query_one(AlertsPane)
        # the toast comes at the tick that first sees the alert; the pane redraws at its capped rate
        # after it, by when (on a loaded machine) the 8 s toast may have gone: look for each as it comes
        await wait_for(pilot, lambda: any("stall" in (n.title or "") for n in app._notifications), 90,
                       "a toast for the new alert")
        await wait_for(pilot, lambda: "stall" in plain(pane), 30, "the stall alert in the pane")
        text = plain(pane)
        assert "rank 0" in text and "phase train" in text and "last step 3" in text
        await pilot.press("d")
        viewer = await wait_for(pilot, stacks_shown(app), 30, "stacks")
        assert "maybe_hang" in viewer.query_one("#stacks-text").text  # where it hangs
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 5)
        recorded = app.state.hosts["local"].recorded
        await wait_for(pilot, lambda: any(st.alert.evidence for st in recorded.values()), 30, "evidence")
        pane.focus()
        await pilot.press("d")  # on the alert: what the watchdog captured when it happened
        viewer = await wait_for(pilot, on(app, StacksScreen), 30, "evidence")
        text = viewer.query_one("#stacks-text").text
        assert "maybe_hang" in text and "stacks/watchdog-" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 5)
        await pilot.press("a")
        await wait_for(pilot, lambda: any(st.state == "acknowledged" for st in recorded.values()), 10,
                       "the acknowledgement, recorded on the host")
        lines = (runs_root / run_id / "alerts.jsonl").read_text()
        assert '"action":"acknowledged"' in lines


async def test_crashed_run_shows_its_traceback(runs_root: Path, make_config) -> None:
    config = make_config("crashy", train__steps=50, debug__crash_at_step=2)
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        await launch_through_dialog(app, pilot, config)
        run = app.state.selected_run()
        await wait_for(pilot, lambda: run.status in ("crashed", "failed"), 90, "the crash")
        await wait_for(pilot, lambda: any("InjectedCrash" in line for line in run.log.lines), 10, "traceback")
        lines = list(run.log.lines)
        assert any(line.startswith("Traceback") for line in lines)
        pane = app.screen.query_one(AlertsPane)
        await wait_for(pilot, lambda: "crash" in plain(pane).lower(), 10, "the crash alert")
        # search takes the view to the traceback, drawn in the error style
        log = app.screen.query_one(LogView)
        await pilot.press("slash")
        for ch in "Traceback":
            await pilot.press(ch)
        await pilot.press("enter")
        await wait_for(pilot, lambda: log.current_match is not None and not log.follow, 10, "the match")
        rendered = [log.render_line(y) for y in range(log.size.height)]
        red = [s for s in rendered if any(seg.style and seg.style.color and seg.style.color.name == "red"
                                          for seg in s)]
        assert red, "error lines are highlighted"


async def test_bad_config_error_stays_in_the_dialog(runs_root: Path, make_config) -> None:
    config = make_config("bad", train__bogus_key=1)
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        await pilot.press("l")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen, 5)
        dialog.query_one("#config-path").value = config
        await pilot.press("ctrl+s")
        err = dialog.query_one("#launch-error")
        await wait_for(pilot, lambda: err.display and "bogus_key" in plain(err), 30, "host's error")
        assert isinstance(app.screen, LaunchScreen)
        assert not list(runs_root.iterdir()) if runs_root.exists() else True


async def test_no_runs_offers_the_packaged_demo(runs_root: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # not a checkout: the demo config comes from the package
    app = NsaApp(["local"])
    async with app.run_test(size=SIZE) as pilot:
        offer = await wait_for(pilot, on(app, ConfirmScreen), 30, "offer")
        assert "nsa_tui/configs/demo-cpu.yaml" in plain(offer.query_one("#confirm-body"))
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 5)
        await pilot.press("q")
    assert "no runs" in app.return_value


@pytest.mark.slow
async def test_accepting_the_demo_shows_a_real_run_training(runs_root: Path, tmp_path: Path, monkeypatch,
                                                            make_config) -> None:
    # a checkout whose configs/tiny-cpu.yaml is the smoke config, so the demo trains in seconds
    (tmp_path / "configs").mkdir()
    smoke = Path(make_config("tiny", train__steps=5000)).read_text()
    (tmp_path / "configs" / "tiny-cpu.yaml").write_text(smoke)
    monkeypatch.chdir(tmp_path)
    app = NsaApp(["local"])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, on(app, ConfirmScreen), 30, "offer")
        await pilot.press("y")
        run = await wait_for(pilot, lambda: app.state.selected_run(), 30, "the demo run")
        assert run.name == "demo"
        await wait_for(pilot, lambda: points(run) >= 2, 90, "the demo's first steps")
        await pilot.press("q")
    assert run.run_id in app.return_value


async def test_keymap_file_remaps_and_help_lists_it(runs_root: Path, tmp_path: Path, monkeypatch) -> None:
    keymap = tmp_path / "keymap.yaml"
    keymap.write_text("launch: x\n")
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(keymap))
    app = NsaApp(["local"], offer_demo=False, live=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        await pilot.press("l")
        await pilot.pause(0.2)
        assert isinstance(app.screen, MainScreen)
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen), 5, "remapped launch key")
        await pilot.press("escape")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen", 5)
        commands = {c.title for c in app.get_system_commands(app.screen_stack[1])}
        for label in ("Launch", "Kill", "1-gpu", "Resume", "Stacks", "Follow", "Search", "Keys", "Quit"):
            assert any(t.startswith(label) for t in commands), label
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 5)
        # the command palette runs the same actions by name
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "CommandPalette", 5, "palette")
        for ch in "launch":
            await pilot.press(ch)
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen), 5, "launch from the palette")


async def test_unreachable_host_is_retried_and_the_ui_stays_responsive(runs_root: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on: connection refused, retried
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dest = f"nobody@127.0.0.1:{port}"
    app = NsaApp(["local", dest], offer_demo=False)
    async with app.run_test(size=SIZE) as pilot:
        host = app.state.hosts[dest]
        await wait_for(pilot, lambda: host.conn == "reconnecting", 30, "the retry state")
        await wait_for(pilot, lambda: "reconnecting in" in plain(app.screen.query_one(PanelHeader)), 5)
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "the local host")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "HelpScreen", 5, "help while retrying")
        await pilot.press("escape")
        await pilot.press("q")
    assert app.return_value
