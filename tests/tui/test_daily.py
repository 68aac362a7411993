"""Daily use: any terminal size, charts worth reading, runs compared, a run list that stays short.

Pure parts (ticks, series, listing, reducer) are called directly; the panel is driven by real
Textual pilots on fixed contract records (fixed_data.py), and archive/delete by the real
local agent on real run directories.
"""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from nsa.contract import HostSample, TrainMetric
from nsa.contract.records import Usage
from nsa.contract.series import MetricsFolder
from nsa_tui.app import chartdata, reducer
from nsa_tui.app.app import NsaApp
from nsa_tui.app.listing import parse_filter, run_rows
from nsa_tui.app.runmetrics import RunMetrics, thin_points
from nsa_tui.app.screens.dialogs import ConfirmScreen, HelpScreen
from nsa_tui.app.screens.main import MainScreen
from nsa_tui.app.state import PanelState
from nsa_tui.app.viewprefs import load_prefs
from nsa_tui.app.widgets.charts import MetricChart, spikes, y_axis
from nsa_tui.app.widgets.gpus import GpuTable
from nsa_tui.app.widgets.keybar import KeyBar
from nsa_tui.app.widgets.runlist import RunList, clip
from nsa_tui.fmt import GIB, fmt_ticks, nice_ticks
from tests.tui import fixed_data as fd
from tests.tui.helpers import wait_for


def app_for(state: PanelState) -> NsaApp:
    return NsaApp(["local"], state=state, live=False, clock=lambda: fd.NOW, configs=[], keymap_file=None)


def text_of(renderable: object, width: int = 200) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


# -- axes -------------------------------------------------------------------------------------
def test_tick_labels_are_round_unique_and_share_one_precision() -> None:
    cases = [(1, 3, 6, True), (1, 2400, 4, True), (1.9, 7.49, 4, False), (22500, 42800, 4, False),
             (0, 5.8e-4, 3, False), (2.0026, 2.0041, 4, False), (0.27, 0.46, 4, False)]
    for lo, hi, n, integer in cases:
        ticks = nice_ticks(lo, hi, n, integer=integer)
        labels = fmt_ticks(ticks)
        assert 1 <= len(ticks) <= n and all(lo <= t <= hi for t in ticks), (lo, hi, ticks)
        assert len(set(labels)) == len(labels), labels  # never "1 1 2 2"
        mantissas = [re.sub(r"[kMGT]$", "", lab.split("e")[0]) for lab in labels if lab != "0"]
        decimals = {len(m.split(".")[1]) if "." in m else 0 for m in mantissas}
        assert len(decimals) <= 1, labels  # one precision: not "96.78" beside "271"
    assert fmt_ticks([20000.0, 40000.0, 60000.0]) == ["20k", "40k", "60k"]
    assert fmt_ticks([0.0, 0.0002, 0.0004]) == ["0", "2e-4", "4e-4"]
    assert fmt_ticks([1.9, 2.0, 2.1]) == ["1.9", "2.0", "2.1"]


def test_y_ticks_fall_on_rows_and_cover_the_data() -> None:
    for lo, hi, rows, most in [(2, 7.49, 10, 5), (22500, 61900, 9, 5), (0, 5.8e-4, 6, 3), (1.9, 9.5, 7, 4),
                               (2.0026, 2.0041, 8, 4), (5, 5, 8, 4)]:
        y0, y1, ticks = y_axis(lo, hi, rows, most)
        assert y0 <= lo and y1 >= hi and 2 <= len(ticks) <= most
        unit = (y1 - y0) / (rows - 1)
        for t in ticks:
            assert y0 - 1e-9 <= t <= y1 + 1e-9
            assert abs((t - y0) / unit - round((t - y0) / unit)) < 1e-6, (lo, hi, t)  # on a row


