"""What one incoming event costs the panel: only the panes it changes are drawn again, and a
chart takes the new point without rebuilding its series. Counted in a real pilot session
against the real local agent and a run written by the benchmark's synthetic writer (the
trainer's records and writers); the speed targets themselves are in bench/panel_cost.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.panel_cost import count_renders
from nsa.contract import TrainMetric
from nsa.contract.io import JsonlWriter
from nsa_tui.app.app import NsaApp
from nsa_tui.app.screens.main import MainScreen
from tests.tui.conftest import REPO
from tests.tui.helpers import wait_for

RUN = "20990101-000000-synthetic-0"
STEPS = 600


def start_writer(root: Path) -> subprocess.Popen[bytes]:
    """A live synthetic run: STEPS steps of 2 ranks at once, then alive and quiet."""
    return start_writer_at(root, RUN, rate=0.0, steps=STEPS)


def start_writer_at(root: Path, run_id: str, rate: float, steps: int = 10**9) -> subprocess.Popen[bytes]:
    """A live synthetic run of 2 ranks, ``rate`` steps/s (0: at once) up to ``steps``, then
    alive and quiet: the benchmark's writer, which writes what the trainer writes."""
    d = root / run_id
    d.mkdir(parents=True)
    env = {**os.environ, "NSA_RUN_ID": run_id, "NSA_RUN_DIR": str(d), "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "bench.panel_cost", "--writer", str(d), "2", str(rate),
                             str(steps), "1000000"], env=env, cwd=REPO, start_new_session=True)


async def test_one_metric_line_redraws_only_what_it_changes(runs_root: Path) -> None:
    writer = start_writer(runs_root)
    try:
        app = NsaApp(["local"], offer_demo=False)
        with count_renders() as counts:
            async with app.run_test(size=(120, 40)) as pilot:
                run = await wait_for(pilot, lambda: (r := app.state.selected_run()) is not None
                                     and r.synced and r.metrics.last_train is not None
                                     and r.metrics.last_train.step == STEPS and r.log.total >= STEPS and r,
                                     60, "the run shown in full")
                screen = app.screen
                assert isinstance(screen, MainScreen)

                def drawn() -> bool:  # the charts' signature: (kinds, axis, compare, ((run, count, view),))
                    sig = screen._chart_sig
                    return bool(sig) and sig[3][0][1] == run.metrics.count
                await wait_for(pilot, drawn, 30, "the charts drawn with every point")
                await pilot.pause(1.5)  # the panes settle (the cap lets the last change through)
                counts.renders.clear()
                rebuilds, count = run.metrics.rebuilds, run.metrics.count

                # one event: the next step's metrics line, as the trainer appends it
                w = JsonlWriter(runs_root / RUN / "metrics.jsonl")
                w.write(TrainMetric(ts=time.time(), step=STEPS + 1, loss=1.5, lr=3e-4, tokens=1,
                                    grad_norm=1.0, tokens_per_s=1.0, step_time_s=0.1))
                w.close()
                await wait_for(pilot, lambda: run.metrics.count > count, 30, "the line to arrive")
                await wait_for(pilot, drawn, 30, "the charts drawn with the new point")
                await pilot.pause(0.3)
                rendered = {k.removesuffix(":lines") for k in counts.renders}
                assert run.metrics.points("loss").x[-1] == STEPS + 1
                await app.action_quit_panel()
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
    # the new point is drawn (the charts and the header's step), nothing rebuilt its series
    assert {"chart0", "header"} <= rendered, rendered
    assert run.metrics.rebuilds == rebuilds, "a line rebuilt a whole chart series"
    # panes that a metrics line does not change are not drawn again (the GPU pane follows the
    # host's samples, once a second, whatever the run does)
    untouched = {"alerts", "log", "summary-facts", "summary-end"} & rendered
    assert not untouched, f"a metrics line redrew {untouched} ({dict(counts.renders)})"
    assert counts.renders["chart0"] <= 2, dict(counts.renders)


async def test_a_followed_log_renders_only_its_new_lines() -> None:
    """Following a log, each redraw moves every visible line up; the lines already drawn are
    kept, so a redraw renders the new lines, not the whole pane. A search, a scroll column or
    another width draws them again (what a line looks like depends on them)."""
    from textual.app import App, ComposeResult

    from nsa_tui.app.state import LogBuffer
    from nsa_tui.app.widgets.logview import LogView

    class LogApp(App[None]):
        def compose(self) -> ComposeResult:
            yield LogView(id="log")

    buf = LogBuffer()
    buf.append_many([f"line {n}" for n in range(200)] + ["Traceback (most recent call last):"])
    app = LogApp()
    async with app.run_test(size=(80, 24)) as pilot:
        log = app.query_one(LogView)
        log.set_buffer(buf)
        await pilot.pause(0.2)
        first = log.lines_rendered
        assert first >= 20  # the pane, once
        for n in range(3):  # three redraws of a followed log, three new lines each
            buf.append_many([f"more {n}.{k}" for k in range(3)])
            assert log.sync()
            await wait_for(pilot, lambda: log.is_vertical_scroll_end and log.scroll_y > 0, 10, "the end")
            await pilot.pause(0.1)
        assert log.lines_rendered - first <= 3 * 3 + 2, (first, log.lines_rendered)
        lines = [log.render_line(y).text for y in range(log.size.height)]
        assert lines[-1].startswith("more 2.2") and lines[-10].startswith("Traceback")
        before = log.lines_rendered
        log.search("more")  # matches are marked: every visible line drawn again
        await pilot.pause(0.2)
        assert log.lines_rendered - before >= log.size.height - 1
