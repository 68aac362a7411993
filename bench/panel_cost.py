"""What the panel itself costs while it watches runs: CPU, memory, frames, first paint.

    python -m bench.panel_cost [--seconds 30] [--warmup 45] [--only idle 1x2@1 1x2@10 3x8@10 day cold]

The real app (``NsaApp``, as ``nsa-tui`` starts it) runs in a pseudo-terminal of 120×40 with
its real local agent; synthetic runs are written at a chosen rate by writer processes that
write what the trainer writes (launch.json, run.json, a heartbeat per step and rank, a
metrics line and a log line per step), with the contract's records and writers, and that
carry ``NSA_RUN_ID`` like a run's processes do, so the agent sees them alive. No training.

Scenarios: ``idle`` (no run), ``1x2@1`` and ``1x2@10`` (1 run × 2 ranks at 1 and 10
steps/s), ``3x8@10`` (3 runs × 8 ranks at 10 steps/s, the first one selected), ``day`` (a
24 h run at 1 step/s, 86,400 steps written as fast as the panel takes them: the panel's RSS
after 1 h, 6 h and 24 h of steps) and ``cold`` (a finished 1M-step run, built by
bench.scale.make_run, opened by a fresh panel: seconds to its first full paint).

Reported per scenario, over ``--seconds`` after ``--warmup``: CPU in % of one core (from
/proc: user + system time over wall time) and RSS of the panel and of its agent, frames
drawn per second (Textual's screen updates) and widget renders per second. The machine is
shared, so an idle Python process (an asyncio loop that wakes 10×/s, the least any panel
costs) is measured beside them in the same window, and the panel's and agent's numbers are
also given as ratios against it; the load average is printed with each row.

Targets: panel ≤ 3 % of a core for 1x2@10 and ≤ 5 % for 3x8@10, agent ≤ 2 %, panel RSS
within 10 % between 6 h and 24 h of a run, first full paint of a 1M-step run ≤ 2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import pty
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

COLS, ROWS = 120, 40
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
DAY_STEPS = 86_400
IDLE_PY = ("import asyncio\nasync def main():\n    while True:\n        await asyncio.sleep(0.1)\n"
           "asyncio.run(main())\n")


# -- render counting (also used by tests/tui) --------------------------------------------------
@dataclass
class RenderCount:
    """Frames Textual drew (screen updates sent to the terminal, or that would be when
    headless) and renders per widget id (a widget's content built again after a refresh)."""

    frames: int = 0
    renders: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)  # time in those renders, per widget
    after_frame: list[Any] = field(default_factory=list)  # callables run after each frame


@contextlib.contextmanager
def count_renders() -> Iterator[RenderCount]:
    """Count frames and widget renders of every Textual app in this process while open."""
    from textual.app import App
    from textual.widget import Widget

    counts = RenderCount()
    display, render, lines = App._display, Widget._render, Widget.render_lines

    def counting_display(self: App[Any], screen: Any, renderable: Any) -> None:
        display(self, screen, renderable)
        if renderable is not None and not self._batch_count:
            counts.frames += 1
            for fn in counts.after_frame:
                fn()

    def counting_render(self: Widget) -> Any:
        name = self.id or type(self).__name__
        counts.renders[name] += 1
        t = time.perf_counter()
        try:
            return render(self)
        finally:
            counts.seconds[name] += time.perf_counter() - t

    def counting_lines(self: Widget, crop: Any) -> Any:
        # line-API widgets (the log, the run table) draw here instead of in _render; a call
        # without dirty lines is served from the cache (a neighbour's frame), not a render
        name = (self.id or type(self).__name__) + ":lines"
        if type(self).render_line is not Widget.render_line and self._styles_cache._dirty_lines:
            counts.renders[name] += 1
        t = time.perf_counter()
        try:
            return lines(self, crop)
        finally:
            counts.seconds[name] += time.perf_counter() - t

    App._display = counting_display  # type: ignore[method-assign]
    Widget._render = counting_render  # type: ignore[method-assign]
    Widget.render_lines = counting_lines  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        App._display = display  # type: ignore[method-assign]
        Widget._render = render  # type: ignore[method-assign]
        Widget.render_lines = lines  # type: ignore[method-assign]