async def test_a_chart_of_a_few_steps_has_no_repeated_or_stray_labels() -> None:
    """The old x ticks of steps 1..2 read '1 1 2 2'; y labels must sit on the frame's left edge."""
    state = PanelState.for_destinations(["local"], clock=lambda: fd.NOW)
    reducer.run_view(state, "local", fd.view("20260101-000000-short-0001", "short", "running", alive=True,
                                             started_at=fd.NOW - 10))
    run = state.host("local").runs["20260101-000000-short-0001"]
    for step, loss in ((1, 5.51), (2, 5.2)):
        run.metrics.add(TrainMetric(ts=fd.NOW, step=step, loss=loss, tokens_per_s=15123.0 + 4000 * step))
    state.selected = run.key
    app = app_for(state)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)
        for chart_id in ("#chart0", "#chart1"):
            chart = app.screen.query_one(chart_id, MetricChart)
            lines = chart.render().plain.splitlines()
            x_labels = lines[-1].split()
            assert x_labels and len(set(x_labels)) == len(x_labels) and all(x.isdigit() for x in x_labels)
            y_rows = [ln for ln in lines if "┤" in ln]
            assert len(y_rows) >= 2, lines
            edges = {ln.index("┤") for ln in y_rows}
            assert len(edges) == 1  # every y label ends at the frame, none drawn outside it


# -- series: spikes and NaN survive --------------------------------------------------------------
def test_a_one_step_spike_and_a_nan_survive_a_long_run_in_the_chart() -> None:
    folder = MetricsFolder(cap=2048)
    for step in range(1, 200_001):
        loss = 9.0 if step == 123_456 else (float("nan") if step == 150_000 else 2.0 + 1.0 / step)
        folder.add(TrainMetric(ts=0.0, step=step, loss=loss))
    m = RunMetrics()
    m.folder = MetricsFolder(cap=2048, summary=folder.summary(512))  # what the agent sends
    p = m.points("loss")
    assert max(p.hi) == 9.0 and max(p.y) < 3.0  # the mean of its bucket hides it, the max does not
    assert len(p.bad) == 1 and 149_000 < p.bad[0] <= 150_500
    thin = thin_points(p, 60)
    assert len(thin) == 60 and max(thin.hi) == 9.0 and thin.bad
    assert [thin.x[i] for i in spikes(thin)] == [next(x for x, h in zip(thin.x, thin.hi) if h == 9.0)]
    state = PanelState.for_destinations(["local"])
    run = state.host("local").run("r")
    run.metrics = m
    data = chartdata.single(state, run, "loss")
    assert "1 NaN/inf" in data.note


def test_tflops_mfu_and_memory_from_the_runs_own_numbers() -> None:
    state = fd.eight_gpus_state()
    run = state.selected_run()
    assert run is not None
    tflops = chartdata.single(state, run, "tflops")
    last = tflops.lines[0].points.y[-1]
    tps = run.metrics.last_train.tokens_per_s
    assert last == pytest.approx(tps * 2.1e9 / 1e12)
    assert tflops.note == f"MFU {last * 1e12 / (989e12 * 8) * 100:.0f}%"  # 8 ranks on H100s
    a100 = fd.fixed_state()  # two A100s (312 TFLOP/s bf16 each) for a 2-rank run
    assert chartdata.mfu_note(a100, a100.host("local").runs["20261121T180000Z-nsa-125m"], 40.0) == "MFU 6%"
    mem = chartdata.single(state, run, "memory")
    assert mem.title == "memory, rank 0 (GiB)" and 52 < mem.lines[0].points.y[-1] < 55
    cpu = fd.view("20260101-000000-cpu-0001", "cpu", "running", device="cpu", dtype="fp32",
                  train_flops_per_token=1e7)
    reducer.run_view(state, "local", cpu)
    cpu_run = state.host("local").runs["20260101-000000-cpu-0001"]
    cpu_run.metrics.add(TrainMetric(ts=0, step=1, loss=3.0, tokens_per_s=900.0,
                                    mem_allocated_bytes=300 << 20))
    assert chartdata.single(state, cpu_run, "tflops").note == "MFU N/A on cpu"
    assert chartdata.single(state, cpu_run, "memory").title == "memory, rank 0 (RSS, MiB)"


