"""A full disk, for real: runs on a small tmpfs mounted for the test (needs root and a kernel that
lets this container mount; skipped otherwise, saying so). Nothing is injected: the trainer, the
watchdog and the agent meet real ENOSPC errors.

Before the fix: train.log cut mid-traceback, "No space left on device" recorded nowhere, run.json
still ``running``, the partial checkpoint kept the disk full, and ``resume`` failed and left an
empty run directory behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nsa.contract import AlertEvent, RunInfo, RunStatus, decode_lines, read_json
from nsa_tui.agent.procs import run_processes
from nsa_tui.health.ledger import ALERTS_FILE
from nsa_tui.hosts.client import AgentError, HostClient
from tests.agent.e2e import SMOKE

pytestmark = pytest.mark.slow


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({res.stderr.strip() or res.returncode}); "
                    "the full-disk tests need one (root in a container that allows mount)")
    try:
        yield mnt
    finally:
        for d in mnt.rglob("launch.json"):
            for p in run_processes(d.parent.name):
                os.kill(p.pid, signal.SIGKILL)
        for _ in range(50):
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)


def fill(disk: Path, leave: int) -> None:
    """Take the disk's free space down to about ``leave`` bytes."""
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(disk / "filler", "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))


def fill_up(path: Path) -> None:
    """Every last byte."""
    with open(path, "ab", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass


async def test_a_filling_disk_alerts_first_then_the_failure_says_enospc_and_resume_refuses(
        tiny_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "settings.yaml").write_text(yaml.safe_dump({
        "alerts": {"disk_warn_bytes": 700_000, "disk_critical_bytes": 100_000},
        "watchdog": {"interval_s": 0.2, "host_every_s": 0.2}}))
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(tmp_path / "settings.yaml"))
    root = tiny_disk / "runs"
    root.mkdir()
    fill(tiny_disk, 1_250_000)  # room for boot and two checkpoints (~0.4 MB each), not a third
    c = HostClient("local", runs_root=str(root))
    await c.start()
    try:
        res = await c.launch(SMOKE, nproc=2, overrides=["train.steps=100000", "train.save_every=5",
                                                         "train.eval_every=100000", "debug.slow_data_s=0.03"])
        d = root / res.run_id
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (await c.run(res.run_id)).status.is_terminal():
            await asyncio.sleep(0.5)
        view = await c.run(res.run_id)
        info = read_json(d / "run.json", RunInfo)
        assert view.status == RunStatus.FAILED and info is not None and info.status == RunStatus.FAILED
        assert "no space left on device (ENOSPC)" in (info.exit_reason or ""), info.exit_reason
        assert not list((d / "checkpoints").glob(".tmp-step-*"))  # the partial checkpoint is gone
        await asyncio.sleep(1.0)  # the supervisor's last lines
        events = decode_lines((d / ALERTS_FILE).read_text().splitlines(), AlertEvent)
        disk = next(e for e in events if e.alert.kind == "disk" and e.action == "raised")
        full = next(e for e in events if e.alert.kind == "disk_full")
        assert disk.ts < (info.ended_at or 0) and disk.ts < full.ts  # said before it was full
        assert "ENOSPC" in full.alert.message or "no space" in full.alert.message
        before = sorted(p.name for p in root.iterdir())
        with pytest.raises(AgentError) as err:
            await c.resume(res.run_id)
        assert err.value.code == "no_space" and "MiB free" in err.value.message
        assert sorted(p.name for p in root.iterdir()) == before  # no empty run directory
        assert json.loads((d / "run.json").read_text())["status"] == "failed"
    finally:
        await c.close()


def test_run_json_says_enospc_even_with_not_one_byte_left(tiny_disk: Path, tmp_path: Path) -> None:
    """The disk fills to the last byte mid-run: the atomic writer cannot make a new file's worth of
    room, so the failure goes into run.json's own blocks."""
    run_dir = tiny_disk / "run"
    cmd = [sys.executable, "-m", "nsa.train", "--config", SMOKE, "--run-dir", str(run_dir), "--set",
           "train.steps=100000", "train.save_every=100000", "train.eval_every=100000",
           "debug.slow_data_s=0.02"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(tmp_path / "out.log", "wb") as out:  # not on the full disk
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            info = read_json(run_dir / "run.json", RunInfo)
            if info is not None and info.status == RunStatus.RUNNING:
                break
            time.sleep(0.2)
        fill_up(tiny_disk / "filler")
        assert proc.wait(120) == 1
    finally:
        proc.kill()
    assert os.statvfs(tiny_disk).f_bavail == 0  # nothing was freed for it
    info = read_json(run_dir / "run.json", RunInfo)
    assert info is not None and info.status == RunStatus.FAILED
    assert "no space left on device (ENOSPC)" in (info.exit_reason or "")