# -- the synthetic writer (a process per run) --------------------------------------------------
def writer_main(run_dir: Path, ranks: int, rate: float, steps: int, total: int) -> None:
    """Write one run the way the trainer does, ``rate`` steps/s (0: as fast as possible) up to
    ``steps`` steps, then wait (alive, as a run between steps) until killed."""
    from nsa.contract import Beat, DeviceInfo, LaunchInfo, Phase, RunInfo, RunStatus, TrainMetric
    from nsa.contract.io import JsonlWriter, write_json_atomic
    from nsa_tui.agent.procs import boot_id

    run_id = run_dir.name
    (run_dir / "heartbeats").mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    gb, seq = 8 * ranks, 256
    write_json_atomic(run_dir / "launch.json", LaunchInfo(
        run_id=run_id, name=run_id.split("-", 2)[-1], created=t0, nproc=ranks, launcher_pid=os.getpid(),
        launcher_pgid=os.getpgrp(), boot_id=boot_id(), config_file="configs/synthetic.yaml"))

    def info(step: int) -> RunInfo:
        return RunInfo(run_id=run_id, name="synthetic", status=RunStatus.RUNNING, param_count=1_500_000,
                       world_size=ranks, batch_size=8, grad_accum=1, global_batch=gb, seq_len=seq,
                       started_at=t0, updated_at=time.time(), step=step, total_steps=total,
                       tokens=step * gb * seq, device="cpu", dtype="float32")

    write_json_atomic(run_dir / "run.json", info(0))
    beats = [JsonlWriter(run_dir / "heartbeats" / f"rank-{r}.jsonl") for r in range(ranks)]
    metrics = JsonlWriter(run_dir / "metrics.jsonl")
    log = open(run_dir / "train.log", "ab", buffering=0)
    devices = [DeviceInfo(type="cpu", index=r) for r in range(ranks)]
    host = platform.node()
    info_at = time.monotonic()
    start = time.monotonic()
    for s in range(1, steps + 1):
        now = time.time()
        for r, w in enumerate(beats):
            w.write(Beat(ts=now, run_id=run_id, rank=r, local_rank=r, world_size=ranks, pid=os.getpid(),
                         host=host, device=devices[r], phase=Phase.TRAIN, phase_since=t0, step=s,
                         source="step"))
        loss = 2.0 + 8.0 / (1 + s / 500)
        metrics.write(TrainMetric(ts=now, step=s, loss=loss, lr=3e-4, tokens=s * gb * seq,
                                  tokens_per_s=gb * seq * max(rate, 1.0), step_time_s=1 / max(rate, 1.0),
                                  grad_norm=1.0 + (s % 7) / 10, mem_allocated_bytes=200 << 20))
        log.write(f"step {s}/{total} loss {loss:.4f} lr 3.00e-04 grad_norm 1.00 {gb * seq} tok/s\n".encode())
        if time.monotonic() - info_at > 10:  # the trainer rewrites run.json every ~10 s
            write_json_atomic(run_dir / "run.json", info(s))
            info_at = time.monotonic()
        if rate > 0:
            delay = start + s / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    write_json_atomic(run_dir / "run.json", info(steps))
    while True:
        time.sleep(3600)