# -- comparison ---------------------------------------------------------------------------------
def test_marked_runs_overlay_by_step_and_by_tokens() -> None:
    state = fd.compare_state()
    runs = state.marked_runs()
    assert [r.name for r in runs] == ["nsa-125m", "nsa-125m-1gpu", "dense-125m"]
    by_step = chartdata.compare(state, runs, "loss")
    assert [line.label for line in by_step.lines] == ["nsa-125m", "nsa-125m-1gpu", "dense-125m"]
    assert by_step.lines[0].points.x[-1] == 1500 and by_step.lines[1].points.x[0] == 1501  # own points
    by_tokens = chartdata.compare(state, runs, "loss", "tokens")
    for a, b in zip(by_step.lines, by_tokens.lines):
        assert b.points.x == [x * 16 * 2048 for x in a.points.x]  # global batch × seq len per step
    assert [c for _, c in chartdata.legend(runs)] == list(chartdata.PALETTE[:3])
    reducer.run_removed(state, "local", "20261121T100000Z-dense-125m")
    assert state.view.compare  # two marked runs left
    reducer.toggle_mark(state, "local", "20261121T180000Z-nsa-125m")
    assert not state.view.compare and not reducer.set_compare(state, True)  # one is no comparison


async def test_keys_mark_compare_switch_axis_and_cycle_charts_that_are_remembered(private_view_prefs) -> None:
    app = app_for(fd.compare_state())
    reducer.set_compare(app.state, False)
    app.state.view.marks.clear()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("c")  # nothing marked: no comparison
        await pilot.pause(0.2)
        assert not app.state.view.compare
        await pilot.press("m")
        await pilot.press("down")  # dense-125m
        await pilot.press("m")
        await pilot.press("c")
        legend = app.screen.query_one("#legend")
        chart = app.screen.query_one("#chart0", MetricChart)
        await wait_for(pilot, lambda: legend.display and chart.compare, 5, "the comparison")
        assert [line.label for line in chart.data.lines] == ["nsa-125m-1gpu", "dense-125m"]
        assert "nsa-125m-1gpu" in text_of(legend.render()) and "dense-125m" in text_of(legend.render())
        await pilot.press("x")
        await wait_for(pilot, lambda: "by tokens" in str(chart.border_title), 5, "by tokens")
        await pilot.press("g")
        await wait_for(pilot, lambda: app.screen.query_one("#chart2").display, 5, "three charts")
        assert app.state.view.charts == ("loss", "grad_norm", "lr")
        await pilot.press("c")
        await wait_for(pilot, lambda: not legend.display, 5, "back to the selected run")
    prefs = load_prefs()
    assert prefs.charts == ["loss", "grad_norm", "lr"] and prefs.x_axis == "tokens"
    again = app_for(fd.fixed_state())
    async with again.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        assert again.state.view.charts == ("loss", "grad_norm", "lr") and again.state.view.x_axis == "tokens"
    (private_view_prefs / "view.json").write_text("{not json")
    assert load_prefs().charts == list(chartdata.PRESETS[0])  # a broken file: the defaults


# -- run list -----------------------------------------------------------------------------------
def test_run_list_folds_lineages_hides_archived_and_filters() -> None:
    state = fd.many_runs_state()
    rows = run_rows(state)
    names = [r.run.name for r in rows]
    assert len(state.all_runs()) == 14 and len(rows) < 14
    head = next(r for r in rows if r.run.name == "nsa-125m-1gpu")
    assert head.folded == 1 and "nsa-125m" not in names  # its parent is in the entry
    assert not any(r.run.view.archived for r in rows)
    reducer.set_filter(state, "crashed")
    assert {r.run.status.value for r in run_rows(state)} == {"crashed"}
    reducer.set_filter(state, "archived window-128")
    assert [r.run.name for r in run_rows(state)] == ["ablation-window-128-seed1"]
    reducer.set_filter(state, "")
    reducer.toggle_expanded(state, head.root)
    unfolded = run_rows(state)
    i = [r.run.name for r in unfolded].index("nsa-125m-1gpu")
    assert unfolded[i].expanded and unfolded[i + 1].run.name == "nsa-125m" and unfolded[i + 1].depth == 1
    f = parse_filter("Running alive nsa archived")
    assert f.statuses == {"running"} and f.alive is True and f.words == ["nsa"] and f.archived
    assert clip("ablation-window-704-seed1-resume", 16) == "ablation…-resume"
    assert clip("short", 16) == "short" and len(clip("x" * 50, 12)) == 12


