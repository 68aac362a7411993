"""The trainer's side of the run directory: run.json, heartbeats, metrics and their summary.

The records are the contract's (nsa/contract; docs/run-directory.md). Every JSON file is
written atomically, every JSONL line with one write. The heartbeat thread beats in every
phase, so a rank that is alive but stuck (its ``step`` frozen while timer beats continue)
is told apart from a rank that is gone. Heartbeat files rotate at ``NSA_ROTATE_BYTES``
(default 32 MiB; nsa.contract.appended.rotate_bytes), the previous file kept as
``rank-R.jsonl.1``, so a week-long run's beats cost a bounded amount of disk and reading the
latest is O(1).
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from nsa.contract import (
    TRAINER_STATUSES,
    Beat,
    DeviceInfo,
    Metric,
    MetricsFolder,
    MetricsSummary,
    Phase,
    RunInfo,
    RunStatus,
    read_json,
    write_json_atomic,
)
from nsa.contract.appended import DEFAULT_ROTATE_BYTES, RotatingJsonl
from nsa.contract.io import JsonlWriter, decode_lines, private_dir, read_lines, write_json_in_place
from nsa.contract.rundir import (
    METRICS_JSONL,
    METRICS_SUMMARY_JSON,
    RUN_JSON,
    TRAINER_SUBDIRS,
    RunDir,
)

HEARTBEAT_ROTATE_BYTES = DEFAULT_ROTATE_BYTES  # without NSA_ROTATE_BYTES
SUMMARY_EVERY_S = 10.0
SUBDIRS = TRAINER_SUBDIRS


def ensure_run_dir(run_dir: Path) -> Path:
    """Create the run directory and its subdirectories private to their user (0700)."""
    private_dir(run_dir)
    for sub in SUBDIRS:
        private_dir(run_dir / sub)
    return run_dir


class Heartbeat:
    """Per-rank heartbeats: ``step`` beats from the training loop, ``timer`` beats from a thread.
    ``rotate_bytes``: None reads ``NSA_ROTATE_BYTES`` (default 32 MiB)."""

    def __init__(self, run_dir: Path, run_id: str, rank: int, local_rank: int, world_size: int,
                 device: DeviceInfo, interval_s: float, rotate_bytes: int | None = None) -> None:
        self.writer = RotatingJsonl(RunDir(run_dir).heartbeat(rank), rotate_bytes)
        self.run_id, self.rank, self.local_rank, self.world_size = run_id, rank, local_rank, world_size
        self.pid, self.host, self.device = os.getpid(), socket.gethostname(), device
        self.interval_s = interval_s
        self.phase, self.phase_since, self.step = Phase.BOOT, time.time(), 0
        self.cost_s = 0.0  # time the training thread spent writing beats (overhead accounting)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nsa-heartbeat", daemon=True)

    def start(self) -> None:
        self.beat("timer")
        self._thread.start()

    def set_phase(self, phase: Phase | str) -> None:
        phase = Phase(phase)
        if phase != self.phase:
            self.phase, self.phase_since = phase, time.time()
            self.beat("timer")

    def beat(self, source: str, step: int | None = None, error: str | None = None) -> None:
        if step is not None:
            self.step = step
        self.writer.write(Beat(
            ts=time.time(), run_id=self.run_id, rank=self.rank, local_rank=self.local_rank,
            world_size=self.world_size, pid=self.pid, host=self.host, device=self.device, phase=self.phase,
            phase_since=self.phase_since, step=self.step, source=source, error=error))  # type: ignore[arg-type]

    def step_beat(self, step: int) -> None:
        t0 = time.perf_counter()
        self.beat("step", step)
        self.cost_s += time.perf_counter() - t0

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat("timer")
            except Exception:  # a full disk must not kill the rank from this thread
                pass

    def stop(self, final_phase: Phase | str, error: str | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.phase, self.phase_since = Phase(final_phase), time.time()
        self.beat("timer", error=error)
        self.writer.close()


class RunRecord:
    """run.json, owned by rank 0: identity, resolved config, status, progress."""

    def __init__(self, run_dir: Path, info: RunInfo) -> None:
        self.path = run_dir / RUN_JSON
        now = time.time()
        self.info = msgspec.structs.replace(info, status=RunStatus.STARTING, started_at=now, updated_at=now)
        self._last_write = 0.0
        self.write()

    def update(self, **fields: Any) -> None:
        status = fields.get("status")
        if status is not None and RunStatus(status) not in TRAINER_STATUSES:
            raise ValueError(f"the trainer cannot write status {status!r}")
        self.info = msgspec.structs.replace(self.info, **fields)
        self.write()

    def progress(self, step: int, tokens: int, every_s: float = 10.0) -> None:
        """Step and tokens, rewritten at most every ``every_s`` seconds (cheap, atomic)."""
        self.info.step, self.info.tokens = step, tokens
        if time.time() - self._last_write >= every_s:
            self.write(durable=False)

    def write(self, durable: bool = True) -> None:
        self.info.updated_at = time.time()
        try:
            write_json_atomic(self.path, self.info, durable)
        except OSError as exc:
            if exc.errno != errno.ENOSPC or not self.path.exists():
                raise
            self._write_on_full_disk()
        self._last_write = time.time()

    def _write_on_full_disk(self) -> None:
        """The disk is full: the record goes into run.json's own blocks (compact, then with a
        shorter reason if even that does not fit), so a failure for want of space is still said."""
        try:
            write_json_in_place(self.path, self.info)
        except OSError:
            reason = (self.info.exit_reason or "")[:200]
            write_json_in_place(self.path, msgspec.structs.replace(self.info, exit_reason=reason))


class MetricsLog:
    """metrics.jsonl (every line) and metrics-summary.json (every series in bounded buckets,
    rewritten at most every ``every_s`` and at the end): what lets a panel show a run of any
    age without reading all of it."""

    def __init__(self, run_dir: Path, every_s: float = SUMMARY_EVERY_S) -> None:
        self.path = run_dir / METRICS_JSONL
        self.summary_path = run_dir / METRICS_SUMMARY_JSON
        self.every_s = every_s
        self.folder = MetricsFolder(summary=read_json(self.summary_path, MetricsSummary))
        self._catch_up()
        self.writer = JsonlWriter(self.path)
        self._last_summary = 0.0

    def _catch_up(self) -> None:
        """A run continued in place (``--resume auto``): fold the lines its summary misses."""
        offset = self.folder.upto_offset
        while True:
            lines, end = read_lines(self.path, offset)
            if not lines:
                break
            for line in lines:
                for rec in decode_lines([line.text], Metric):
                    self.folder.add(rec)
            offset = end
        self.folder.upto_offset = offset

    def write(self, metric: Metric) -> None:
        self.writer.write(metric)
        self.folder.add(metric, self.writer.size())
        if time.time() - self._last_summary >= self.every_s:
            self.write_summary()

    def write_summary(self) -> None:
        write_json_atomic(self.summary_path, self.folder.summary(), durable=False)
        self._last_summary = time.time()

    def close(self) -> None:
        self.write_summary()
        self.writer.close()
