"""Signals (SIGTERM: stop cleanly; SIGUSR1: stack dump) and debug fault injection.

SIGUSR1 wakes a thread of its own (``nsa-stacks``, through Python's signal wakeup fd, written
by the C-level handler in whichever thread got the signal), which writes every thread's stack
while holding the GIL: a rank stuck inside a C call that waits without the GIL (a hung
collective) still dumps. Not faulthandler's C-level dump: that one reads the other threads'
frames and the thread list without the GIL, while they run, and killed healthy ranks with
SIGSEGV when a thread (an async checkpoint's writer) came, went or returned under it. SIGTERM
(and SIGINT) only set a flag: the training loop finishes its step, every rank agrees through
the per-step all-reduce, a checkpoint is saved and the run exits 0. The two handlers are
separate, so a stack dump never swallows a stop.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

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
    """SIGUSR1 -> ``stacks/rank-R-<unix-ms>.txt`` with every thread's Python stack, in
    faulthandler's format (``nsa_tui/health/stacks.py`` reads it).

    :meth:`install` (on the main thread) gives SIGUSR1 a Python handler that does nothing but
    have the interpreter's C-level handler write the signal's number to the wakeup fd, in
    whatever thread the signal lands on; the ``nsa-stacks`` thread waits on that fd (without the
    GIL) and writes the dump with the GIL held (``sys._current_frames``), so no thread moves its
    frames while they are read and no signal handler walks them.
    """

    MAX_FRAMES = 100  # per thread, as faulthandler

    def __init__(self, stacks_dir: Path, rank: int) -> None:
        self.dir, self.rank = stacks_dir, rank
        self.pending = stacks_dir / pending_stack_file(rank)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None
        self._old_wakeup = -1
        self._last_ms = 0

    def install(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        r, w = self._pipe = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)  # the wakeup fd does the work
        self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, args=(r,), name="nsa-stacks", daemon=True)
        self._thread.start()

    def _watch(self, fd: int) -> None:
        while not self._stop.is_set():
            try:
                if not select.select([fd], [], [], 0.2)[0]:
                    continue
                # one byte per signal caught (SIGTERM's and SIGINT's too: their handlers act on those)
                if signal.SIGUSR1 in os.read(fd, 512) and not self._stop.is_set():
                    self.write()
            except Exception:
                if self._stop.wait(0.2):
                    return

    def write(self) -> Path:
        """Every thread's stack into a file of its own (written, then renamed into place)."""
        me = threading.get_ident()
        blocks = [self._block(ident, frame, ident == me) for ident, frame in sys._current_frames().items()]
        with open(self.pending, "w") as fh:
            fh.write("\n".join(blocks))
        ms = self._last_ms = max(int(time.time() * 1000), self._last_ms + 1)  # never overwrite one
        final = self.dir / stack_file(self.rank, ms)
        os.replace(self.pending, final)
        return final

    @classmethod
    def _block(cls, ident: int, frame: FrameType | None, current: bool) -> str:
        lines = [f"{'Current thread' if current else 'Thread'} 0x{ident:016x} (most recent call first):"]
        depth = 0
        while frame is not None:
            if depth == cls.MAX_FRAMES:
                lines.append("  ...")
                break
            code = frame.f_code
            line = frame.f_lineno if frame.f_lineno is not None else "???"
            lines.append(f'  File "{code.co_filename}", line {line} in {code.co_name}')
            frame, depth = frame.f_back, depth + 1
        if depth == 0:
            lines.append("  <no Python frame>")
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self._stop.set()
        try:
            # a dump request during teardown must not turn a clean exit into a death by signal:
            # ignored from now on, never the default action (terminate)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            if self._pipe is not None:
                signal.set_wakeup_fd(self._old_wakeup)
        except ValueError:  # not the main thread: the no-op handler stays, harmless
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        try:
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
