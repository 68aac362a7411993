"""Evidence of a stall, captured when it happens, into the run directory.

The watchdog calls :func:`capture` once per stall, before anyone looks, so the evidence
exists even if the run is killed before morning. Every rank gets SIGUSR1 (faulthandler
writes all its threads' stacks to ``stacks/rank-R-<ms>.txt``: the mechanism of the agent's
``dump``), ``py-spy dump`` where it is installed (it also reads a rank that cannot run its
handler, e.g. one stopped by SIGSTOP), and on CUDA a request to the NCCL flight recorder
through ``nccl/pipe_R.pipe`` (its dump lands in ``nccl/rank_R``). ``stacks/watchdog-<ms>.txt``
records what the watchdog saw of each rank: its pid, its process state (``T (stopped)``,
``S (sleeping)``), where the kernel has it waiting, and which of the above it produced.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from nsa.contract import Beat
from nsa.contract.rundir import NCCL, STACKS, rank_of_stack_file, stack_file, watchdog_stack_file
from nsa_tui.agent.owners import own_part
from nsa_tui.agent.procs import run_process

PY_SPY_TIMEOUT_S = 20.0


@dataclass
class Captured:
    files: list[str] = field(default_factory=list)  # relative to the run directory
    notes: list[str] = field(default_factory=list)


def _proc_state(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "gone"


def _wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
    except OSError:
        return "-"


def _new_stacks(stacks: Path, since: float) -> dict[int, str]:
    """rank -> the newest faulthandler file written since ``since``."""
    out: dict[int, tuple[float, str]] = {}
    try:
        entries = list(os.scandir(stacks))
    except OSError:
        return {}
    for e in entries:
        name = e.name
        rank = rank_of_stack_file(name, py_spy=False)
        if rank is None:
            continue
        try:
            mtime = e.stat().st_mtime
        except OSError:
            continue
        if mtime >= since - 0.5 and mtime > out.get(rank, (0.0, ""))[0]:
            out[rank] = (mtime, f"{STACKS}/{name}")
    return {k: v for k, (_, v) in out.items()}


def _ask_nccl(run_dir: Path, rank: int) -> str | None:
    """Write to the rank's flight-recorder pipe (never blocks: a pipe without reader is skipped)."""
    pipe = run_dir / NCCL / f"pipe_{rank}.pipe"
    try:
        if not stat.S_ISFIFO(os.stat(pipe).st_mode):
            return None
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        os.write(fd, b"1\n")
    except OSError:
        return None
    finally:
        os.close(fd)
    return f"{NCCL}/rank_{rank}"


def capture(run_dir: Path, run_id: str, beats: dict[int, Beat], wait_s: float = 3.0,
            why: str = "") -> Captured:
    """Stacks of every live rank (and the NCCL flight recorder on CUDA) into ``run_dir``."""
    out = Captured()
    stacks = run_dir / STACKS
    stacks.mkdir(mode=0o700, exist_ok=True)
    t0 = time.time()
    ms = int(t0 * 1000)
    live = {}
    seen: dict[int, str] = {}  # each rank's state as found, before anything is done to it
    for rank, b in sorted(beats.items()):
        proc = run_process(b.pid, run_id, str(own_part(run_dir)))
        if proc is None or b.pid is None:
            continue
        live[rank] = b
        seen[rank] = f"state {_proc_state(b.pid)} (kernel wait: {_wchan(b.pid)})"
        try:
            os.kill(b.pid, signal.SIGUSR1)
        except (ProcessLookupError, PermissionError):
            pass
    nccl: dict[int, str] = {}
    for rank, b in live.items():
        if b.device.type == "cuda":
            got = _ask_nccl(run_dir, rank)
            if got:
                nccl[rank] = got
    stacks_by_rank: dict[int, str] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        stacks_by_rank = _new_stacks(stacks, t0)
        if len(stacks_by_rank) >= len(live):
            break
        time.sleep(0.2)
    time.sleep(0.2)  # let the last writer finish
    stacks_by_rank = _new_stacks(stacks, t0)
    spy = shutil.which("py-spy")
    spied: dict[int, str] = {}
    if spy:
        for rank, b in live.items():
            name = f"{STACKS}/{stack_file(rank, ms, py_spy=True)}"
            try:
                res = subprocess.run([spy, "dump", "--pid", str(b.pid)], capture_output=True, text=True,
                                     timeout=PY_SPY_TIMEOUT_S)
                text = res.stdout + res.stderr
            except (OSError, subprocess.TimeoutExpired) as exc:
                text = f"py-spy failed: {exc}"
            _write_private(run_dir / name, text)
            spied[rank] = name
    else:
        out.notes.append("py-spy not installed: faulthandler stacks only")
    for got in nccl.values():
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not (run_dir / got).exists():
            time.sleep(0.2)
    lines = [f"nsa-tui watchdog evidence, {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t0))}"
             f"{': ' + why if why else ''}"]
    for rank, b in sorted(beats.items()):
        if rank not in live:
            lines.append(f"rank {rank}: pid {b.pid} gone")
            continue
        got = ", ".join(g for g in (stacks_by_rank.get(rank), spied.get(rank), nccl.get(rank)) if g)
        lines.append(f"rank {rank}: pid {b.pid} {seen[rank]}, "
                     f"step {b.step}, phase {b.phase.value}, device {b.device.type}"
                     f"{':' + str(b.device.index) if b.device.index is not None else ''}; files: "
                     f"{got or 'none (a stopped rank cannot run its stack handler)'}")
    summary = f"{STACKS}/{watchdog_stack_file(ms)}"
    _write_private(run_dir / summary, "\n".join(lines) + "\n")
    out.files = [summary, *sorted(stacks_by_rank.values()), *sorted(spied.values()),
                 *sorted(g for g in nccl.values() if (run_dir / g).exists())]
    missing = sorted(set(live) - set(stacks_by_rank))
    if missing:
        out.notes.append(f"no faulthandler stack from rank(s) {missing} within {wait_s:.0f} s")
    return out


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
