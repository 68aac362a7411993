"""The panel's evaluation key against the real local agent and real records: two tiny runs
(NSA and dense) that evaluate themselves while training (eval.every_steps), then e on one
run, and e with both marked: their passkey grids and loss by position side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nsa_tui.app.app import NsaApp
from nsa_tui.app.screens.evals import EvalScreen
from nsa_tui.app.screens.main import MainScreen
from tests.tui.helpers import plain, wait_for

NSA = {"kind": "nsa", "compress_block": 16, "compress_stride": 8, "select_block": 16, "num_selected": 3,
       "num_initial": 1, "num_local": 1, "window": 32}
EVAL = {"every_steps": 3, "lengths": [32, 64], "depths": [0.0, 1.0], "trials": 2, "loss_sequences": 1,
        "buckets": 4, "seed": 9}


def nsa_tui(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def trained(make_config, name: str, attention: dict) -> str:
    config = make_config(name, model__attention=attention, train__steps=3, train__save_every=3,
                         train__eval_every=1000, **{f"eval__{k}": v for k, v in EVAL.items()})
    r = nsa_tui("launch", "local", "--config", config, "--nproc", "1", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["run_id"]


def shown(app: NsaApp) -> Callable[[], EvalScreen | None]:
    """The evaluation screen once it has drawn the records."""
    return lambda: app.screen if isinstance(app.screen, EvalScreen) and app.screen.runs is not None else None


@pytest.mark.slow
async def test_e_shows_the_grid_and_the_marked_runs_side_by_side(runs_root: Path, make_config) -> None:
    sparse = trained(make_config, "sparse", NSA)
    dense = trained(make_config, "dense", {**NSA, "kind": "dense"})
    for rid in (sparse, dense):
        logs = nsa_tui("logs", "local", rid, "-f")  # returns when the run has ended
        assert logs.returncode == 0, logs.stderr
    recs = {rid: [json.loads(x) for x in (runs_root / rid / "eval" / "passkey.jsonl").read_text().split()]
            for rid in (sparse, dense)}
    assert [len(v) for v in recs.values()] == [1, 1], recs
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        for rid in (sparse, dense):
            await wait_for(pilot, lambda rid=rid: app.state.host("local").runs.get(rid), 15, "the run listed")
        app.select("local", sparse)
        await pilot.press("e")
        screen = await wait_for(pilot, shown(app), 30, "the evaluation screen")
        assert [r.label for r in screen.runs] == ["sparse"]
        text = plain(screen.query_one("#evals-body"))
        rec = recs[sparse][0]
        assert "sparse  nsa · step 3 (in training) · 2 trial(s), seed 9" in text
        assert "loss by position" in text
        rows = [line.replace("│", " ").split() for line in text.splitlines()]
        for n, row in zip(rec["lengths"], rec["accuracy"]):  # each row of the grid, as recorded
            assert [str(n), *(f"{a:.2f}" for a in row)] in rows, text
        assert f"{rec['loss_buckets'][0]['loss']:.3f}" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 5, "the screen to close")

        for rid in (sparse, dense):
            app.select("local", rid)
            await pilot.press("m")
        await pilot.press("e")
        screen = await wait_for(pilot, shown(app), 30, "the comparison")
        assert [r.label for r in screen.runs] == ["sparse", "dense"]
        text = plain(screen.query_one("#evals-body"))
        assert "sparse  nsa" in text and "dense  dense" in text
        head = next(line for line in text.splitlines() if "positions" in line)
        assert "sparse (val)" in head and "dense (val)" in head  # one loss chart, a column per run
        for rid in (sparse, dense):
            assert f"{recs[rid][0]['loss_buckets'][-1]['loss']:.3f}" in text
        await pilot.press("escape")
