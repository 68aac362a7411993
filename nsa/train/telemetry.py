"""The run directory's files: run.json, heartbeats, metrics (docs/run-directory.md).

Every JSON file is written atomically (temporary name, then ``os.replace``); every JSONL
line is one ``write`` of a complete line, flushed, so a reader never sees half a record.
The heartbeat thread beats in every phase, so a rank that is alive but stuck (its ``step``
frozen while timer beats continue) is told apart from a rank that is gone (LESSONS 8, 10).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PHASES = ("boot", "data", "compile", "train", "eval", "checkpoint", "done", "failed")
STATUSES = ("starting", "running", "stopped", "finished", "failed")


def write_json_atomic(path: Path, data: Any, durable: bool = True) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file in the same directory
    (``durable``: fsync first, for records that must survive a power cut)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, default=str)
            f.write("\n")
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class JsonlWriter:
    """Appends one complete JSON line per record, thread-safe, flushed at once."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = open(path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()


def ensure_run_dir(run_dir: Path) -> Path:
    """Create the run directory private to its user (mode 0700) and its subdirectories."""
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    for sub in ("heartbeats", "stacks", "checkpoints"):
        (run_dir / sub).mkdir(exist_ok=True)
    return run_dir


class Heartbeat:
    """Per-rank heartbeats: ``step`` beats from the training loop, ``timer`` beats from a thread."""

    def __init__(self, run_dir: Path, run_id: str, rank: int, local_rank: int, world_size: int,
                 device: dict[str, Any], interval_s: float) -> None:
        self.writer = JsonlWriter(run_dir / "heartbeats" / f"rank-{rank}.jsonl")
        self.base = {"run_id": run_id, "rank": rank, "local_rank": local_rank, "world_size": world_size,
                     "pid": os.getpid(), "host": socket.gethostname(), "device": device}
        self.interval_s = interval_s
        self.phase, self.phase_since, self.step = "boot", time.time(), 0
        self.cost_s = 0.0  # time the training thread spent writing beats (overhead accounting)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nsa-heartbeat", daemon=True)

    def start(self) -> None:
        self.beat("timer")
        self._thread.start()

    def set_phase(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        if phase != self.phase:
            self.phase, self.phase_since = phase, time.time()
            self.beat("timer")

    def beat(self, source: str, step: int | None = None, **extra: Any) -> None:
        if step is not None:
            self.step = step
        rec = {"ts": time.time(), **self.base, "phase": self.phase, "phase_since": self.phase_since,
               "step": self.step, "source": source, **extra}
        self.writer.write(rec)

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

    def stop(self, final_phase: str, **extra: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.phase, self.phase_since = final_phase, time.time()
        self.beat("timer", **extra)
        self.writer.close()


class RunRecord:
    """run.json, owned by rank 0: identity, resolved config, status, progress."""

    def __init__(self, run_dir: Path, fields: dict[str, Any]) -> None:
        self.path = run_dir / "run.json"
        now = time.time()
        self.data: dict[str, Any] = {"status": "starting", "exit_reason": None, "started_at": now,
                                     "updated_at": now, "ended_at": None, "step": 0, "tokens": 0, **fields}
        self._last_write = 0.0
        self.write()

    def update(self, **fields: Any) -> None:
        if "status" in fields and fields["status"] not in STATUSES:
            raise ValueError(f"unknown status {fields['status']!r}")
        self.data.update(fields)
        self.write()

    def progress(self, step: int, tokens: int, every_s: float = 10.0) -> None:
        """Step and tokens, rewritten at most every ``every_s`` seconds (cheap, atomic)."""
        self.data.update(step=step, tokens=tokens)
        if time.time() - self._last_write >= every_s:
            self.write(durable=False)

    def write(self, durable: bool = True) -> None:
        self.data["updated_at"] = time.time()
        write_json_atomic(self.path, self.data, durable)
        self._last_write = time.time()


def read_launch(run_dir: Path) -> dict[str, Any]:
    """launch.json of THIS run directory (written by the agent), or {} when run by hand."""
    try:
        data = json.loads((run_dir / "launch.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}
