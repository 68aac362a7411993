"""Make the panel screenshots in docs/ from fixed data (tests/tui/fixed_data.py): a comparison
of runs and the GPU pane with 8 (fake) GPUs, at 80x24 and 120x40.

    python scripts/docs_screenshots.py          # needs rsvg-convert (apt install librsvg2-bin)

Textual's SVG places each run of text with ``textLength``; rsvg-convert ignores it (and a list
of x positions) and takes glyph widths from whatever font it finds, so braille chart lines
drift out of their cells and no-break spaces vanish. Every character becomes a text element
of its own at its cell before converting.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TEXT = re.compile(r'<text ([^>]*?)x="([\d.]+)"([^>]*?)textLength="([\d.]+)"([^>]*)>([^<]*)</text>')

# (file name, fixed_data state, terminal size, keys pressed first)
SHOTS = [
    ("compare-120x40", "compare_state", (120, 40), []),
    ("compare-80x24", "compare_state", (80, 24), ["2"]),
    ("gpus8-120x40", "eight_gpus_state", (120, 40), []),
    ("gpus8-80x24", "eight_gpus_state", (80, 24), ["3"]),
]


def cell_aligned(svg: str) -> str:
    """Each character of each text run at its own cell (spaces dropped: the background is
    drawn separately)."""

    def one(m: re.Match[str]) -> str:
        before, x, middle, length, after, content = m.groups()
        chars = html.unescape(content).replace("\xa0", " ")
        if not chars:
            return m.group(0)
        cell = float(length) / len(chars)
        return "".join(f'<text {before}x="{float(x) + i * cell:.1f}"{middle}{after}>'
                       f"{html.escape(c, quote=False)}</text>" for i, c in enumerate(chars) if c != " ")

    return TEXT.sub(one, svg)


async def shoot(state_name: str, size: tuple[int, int], keys: list[str]) -> str:
    from nsa_tui.app.app import NsaApp
    from tests.tui import fixed_data

    state = getattr(fixed_data, state_name)()
    app = NsaApp(["local"], state=state, live=False, clock=lambda: fixed_data.NOW, configs=[],
                 keymap_file=None)
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.5)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.3)
        await pilot.pause(0.5)
        return app.export_screenshot(title="nsa-tui")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NSA_TUI_STATE_DIR"] = tmp  # the default charts, whatever this user chose
        os.environ["NSA_TUI_KEYMAP"] = str(Path(tmp) / "none.yaml")
        for name, state, size, keys in SHOTS:
            svg = Path(tmp) / f"{name}.svg"
            svg.write_text(cell_aligned(asyncio.run(shoot(state, size, keys))))
            out = REPO / "docs" / f"{name}.png"
            subprocess.run(["rsvg-convert", "-b", "white", str(svg), "-o", str(out)], check=True)
            print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
