"""What a newcomer met in the panel: a screenshot on a server, a calm header over a
frozen rank, a selection the run list no longer shows, chart legends cut at 120x40, a dense
run's gate chart, the help screen, the launch dialog's picker behind a typed path, a header
wider than 80 columns, and the README's "train by hand" run that nothing listed.

Real Textual pilots on fixed contract records (fixed_data.py), the pure parts called directly,
and the README's command run for real."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from rich.text import Text

from nsa.contract import RunStatus
from nsa.contract.replies import AlertState
from nsa.contract.rundir import RUN_ID_RE
from nsa_tui.agent.runs import RunStore
from nsa_tui.app import chartdata, reducer
from nsa_tui.app.app import NsaApp
from nsa_tui.app.screens.dialogs import HelpScreen
from nsa_tui.app.screens.launch import LaunchScreen
from nsa_tui.app.state import PanelState
from nsa_tui.app.widgets.charts import MetricChart, chart_labels
from nsa_tui.app.widgets.header import PanelHeader, run_progress
from nsa_tui.app.widgets.runlist import RunList
from nsa_tui.app.widgets.summary import RunSummary
from nsa_tui.fmt import fmt_count3
from tests.tui import fixed_data as fd
from tests.tui.helpers import plain, wait_for

REPO = Path(__file__).resolve().parents[2]
RUNNING = "20261121T192000Z-nsa-125m-1gpu"
PARENT = "20261121T180000Z-nsa-125m"
CONFIGS = ["configs/dense-125m.yaml", "configs/smoke-cpu.yaml", "configs/tiny-cpu.yaml"]


def app_for(state: PanelState) -> NsaApp:
    return NsaApp(["local"], state=state, live=False, clock=lambda: fd.NOW, configs=CONFIGS, keymap_file=None)


def header_lines(app: NsaApp) -> list[str]:
    """The header's two lines (empty ones before its first draw)."""
    return (plain(app.screen.query_one(PanelHeader)).rstrip("\n").split("\n") + ["", ""])[:2]


def stall(run_id: str, rank: int | None, state: str = "open", kind: str = "stall") -> AlertState:
    """A stall alert as a host's watchdog records it (alerts.jsonl)."""
    alert = fd.make_alert(kind=kind, severity="critical", host="local", run=run_id, rank=rank, phase="train",
                          last_step=2400, message=f"rank {rank} has not advanced for 5m12s")
    return AlertState(id=f"7-{kind}-{rank}", run=run_id, state=state, raised_at=fd.NOW - 312,
                      updated_at=fd.NOW - 300, alert=alert)


# -- 1. screenshots on a server ------------------------------------------------------------------
async def test_a_screenshot_is_saved_in_the_state_directory_where_there_is_no_downloads(
        tmp_path: Path, monkeypatch, private_view_prefs: Path) -> None:
    """The palette's Screenshot saved to ~/Downloads, which a server has not: "Failed to save
    screenshot". It goes to the panel's state directory (else the working directory), and the
    notification says where."""
    home = tmp_path / "home"  # no Downloads in it, as on a server
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DOWNLOAD_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    app = app_for(fd.fixed_state())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"Screenshot")
        await pilot.pause(0.5)
        await pilot.press("enter")
        folder = private_view_prefs / "screenshots"
        saved = await wait_for(pilot, lambda: list(folder.glob("*.svg")), 10, "the screenshot file")
        assert "<svg" in saved[0].read_text()
        said = [n.message for n in app._notifications]
        assert any(str(saved[0]) in m for m in said), said
        assert not any("Failed" in m for m in said), said
        # a state directory that cannot be made (a file in its place): the working directory
        private_view_prefs.mkdir(parents=True, exist_ok=True)
        (private_view_prefs / "screenshots").rename(tmp_path / "moved")
        (private_view_prefs / "screenshots").write_text("a file, not a directory")
        app.deliver_screenshot()
        here = list(tmp_path.glob("nsa-tui-*.svg"))
        assert len(here) == 1
        await wait_for(pilot, lambda: any(str(here[0]) in n.message for n in app._notifications), 5, "where")