async def test_run_list_keys_filter_and_fold(private_view_prefs) -> None:
    app = app_for(fd.many_runs_state())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.3)
        table = app.screen.query_one(RunList)
        # 14 runs, 2 archived, 3 lineages of two: 9 entries
        assert len(table.rows_shown) == 9 and "runs 12/14" in str(table.border_title)
        assert table.size.height <= 0.4 * 37 + 1  # bounded: the summary keeps its room
        await pilot.press("s")
        await pilot.press(*"crashed")
        await wait_for(pilot, lambda: len(table.rows_shown) == 3, 5, "the filter")
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(table.rows_shown) == 9, 5, "the filter cleared")
        app.select("local", "20261121T192000Z-nsa-125m-1gpu")
        await pilot.press("z")
        await wait_for(pilot, lambda: len(table.rows_shown) == 10, 5, "the lineage unfolded")
        await pilot.press("z")
        await wait_for(pilot, lambda: len(table.rows_shown) == 9, 5, "the lineage folded")


# -- any terminal size ----------------------------------------------------------------------------
def pane_lines(pane: GpuTable) -> list[str]:
    """The GPU pane's lines, checked to be all on screen: its text is as tall as its widget and
    the pane needs no scrolling to show it."""
    lines_widget = pane.query_one("#gpu-lines")
    lines = text_of(lines_widget.content, lines_widget.size.width).rstrip("\n").split("\n")
    assert lines_widget.size.height == len(lines) and pane.max_scroll_y == 0, (lines, lines_widget.size)
    return lines


async def test_gpu_pane_shows_its_last_line_when_a_line_grows_and_with_8_gpus() -> None:
    """Its height counted items, not lines: when a new sample's host line wrapped (RAM and disk
    known: longer text), the pane kept its height and the last line went out of sight."""
    state = fd.fixed_state(with_alert=False)
    short = HostSample(ts=fd.NOW, cpu_pct=5.0, gpu_message="NVML unavailable: libnvidia-ml.so.1 not found",
                       ram=Usage(), disk=Usage())
    reducer.host_sample(state, "local", short)
    app = app_for(state)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)
        pane = app.screen.query_one(GpuTable)
        assert pane_lines(pane)[-1].startswith("GPUs: N/A — NVML unavailable")
        reducer.host_sample(state, "local", HostSample(
            ts=fd.NOW + 1, cpu_pct=100.0, gpu_message=short.gpu_message,
            ram=Usage(used_bytes=1000 * GIB, total_bytes=1500 * GIB),
            disk=Usage(used_bytes=1900 * GIB * 1024, total_bytes=2000 * GIB * 1024)))
        # a new sample is drawn within the refresh cap (a second)
        await wait_for(pilot, lambda: pane_lines(pane)[0].startswith("CPU 100 %"), 5, "the new sample")
        lines = pane_lines(pane)
        assert lines[-1].startswith("GPUs: N/A — NVML unavailable") and len(lines) == 3, lines
    app = app_for(fd.eight_gpus_state())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)
        lines = pane_lines(app.screen.query_one(GpuTable))
        assert [line.split()[0] for line in lines[-8:]] == [f"GPU{i}" for i in range(8)], lines


async def test_small_terminal_shows_one_view_at_a_time_and_keeps_help_and_quit() -> None:
    app = app_for(fd.fixed_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.5)
        screen = app.screen
        assert isinstance(screen, MainScreen) and screen.compact
        keys = text_of(screen.query_one(KeyBar).render(), 80)
        assert "? help" in keys and "q quit" in keys and "v view" in keys
        assert screen.query_one("#log").size.height >= 8 and screen.query_one("#chart0").region.height == 0
        await pilot.press("2")
        await pilot.pause(0.3)
        for chart in ("#chart0", "#chart1"):
            assert screen.query_one(chart).size.height >= 6  # not one row
        assert screen.query_one("#log").region.height == 0
        await pilot.press("v")
        await pilot.pause(0.3)
        assert screen.page == "host" and screen.query_one(GpuTable).region.height >= 4
        await pilot.resize_terminal(120, 40)
        await pilot.pause(0.5)
        assert not screen.compact
        for pane in ("#runs", "#summary", "#chart0", "#chart1", "#gpus", "#alerts", "#log"):
            assert screen.query_one(pane).region.height >= 4, pane
        await pilot.press("question_mark")
        help_screen = await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen, 5)
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.3)
        box = help_screen.query_one("#help")
        assert box.region.right <= 80 and box.region.bottom <= 24  # inside the terminal: it scrolls
        box.scroll_end(animate=False)
        await pilot.pause(0.3)
        assert box.max_scroll_y > 0 and box.scroll_y == box.max_scroll_y


