"""Snapshots of the main screen and the launch dialog with deterministic data (fixed clock).

Update after an intended change of the drawing: pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest

from nsa_tui.app.app import NsaApp
from tests.tui.fixed_data import (
    NOW,
    compare_state,
    eight_gpus_state,
    fixed_state,
    many_runs_state,
    two_hosts_state,
)

CONFIGS = ["configs/nsa-125m.yaml", "configs/smoke-cpu.yaml", "configs/tiny-cpu.yaml"]


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Alert times are drawn in local time: the same picture in every time zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def fixed_app(state=None, **kw) -> NsaApp:
    """Fixed data; the host's recorded alerts shown at their local time: TZ is fixed to UTC."""
    return NsaApp(["local"], state=state or fixed_state(**kw), live=False, clock=lambda: NOW, configs=CONFIGS,
                  keymap_file=None)


async def settle(pilot) -> None:
    await pilot.pause(0.3)


def test_main_screen_100x30(snap_compare, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(tmp_path / "none-settings.yaml"))
    assert snap_compare(fixed_app(), terminal_size=(100, 30), run_before=settle)


def test_main_screen_160x45(snap_compare, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(tmp_path / "none-settings.yaml"))
    assert snap_compare(fixed_app(), terminal_size=(160, 45), run_before=settle)


def test_launch_dialog(snap_compare, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(tmp_path / "none-settings.yaml"))
    assert snap_compare(fixed_app(with_alert=False), press=["l"], terminal_size=(100, 30), run_before=settle)


def test_launch_dialog_80x24(snap_compare, monkeypatch, tmp_path) -> None:
    """The form scrolls; the buttons stay on the screen."""
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    assert snap_compare(fixed_app(with_alert=False), press=["l"], terminal_size=(80, 24), run_before=settle)


def test_two_hosts_and_a_crashed_run(snap_compare, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(tmp_path / "none-settings.yaml"))
    app = NsaApp(["local", "gpu2"], state=two_hosts_state(), live=False, clock=lambda: NOW, configs=CONFIGS)
    assert snap_compare(app, terminal_size=(120, 34), run_before=settle)


# every size from a tmux split to a large screen: below 100x30 one view at a time (keys 1 2 3)
@pytest.mark.parametrize("size,press", [((80, 24), []), ((80, 24), ["2"]), ((80, 24), ["3"]), ((120, 40), []),
                                        ((200, 60), [])],
                         ids=["80x24-runs", "80x24-charts", "80x24-host", "120x40", "200x60"])
def test_main_screen_sizes(snap_compare, monkeypatch, tmp_path, size, press) -> None:
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    assert snap_compare(fixed_app(), terminal_size=size, press=press, run_before=settle)


@pytest.mark.parametrize("size", [(120, 40), (100, 30), (80, 24)], ids=["120x40", "100x30", "80x24"])
def test_eight_gpus(snap_compare, monkeypatch, tmp_path, size) -> None:
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    press = ["3"] if size == (80, 24) else []
    assert snap_compare(fixed_app(eight_gpus_state()), terminal_size=size, press=press, run_before=settle)


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
def test_comparison(snap_compare, monkeypatch, tmp_path, size) -> None:
    """NSA, its 1-GPU fallback and a dense run on the same axes; the dense run's loss spike and
    NaN gradient norm marked."""
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    press = ["2"] if size == (80, 24) else []
    assert snap_compare(fixed_app(compare_state()), terminal_size=size, press=press, run_before=settle)


def test_fourteen_runs_stay_a_short_list(snap_compare, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    assert snap_compare(fixed_app(many_runs_state()), terminal_size=(100, 30), run_before=settle)


def test_help_at_80x24(snap_compare, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    assert snap_compare(fixed_app(), terminal_size=(80, 24), press=["question_mark"], run_before=settle)


async def test_the_summarys_live_rows_grow_and_its_facts_are_not_drawn_again(monkeypatch, tmp_path) -> None:
    """The summary draws its parts on their own; a part that grows (ranks joining, a line that
    wraps) is laid out again, so nothing is cut, and the facts are not drawn for it."""
    from bench.panel_cost import count_renders
    from nsa.contract import Beat, Phase

    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(tmp_path / "none-settings.yaml"))
    app = fixed_app()
    with count_renders() as counts:
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(pilot)
            live = app.screen.query_one("#summary-live")
            assert live.size.height == 3  # gates, last, ranks: r0
            counts.renders.clear()
            run = app.state.selected_run()
            for rank in range(1, 4):
                run.beats[rank] = Beat(ts=NOW - 1, run_id=run.run_id, rank=rank, phase=Phase.TRAIN,
                                       phase_since=NOW - 1500, step=2400, source="step")
            run.version += 1
            for _ in range(50):
                await pilot.pause(0.1)
                if live.size.height == 6:
                    break
            assert live.size.height == 6, live.size  # r0 .. r3, each on its line
            assert "summary-facts" not in counts.renders, dict(counts.renders)