# -- the panel (in a pseudo-terminal) ----------------------------------------------------------
def panel_main(runs_root: str, stats_path: str, select: str | None) -> None:
    """The real app, as ``nsa-tui`` runs it, plus a stats file written once a second for the
    benchmark."""
    t_start = time.monotonic()
    from nsa_tui.app.app import NsaApp
    from nsa_tui.app.widgets.charts import MetricChart
    from nsa_tui.hosts.client import HostClient

    class BenchApp(NsaApp):
        CSS_PATH = str(Path(sys.modules[NsaApp.__module__].__file__ or "").parent / "panel.tcss")

        def on_mount(self) -> None:  # Textual calls NsaApp.on_mount as well
            # once a second: the stats file is the benchmark's own cost, counted as the panel's
            self.set_interval(1.0, every_second)

    t_imported = time.monotonic()
    app = BenchApp(["local"], offer_demo=False, clients={"local": HostClient("local", runs_root=runs_root)})
    painted: dict[str, float] = {}

    def full_paint_check() -> None:
        if "full" in painted:
            return
        run = app.state.selected_run()
        if run is None or not run.synced or not run.metrics.count or not run.log.total:
            return
        if select and run.run_id != select:
            return
        charts = [c for c in app.screen.query(MetricChart) if c.display] if app.screen.is_attached else []
        if charts and all(c.data.lines and not c.data.empty for c in charts[:1]):
            painted["full"] = time.monotonic()

    def write_stats() -> None:
        run = app.state.selected_run()
        stats = {"t": time.monotonic(), "frames": counts.frames, "renders": dict(counts.renders),
                 "seconds": dict(counts.seconds),
                 "t_start": t_start,
                 "imported_s": t_imported - t_start, "ticks": app.tick_count,
                 "run": run.run_id if run else None, "step": run.metrics.last_train.step
                 if run and run.metrics.last_train else 0, "synced": bool(run and run.synced),
                 "full_paint_s": painted["full"] - t_start if "full" in painted else None,
                 "log_lines": len(run.log.lines) if run else 0,
                 # the redraw budget's stretch of the refresh cap (nsa_tui/app/budget.py)
                 "stretch": getattr(getattr(app.screen, "_budget", None), "stretch", 1.0)}
        tmp = stats_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(stats, fh)
        os.replace(tmp, stats_path)

    def every_second() -> None:
        if select and app.state.selected != ("local", select) and select in app.state.host("local").runs:
            app.select("local", select)
        write_stats()

    with count_renders() as counts:
        counts.after_frame.append(full_paint_check)
        profile = os.environ.get("PANEL_COST_PROFILE")  # where the benchmark's --profile puts it
        if profile:
            import cProfile

            cProfile.runctx("app.run()", globals(), {"app": app}, profile)
        else:
            app.run()


# -- measuring ---------------------------------------------------------------------------------
def cpu_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (f"{platform.node()}: {os.cpu_count()} CPUs ({model or platform.machine()}), "
            f"python {sys.version.split()[0]}")


class Panel:
    """The panel process in a pseudo-terminal (its output drained and counted)."""

    def __init__(self, runs_root: Path, work: Path, env: dict[str, str], select: str | None = None) -> None:
        self.stats_path = work / f"stats-{time.monotonic_ns()}.json"
        master, slave = pty.openpty()
        fcntl_size = struct.pack("HHHH", ROWS, COLS, 0, 0)
        import fcntl

        fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl_size)
        self.master = master
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.panel_cost", "--panel", str(runs_root), str(self.stats_path)]
            + (["--select", select] if select else []),
            stdin=slave, stdout=slave, stderr=slave,  # Textual draws on stderr
            env={**env, "TERM": "xterm-256color"}, cwd=ROOT, start_new_session=True)
        os.close(slave)
        self.bytes_out = 0
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.bytes_out += len(data)

    def stats(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.stats_path.read_text()))
        except (OSError, ValueError):
            return {}

    def wait_for(self, pred: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.stats()
            if st and pred(st):
                return st
            if self.proc.poll() is not None:
                raise RuntimeError(f"the panel exited ({self.proc.returncode}) waiting for {what}")
            time.sleep(0.1)
        raise TimeoutError(f"the panel did not reach {what} in {timeout:.0f} s")

    def agent(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            kids = children_of(self.proc.pid)
            if kids:
                return kids[0]
            time.sleep(0.1)
        raise TimeoutError("the panel started no agent")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.master, b"q")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.master)


def start_writer(root: Path, run_id: str, ranks: int, rate: float, steps: int, total: int,
                 env: dict[str, str]) -> subprocess.Popen[bytes]:
    d = root / run_id
    d.mkdir(parents=True)
    return subprocess.Popen(
        [sys.executable, "-m", "bench.panel_cost", "--writer", str(d), str(ranks), str(rate), str(steps),
         str(total)], env={**env, "NSA_RUN_ID": run_id, "NSA_RUN_DIR": str(d)}, cwd=ROOT,
        stdout=subprocess.DEVNULL, start_new_session=True)


