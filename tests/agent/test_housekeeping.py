"""Archive and delete through the real agent: never of a live run, delete says what it frees."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from nsa_tui.agent.runs import RunStore
from nsa_tui.hosts.client import AgentError, HostClient
from tests.agent.test_runs import fake_run, reap, wait_children

DONE = "20260101-000000-done-0001"
CHILD = "20260101-000100-done-resume-0002"
LIVE = "20260101-000200-live-0003"


def finished(root: Path, run_id: str, parent: str | None = None, payload: int = 0) -> Path:
    d = root / run_id
    d.mkdir(parents=True, mode=0o700)
    (d / "run.json").write_text(json.dumps({"run_id": run_id, "name": "done", "status": "finished",
                                            "step": 3, "parent_run": parent}))
    if payload:
        (d / "checkpoints").mkdir()
        (d / "checkpoints" / "model.pt").write_bytes(b"\0" * payload)
    return d


def du(path: Path) -> tuple[int, int]:
    """(bytes, files) as `du -b` and `find -type f` would count them."""
    sizes = [os.lstat(os.path.join(r, n)).st_size for r, _, names in os.walk(path) for n in names]
    return sum(sizes), len(sizes)


async def test_archive_hides_a_finished_run_and_refuses_a_live_one(tmp_path: Path) -> None:
    finished(tmp_path, DONE)
    store = RunStore(tmp_path)
    _, proc = fake_run(store, LIVE, env_id=LIVE)
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        wait_children(3, LIVE, proc.pid)
        runs = c.watch_runs()
        first = await asyncio.wait_for(runs.__anext__(), 20)
        assert {v.run_id: v.archived for v in first.data.runs} == {DONE: False, LIVE: False}
        view = await c.archive(DONE)
        assert view.archived and (tmp_path / DONE / "archived.json").is_file()
        ev = await asyncio.wait_for(runs.__anext__(), 20)  # the run list hears of it
        assert ev.kind == "run" and ev.data.run_id == DONE and ev.data.archived
        assert {v.run_id: v.archived for v in await c.runs()} == {DONE: True, LIVE: False}
        with pytest.raises(AgentError) as err:
            await c.archive(LIVE)
        assert err.value.code == "running" and "stop it" in err.value.message
        assert not (tmp_path / LIVE / "archived.json").exists()
        assert not (await c.archive(DONE, archived=False)).archived
        assert not (tmp_path / DONE / "archived.json").exists()
    finally:
        await c.close()
        reap(proc)


async def test_delete_says_what_it_frees_and_never_takes_a_live_run(tmp_path: Path) -> None:
    parent = finished(tmp_path, DONE, payload=3 << 20)
    finished(tmp_path, CHILD, parent=DONE)
    store = RunStore(tmp_path)
    _, proc = fake_run(store, LIVE, env_id=LIVE)
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        wait_children(3, LIVE, proc.pid)
        dry = await c.delete(DONE, dry_run=True)
        assert (dry.bytes, dry.files) == du(parent) and dry.bytes >= 3 << 20
        assert not dry.deleted and dry.children == [CHILD] and parent.is_dir()
        with pytest.raises(AgentError) as err:
            await c.delete(LIVE)
        assert err.value.code == "running" and (tmp_path / LIVE).is_dir()
        runs = c.watch_runs()
        await asyncio.wait_for(runs.__anext__(), 20)
        done = await c.delete(DONE)
        assert done.deleted and done.bytes == dry.bytes
        assert not parent.exists() and not any(p.name.startswith(".deleting") for p in tmp_path.iterdir())
        ev = await asyncio.wait_for(runs.__anext__(), 20)
        assert ev.kind == "run_removed" and ev.data.run_id == DONE
        assert sorted(v.run_id for v in await c.runs()) == [CHILD, LIVE]  # the child keeps its files
        with pytest.raises(AgentError) as err:
            await c.delete(DONE)
        assert err.value.code == "no_such_run"
    finally:
        await c.close()
        reap(proc)


async def test_delete_refuses_a_run_whose_continuation_is_alive(tmp_path: Path) -> None:
    finished(tmp_path, DONE)
    store = RunStore(tmp_path)
    d, proc = fake_run(store, LIVE, env_id=LIVE)
    (d / "run.json").write_text(json.dumps({"run_id": LIVE, "name": "x", "status": "running",
                                            "parent_run": DONE}))
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        wait_children(3, LIVE, proc.pid)
        with pytest.raises(AgentError) as err:
            await c.delete(DONE)
        assert err.value.code == "running" and LIVE in err.value.message
        assert (tmp_path / DONE).is_dir()
    finally:
        await c.close()
        reap(proc)
