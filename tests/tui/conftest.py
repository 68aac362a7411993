"""Fixtures for the panel's pilot tests: a private runs root, tiny real configs, cleanup."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `tests` is not installed: make tests.* importable under any runner
    sys.path.insert(0, str(REPO))

from tests.sshd import sshd, sshd_nodes  # noqa: E402,F401  (real OpenSSH server fixtures)

SMOKE = REPO / "configs" / "smoke-cpu.yaml"


@pytest.fixture(autouse=True)
def private_view_prefs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The panel remembers view choices (charts, x axis) in NSA_TUI_STATE_DIR: a fresh one per
    test, never the user's."""
    state = tmp_path / "nsa-tui-state"
    monkeypatch.setenv("NSA_TUI_STATE_DIR", str(state))
    return state


@pytest.fixture
def private_user_state(private_view_prefs: Path) -> Path:
    """The panel's launch history (nsa_tui/user/recent.py): in the same private state directory."""
    return private_view_prefs / "launches.json"


@pytest.fixture
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """NSA_RUNS_ROOT for the local agent; every run still alive afterwards is killed."""
    root = tmp_path / "runs"
    monkeypatch.setenv("NSA_RUNS_ROOT", str(root))
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "no-keymap.yaml"))
    # the user's own settings.yaml never reaches a test (the panel, the agent and the watchdogs
    # it starts read this path; a test writes it to change thresholds or notifications)
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(tmp_path / "settings.yaml"))
    yield root
    kill_all(root)
    kill_all(tmp_path / "ssh-runs")


def kill_all(root: Path) -> None:
    """SIGKILL the process group of every run under `root` that is still alive."""
    from nsa_tui.agent.runs import RunStore, run_processes

    for run_id in RunStore(root).ids():
        for p in run_processes(run_id):
            try:
                os.killpg(p.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., str]:
    """Write smoke-cpu.yaml with `section.key` changes; returns the file's path."""

    def make(name: str = "smoke", **changes: Any) -> str:
        cfg = yaml.safe_load(SMOKE.read_text())
        cfg["name"] = name
        for dotted, value in changes.items():
            section, key = dotted.split("__", 1)
            cfg.setdefault(section, {})[key] = value
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return str(path)

    return make


@pytest.fixture
def settings(tmp_path: Path, runs_root: Path) -> Callable[[dict[str, Any]], Path]:
    """Write the settings.yaml that the panel, its agent and the runs' watchdogs read."""

    def write(data: dict[str, Any]) -> Path:
        path = tmp_path / "settings.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write