# -- archive and delete through the real agent ------------------------------------------------------
def finished_run(root: Path, run_id: str, payload: int = 0) -> None:
    d = root / run_id
    d.mkdir(parents=True, mode=0o700)
    record = {"run_id": run_id, "name": run_id.split("-")[2], "status": "finished", "step": 10,
              "started_at": time.time() - 600}
    (d / "run.json").write_text(json.dumps(record))
    if payload:
        (d / "checkpoint.bin").write_bytes(b"\0" * payload)


async def test_archive_and_delete_from_the_panel_never_a_live_run(runs_root: Path) -> None:
    from nsa_tui.agent.runs import RunStore
    from tests.agent.test_runs import fake_run, reap, wait_children

    keep, gone, live = "20260101-000000-keep-0001", "20260101-000100-gone-0002", "20260101-000200-live-0003"
    finished_run(runs_root, keep)
    finished_run(runs_root, gone, payload=3 << 20)
    _, proc = fake_run(RunStore(runs_root), live, env_id=live)
    try:
        wait_children(3, live, proc.pid)
        app = NsaApp(["local"], offer_demo=False)
        async with app.run_test(size=(120, 40)) as pilot:
            host = app.state.host("local")
            await wait_for(pilot, lambda: len(host.runs) == 3, 30, "the runs")
            table = app.screen.query_one(RunList)
            app.select("local", keep)
            await pilot.press("h")
            await wait_for(pilot, lambda: host.runs[keep].view.archived, 15, "archived")
            await wait_for(pilot, lambda: keep not in [r.run.run_id for r in table.rows_shown], 5, "hidden")
            assert (runs_root / keep / "archived.json").is_file()
            app.set_run_filter("archived")
            await wait_for(pilot, lambda: keep in [r.run.run_id for r in table.rows_shown], 5, "shown")
            app.set_run_filter("")
            app.select("local", live)
            await pilot.press("h")
            await pilot.press("delete")
            await pilot.pause(1.0)
            assert isinstance(app.screen, MainScreen) and not host.runs[live].view.archived
            assert (runs_root / live).is_dir()
            app.select("local", gone)
            await pilot.press("delete")
            confirm = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, 15,
                                     "the question")
            asked = text_of(confirm.query_one("#confirm-body").render())
            assert "3 MiB" in asked and gone in asked
            await pilot.press("y")
            await wait_for(pilot, lambda: gone not in host.runs and not (runs_root / gone).exists(), 15,
                           "deleted")
            assert (runs_root / keep).is_dir() and (runs_root / live).is_dir()
    finally:
        reap(proc)


def test_every_key_has_its_action_for_the_palette_and_keymap() -> None:
    """The command palette and the keymap file reach every key by its action and binding id."""
    from nsa_tui.app.keymap import KNOWN_IDS
    from nsa_tui.app.screens.main import KEYS, SCREEN_ACTIONS

    for bid, _key, action, _label, _what in KEYS:
        owner = MainScreen if action in SCREEN_ACTIONS else NsaApp
        assert callable(getattr(owner, f"action_{action}", None)), action
        assert bid in KNOWN_IDS


def test_a_deleted_run_is_not_watched_again_while_still_selected() -> None:
    """The service still focuses the deleted run: a new watch of it re-created it in the list."""
    from nsa_tui.app.services.watches import plan_watches

    state = fd.compare_state()
    host = state.host("local")
    dense = "20261121T100000Z-dense-125m"
    assert plan_watches(host, dense)[dense] == "full"
    reducer.run_removed(state, "local", dense)
    assert dense not in plan_watches(host, dense, marked=[dense]) and dense not in host.runs