# -- 2. the header and the selection --------------------------------------------------------------
def test_the_header_says_stalled_instead_of_an_eta_while_a_stall_alert_is_unresolved() -> None:
    state = fd.fixed_state(with_alert=False)
    run = state.selected_run()
    assert run is not None
    calm = run_progress(run, fd.NOW, 0, state.stalled_ranks(run)).plain
    assert "ETA" in calm and "STALLED" not in calm
    reducer.recorded_alert(state, "local", stall(RUNNING, 1))
    text = run_progress(run, fd.NOW, 0, state.stalled_ranks(run)).plain
    assert text.startswith("nsa-125m-1gpu  running · STALLED r1 · ") and "ETA" not in text, text
    reducer.recorded_alert(state, "local", stall(RUNNING, 1, "acknowledged"))  # seen, still frozen
    assert state.stalled_ranks(run) == [1]
    reducer.recorded_alert(state, "local", stall(RUNNING, 1, "resolved"))
    assert state.stalled_ranks(run) == []
    reducer.recorded_alert(state, "local", stall(PARENT, 0))  # another run's stall: not this one's
    assert state.stalled_ranks(run) == []
    # the panel's own detector (a run without a watchdog) says the same
    reducer.alerts(state, "local", [stall(RUNNING, 3, kind="no_heartbeat").alert, stall(RUNNING, 0).alert])
    assert state.stalled_ranks(run) == [0, 3]
    assert "STALLED r0,r3" in run_progress(run, fd.NOW, 0, state.stalled_ranks(run)).plain


async def test_the_header_of_a_frozen_run_says_stalled_in_the_panel() -> None:
    state = fd.fixed_state()
    reducer.recorded_alert(state, "local", stall(RUNNING, 1))
    app = app_for(state)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: "STALLED r1" in header_lines(app)[1], 5, "the stalled header")
        assert "ETA" not in header_lines(app)[1]
        reducer.recorded_alert(state, "local", stall(RUNNING, 1, "resolved"))
        await wait_for(pilot, lambda: "ETA 18h46m" in header_lines(app)[1], 5, "the ETA back")


async def test_the_selection_follows_the_filter_and_the_archive() -> None:
    """A filter (s: failed) or an archive hid the selected run, and the header and the summary
    went on showing it: the first run the list shows is selected, or none."""
    state = fd.many_runs_state()
    app = app_for(state)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        assert state.selected == ("local", RUNNING)
        table = app.screen.query_one(RunList)
        await pilot.press("s", *"failed", "enter")
        await wait_for(pilot, lambda: table.rows_shown and all(r.run.status == RunStatus.FAILED
                                                               for r in table.rows_shown), 5, "the filter")
        first = table.rows_shown[0].run
        await wait_for(pilot, lambda: state.selected == first.key, 5, "the first failed run selected")
        await wait_for(pilot, lambda: header_lines(app)[1].startswith(first.name), 5, "the header")
        summary = app.screen.query_one(RunSummary)
        assert first.parent_run and first.parent_run in plain(summary)  # the summary is the failed run's
        assert "nsa-125m-1gpu" not in header_lines(app)[1]
        await pilot.press("s", "ctrl+u", *"nomatch", "enter")
        await wait_for(pilot, lambda: state.selected is None, 5, "nothing selected")
        await wait_for(pilot, lambda: "none matches the filter 'nomatch'" in header_lines(app)[1], 5,
                       "the header saying why")
        assert "no run selected" in plain(summary)
        await pilot.press("s", "ctrl+u", "enter")  # the filter cleared: a run is selected again
        await wait_for(pilot, lambda: state.selected is not None, 5, "a run selected again")
        # archived (the agent's reply to h, through the reducer as the service applies it)
        old = state.host("local").runs["20261120T090000Z-tiny-cpu"]
        app.select(*old.key)
        await wait_for(pilot, lambda: header_lines(app)[1].startswith("tiny-cpu"), 5, "tiny-cpu shown")
        assert old.view is not None
        reducer.run_view(state, "local", msgspec.structs.replace(old.view, archived=True))
        await wait_for(pilot, lambda: state.selected != old.key, 5, "the archived run no longer selected")
        assert state.selected == ("local", RUNNING)  # the first alive run the list shows
        await wait_for(pilot, lambda: header_lines(app)[1].startswith("nsa-125m-1gpu"), 5, "the header")


