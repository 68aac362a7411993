"""Faults from outside, no panel running: what the host's watchdog records and how fast.

    python -m bench.watchdog_faults [--minutes 10] [--burners 2] [--only stop,healthy,kill9,restart]

Each scenario launches real runs (configs/smoke-cpu.yaml, 2 ranks on CPU) through the local
agent and disconnects at once: only the runs' watchdogs look. Settings (a private
settings.yaml): stall floor 10 s (x10 the median step time), no heartbeat 10 s, and a
notification command that records when it ran.

- ``stop``: ``kill -STOP`` of rank 1 mid-training -> time to the first alert in alerts.jsonl and to
  the notification command running. Goal: threshold + <= 2 s.
- ``healthy``: a healthy run for ``--minutes`` with ``--burners`` busy-looping processes loading
  every core -> alerts raised. Goal: 0.
- ``kill9``: ``kill -9`` of rank 1 -> time to a crash alert naming rank 1. Goal: <= 5 s.
- ``restart``: ``on_failure: restart`` and ``kill -9`` of rank 1 -> the new run, resumed from the
  newest checkpoint, reaches the crashed step; its losses are compared, bit for bit, with the
  crashed run's for the redone steps and with an uninterrupted reference run for every step.

Prints a Markdown table and writes the numbers as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from nsa.contract import AlertEvent, Relaunch, TrainMetric, decode_lines, read_json  # noqa: E402
from nsa_tui.agent.procs import run_processes  # noqa: E402
from nsa_tui.health.ledger import ALERTS_FILE  # noqa: E402
from nsa_tui.hosts.client import HostClient  # noqa: E402

SMOKE = str(ROOT / "configs" / "smoke-cpu.yaml")
LONG = ["train.steps=1000000", "train.save_every=100000", "train.eval_every=1000000"]
STALL_FLOOR_S = 10.0
NO_HEARTBEAT_S = 10.0


def steps(d: Path) -> dict[int, float]:
    try:
        lines = (d / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return {}
    return {m.step: m.loss for m in decode_lines(lines, TrainMetric) if isinstance(m, TrainMetric)}


def events(d: Path) -> list[AlertEvent]:
    try:
        return decode_lines((d / ALERTS_FILE).read_text().splitlines(), AlertEvent)
    except FileNotFoundError:
        return []


def wait(cond, timeout: float, what: str, poll: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def rank_pid(run_id: str, rank: int) -> int:
    return wait(lambda: next((p.pid for p in run_processes(run_id, fresh=True) if p.rank == rank), None), 60,
                f"rank {rank} of {run_id}")


def kill_run(run_id: str) -> None:
    for p in run_processes(run_id, fresh=True):
        try:
            os.kill(p.pid, signal.SIGCONT)
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Bench:
    def __init__(self, work: Path) -> None:
        self.root = work / "runs"
        self.notified = work / "notified.log"
        script = ("import sys, time, json; ev = json.loads(sys.stdin.read()); "
                  f"open({str(self.notified)!r}, 'a')"
                  ".write(f\"{time.time()} {ev['alert']['run']} {ev['id']}\\n\")")
        settings = {"alerts": {"stall_floor_s": STALL_FLOOR_S, "no_heartbeat_s": NO_HEARTBEAT_S},
                    "notify": {"command": [sys.executable, "-c", script]}}
        (work / "settings.yaml").write_text(yaml.safe_dump(settings))
        os.environ["NSA_TUI_SETTINGS"] = str(work / "settings.yaml")
        self.launched: list[str] = []

    def launch(self, *overrides: str, on_failure: str | None = None) -> tuple[str, Path]:
        async def go() -> str:
            c = HostClient("local", runs_root=str(self.root))
            await c.start()
            try:
                res = await c.launch(SMOKE, nproc=2, overrides=[*LONG, *overrides], on_failure=on_failure)
            finally:
                await c.close()
            return res.run_id

        rid = asyncio.run(go())
        self.launched.append(rid)
        return rid, self.root / rid

    def notified_at(self, run_id: str, alert_id: str) -> float | None:
        try:
            for line in self.notified.read_text().splitlines():
                ts, rid, aid = line.split()
                if rid == run_id and aid == alert_id:
                    return float(ts)
        except FileNotFoundError:
            pass
        return None

    # -- scenarios ------------------------------------------------------------------------------
    def stop(self) -> dict:
        rid, d = self.launch()
        wait(lambda: len(steps(d)) >= 30, 180, "step 30", poll=0.2)
        pid = rank_pid(rid, 1)
        os.kill(pid, signal.SIGSTOP)
        t = time.time()
        first = wait(lambda: next((e for e in events(d) if e.action == "raised"), None), 120,
                     "the first alert")
        sent = wait(lambda: self.notified_at(rid, first.id), 60, "the notification")
        wait(lambda: len([e for e in events(d) if e.action == "raised"]) >= 2, 60, "both ranks' alerts")
        alerts = {f"{e.alert.kind} rank {e.alert.rank}": round(e.ts - t, 2)
                  for e in events(d) if e.action == "raised"}
        kill_run(rid)
        return {"first_alert": f"{first.alert.kind} rank {first.alert.rank}",
                "alert_after_s": round(first.ts - t, 2),
                "notified_after_s": round(sent - t, 2), "threshold_s": min(STALL_FLOOR_S, NO_HEARTBEAT_S),
                "alerts": alerts}

    def healthy(self, minutes: float, burners: int) -> dict:
        """The load is there from before the run starts: every alert is a false one."""
        burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
        loads = []
        try:
            rid, d = self.launch("train.save_every=500")
            wait(lambda: len(steps(d)) >= 5, 180, "the first steps", poll=0.2)
            t0 = time.time()
            while time.time() - t0 < minutes * 60:
                time.sleep(10)
                loads.append(os.getloadavg()[0])
        finally:
            for p in burn:
                p.kill()
                p.wait()
        raised = [e for e in events(d) if e.action == "raised"]
        n = len(steps(d))
        kill_run(rid)
        return {"minutes": minutes, "burners": burners, "alerts": len(raised),
                "kinds": sorted({e.alert.kind for e in raised}), "steps": n,
                "load_avg_1m_mean": round(sum(loads) / max(1, len(loads)), 2)}

    def kill9(self) -> dict:
        rid, d = self.launch()
        wait(lambda: len(steps(d)) >= 30, 180, "step 30", poll=0.2)
        os.kill(rank_pid(rid, 1), signal.SIGKILL)
        t = time.time()
        crash = wait(lambda: next((e for e in events(d) if e.alert.kind == "crash"), None), 60,
                     "the crash alert")
        sig = wait(lambda: next((e for e in events(d) if e.alert.kind == "crash"
                                 and "SIGKILL" in e.alert.message), None), 60, "torchrun's summary")
        return {"crash_alert_after_s": round(crash.ts - t, 2), "rank": crash.alert.rank,
                "signal_named_after_s": round(sig.ts - t, 2), "message": sig.alert.message[:160]}

    def restart(self) -> dict:
        common = ["train.steps=60", "train.save_every=10"]
        ref_id, ref = self.launch(*common)
        rid, d = self.launch(*common, "on_failure.backoff_s=1", on_failure="restart")
        wait(lambda: len(steps(d)) >= 25, 180, "step 25", poll=0.05)
        os.kill(rank_pid(rid, 1), signal.SIGKILL)
        rel = wait(lambda: read_json(d / "relaunch.json", Relaunch), 120, "the restart", poll=0.2)
        child = self.root / rel.child_run
        crashed = max(steps(d))
        wait(lambda: len(steps(child)) and max(steps(child)) >= 60, 300, "the restarted run's end", poll=0.5)
        wait(lambda: len(steps(ref)) >= 60, 300, "the reference run's end", poll=0.5)
        ck = int(Path(rel.resume_from).name.split("-")[1])
        parent, mine, reference = steps(d), steps(child), steps(ref)
        redone = [s for s in range(ck + 1, crashed + 1) if s in mine and s in parent]
        joined = {**{s: v for s, v in parent.items() if s <= ck}, **mine}
        return {"checkpoint": ck, "crashed_at": crashed, "redone_steps": len(redone),
                "redone_bit_identical": all(mine[s] == parent[s] for s in redone),
                "all_60_steps_equal_reference": all(joined.get(s) == reference.get(s) for s in range(1, 61)),
                "child": rel.child_run, "reference": ref_id}


def machine() -> dict:
    import torch

    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     cwd=ROOT).stdout.strip()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.watchdog_faults", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="length of the healthy run (default 10)")
    p.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="CPU-loading processes")
    p.add_argument("--only", default="stop,kill9,restart,healthy")
    p.add_argument("--out", default=None, help="write the numbers as JSON here")
    p.add_argument("--keep", default=None, help="keep the runs in this directory")
    args = p.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="nsa-watchdog-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(work)
    out: dict = {"machine": machine()}
    try:
        for name in args.only.split(","):
            t = time.time()
            print(f"... {name}", file=sys.stderr, flush=True)
            if name == "healthy":
                out[name] = bench.healthy(args.minutes, args.burners)
            else:
                out[name] = getattr(bench, name)()
            out[name]["took_s"] = round(time.time() - t, 1)
            print(f"    {json.dumps(out[name])}", file=sys.stderr, flush=True)
    finally:
        for rid in bench.launched:
            kill_run(rid)
            for f in (bench.root / rid / "relaunch.json",):
                rel = read_json(f, Relaunch)
                if rel is not None:
                    kill_run(rel.child_run)
    m = out["machine"]
    print(f"\n{m['cpus']} CPUs, Python {m['python']}, torch {m['torch']}, commit {m['commit']}, "
          f"load at start {m['load_avg_at_start']}")
    print("| measurement | result | goal |\n|---|---|---|")
    if "stop" in out:
        s = out["stop"]
        print(f"| kill -STOP rank 1 -> first alert in alerts.jsonl ({s['first_alert']}) | "
              f"{s['alert_after_s']} s (threshold {s['threshold_s']:.0f} s) | threshold + <= 2 s |")
        print(f"| kill -STOP rank 1 -> notification command ran | {s['notified_after_s']} s | "
              "threshold + <= 2 s |")
    if "kill9" in out:
        k = out["kill9"]
        print(f"| kill -9 rank 1 -> crash alert naming rank {k['rank']} | {k['crash_alert_after_s']} s "
              f"(signal named at {k['signal_named_after_s']} s) | <= 5 s |")
    if "restart" in out:
        r = out["restart"]
        print(f"| restart after kill -9 at step {r['crashed_at']} (checkpoint {r['checkpoint']}): "
              f"redone steps bit-identical | {r['redone_bit_identical']} ({r['redone_steps']} steps); "
              f"all 60 steps = uninterrupted run: {r['all_60_steps_equal_reference']} | bit-identical |")
    if "healthy" in out:
        h = out["healthy"]
        print(f"| healthy run, {h['minutes']:g} min, {h['burners']} CPU burners "
              f"(load {h['load_avg_1m_mean']}): alerts | {h['alerts']} {h['kinds'] or ''} "
              f"({h['steps']} steps) | 0 |")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
