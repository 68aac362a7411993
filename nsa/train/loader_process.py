"""This rank's micro-batches made in a child process (``data.loader: process``).

Why: the loader thread's Python (reading documents, tokenizing, packing) holds the GIL that
the training thread needs between kernel launches. A step bound by the host then waits for
it: on an H200 a dense-125m step took 71.6 ms in nsa-train against 63.0 ms bare, with 6.5 ms
of the loader thread's Python per micro-batch; ``bench/loader_gil.py`` shows the same on a
CPU. A process has a GIL of its own; the training thread only unpickles each batch (one
array) and pins it.

The child builds the data source, the tokenizer and the packers from the config and the
checkpoint's positions, and runs the same ``micro_batches`` as the thread: the batches, the
positions after each and the epoch messages are the thread's, exactly. The tokens cross in a
ring of shared-memory slots (one copy out on the training thread, into pinned memory on
CUDA); the queue carries only the slot and the positions. An error in the child
is raised by ``next``, with the child's traceback in its notes. It leaves with the run:
``close``, or the parent's death (the kernel's parent-death signal on Linux, and a check of
its parent before every batch elsewhere), never lingering after the rank that started it. It
is not a rank to the host agent: its environment lacks ``RANK``, so a stack dump (SIGUSR1 to
every rank) never reaches it, while the run's id, which a kill goes by, stays.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - its pickling of shared-memory tensors, for the ring

from nsa.config import DataConfig
from nsa.train.data import Batch, Packer, StreamPos, micro_batches
from nsa.train.sources import build_source
from nsa.train.tokenizer import build_tokenizer

__all__ = ["LoaderSpec", "ProcessLoader"]

POLL_S = 0.2  # how often a waiting child looks at its stop flag and its parent
RANK_KEYS = ("RANK", "LOCAL_RANK")


@dataclass
class LoaderSpec:
    """What the child needs to make this rank's batches (picklable: the config, not the source)."""

    data: DataConfig
    streams: list[int]
    n_streams: int
    window: int
    positions: dict[int, StreamPos]
    micro_per_stream: int
    batch_size: int
    slow_s: float = 0.0


class ProcessLoader:
    """``PrefetchLoader``'s interface (``next``, ``ready``, ``close``) over a child process that
    makes the batches, ``prefetch`` ahead."""

    def __init__(self, spec: LoaderSpec, prefetch: int, pin: bool = False) -> None:
        self.pin = pin
        ctx = mp.get_context("spawn")  # never fork a process that holds threads and CUDA state
        queued = max(1, prefetch)
        self._q: Any = ctx.Queue(maxsize=queued)
        # Slots for the queued batches, the one being copied out here and the one being written:
        # the child writes a slot only after its previous batch entered the queue, so at most
        # ``queued + 1`` others are still to be read.
        slots = (queued + 2, spec.batch_size, spec.window)
        self._ring = torch.zeros(slots, dtype=torch.int64).share_memory_()
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_produce, args=(spec, self._ring, self._q, self._stop, os.getpid()),
                                 name="nsa-data", daemon=True)
        try:
            with _not_a_rank():
                self._proc.start()
        except OSError as exc:  # no processes left to this user, no /dev/shm: say what to set
            raise RuntimeError(f"cannot start the data loader's process ({type(exc).__name__}: {exc}); "
                               "data.loader: thread makes the batches in a thread instead") from exc
        self.pid = self._proc.pid

    def next(self) -> Batch:
        while True:
            try:
                item = self._q.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self._proc.is_alive() and self._q.empty():
                    raise RuntimeError(f"the data process (pid {self.pid}) died: exit code "
                                       f"{self._proc.exitcode}") from None
        if isinstance(item, BaseException):
            raise item
        slot, stream, positions, events = item
        tokens = torch.empty(self._ring.shape[1:], dtype=torch.int64, pin_memory=self.pin)
        tokens.copy_(self._ring[slot])
        return Batch(tokens, stream, positions, events)

    def ready(self) -> bool:
        return not self._q.empty()

    def close(self) -> None:
        """Stop the child and wait for it (killed if it has not left within seconds)."""
        self._stop.set()
        deadline = time.monotonic() + 5.0
        while self._proc.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                self._q.get(timeout=POLL_S)  # drained: a child blocked on a full queue sees the flag
            self._proc.join(timeout=0)
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(timeout=5.0)
        self._q.close()
        self._q.cancel_join_thread()


@contextlib.contextmanager
def _not_a_rank() -> Iterator[None]:
    """The child's environment without the rank's identity (``RANK``, ``LOCAL_RANK``): the host
    agent finds a run's ranks by their environment and signals them (SIGUSR1 for a stack dump),
    and the data process is not one. The run's id stays, so killing the run kills it too."""
    saved = {k: os.environ.pop(k) for k in RANK_KEYS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this process when its parent exits."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` with the child's traceback in its notes, or a RuntimeError that says what it was
    when it cannot cross to the parent."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - whatever the type, the parent gets its text
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    add_note = getattr(exc, "add_note", None)  # Python 3.11+
    if add_note is not None:
        add_note(f"in the data process:\n{text}")
    return exc


def _produce(spec: LoaderSpec, ring: torch.Tensor, out: Any, stop: Any, parent: int) -> None:
    """The child: batches into ``ring``'s slots, in turn, and their slots into ``out``, until
    ``stop`` is set or the parent is gone."""
    _die_with_parent()
    # ^C, a stop (Slurm's scancel TERMs every process of the job) and stack dumps are for the
    # rank, which may need more batches to finish its step and then closes us (or dies: the
    # parent-death signal)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    out.cancel_join_thread()  # leaving never waits for the parent to read what is still queued
    torch.set_num_threads(1)  # one copy per batch: no pool of threads beside the ranks' own

    def gone() -> bool:
        return stop.is_set() or os.getppid() != parent

    def put(item: Any) -> bool:
        while not gone():
            try:
                out.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    try:
        source = build_source(spec.data)
        tokenizer = build_tokenizer(spec.data)
        packers = {s: Packer(source, tokenizer, s, spec.n_streams, "train", spec.window,
                             pos=spec.positions.get(s)) for s in spec.streams}
        events: list[str] = []
        for packer in packers.values():
            packer.on_epoch = events.append
        made = micro_batches(packers, spec.micro_per_stream, spec.batch_size, spec.slow_s, events)
        for k, (tokens, stream, positions, said) in enumerate(made):
            slot = k % ring.shape[0]
            ring[slot].copy_(torch.from_numpy(tokens))
            if not put((slot, stream, positions, said)):
                return
    except BaseException as exc:  # noqa: BLE001 - handed to the training thread, never swallowed
        put(_picklable(exc))
        while not gone():  # the parent reads it, then closes us
            stop.wait(POLL_S)
