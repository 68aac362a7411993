"""Helpers of the tests that drive two sshd "hosts" (tests/sshd.py's SshNodes): the CLI against
them, clients connected to both, and waits for a state of the run they share."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from nsa_tui.hosts import coordinator as co
from nsa_tui.hosts.client import HostClient
from nsa_tui.hosts.merge import MergedRun, merge
from nsa_tui.transport.ssh import SshTransport
from tests.sshd import SshNodes


def cli(nodes: SshNodes, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsa_tui.cli", *args], env=nodes.env(), capture_output=True,
                          text=True, timeout=timeout)


@contextlib.asynccontextmanager
async def connected(nodes: SshNodes) -> AsyncIterator[dict[str, HostClient]]:
    """A client per host, each connected over its sshd; all closed afterwards."""
    def make(dest: str) -> HostClient:
        tr = SshTransport(dest, config=[str(nodes.ssh_config)], remote_python=sys.executable)
        return HostClient(dest, transport=tr)

    clients, bad = await co.connect(nodes.aliases, make)
    assert not bad, bad
    try:
        yield clients
    finally:
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)


async def until(what: str, fn: Callable[[], Any], timeout: float = 150, show: Callable[[], Any] | None = None
                ) -> Any:
    """Poll ``fn`` (async) until it returns something truthy: states, not times. ``show``
    (async) says more about the state when it never comes."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = await fn()
        if last:
            return last
        await asyncio.sleep(0.5)
    extra = f"; {await show()}" if show is not None else ""
    raise AssertionError(f"timed out waiting for {what}; last: {last}{extra}")


async def merged(clients: dict[str, HostClient], run_id: str) -> MergedRun:
    """The run as the panel sees it: every host's part, merged."""
    return merge(run_id, await co.parts(clients, run_id))


def stepped(n: int, clients: dict[str, HostClient], run_id: str) -> Callable[[], Any]:
    """A check for ``until``: both ranks at step ``n`` or later (the merged run, else None)."""
    async def check() -> MergedRun | None:
        m = await merged(clients, run_id)
        ok = len(m.ranks) == 2 and min(b.step for _, b in m.ranks) >= n
        return m if ok else None
    return check


def parts_report(nodes: SshNodes, run_id: str, lines: int = 25) -> str:
    """What each host's part of a run says about how it ended, for a failing assertion: the
    supervisor's ``exit.json`` (torchrun's exit code or signal), each rank's last heartbeat
    (phase, step, error), the stack dumps, and the tail of ``train.log`` (torchrun names every
    failed rank with its exit code or signal; a rank that died of a signal left faulthandler's
    report there)."""
    out = []
    for alias, server in zip(nodes.aliases, nodes.servers):
        part = server.runs_root / run_id
        out.append(f"=== {alias}: {part}")
        exit_json = part / "exit.json"
        ended = exit_json.read_text().strip() if exit_json.is_file() else "(none: still running?)"
        out.append(f"exit.json: {ended}")
        for beats in sorted((part / "heartbeats").glob("rank-*.jsonl")):
            last = beats.read_text(errors="replace").strip().splitlines()[-1:]
            beat = json.loads(last[0]) if last else {}
            error = (beat.get("error") or "").strip().splitlines()[:1]
            out.append(f"{beats.stem}: last beat pid {beat.get('pid')} phase {beat.get('phase')} "
                       f"step {beat.get('step')} error {error[0][:300] if error else None}")
        stacks = sorted(p.name for p in (part / "stacks").glob("*")) if (part / "stacks").is_dir() else []
        out.append(f"stacks/: {stacks}")  # a .rank-R.pending left behind: a dump was being written
        log = part / "train.log"
        tail = log.read_text(errors="replace").splitlines()[-lines:] if log.is_file() else ["(no train.log)"]
        out.append("train.log tail:\n" + "\n".join(tail))
    return "\n".join(out)
