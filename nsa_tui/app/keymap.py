"""User key remapping: binding id -> key(s), e.g. `kill: x` or `search: ctrl+f`.

Read from the ``keys:`` section of settings.yaml (nsa_tui/user/settings.py); a keymap.yaml of
earlier versions ($NSA_TUI_KEYMAP, else ~/.config/nsa-tui/keymap.yaml) is still read when
settings.yaml has no ``keys``, with a note to move it. Binding ids are the ones `?` lists
(launch, kill, fallback, resume, dump, follow, search, ack, help, quit).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from nsa_tui.app.screens.main import KEYS

KNOWN_IDS = {bid for bid, *_ in KEYS}


def keymap_path() -> Path:
    env = os.environ.get("NSA_TUI_KEYMAP")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "nsa-tui" / "keymap.yaml"


def load_keymap(path: Path | None = None, settings: Any = None) -> tuple[dict[str, str], list[str]]:
    """Return (keymap, problems). A missing file is no problem; a bad one is reported, not fatal.
    ``settings``: its ``keys`` win over keymap.yaml (``path`` given: that file, for tests)."""
    if path is None and settings is not None and settings.keys:
        return check_keys(settings.keys, f"{settings.path}: keys")
    explicit = path is not None or bool(os.environ.get("NSA_TUI_KEYMAP"))
    path = path or keymap_path()
    if not path.is_file():
        return {}, []
    keymap, problems = _read_keymap(path)
    if not explicit and keymap:
        from nsa_tui.user.settings import settings_path

        problems.append(f"{path}: read for compatibility; move its lines under `keys:` in {settings_path()}")
    return keymap, problems


def _read_keymap(path: Path) -> tuple[dict[str, str], list[str]]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        return {}, [f"{path}: {exc}"]
    if not isinstance(data, dict):
        return {}, [f"{path}: expected a mapping of binding id to key, got {type(data).__name__}"]
    return check_keys(data, str(path))


def check_keys(data: dict[Any, Any], path: str) -> tuple[dict[str, str], list[str]]:
    """Known binding ids with a key each; the rest reported."""
    keymap: dict[str, str] = {}
    problems: list[str] = []
    for bid, keys in data.items():
        if bid not in KNOWN_IDS:
            problems.append(f"{path}: unknown binding id {bid!r} (known: {', '.join(sorted(KNOWN_IDS))})")
            continue
        if isinstance(keys, list):
            keys = ",".join(map(str, keys))
        if not isinstance(keys, str) or not keys.strip():
            problems.append(f"{path}: {bid}: expected a key like 'x' or 'ctrl+x'")
            continue
        keymap[str(bid)] = keys.strip()
    return keymap, problems
