"""The panel's view choices that outlive a session: which charts, and the x axis.

A small JSON file on the client machine: ``$NSA_TUI_STATE_DIR/view.json``, else
``$XDG_STATE_HOME/nsa-tui/view.json``, else ``~/.local/state/nsa-tui/view.json``. Written
with the contract's atomic writer (nsa.contract.io) whenever a choice changes; a missing or
unreadable file means the defaults, never an error.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from nsa.contract.io import read_json, write_json_atomic
from nsa_tui.app.state import DEFAULT_CHARTS, ViewState


class ViewPrefs(msgspec.Struct, kw_only=True):
    """view.json: unknown fields are ignored (an older panel reads a newer one's file)."""

    charts: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_CHARTS))
    x_axis: str = "step"


def state_dir() -> Path:
    env = os.environ.get("NSA_TUI_STATE_DIR")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "nsa-tui"


def prefs_path() -> Path:
    return state_dir() / "view.json"


def load_prefs(path: Path | None = None) -> ViewPrefs:
    return read_json(path or prefs_path(), ViewPrefs) or ViewPrefs()


def save_prefs(view: ViewState, path: Path | None = None) -> None:
    """Remember ``view``'s lasting choices; a read-only home only loses the memory."""
    path = path or prefs_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_json_atomic(path, ViewPrefs(charts=list(view.charts), x_axis=view.x_axis),
                          durable=False)
    except OSError:
        pass
