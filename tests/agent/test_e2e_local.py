"""Real tiny nsa-train runs (2 ranks on CPU) through the local transport."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from nsa.contract import RunStatus
from nsa_tui.agent.procs import run_processes
from nsa_tui.health.alerts import AlertDetector, Thresholds
from nsa_tui.hosts.client import HostClient
from tests.agent.e2e import LONG, SMOKE, is_step, stop_all, until

pytestmark = pytest.mark.slow


async def test_dump_kill_and_fallback_keep_the_global_batch(tmp_path: Path) -> None:
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    ids: list[str] = []
    try:
        run = await c.launch(SMOKE, nproc=2, overrides=LONG)
        ids.append(run.run_id)
        await until(c.watch(run.run_id, streams=["metrics"]), is_step(8), 90)
        dump = await c.dump(run.run_id)
        assert sorted(dump.ranks) == [0, 1]
        texts = [f.text for f in dump.files if f.name.startswith("stacks/rank-")]
        assert len(texts) == 2 and all("File " in t for t in texts)

        fb = await c.fallback(run.run_id, grace_s=30)
        ids.append(fb.run_id)
        assert fb.killed is not None and fb.killed.remaining == [] and run_processes(run.run_id) == []
        parent = (await c.run(run.run_id)).info
        assert (await c.run(run.run_id)).status == RunStatus.STOPPED
        assert fb.resume_from is not None
        ck_step = int(Path(fb.resume_from).name.split("-")[1])
        first = await until(c.watch(fb.run_id, streams=["metrics"]), is_step(0), 90)
        assert first.data[0].step == ck_step + 1  # the step count continues
        child = (await c.run(fb.run_id)).info
        assert child.world_size == 1 and child.parent_run == run.run_id
        assert child.global_batch == parent.global_batch
        assert parent.grad_accum is not None and child.grad_accum == parent.grad_accum * parent.world_size
        # threads per rank on the agent's launch path: the usable CPUs over the ranks on this host
        assert parent.cpu_threads is not None and child.cpu_threads is not None
        usable = child.cpu_threads.usable_cpus
        assert (parent.cpu_threads.local_ranks, child.cpu_threads.local_ranks) == (2, 1)
        assert (parent.cpu_threads.per_rank, child.cpu_threads.per_rank) == (max(1, usable // 2), usable)

        killed = await c.kill(fb.run_id, grace_s=30)
        assert killed.was_running and killed.remaining == []
        assert run_processes(fb.run_id) == []
        assert (await c.run(fb.run_id)).status == RunStatus.STOPPED
        # every file and directory of both runs (checkpoints, stacks, logs) is private to its user
        for rid in (run.run_id, fb.run_id):
            for path in [tmp_path / rid, *(tmp_path / rid).rglob("*")]:
                mode = path.stat().st_mode & 0o777
                assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    finally:
        await stop_all(c, ids)
        await c.close()


async def test_two_clients_falling_back_the_same_run_start_exactly_one_run(tmp_path: Path) -> None:
    """Two panels (two agents) press `f` on the same run at once: one new run from the checkpoint,
    and both get it (the second sees the first's relaunch under the run's lock)."""
    a = HostClient("local", runs_root=str(tmp_path))
    b = HostClient("local", runs_root=str(tmp_path))
    await a.start()
    await b.start()
    ids: list[str] = []
    try:
        run = await a.launch(SMOKE, nproc=2, overrides=LONG)
        ids.append(run.run_id)
        await until(a.watch(run.run_id, streams=["metrics"]), is_step(6), 90)
        one, two = await asyncio.gather(a.fallback(run.run_id, grace_s=30),
                                        b.fallback(run.run_id, grace_s=30))
        ids += [one.run_id, two.run_id]
        assert one.run_id == two.run_id
        assert sorted([one.again, two.again]) == [False, True]
        children = [v for v in await a.runs() if v.parent_run == run.run_id]
        assert [v.run_id for v in children] == [one.run_id]
        again = await a.fallback(run.run_id)  # later, too: the same run, nothing new started
        assert again.run_id == one.run_id and again.again
        assert len(await a.runs()) == 2
    finally:
        await stop_all(a, ids)
        await a.close()
        await b.close()


async def test_hang_on_rank_1_alerts_within_threshold_and_healthy_run_stays_quiet(tmp_path: Path) -> None:
    floor = 5.0
    th = Thresholds(train_floor_s=floor, train_factor=10.0, no_heartbeat_s=20.0)
    det = AlertDetector("local", th)
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    ids: list[str] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        hang = await c.launch(SMOKE, nproc=2, name="hang",
                              overrides=LONG + ["debug.hang_at_step=15", "debug.hang_rank=1"])
        ok = await c.launch(SMOKE, nproc=2, name="healthy", overrides=LONG)
        ids += [hang.run_id, ok.run_id]

        async def feed(it) -> None:
            async for ev in it:
                det.feed(ev)

        tasks = [asyncio.create_task(feed(c.watch(r))) for r in ids]
        tasks.append(asyncio.create_task(feed(c.host_events())))
        deadline = time.monotonic() + 120
        stall = None
        while time.monotonic() < deadline and stall is None:
            await asyncio.sleep(0.2)
            alerts = det.check(time.time())
            # throughput may truly drop when other work loads the machine; liveness may not
            assert not [a for a in alerts if a.run == ok.run_id and a.kind != "throughput"], alerts
            stall = next((a for a in alerts if a.kind == "stall" and a.rank == 1), None)
        assert stall is not None, "no stall alert for rank 1"
        rank1 = det.runs[hang.run_id].ranks[1]
        threshold = det.train_threshold(hang.run_id)
        latency = (time.time() - det.skew()) - rank1.advanced_at
        print(f"\nMEASURE hang alert latency: {latency:.2f} s after rank 1's last step "
              f"(threshold {threshold:.1f} s)")
        assert threshold == pytest.approx(floor, abs=0.01) or threshold < 15
        assert latency <= threshold + 2.0
        assert stall.last_step == 15 and stall.phase == "train" and stall.heartbeat_age_s < 3
        # the healthy run over the same time: still no alert, still stepping
        assert [a for a in det.check(time.time()) if a.run == ok.run_id and a.kind != "throughput"] == []
        ok_rank = det.runs[ok.run_id].ranks[0]
        assert ok_rank.step > 15
    finally:
        for t in tasks:
            t.cancel()
        await stop_all(c, ids)
        await c.close()
