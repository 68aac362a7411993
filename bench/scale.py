"""What looking at a run costs as the run ages: ``nsa-tui status`` and the panel's first view.

    python -m bench.scale [--steps 2000 20000 200000 1000000] [--ranks 8] [--keep DIR]

For each size it writes a synthetic finished run directory the way the trainer leaves it
(a heartbeat, a metrics line and a log line per step and rank; heartbeat files rotated at
the trainer's 32 MiB, so only the newest 32-64 MiB of beats per rank are on disk;
metrics-summary.json folded by the trainer's own MetricsFolder), then measures:

- ``status``: wall time of ``nsa-tui status local RUN --json`` (a fresh CLI process and a
  fresh local agent, as a user runs it), median of 3;
- ``first view``: the real panel (NsaApp, headless) from start until the run is shown in
  full (its watch has synced), median of 3, and the bytes the agent sent for it.

Goal: status < 0.5 s at every size, the first view of a 1M-step run < 2 s and
< 5 MB, and 1M-step / 2k-step time ratios < 2. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nsa.contract import (  # noqa: E402
    Beat,
    DeviceInfo,
    LaunchInfo,
    MetricsFolder,
    Phase,
    RunInfo,
    RunStatus,
    TrainMetric,
    encode,
    write_json_atomic,
)
from nsa.train.telemetry import HEARTBEAT_ROTATE_BYTES  # noqa: E402

RUN = "20260101-000000-scale-{steps}"


def _write_lines(path: Path, lines) -> int:
    n = 0
    with open(path, "wb", buffering=1 << 20) as fh:
        for line in lines:
            fh.write(line)
            fh.write(b"\n")
            n += len(line) + 1
    return n


def make_run(root: Path, steps: int, ranks: int) -> tuple[str, int]:
    """A finished run of ``steps`` steps on ``ranks`` ranks; returns (run id, bytes on disk)."""
    run_id = RUN.format(steps=steps)
    d = root / run_id
    for sub in ("heartbeats", "stacks", "checkpoints"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    t0 = 1_795_000_000.0
    dt = 0.5
    gb, seq = 64, 2048
    write_json_atomic(d / "launch.json", LaunchInfo(run_id=run_id, name="scale", created=t0, nproc=ranks,
                                                    launcher_pid=None, launcher_pgid=None))
    write_json_atomic(d / "run.json", RunInfo(
        run_id=run_id, name="nsa-125m", status=RunStatus.FINISHED, exit_reason=f"finished {steps} steps",
        param_count=121_088_832, world_size=ranks, batch_size=gb // ranks, grad_accum=1, global_batch=gb,
        seq_len=seq, started_at=t0, ended_at=t0 + steps * dt, step=steps, total_steps=steps,
        tokens=steps * gb * seq))
    folder = MetricsFolder()
    size = 0

    def metrics():
        nonlocal size
        for s in range(1, steps + 1):
            m = TrainMetric(ts=t0 + s * dt, step=s, loss=2.0 + 8.0 * math.exp(-s / 5000), lr=3e-4,
                            tokens=s * gb * seq, tokens_per_s=gb * seq / dt, step_time_s=dt, grad_norm=1.0,
                            mem_allocated_bytes=20 << 30, mem_reserved_bytes=24 << 30)
            line = encode(m)
            size += len(line) + 1
            folder.add(m, size)
            yield line

    nbytes = _write_lines(d / "metrics.jsonl", metrics())
    write_json_atomic(d / "metrics-summary.json", folder.summary(), durable=False)
    nbytes += _write_lines(d / "train.log", (
        f"step {s}/{steps} loss {2.0 + 8.0 * math.exp(-s / 5000):.4f} lr 0.0003 grad_norm 1.0 "
        f"{gb * seq / dt:.0f} tok/s {dt * 1000:.0f} ms/step".encode() for s in range(1, steps + 1)))
    for r in range(ranks):
        def beat(s: int, r: int = r) -> bytes:
            dev = DeviceInfo(type="cuda", index=r, uuid=f"GPU-{r}")
            phase = Phase.TRAIN if s < steps else Phase.DONE
            return encode(Beat(ts=t0 + s * dt, run_id=run_id, rank=r, local_rank=r, world_size=ranks,
                               pid=1000 + r, host="node", device=dev, phase=phase, phase_since=t0, step=s,
                               source="step"))
        per_file = max(1, HEARTBEAT_ROTATE_BYTES // (len(beat(steps)) + 1))
        full = steps // per_file  # files the rotation filled; the newest full one is kept as .1
        current = range(full * per_file + 1, steps + 1)
        path = d / "heartbeats" / f"rank-{r}.jsonl"
        if full:
            older = range((full - 1) * per_file + 1, full * per_file + 1)
            nbytes += _write_lines(path.with_name(path.name + ".1"), (beat(s) for s in older))
        nbytes += _write_lines(path, (beat(s) for s in current))
    return run_id, nbytes


def time_status(root: Path, run_id: str) -> float:
    cmd = [sys.executable, "-m", "nsa_tui.cli", "status", "local", run_id, "--runs-root", str(root), "--json"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - t0
    if out.returncode not in (0, 6):
        raise RuntimeError(f"status failed ({out.returncode}): {out.stderr[-500:]}")
    json.loads(out.stdout)
    return elapsed


async def first_view(root: Path, run_id: str) -> tuple[float, int]:
    """Seconds from the panel's start until the run is shown in full, and bytes received."""
    from nsa_tui.app.app import NsaApp
    from nsa_tui.hosts.client import HostClient

    client = HostClient("local", runs_root=str(root))
    app = NsaApp(["local"], offer_demo=False, clients={"local": client})
    t0 = time.perf_counter()
    async with app.run_test(size=(120, 40)) as pilot:
        while True:
            run = app.state.selected_run()
            if run is not None and run.run_id == run_id and run.synced and run.metrics.count:
                break
            if time.perf_counter() - t0 > 120:
                raise TimeoutError("the first view did not come within 120 s")
            await pilot.pause(0.01)
        elapsed = time.perf_counter() - t0
        received = client.bytes_received
        await app.action_quit_panel()
    return elapsed, received


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[2_000, 20_000, 200_000, 1_000_000])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="build the run directories here and keep them")
    args = ap.parse_args(argv)
    rows = []
    for steps in args.steps:
        root = args.keep or Path(tempfile.mkdtemp(prefix="nsa-scale-"))
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        run_id, nbytes = make_run(root, steps, args.ranks)
        made = time.perf_counter() - t0
        status = statistics.median(time_status(root, run_id) for _ in range(args.repeat))
        views = [asyncio.run(first_view(root, run_id)) for _ in range(args.repeat)]
        view_s = statistics.median(v[0] for v in views)
        view_b = statistics.median(v[1] for v in views)
        rows.append((steps, nbytes, status, view_s, view_b))
        print(f"{steps:>9,} steps: run dir {nbytes / 2**20:,.0f} MiB (built in {made:.0f} s); status "
              f"{status:.2f} s; first view {view_s:.2f} s, {view_b / 2**20:.2f} MiB", flush=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"| steps × {args.ranks} ranks | run dir | `nsa-tui status --json` | panel first view "
          "| bytes sent |")
    print("|---:|---:|---:|---:|---:|")
    for steps, nbytes, status, view_s, view_b in rows:
        print(f"| {steps:,} | {nbytes / 2**20:,.0f} MiB | {status:.2f} s | {view_s:.2f} s | "
              f"{view_b / 2**20:.2f} MiB |")
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(f"\nratio {b[0]:,} / {a[0]:,} steps: status {b[2] / a[2]:.2f}×, first view {b[3] / a[3]:.2f}×, "
              f"bytes {b[4] / a[4]:.2f}×")
    print(f"\nmachine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
