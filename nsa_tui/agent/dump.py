"""Stack dumps of a run's ranks: SIGUSR1 makes each rank's faulthandler write its threads'
stacks to ``stacks/``; py-spy adds its view where installed. Ranks without a stack are named
with the reason (not alive here, or signalled but silent), so a missing rank is never just absent.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from nsa.contract import LaunchInfo, RunInfo, read_json
from nsa.contract.replies import DumpFile, DumpResult, MissingRank
from nsa.contract.rundir import LAUNCH_JSON, RUN_JSON, STACKS, rank_of_stack_file, stack_file
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.owners import own_part
from nsa_tui.agent.procs import run_processes


async def dump(run_dir: Path, run_id: str, wait_s: float = 3.0) -> DumpResult:
    """SIGUSR1 to every rank (faulthandler stacks), plus py-spy where installed."""
    ranks = [p for p in await asyncio.to_thread(run_processes, run_id, None, False, str(own_part(run_dir)))
             if p.rank is not None]
    if not ranks:
        raise OpError("not_running", f"{run_id} has no live rank to dump")
    stacks = run_dir / STACKS
    t0 = time.time()
    for p in ranks:
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    files: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        files = _new_files(stacks, t0)
        if len(files) >= len(ranks):
            await asyncio.sleep(0.2)  # let the last writer finish
            files = _new_files(stacks, t0)
            break
    notes = []
    spy = shutil.which("py-spy")
    if spy:
        stacks.mkdir(mode=0o700, exist_ok=True)
        for p in ranks:
            if p.rank is None:  # filtered above; says so to the type checker
                continue
            res = await asyncio.to_thread(
                subprocess.run, [spy, "dump", "--pid", str(p.pid)],
                capture_output=True, text=True, timeout=20,
            )
            name = f"{STACKS}/{stack_file(p.rank, int(time.time() * 1000), py_spy=True)}"
            text = res.stdout + res.stderr
            fd = os.open(run_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            files[name] = text
    else:
        notes.append("py-spy not installed: faulthandler stacks only")
    signalled = sorted(p.rank for p in ranks if p.rank is not None)
    return DumpResult(run_id=run_id, ranks=signalled, notes=notes,
                      files=[DumpFile(name=k, text=v) for k, v in sorted(files.items())],
                      missing=_missing_ranks(run_dir, signalled, files, wait_s))


def _missing_ranks(run_dir: Path, signalled: list[int], files: dict[str, str],
                   wait_s: float) -> list[MissingRank]:
    """Every rank of the run without a stack in this dump, and why: not alive here (with what
    its last heartbeat said), or signalled but silent."""
    from nsa_tui.agent.runs import latest_beats

    run = read_json(run_dir / RUN_JSON, RunInfo)
    launch = read_json(own_part(run_dir) / LAUNCH_JSON, LaunchInfo)
    world = (run.world_size if run else None) or (launch.nproc if launch else 1)
    have = {r for name in files if (r := rank_of_stack_file(name.rpartition("/")[2])) is not None}
    beats = {b.rank: b for b in latest_beats(run_dir)}
    out = []
    for rank in range(max(world, max(signalled, default=-1) + 1)):
        if rank in have:
            continue
        if rank in signalled:
            reason = (f"signalled (SIGUSR1) but wrote no stack within {wait_s:.0f} s: the process may be "
                      "stopped (SIGSTOP), a zombie, or blocking signals")
        elif rank in beats:
            b = beats[rank]
            ago = max(0.0, time.time() - b.ts)
            reason = (f"no live process of rank {rank} on this host; its last heartbeat, {ago:.0f} s ago, "
                      f"said phase {b.phase.value} at step {b.step}" + (f": {b.error.splitlines()[0]}"
                                                                        if b.error else ""))
        else:
            reason = f"no process and no heartbeat of rank {rank} on this host (never started here)"
        out.append(MissingRank(rank=rank, reason=reason))
    return out



def _new_files(stacks: Path, since: float) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        entries = list(os.scandir(stacks))
    except OSError:
        return out
    for e in entries:
        if rank_of_stack_file(e.name, py_spy=False) is not None and e.stat().st_mtime >= since - 0.5:
            try:
                out[f"{STACKS}/{e.name}"] = Path(e.path).read_text(errors="replace")
            except OSError:
                continue
    return out

