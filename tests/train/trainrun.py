"""Run ``nsa-train`` for real (one process, or torchrun with gloo) in a run directory.

Reusable by other tests (the host agent's) that need run directories a real trainer wrote.
Every run is started in its own session and tagged with a unique ``NSA_TRAINRUN_TAG`` in its
environment. torchrun starts each worker in a session of its own (``start_new_session``), so
killing torchrun's group does not reach the workers: ``kill_group`` also kills every process
that carries the run's tag, and no torchrun or worker outlives a test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "smoke-cpu.yaml"


def train_command(run_dir: Path, sets: Sequence[str] = (), nproc: int | None = 2, config: Path = SMOKE,
                  resume: str | None = None, module: str = "nsa.train") -> list[str]:
    """argv for nsa-train (``nproc=None``: a plain process, no torchrun; ``module``: another entry
    point that takes nsa-train's arguments)."""
    cmd = [sys.executable]
    if nproc is not None:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += ["-m", module, "--config", str(config), "--run-dir", str(run_dir)]
    if sets:
        cmd += ["--set", *sets]
    if resume:
        cmd += ["--resume", resume]
    return cmd


def train_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTHONUNBUFFERED": "1"})  # threads per rank: nsa-train chooses (nsa/train/threads.py)
    env.update(extra or {})
    return env


@dataclass
class Finished:
    rc: int
    output: str
    run_dir: Path


def run_train(run_dir: Path, sets: Sequence[str] = (), nproc: int | None = 2, config: Path = SMOKE,
              resume: str | None = None, timeout: float = 120, env: dict[str, str] | None = None,
              module: str = "nsa.train") -> Finished:
    """Run to completion (or ``timeout``, then kill the group and fail loudly)."""
    proc = start_train(run_dir, sets, nproc, config, resume, env, module)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, _ = proc.communicate()
        raise AssertionError(f"nsa-train did not finish in {timeout} s:\n{out[-4000:]}") from None
    finally:
        kill_group(proc)
    return Finished(proc.returncode, out, run_dir)


def start_train(run_dir: Path, sets: Sequence[str] = (), nproc: int | None = 2, config: Path = SMOKE,
                resume: str | None = None, env: dict[str, str] | None = None,
                module: str = "nsa.train") -> subprocess.Popen:
    """Start in a new session (own process group), output to a pipe: stop with ``kill_group``."""
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(train_command(run_dir, sets, nproc, config, resume, module), cwd=REPO,
                            env=train_env({**(env or {}), "NSA_TRAINRUN_TAG": tag}),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    proc.nsa_tag = tag  # type: ignore[attr-defined]
    return proc


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``NSA_TRAINRUN_TAG=tag``."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("NSA_TRAINRUN_TAG") == tag:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal the launcher's group and every worker of the run (they left the group)."""
    tag = getattr(proc, "nsa_tag", None)
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for p in tagged(tag) if tag else []:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_json(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


def metrics(run_dir: Path, kind: str = "train") -> list[dict[str, Any]]:
    return [m for m in read_jsonl(run_dir / "metrics.jsonl") if m.get("kind") == kind]


def beats(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    return read_jsonl(run_dir / "heartbeats" / f"rank-{rank}.jsonl")


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``pred`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
