"""What the panel remembers on this machine between sessions: each host's recent launches.

Why: the launch dialog used to preselect the alphabetically first config (a 125M GPU job on
FineWeb from the Hub), also on a CPU box without network. It now preselects the config last
launched on that host (else the demo), and offers that host's recent launches to run again
with one key. Kept on the client (a host may be reached from several machines, each with its
own files to upload) in ``launches.json`` of the panel's state directory
(``$NSA_TUI_STATE_DIR``, else ``$XDG_STATE_HOME/nsa-tui``, else ``~/.local/state/nsa-tui``),
private to its user. Separate from the settings file (alerts, thresholds) on purpose: this is
history, not configuration.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from nsa.contract.io import read_json, write_json_atomic

KEEP = 10  # launches remembered per host


class RecentLaunch(msgspec.Struct, kw_only=True):
    """One launch from the panel, as the dialog had it (enough to do it again)."""

    config: str
    nproc: int | None = None
    overrides: list[str] = []
    name: str | None = None
    ts: float = 0.0

    def same_as(self, other: RecentLaunch) -> bool:
        return (self.config, self.nproc, self.overrides, self.name) == (
            other.config, other.nproc, other.overrides, other.name)

    def label(self) -> str:
        """One line for a list: config, processes, overrides, name."""
        parts = [self.config]
        if self.nproc:
            parts.append(f"×{self.nproc}")
        if self.overrides:
            parts.append("--set " + " ".join(self.overrides))
        if self.name:
            parts.append(f"as {self.name}")
        return " ".join(parts)


class LaunchHistory(msgspec.Struct, kw_only=True):
    hosts: dict[str, list[RecentLaunch]] = {}


def state_path() -> Path:
    """launches.json in the panel's state directory (beside view.json: nsa_tui/app/viewprefs.py)."""
    env = os.environ.get("NSA_TUI_STATE_DIR")
    base = Path(env).expanduser() if env else Path(
        os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "nsa-tui"
    return base / "launches.json"


def recent(dest: str, path: Path | None = None) -> list[RecentLaunch]:
    """The host's launches, newest first (an unreadable file is an empty history)."""
    hist = read_json(path or state_path(), LaunchHistory)
    return list(hist.hosts.get(dest, [])) if hist else []


def last_config(dest: str, path: Path | None = None) -> str | None:
    runs = recent(dest, path)
    return runs[0].config if runs else None


def remember(dest: str, launch: RecentLaunch, path: Path | None = None) -> None:
    """Put ``launch`` first in the host's history (an identical earlier one moves up)."""
    path = path or state_path()
    hist = read_json(path, LaunchHistory) or LaunchHistory()
    launch.ts = launch.ts or time.time()
    kept = [r for r in hist.hosts.get(dest, []) if not r.same_as(launch)]
    hist.hosts[dest] = [launch, *kept][:KEEP]
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_json_atomic(path, hist, durable=False)
