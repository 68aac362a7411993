"""A newcomer's first run: the panel on an empty runs root, `y` to the demo offer, until step 100.

    python -m bench.demo_first_run [--steps 100] [--timeout 900] [--size 120x40]

Starts the real panel (NsaApp, headless) with the real local agent on a fresh runs root and
a fresh launch history, waits for the demo offer, answers `y`, and measures from that key
to the first heartbeat, the first step and step ``--steps`` as the panel sees them (its
state, fed by the agent's events). Then it stops the run (nothing is left running) and
prints one JSON line with the times, the machine (CPUs usable, load average before, during
and after), the run's threads per rank (run.json ``cpu_threads``, absent on older runs),
torch's version and the median step time.

Goal: step 100 within 180 s of pressing `y` on 2 cores. Run from a checkout: the
demo is its configs/tiny-cpu.yaml.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
GOAL_S = 180.0


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def measure(steps: int, timeout: float, size: tuple[int, int]) -> dict:
    from nsa.contract import TrainMetric
    from nsa_tui.app.app import NsaApp
    from nsa_tui.app.screens.dialogs import ConfirmScreen

    app = NsaApp(["local"])
    out: dict = {"steps": steps, "load_before": load()}
    loads: list[list[float]] = []
    async with app.run_test(size=size) as pilot:
        t_start = time.monotonic()
        while not isinstance(app.screen, ConfirmScreen):
            if time.monotonic() - t_start > 120:
                raise RuntimeError("no demo offer within 120 s")
            await pilot.pause(0.1)
        out["offer_after_start_s"] = round(time.monotonic() - t_start, 2)
        await pilot.press("y")
        t0 = time.monotonic()
        run = None
        first_beat = first_step = None
        next_load = t0
        while True:
            now = time.monotonic()
            if now - t0 > timeout:
                out["timed_out"] = True
                break
            if now >= next_load:
                loads.append(load())
                next_load = now + 10
            run = app.state.selected_run()
            if run is not None:
                if first_beat is None and run.beats:
                    first_beat = now - t0
                if first_step is None and run.metrics.last_train is not None:
                    first_step = now - t0
                if run.step >= steps:
                    out["to_step_s"] = round(now - t0, 1)
                    break
                if run.status.is_terminal():
                    out["ended_early"] = run.status.value
                    break
            await pilot.pause(0.1)
        out["reached_step"] = run.step if run is not None else 0
        out["waited_s"] = round(time.monotonic() - t0, 1)
        out["first_heartbeat_s"] = round(first_beat, 1) if first_beat is not None else None
        out["first_step_s"] = round(first_step, 1) if first_step is not None else None
        if run is not None:
            times = [m.step_time_s for m in run.metrics.recent
                     if isinstance(m, TrainMetric) and m.step_time_s is not None]
            out["median_step_s"] = round(statistics.median(times), 3) if times else None
            out["run_id"] = run.run_id
            info = run.view.info if run.view is not None else None
            raw = Path(run.view.dir) / "run.json" if run.view is not None else None
            if raw is not None and raw.exists():
                rec = json.loads(raw.read_text())
                out["cpu_threads"] = rec.get("cpu_threads")  # absent on older runs
                out["config"] = rec.get("config_path")
            out["param_count"] = info.param_count if info else None
            svc = app.services.get("local")
            if svc is not None and run.alive:
                await svc.actions.kill(run.run_id)
        await pilot.press("q")
    out["load_during"] = loads
    out["load_after"] = load()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.demo_first_run", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.add_argument("--size", default="120x40", help="terminal size of the headless panel")
    args = p.parse_args(argv)
    w, h = (int(x) for x in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="nsa-demo-bench-") as tmp:
        os.environ["NSA_RUNS_ROOT"] = str(Path(tmp) / "runs")  # an empty runs root: the demo is offered
        os.environ["NSA_TUI_STATE_DIR"] = str(Path(tmp) / "state")  # no launch history, no view choices
        os.environ["NSA_TUI_KEYMAP"] = str(Path(tmp) / "no-keymap.yaml")
        res = asyncio.run(measure(args.steps, args.timeout, (w, h)))
    import nsa_tui

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    res.update(machine=platform.node(), cpus=os.cpu_count(), usable_cpus=len(os.sched_getaffinity(0)),
               python=platform.python_version(), torch=torch_version, code=str(Path(nsa_tui.__file__).parent),
               goal_s=GOAL_S, met=res.get("to_step_s") is not None and res["to_step_s"] <= GOAL_S)
    print(json.dumps(res))
    return 0 if res["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
