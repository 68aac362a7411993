"""The panel's sample key against the real local agent and a real trained run: press p, type a
prompt, see the answer stream in (piece by piece: the screen records each piece it shows)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_tui.app.app import NsaApp
from nsa_tui.app.screens.main import MainScreen
from nsa_tui.app.screens.sample import SampleScreen, shown
from tests.tui.helpers import wait_for


def nsa_tui(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
async def test_p_prompts_the_selected_run_and_streams_the_answer(runs_root: Path, make_config) -> None:
    config = make_config("talky", model__attention={"kind": "nsa", "compress_block": 16, "compress_stride": 8,
                                                    "select_block": 16, "num_selected": 3, "num_initial": 1,
                                                    "num_local": 1, "window": 32},
                         train__steps=3, train__save_every=3, train__eval_every=1000)
    r = nsa_tui("launch", "local", "--config", config, "--nproc", "1", "--json")
    assert r.returncode == 0, r.stderr
    rid = json.loads(r.stdout)["run_id"]
    assert nsa_tui("logs", "local", rid, "-f").returncode == 0  # returns when the run has ended
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        await wait_for(pilot, lambda: app.state.host("local").runs.get(rid), 15, "the run in the list")
        app.select("local", rid)
        await pilot.press("p")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, SampleScreen) and app.screen, 5,
                                "the prompt")
        await pilot.press("h", "i", "enter")
        await wait_for(pilot, lambda: screen.done, 90, "a complete answer")
        done = screen.result
        # streamed: each generated piece went on the screen as it came, the answer growing by
        # it (whether the host sent them apart or together depends on the load, not on us)
        pieces = screen.shown
        assert pieces and pieces[-1] == done.text
        assert all(b.startswith(a) and len(b) > len(a) for a, b in zip(pieces, pieces[1:]))
        # (two tokens can make one character, so a two-token answer may be one piece)
        assert len(pieces) >= 2 or len(done.tokens) <= 2, "the answer came as one piece, not streamed"
        assert done.checkpoint == "step-3" and done.prompt == "hi" and screen.answer == done.text
        assert screen.query_one("#sample-text").text == shown("hi" + done.text)
        assert str(done.seed) in str(screen.query_one("#sample-status").render())
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 5, "the screen to close")


def test_control_characters_are_shown_not_obeyed() -> None:
    """A byte-level model emits any byte: none of them may break or hide the screen's lines."""
    text = "".join(chr(c) for c in range(0x100)) + "\u2028\u2029"
    assert shown(text).splitlines() == shown(text).split("\n") and shown(text).count("\n") == 1
    assert shown("a\tb\nc") == "a\tb\nc" and shown("\r\x00") == "\u240d\u2400"