def start_idle() -> subprocess.Popen[bytes]:
    """The reference: a Python process that only wakes 10x/s."""
    return subprocess.Popen([sys.executable, "-c", IDLE_PY], stdout=subprocess.DEVNULL,
                            start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def reference_ms(repeat: int = 5) -> float:
    """CPU milliseconds of a fixed pure-Python workload (string formatting, dicts, a sort: the
    kind of work drawing a frame is), the best of ``repeat``: the unit that makes CPU time per
    frame comparable between machines (a slower core takes longer for both)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        rows = [{"step": i, "loss": 2.0 + 1.0 / (i + 1), "name": f"rank-{i % 8}"} for i in range(20_000)]
        text = "\n".join(f"{r['name']:>8} {r['step']:>7} {r['loss']:.4f}" for r in rows)
        sorted(text.split("\n"), key=len)
        best = min(best, time.process_time() - t)
    return best * 1000


def lines_written(root: Path) -> int:
    """Lines the synthetic writers have appended under ``root`` (every run's heartbeats,
    metrics and log)."""
    total = 0
    paths = [p for pattern in ("*/heartbeats/*.jsonl", "*/metrics.jsonl", "*/train.log")
             for p in root.glob(pattern)]
    for path in paths:
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""))
    return total


@dataclass
class Row:
    name: str
    panel_cpu: float
    agent_cpu: float
    idle_cpu: float
    panel_rss: float
    agent_rss: float
    idle_rss: float
    frames_s: float
    renders_s: float
    load: float
    events_s: float = 0.0  # lines the writers appended per second (beats, metrics, log) in the window
    stretch: float = 1.0  # how far the panel's CPU budget stretched its refresh cap (1: not at all)
    note: str = ""
    top_renders: list[tuple[str, float, float]] = field(default_factory=list)  # name, % of a core, renders/s


def measure(name: str, panel: Panel, idle: subprocess.Popen[bytes], seconds: float,
            root: Path | None = None) -> Row:
    agent = panel.agent()
    pids = (panel.proc.pid, agent, idle.pid)
    n0 = lines_written(root) if root else 0
    st0, c0, t0 = panel.stats(), [cpu_ticks(p) for p in pids], time.monotonic()
    time.sleep(seconds)
    st1, c1, t1 = panel.stats(), [cpu_ticks(p) for p in pids], time.monotonic()
    n1 = lines_written(root) if root else 0
    wall = t1 - t0
    pct = [100.0 * (b - a) / TICK / wall for a, b in zip(c0, c1)]
    rss = [rss_bytes(p) / 2**20 for p in pids]
    # the stats file is written once a second: its counts are taken over its own clock
    span = max(1e-9, st1.get("t", 0.0) - st0.get("t", 0.0))
    frames = (st1.get("frames", 0) - st0.get("frames", 0)) / span
    r0, r1 = Counter(st0.get("renders", {})), Counter(st1.get("renders", {}))
    d = r1 - r0
    s0, s1 = Counter(st0.get("seconds", {})), Counter(st1.get("seconds", {}))
    top = [(k, v / span * 100, d[k] / span) for k, v in (s1 - s0).most_common(8)]
    return Row(name, pct[0], pct[1], pct[2], rss[0], rss[1], rss[2], frames, sum(d.values()) / span,
               os.getloadavg()[0], events_s=(n1 - n0) / wall, stretch=float(st1.get("stretch", 1.0)),
               top_renders=top)


def environment(work: Path, runs_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(NSA_RUNS_ROOT=str(runs_root), NSA_TUI_STATE_DIR=str(work / "state"),
               NSA_TUI_SETTINGS=str(work / "settings.yaml"), NSA_TUI_KEYMAP=str(work / "no-keymap.yaml"),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env


def live_scenario(name: str, work: Path, runs: int, ranks: int, rate: float, seconds: float,
                  warmup: float) -> Row:
    root = work / name.replace("@", "at")
    root.mkdir()
    env = environment(work, root)
    writers = [start_writer(root, f"20990101-00000{i}-synthetic-{i}", ranks, rate, 10**9, 10**6, env)
               for i in range(runs)]
    select = "20990101-000000-synthetic-0" if runs else None
    idle = start_idle()
    panel = Panel(root, work, env, select)
    try:
        if runs:
            panel.wait_for(lambda st: st.get("run") == select and st.get("synced") and st.get("step", 0) > 0,
                           120, "the run shown")
        else:
            panel.wait_for(lambda st: st.get("frames", 0) > 0, 120, "a first frame")
        time.sleep(warmup)
        return measure(name, panel, idle, seconds, root)
    finally:
        panel.close()
        for w in writers:
            stop(w)
        stop(idle)


def day_scenario(work: Path, steps: int, rate: float) -> Row:
    """24 h of a 1 step/s run (``steps`` steps) written at ``rate`` steps/s: fast, yet every
    line goes through agent, client and panel (its log ring fills, its series merge)."""
    root = work / "day"
    root.mkdir()
    env = environment(work, root)
    run_id = "20990101-000000-synthetic-day"
    writer = start_writer(root, run_id, 2, rate, steps, steps, env)
    idle = start_idle()
    panel = Panel(root, work, env, run_id)
    marks = {"1 h": steps // 24, "6 h": steps // 4, "12 h": steps // 2, "24 h": steps}
    seen: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        for label, at in marks.items():
            st = panel.wait_for(lambda st, at=at: st.get("step", 0) >= at, 1200, f"step {at}")
            seen[label] = rss_bytes(panel.proc.pid) / 2**20
        log_lines = st.get("log_lines", 0)
        elapsed = time.monotonic() - t0
        row = measure("day", panel, idle, 5)
    finally:
        panel.close()
        stop(writer)
        stop(idle)
    growth = (seen["24 h"] - seen["6 h"]) / seen["6 h"] * 100
    rss = " · ".join(f"{k} {v:.0f} MiB" for k, v in seen.items())
    row.note = (f"RSS {rss} (6 h → 24 h {growth:+.1f} %); "
                f"{steps:,} steps × 2 ranks in {elapsed:.0f} s, {log_lines:,} log lines held at the end")
    return row


def cold_scenario(work: Path, steps: int, ranks: int, repeat: int) -> Row:
    """A finished ``steps``-step run opened by a fresh panel: seconds to its first full paint
    (the run selected, synced, its charts and log drawn, and a frame sent after that)."""
    from bench.scale import make_run

    root = work / "cold"
    root.mkdir()
    env = environment(work, root)
    t = time.monotonic()
    run_id, nbytes = make_run(root, steps, ranks)
    built = time.monotonic() - t
    idle = start_idle()
    times = []
    try:
        for _ in range(repeat):
            panel = Panel(root, work, env, run_id)
            try:
                st = panel.wait_for(lambda st: st.get("full_paint_s") is not None, 300,
                                    "the first full paint")
                times.append((st["full_paint_s"], st["imported_s"]))
                row = measure("cold", panel, idle, 3)
            finally:
                panel.close()
    finally:
        stop(idle)
    times.sort()
    paint, imported = times[len(times) // 2]
    row.note = (f"first full paint {paint:.2f} s from process start ({imported:.2f} s of it imports), "
                f"median of {repeat}; {steps:,} steps × {ranks} ranks, {nbytes / 2**20:.0f} MiB (built in "
                f"{built:.0f} s)")
    return row


def table(rows: list[Row], ref_ms: float) -> str:
    """The percentages, and the machine-independent figures beside them: CPU milliseconds per
    frame drawn and per line the writers appended, also in units of ``reference_ms`` (the
    same work on a slower core costs more milliseconds and about the same units)."""
    out = ["| scenario | panel CPU | × idle | agent CPU | × idle | idle Python CPU | panel RSS | agent RSS "
           "| idle RSS | frames/s | renders/s | lines/s | panel ms/frame | panel ms/line | agent ms/line "
           "| panel ref/frame | cap × | load |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        def ratio(x: float, r: Row = r) -> str:
            # an idle process can use less than one clock tick in a window: no ratio then
            return f"{x / r.idle_cpu:.0f}×" if r.idle_cpu > 0 else "n/a (idle < 1 tick)"

        def per(pct: float, rate: float) -> str:  # % of a core is 10 ms of CPU per second
            return f"{pct * 10 / rate:.2f}" if rate > 0 else "-"

        per_frame = r.panel_cpu * 10 / r.frames_s if r.frames_s > 0 else None
        out.append(f"| {r.name} | {r.panel_cpu:.1f} % | {ratio(r.panel_cpu)} | {r.agent_cpu:.1f} % | "
                   f"{ratio(r.agent_cpu)} | {r.idle_cpu:.2f} % | {r.panel_rss:.0f} MiB | "
                   f"{r.agent_rss:.0f} MiB | {r.idle_rss:.0f} MiB | {r.frames_s:.1f} | {r.renders_s:.1f} | "
                   f"{r.events_s:.0f} | {per(r.panel_cpu, r.frames_s)} | {per(r.panel_cpu, r.events_s)} | "
                   f"{per(r.agent_cpu, r.events_s)} | "
                   f"{f'{per_frame / ref_ms:.2f}' if per_frame is not None else '-'} | {r.stretch:.1f} | "
                   f"{r.load:.1f} |")
    return "\n".join(out)


SCENARIOS = {"idle": (0, 0, 0.0), "1x2@1": (1, 2, 1.0), "1x2@10": (1, 2, 10.0), "3x8@10": (3, 8, 10.0)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--writer":
        writer_main(Path(argv[1]), int(argv[2]), float(argv[3]), int(argv[4]), int(argv[5]))
        return 0
    if argv and argv[0] == "--panel":
        sel = argv[argv.index("--select") + 1] if "--select" in argv else None
        panel_main(argv[1], argv[2], sel)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="measuring window per scenario")
    ap.add_argument("--warmup", type=float, default=45.0,
                    help="seconds before measuring: the panel's CPU budget settles its refresh cap")
    ap.add_argument("--only", nargs="+", default=[*SCENARIOS, "day", "cold"])
    ap.add_argument("--day-steps", type=int, default=DAY_STEPS)
    ap.add_argument("--day-rate", type=float, default=1500.0, help="steps/s of the simulated day")
    ap.add_argument("--cold-steps", type=int, default=1_000_000)
    ap.add_argument("--cold-ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="cold opens (the median is reported)")
    ap.add_argument("--details", action="store_true", help="the most rendered widgets per scenario")
    ap.add_argument("--profile", type=Path, help="cProfile the panel: DIR/<scenario>.prof (pstats)")
    ap.add_argument("--profile-agent", type=Path,
                    help="cProfile the agent: DIR/<scenario>-agent.prof (pstats; its worker-thread calls "
                         "run inline, so its CPU numbers are not comparable)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="nsa-panel-cost-"))
    ref_ms = reference_ms()
    print(f"machine: {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"reference workload {ref_ms:.1f} ms of CPU", flush=True)
    rows = []
    try:
        for name in args.only:
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                os.environ["PANEL_COST_PROFILE"] = str(args.profile.resolve() / f"{name}.prof")
            if args.profile_agent:
                args.profile_agent.mkdir(parents=True, exist_ok=True)
                os.environ["NSA_AGENT_PROFILE"] = str(args.profile_agent.resolve() / f"{name}-agent.prof")
            if name in SCENARIOS:
                runs, ranks, rate = SCENARIOS[name]
                row = live_scenario(name, work, runs, ranks, rate, args.seconds, args.warmup)
            elif name == "day":
                row = day_scenario(work, args.day_steps, args.day_rate)
            elif name == "cold":
                row = cold_scenario(work, args.cold_steps, args.cold_ranks, args.repeat)
            else:
                raise SystemExit(f"unknown scenario {name}")
            rows.append(row)
            print(f"{name}: panel {row.panel_cpu:.1f} %, agent {row.agent_cpu:.1f} %, idle Python "
                  f"{row.idle_cpu:.2f} %, panel RSS {row.panel_rss:.0f} MiB, {row.frames_s:.1f} frames/s, "
                  f"{row.events_s:.0f} lines/s, refresh cap × {row.stretch:.1f}, "
                  f"load {row.load:.1f}" + (f"; {row.note}" if row.note else ""), flush=True)
            if args.details:
                print("   % of a core drawing (content + lines), renders/s: "
                      + ", ".join(f"{k} {v:.2f} ({n:.1f}/s)" for k, v, n in row.top_renders), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rows, ref_ms))
    for r in rows:
        if r.note:
            print(f"\n{r.name}: {r.note}")
    print(f"\nmachine: {machine()}; load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"reference workload {ref_ms:.1f} ms of CPU (panel ref/frame: a frame's CPU in those units)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
