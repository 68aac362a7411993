"""Snapshots of the main screen and the launch dialog with deterministic data (fixed clock).

Update after an intended change of the drawing: pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest

from nsa_tui.app.app import NsaApp
from tests.tui.fixed_data import NOW, fixed_state, two_hosts_state

CONFIGS = ["configs/nsa-125m.yaml", "configs/smoke-cpu.yaml", "configs/tiny-cpu.yaml"]


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Alert times are drawn in local time: the same picture in every time zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def fixed_app(**kw) -> NsaApp:
    """Fixed data; the host's recorded alerts shown at their local time: TZ is fixed to UTC."""
    return NsaApp(["local"], state=fixed_state(**kw), live=False, clock=lambda: NOW, configs=CONFIGS,
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