# -- 3. chart legends ---------------------------------------------------------------------------
def test_chart_labels_keep_the_whole_legend_in_narrow_charts() -> None:
    state = fd.fixed_state()
    run = state.selected_run()
    gates = chartdata.single(state, run, "gates")
    for width in (20, 25, 33, 60, 80):
        top, bottom = chart_labels(gates, False, width)
        both = top.plain + " " + (bottom.plain if bottom else "")
        assert all(re.search(rf"━ ?{w}\b", both) for w in ("cmp", "sel", "win")), (width, both)
        assert top.cell_len <= width - 6 and (bottom is None or bottom.cell_len <= width - 6), (width, both)
    assert chart_labels(gates, False, 80)[0].plain == "gate shares  ━ cmp  ━ sel  ━ win"  # room: as before
    loss = chartdata.single(state, run, "loss")
    loss.note = "⚠ 1 NaN/inf"
    top, bottom = chart_labels(loss, False, 25)
    assert bottom is not None and "NaN" in top.plain + bottom.plain and "val" in top.plain + bottom.plain


@pytest.mark.parametrize("size,keys", [((120, 40), []), ((80, 24), ["2"])], ids=["120x40", "80x24"])
async def test_three_charts_in_a_row_show_their_legends(size: tuple[int, int], keys: list[str]) -> None:
    app = app_for(fd.fixed_state())
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        reducer.set_charts(app.state, ("gates", "val_loss", "grad_norm"))  # after view.json was read
        await pilot.press(*keys)
        chart = app.screen.query_one("#chart0", MetricChart)
        await wait_for(pilot, lambda: chart.data.title == "gate shares" and chart.outer_size.width, 5,
                       "the gate chart")
        await pilot.pause(0.3)
        room = chart.outer_size.width - 6  # what a border shows of a label (Textual cuts the rest)
        # a border label reads back as markup
        labels = [Text.from_markup(str(t)).plain for t in (chart.border_title, chart.border_subtitle) if t]
        assert all(len(t) <= room for t in labels), labels
        shown = " ".join(labels)
        assert "gate" in shown and all(w in shown for w in ("cmp", "sel", "win")), shown


def test_a_dense_runs_gate_chart_says_dense_no_gates() -> None:
    state = fd.compare_state()
    dense = state.host("local").runs["20261121T100000Z-dense-125m"]
    assert dense.view is not None
    cfg = {"model": {"dim": 768, "attention": {"kind": "dense"}}}
    reducer.run_view(state, "local", msgspec.structs.replace(
        dense.view, info=msgspec.structs.replace(dense.view.info, config=cfg)))
    assert chartdata.single(state, dense, "gates").note == "dense: no gates"
    nsa = state.host("local").runs[RUNNING]
    assert "dense" not in chartdata.single(state, nsa, "gates").note


# -- 4. smaller ones ----------------------------------------------------------------------------
async def test_the_help_says_how_to_close_it_and_fits_80x24() -> None:
    app = app_for(fd.fixed_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("question_mark")
        help_screen = await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen, 5)
        await pilot.pause(0.3)
        title = help_screen.query_one("#help-title")
        assert "esc/q/? to close" in plain(title)
        dialog, body = help_screen.query_one("#help-dialog"), help_screen.query_one("#help")
        assert dialog.region.height < 24 and dialog.region.width < 80  # not the whole terminal
        assert 0 <= title.region.y and title.region.bottom <= dialog.region.bottom
        assert body.max_scroll_y > 0 and app.focused is body  # ↓ scrolls it
        await pilot.press("pagedown")
        await pilot.pause(0.2)
        assert body.scroll_y > 0 and title.region.y >= dialog.region.y  # the title stays
        await pilot.press("q")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), 5, "the help closed")


