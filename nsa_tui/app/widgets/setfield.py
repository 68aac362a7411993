"""The launch dialog's ``--set`` field: config overrides with completion of the config's keys.

Keys come from nsa/config.py (``known_keys``), so the field completes exactly what the host's
validation accepts; a key it does not know is still sent and the host names it (``--set x=1
(over FILE): unknown key``). Right arrow (or end) accepts the grey completion.
"""

from __future__ import annotations

import shlex
from functools import lru_cache

from textual.suggester import Suggester


@lru_cache(maxsize=1)
def config_keys() -> dict[str, str]:
    from nsa.config import known_keys

    return known_keys()


def split_overrides(text: str) -> list[str]:
    """``train.steps=100 data.paths="[a b]"`` -> items; raises ValueError on bad quoting."""
    return shlex.split(text)


def _last_word(value: str) -> str:
    return value.rsplit(" ", 1)[-1] if value else ""


class OverrideSuggester(Suggester):
    """Completes the key of the item being typed (the last word, before its ``=``)."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        word = _last_word(value)
        if not word or "=" in word:
            return None
        matches = [k for k in config_keys() if k.startswith(word)]
        if not matches:
            return None
        common = matches[0]
        for k in matches[1:]:  # complete as far as every match agrees
            while not k.startswith(common):
                common = common[:-1]
        if len(matches) == 1:
            common += "="
        return value + common[len(word):] if len(common) > len(word) else None


def key_hint(value: str) -> str:
    """What the key being typed is: its type and default, or the keys it could become."""
    word = _last_word(value)
    key = word.split("=", 1)[0]
    if not key:
        return "section.key=value items separated by spaces; → accepts a completed key"
    keys = config_keys()
    if key in keys:
        return f"{key}: {keys[key]}"
    matches = [k for k in keys if k.startswith(key)]
    if not matches:
        return f"{key}: not a config key"
    shown = ", ".join(matches[:6]) + (f", … ({len(matches)} keys)" if len(matches) > 6 else "")
    return shown