async def test_a_resize_keeps_the_log_following_and_a_scrollback_stays_a_scrollback() -> None:
    """120x40 -> 80x24 and other sizes: a following log still follows, at its newest line, and goes
    on following new lines; a log the user scrolled back stays where the user put it."""
    from nsa_tui.app.widgets.logview import LogView

    state = fd.fixed_state(with_alert=True)
    run = state.selected_run()
    run.log.append_many([f"line {i:05d}" for i in range(2000)])
    app = app_for(state)
    async with app.run_test(size=(120, 40)) as pilot:
        log = app.screen.query_one(LogView)
        await wait_for(pilot, lambda: log.follow and log.scroll_y == log.max_scroll_y > 0, 5, "the end")
        for size in [(80, 24), (200, 60), (80, 24), (100, 30), (120, 40)]:
            await pilot.resize_terminal(*size)
            await wait_for(pilot, lambda: log.size.height > 0 and log.scroll_y == log.max_scroll_y, 5,
                           f"the end at {size}")
            assert log.follow, size
        run.log.append_many([f"line {i:05d}" for i in range(2000, 2050)])  # new lines: followed
        await wait_for(pilot, lambda: log.virtual_size.height == len(run.log.lines)
                       and log.scroll_y == log.max_scroll_y, 5, "the new lines")
        log.focus()
        await pilot.press("pageup")  # the user scrolls back
        await wait_for(pilot, lambda: not log.follow, 5, "scrollback")
        kept = log.scroll_y
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: log.size.height == 13, 5, "the small layout")
        await pilot.pause()
        assert not log.follow and log.scroll_y == kept


async def test_the_alerts_of_a_deleted_run_leave_the_panel(runs_root: Path) -> None:
    """A run that crashed at once (the real supervisor and its watchdog record the crash alert),
    deleted with ``nsa-tui delete --yes`` while the panel runs: its alert leaves the panel and ``a``
    has nothing to acknowledge (never "acknowledge failed - no_such_run")."""
    import os
    import subprocess
    import sys

    from nsa.contract import LaunchInfo, write_json_atomic
    from nsa_tui.agent.procs import boot_id

    rid = "20260101-000000-crash-0001"
    d = runs_root / rid
    d.mkdir(parents=True, mode=0o700)
    write_json_atomic(d / "launch.json", LaunchInfo(run_id=rid, name="crash", created=time.time(), nproc=1,
                                                    boot_id=boot_id(), launcher_pid=os.getpid() + 10**6))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with open(d / "train.log", "wb") as log:
        subprocess.run([sys.executable, "-m", "nsa_tui.agent.supervise", str(d), "--", sys.executable, "-m",
                        "no_such_module_here.run"], stdout=log, stderr=subprocess.STDOUT, timeout=120,
                       check=True, env=env)
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=(120, 40)) as pilot:
        def open_alerts() -> list:
            return [s for s in app.state.shown_alerts(history=0) if s.state == "open"]

        await wait_for(pilot, lambda: open_alerts() and open_alerts()[0].alert.run == rid, 30, "the alert")
        recorded = dict(app.state.host("local").recorded)
        deleted = subprocess.run([sys.executable, "-m", "nsa_tui.cli", "delete", "local", rid, "--yes"],
                                 capture_output=True, text=True, timeout=120, env=env)
        assert deleted.returncode == 0 and not d.exists(), deleted.stdout + deleted.stderr
        await wait_for(pilot, lambda: rid not in app.state.host("local").runs, 15, "the run gone")
        await wait_for(pilot, lambda: not open_alerts(), 5, "its alert gone")
        assert not [s for s in app.state.shown_alerts(history=100) if s.alert.run == rid]
        await pilot.press("a")
        said = await wait_for(pilot, lambda: [n.message for n in app._notifications], 5, "an answer")
        assert "no open alerts" in said and not any("no_such_run" in m for m in said), said
        # the alert still listed when the run is already gone (its removal not heard yet): `a` dismisses it
        app.state.host("local").recorded.update(recorded)
        await pilot.press("a")
        said = await wait_for(pilot, lambda: [n.message for n in app._notifications
                                              if "no longer exists" in n.message], 10, "the dismissal")
        assert not open_alerts() and not any("no_such_run" in n.message for n in app._notifications), said