async def test_the_config_picker_follows_the_typed_path(monkeypatch, private_user_state) -> None:
    monkeypatch.chdir(REPO)
    app = app_for(fd.fixed_state())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("l")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen, 5)
        picker, path = dialog.query_one("#config"), dialog.query_one("#config-path")
        assert picker.value == "configs/tiny-cpu.yaml"
        await pilot.press(*"./configs/smoke-cpu.yaml")  # a listed config, typed
        await wait_for(pilot, lambda: picker.value == "configs/smoke-cpu.yaml", 5, "the picker following")
        await pilot.press(*(["backspace"] * 30), *"/elsewhere/mine.yaml")  # not in the list
        await wait_for(pilot, lambda: picker.is_blank(), 5, "the picker blank")
        assert "typed path" in plain(picker.query_one("SelectCurrent #label"))
        assert dialog.form()[1]["config"] == "/elsewhere/mine.yaml"
        picker.value = "configs/dense-125m.yaml"  # picked from the list: the typed path goes
        await wait_for(pilot, lambda: path.value == "", 5, "the typed path cleared")
        assert dialog.form()[1]["config"] == "configs/dense-125m.yaml"
        path.value = "/elsewhere/mine.yaml"
        await wait_for(pilot, lambda: picker.is_blank(), 5, "blank again")
        path.value = ""  # emptied: the config picked last
        await wait_for(pilot, lambda: picker.value == "configs/dense-125m.yaml", 5, "the last pick back")


async def test_the_header_fits_80_columns_with_a_compact_token_count() -> None:
    app = app_for(fd.fixed_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.5)
        header = app.screen.query_one(PanelHeader)
        room = header.content_region.width
        lines = plain(header).rstrip("\n").split("\n")
        assert len(lines) == 2 and all(len(line.rstrip()) <= room for line in lines), lines
        assert lines[1].startswith("nsa-125m-1gpu  running · train") and "step 2400/50000" in lines[1], lines
        await pilot.resize_terminal(120, 40)
        await wait_for(pilot, lambda: header_lines(app)[1].endswith("ETA 18h46m · 78.6M tok"), 5,
                       "every part at 120 columns, the tokens in three digits")
    assert fmt_count3(495_620, "tok") == "496k tok" and fmt_count3(78_643_200, "tok") == "78.6M tok"
    assert fmt_count3(999_600) == "1.00M" and fmt_count3(812) == "812"


def test_the_readmes_train_by_hand_run_is_listed_by_runs_local(tmp_path: Path) -> None:
    """The README's example wrote runs/tiny in the working directory, where neither the panel
    nor `nsa-tui runs local` look (their runs root: ~/nsa-runs): run as written (one step), it
    is listed, with its directory named by its run id."""
    readme = (REPO / "README.md").read_text().splitlines()
    row = next(line for line in readme if line.startswith("| train by hand"))
    command = next(code for code in re.findall(r"`([^`]+)`", row) if "nsa-train " in code)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "configs").symlink_to(REPO / "configs")
    env = {k: v for k, v in os.environ.items() if k != "NSA_RUNS_ROOT"}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    bindir = Path(sys.executable).parent
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(["bash", "-c", command + " --set train.steps=1"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = RunStore(home / "nsa-runs").views()
    assert len(runs) == 1 and runs[0].status == RunStatus.FINISHED, [(r.run_id, r.status) for r in runs]
    assert RUN_ID_RE.match(runs[0].run_id) and runs[0].info.run_id == runs[0].run_id
    listed = subprocess.run([sys.executable, "-m", "nsa_tui.cli", "runs", "local", "--json"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert runs[0].run_id in json.dumps(json.loads(listed.stdout))
