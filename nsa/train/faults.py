"""Signals (SIGTERM: stop cleanly; SIGUSR1: stack dump) and debug fault injection.

SIGUSR1 goes to ``faulthandler`` at C level, so a rank stuck inside a C call (a hung
collective) still dumps every thread's stack; a watcher thread gives each dump its own
file. SIGTERM (and SIGINT) only set a flag: the training loop finishes its step, every rank
agrees through the per-step all-reduce, a checkpoint is saved and the run exits 0. The two
handlers are separate, so a stack dump never swallows a stop.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from nsa.config import DebugConfig
from nsa.contract.rundir import pending_stack_file, stack_file

EXIT_DIED = 9  # debug.die_in_save_at_step


class InjectedCrash(RuntimeError):
    """debug.crash_at_step: a deliberate failure for testing the panel's alerts."""


class StopFlag:
    """Set by SIGTERM/SIGINT (or debug.stop_at_step); read by the training loop."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason: str | None = None

    def set(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()

    def install(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            if signum == signal.SIGINT and self.is_set():  # a second Ctrl-C: stop now, unsaved
                raise KeyboardInterrupt("second SIGINT: stopped without a checkpoint")
            self.set(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def stop_when_launcher_dies(launched: bool) -> None:
    """Under torchrun, ask Linux for SIGTERM when the launcher dies: torchrun puts each worker
    in a session of its own, so a SIGKILLed torchrun would otherwise leave its workers
    running. SIGTERM means the usual clean stop: finish the step, save, exit."""
    if not launched or not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()  # may legitimately be 1: torchrun as a container's PID 1
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != launcher:  # the launcher died before we asked (we were re-parented)
        os.kill(os.getpid(), signal.SIGTERM)


class StackDumper:
    """SIGUSR1 -> ``stacks/rank-R-<unix-ms>.txt`` with every thread's Python stack."""

    def __init__(self, stacks_dir: Path, rank: int) -> None:
        self.dir, self.rank = stacks_dir, rank
        self.pending = stacks_dir / pending_stack_file(rank)
        self._file: TextIO | None = None
        self._stop = threading.Event()

    def _arm(self) -> None:
        old = self._file
        self._file = new = open(self.pending, "w", buffering=1)
        faulthandler.register(signal.SIGUSR1, file=new, all_threads=True, chain=False)
        if old is not None:
            old.close()

    def install(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._arm()
        threading.Thread(target=self._watch, name="nsa-stacks", daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            try:
                if self._file is None or os.fstat(self._file.fileno()).st_size == 0:
                    continue
                time.sleep(0.1)  # the C handler writes in microseconds; let it finish
                ms = int(time.time() * 1000)
                final = self.dir / stack_file(self.rank, ms)
                os.replace(self.pending, final)
                self._arm()
            except Exception:
                continue

    def close(self) -> None:
        self._stop.set()
        try:
            faulthandler.unregister(signal.SIGUSR1)
            # unregister restores SIGUSR1's default action, which kills the process: a dump
            # request during teardown must not turn a clean exit into a death by signal
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            if self._file is not None:
                self._file.close()
            if self.pending.exists() and self.pending.stat().st_size == 0:
                self.pending.unlink()
        except OSError:
            pass


def _mine(rank_sel: int | None, rank: int) -> bool:
    return rank_sel is None or rank_sel == rank


class Faults:
    """The ``debug.*`` knobs, each off by default (docs/run-directory.md lists them)."""

    def __init__(self, cfg: DebugConfig, rank: int) -> None:
        self.cfg, self.rank = cfg, rank

    def nan_now(self, step: int) -> bool:
        """debug.nan_at_step: the loss of optimizer step ``step`` becomes NaN on nan_rank."""
        return self.cfg.nan_at_step == step and _mine(self.cfg.nan_rank, self.rank)

    def maybe_crash(self, step: int) -> None:
        if self.cfg.crash_at_step == step and _mine(self.cfg.crash_rank, self.rank):
            raise InjectedCrash(f"debug.crash_at_step={step}: injected crash on rank {self.rank}")

    def maybe_hang(self, step: int) -> None:
        """debug.hang_at_step: after completing ``step`` this rank blocks forever in phase
        ``train``; its heartbeat thread keeps beating with the frozen step, and its peers
        block in the next collective until the process-group timeout."""
        if self.cfg.hang_at_step == step and _mine(self.cfg.hang_rank, self.rank):
            print(f"[rank {self.rank}] debug.hang_at_step={step}: hanging now", flush=True)
            forever = threading.Event()
            while True:
                forever.wait(3600)

    def maybe_die_in_save(self, step: int) -> None:
        """debug.die_in_save_at_step: every shard of step ``step`` is written, the checkpoint is
        not yet committed, and the process dies at once (a KILL or power loss at the worst time)."""
        if self.cfg.die_in_save_at_step == step:
            print(f"[rank {self.rank}] debug.die_in_save_at_step={step}: dying before the commit", flush=True)
            os._exit(EXIT_DIED)

    def stop_now(self, step: int) -> bool:
        return self.cfg.stop_at_step == step
