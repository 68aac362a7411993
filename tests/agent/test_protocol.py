"""The agent's protocol through the local transport: replies, errors, watch offsets."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsa.contract import PROTOCOL, RunStatus, StreamPos
from nsa.contract.protocol import Gap, RunsList
from nsa_tui.hosts.client import AgentError, Event, HostClient

RID = "20260101-000000-synthetic-0001"
REPO = Path(__file__).resolve().parents[2]


def test_raw_protocol_lines(tmp_path: Path) -> None:
    reqs = ['{"id":1,"op":"ping"}', "not json", '{"id":2,"op":"bogus"}',
            '{"id":3,"op":"run","args":{"run":"../x"}}',
            '{"id":4,"op":"kill","args":{"run":"x","bad_arg":1}}']
    out = subprocess.run([sys.executable, "-m", "nsa_tui.agent", "--runs-root", str(tmp_path)],
                         input="\n".join(reqs) + "\n", capture_output=True, text=True, timeout=60)
    msgs = [json.loads(line) for line in out.stdout.splitlines()]
    assert msgs[0]["hello"]["agent"] == PROTOCOL and msgs[0]["hello"]["runs_root"] == str(tmp_path)
    by_id = {m.get("id"): m for m in msgs[1:]}
    assert by_id[1]["ok"] and by_id[None]["error"]["code"] == "bad_request"
    assert by_id[2]["error"]["code"] == "unknown_op"
    assert by_id[3]["error"]["code"] == "no_such_run"
    assert by_id[4]["error"]["code"] == "bad_request"


async def test_bad_config_starts_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "configs/smoke-cpu.yaml").read_text().replace("steps: 6", "stepz: 6"))
    c = HostClient("local", runs_root=str(tmp_path / "runs"))
    await c.start()
    try:
        with pytest.raises(AgentError) as err:
            await c.launch(str(bad))
        assert err.value.code == "bad_config" and "stepz" in err.value.message
        line = bad.read_text().splitlines().index("  stepz: 6") + 1
        with pytest.raises(AgentError) as err:
            await c.launch(str(bad), upload=True)  # the host validates a temporary copy
        assert err.value.code == "bad_config"
        assert err.value.message.startswith(f"{bad}:{line}: unknown key 'train.stepz'"), err.value.message
        assert ".upload-" not in err.value.message
        with pytest.raises(AgentError) as err:
            await c.launch(str(REPO / "configs/smoke-cpu.yaml"), overrides=["train.nope=1"])
        assert err.value.code == "bad_config" and err.value.message.startswith("--set train.nope=1 (over ")
        assert await c.runs() == []
        assert [p.name for p in (tmp_path / "runs").iterdir()] == []  # no run dir, no temp file
    finally:
        await c.close()


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj))


def _append(path: Path, obj: dict | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write((json.dumps(obj) if isinstance(obj, dict) else obj) + "\n")


def metric(step: int, loss: float = 1.0) -> dict:
    return {"kind": "train", "ts": float(step), "step": step, "loss": loss, "tokens_per_s": 100.0}


def beat(rank: int, step: int) -> dict:
    return {"ts": float(step), "run_id": RID, "rank": rank, "step": step, "phase": "train"}


def finished_run(root: Path, steps: int = 0) -> Path:
    d = root / RID
    d.mkdir(mode=0o700)
    write_json(d / "run.json", {"run_id": RID, "name": "synthetic", "status": "finished", "step": steps})
    return d


async def _take(it, n: int, kinds: tuple[str, ...] = ("metrics", "beats", "log"), timeout: float = 20
                ) -> list[Event]:
    """The next events of ``it`` of ``kinds`` until their records number ``n``."""
    out: list[Event] = []
    count = 0

    async def go() -> None:
        nonlocal count
        async for ev in it:
            if ev.kind in kinds:
                out.append(ev)
                count += len(ev.data.lines) if ev.kind == "log" else len(ev.data)
                if count >= n:
                    return
    await asyncio.wait_for(go(), timeout)
    return out


def steps_of(events: list[Event]) -> list[int]:
    return [m.step for e in events if e.kind in ("metrics", "beats") for m in e.data]


async def test_watch_sends_a_bounded_view_then_live_lines_and_resumes_exactly(tmp_path: Path) -> None:
    """A run of any age costs the same to open: the metrics summary plus the last lines, each
    rank's newest beat, the log's tail (with a gap marker); then live lines; a client that
    missed a few lines gets exactly those."""
    d = finished_run(tmp_path)
    for s in range(1, 3001):
        _append(d / "metrics.jsonl", metric(s, loss=5.0 if s == 1234 else 1.0))
        _append(d / "heartbeats" / "rank-0.jsonl", beat(0, s))
        _append(d / "train.log", f"log line {s}")
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        it = c.watch(RID, recent_metrics=100, log_tail_bytes=1000)
        first: list[Event] = []
        async for ev in it:
            first.append(ev)
            if ev.kind == "synced":
                break
        kinds = [e.kind for e in first]
        assert kinds[0] == "status" and kinds[-1] == "synced"
        summary = next(e.data for e in first if e.kind == "summary")
        loss = summary.series["loss"]
        assert summary.upto_step == 3000 and sum(b.n for b in loss.buckets) == 3000
        assert len(loss.buckets) <= 512 and max(b.hi for b in loss.buckets) == 5.0  # the spike survives
        recent = [m.step for e in first if e.kind == "metrics" for m in e.data]
        assert recent == list(range(2901, 3001))  # full resolution for the newest lines only
        beats = [b.step for e in first if e.kind == "beats" for b in e.data]
        assert beats == [3000]  # the newest beat, not the history
        gap = next(e.data for e in first if e.kind == "gap")
        assert isinstance(gap, Gap) and gap.skipped_bytes > 0
        logs = [ln for e in first if e.kind == "log" for ln in e.data.lines]
        assert logs[-1] == "log line 3000" and 0 < len(logs) < 100
        seen = {e.stream: e.pos for e in first if e.kind in ("metrics", "beats", "log")}
        _append(d / "metrics.jsonl", metric(3001))
        live = await _take(it, 1, ("metrics",))
        assert steps_of(live) == [3001]
        await it.aclose()
        # a client that saw up to step 2999 asks for the rest: exactly steps 3000 and 3001
        size = (d / "metrics.jsonl").stat().st_size
        off = size - 2 * len((json.dumps(metric(3001)) + "\n").encode())
        at = StreamPos(gen=seen["metrics"].gen, offset=off)
        rest = await _take(c.watch(RID, streams=["metrics"], offsets={"metrics": at}), 2, ("metrics",))
        assert steps_of(rest) == [3000, 3001]
        assert seen["heartbeats/rank-0"].offset == (d / "heartbeats" / "rank-0.jsonl").stat().st_size
    finally:
        await c.close()


async def test_watch_of_an_ended_run_ends_with_a_final_status_after_its_backlog(tmp_path: Path) -> None:
    """The initial status already says finished; the non-initial one comes after every line."""
    d = finished_run(tmp_path, steps=50)
    for s in range(1, 51):
        _append(d / "metrics.jsonl", metric(s))
        _append(d / "heartbeats" / "rank-0.jsonl", beat(0, s))
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    seen: list[Event] = []
    try:
        async def until_final() -> None:
            async for ev in c.watch(RID):
                seen.append(ev)
                if ev.kind == "status" and not ev.initial and ev.data.status == RunStatus.FINISHED:
                    return
        await asyncio.wait_for(until_final(), 20)
    finally:
        await c.close()
    assert seen[0].kind == "status" and seen[0].initial and seen[0].data.status == RunStatus.FINISHED
    assert [m.step for e in seen if e.kind == "metrics" for m in e.data] == list(range(1, 51))
    assert [e.kind for e in seen[-2:]] == ["synced", "status"]


async def test_reconnect_after_agent_dies_has_no_gap_and_no_duplicate(tmp_path: Path) -> None:
    d = finished_run(tmp_path)
    states: list[str] = []
    c = HostClient("local", runs_root=str(tmp_path), on_state=lambda s: states.append(s.status))
    await c.start()
    steps: list[int] = []

    async def consume() -> None:
        async for ev in c.watch(RID, streams=["metrics"]):
            if ev.kind == "metrics":
                steps.extend(m.step for m in ev.data)
                if steps and steps[-1] == 60:
                    return

    task = asyncio.create_task(consume())
    try:
        for s in range(1, 61):
            _append(d / "metrics.jsonl", metric(s))
            if s == 20:
                await asyncio.sleep(0.8)
                c.drop_connection()  # the agent dies; lines 21.. are written while nobody reads
            await asyncio.sleep(0.02)
        await asyncio.wait_for(task, 30)
    finally:
        task.cancel()
        await c.close()
    assert steps == list(range(1, 61))
    assert "reconnecting" in states and states.count("connected") >= 2


async def test_malformed_lines_are_skipped_and_counted_never_fatal(tmp_path: Path) -> None:
    """One bad metrics line must not blind the panel to a run: every good line still arrives,
    the stream goes on, and the bad ones are counted."""
    d = finished_run(tmp_path)
    for line in (metric(1), '{"kind": "train", "step": "abc"}', "not json", metric(2),
                 '{"kind":"train","ts":1,"step":3,"loss":"abc"}', metric(4), "x" * 100_000):
        _append(d / "metrics.jsonl", line)
    _append(d / "heartbeats" / "rank-0.jsonl", '{"rank": "zero"}')
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        it = c.watch(RID, offsets={"metrics": StreamPos(), "heartbeats/rank-0": StreamPos()})
        events: list[Event] = []
        async for ev in it:
            events.append(ev)
            if ev.kind == "synced":
                break
        assert steps_of(events) == [1, 2, 4]
        synced = events[-1].data
        assert synced.bad_lines == {"metrics": 4, "heartbeats/rank-0": 1}
        _append(d / "metrics.jsonl", metric(5))  # and the stream goes on
        assert steps_of(await _take(it, 1, ("metrics",))) == [5]
    finally:
        await c.close()


async def test_watch_runs_pushes_new_runs_changes_and_removals(tmp_path: Path) -> None:
    import shutil

    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        it = c.watch_runs()
        first = await asyncio.wait_for(it.__anext__(), 20)
        assert first.kind == "runs" and isinstance(first.data, RunsList) and first.data.runs == []
        d = finished_run(tmp_path, steps=7)
        ev = await asyncio.wait_for(it.__anext__(), 20)
        assert ev.kind == "run" and ev.data.run_id == RID and ev.data.info.step == 7
        write_json(d / "run.json", {"run_id": RID, "name": "synthetic", "status": "failed", "step": 8})
        ev = await asyncio.wait_for(it.__anext__(), 20)
        assert ev.kind == "run" and ev.data.status == RunStatus.FAILED and ev.data.info.step == 8
        shutil.rmtree(d)
        ev = await asyncio.wait_for(it.__anext__(), 20)
        assert ev.kind == "run_removed" and ev.data.run_id == RID
    finally:
        await c.close()


async def test_status_reads_the_newest_beats_and_metrics_only(tmp_path: Path) -> None:
    d = finished_run(tmp_path, steps=500)
    for s in range(1, 501):
        for r in range(3):
            _append(d / "heartbeats" / f"rank-{r}.jsonl", beat(r, s))
        _append(d / "metrics.jsonl", metric(s))
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        rep = await c.status(RID)
        assert [(b.rank, b.step) for b in rep.beats] == [(0, 500), (1, 500), (2, 500)]
        assert [m.step for m in rep.recent_metrics] == list(range(437, 501))
        assert rep.run.status == RunStatus.FINISHED
    finally:
        await c.close()


async def test_an_oversized_request_line_is_refused_and_the_agent_keeps_serving(tmp_path: Path) -> None:
    """A 17 MiB config upload must get a clear error, not end the agent (and every watch with it)."""
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        big = tmp_path / "big.yaml"
        big.write_text("# " + "x" * (17 << 20) + "\n")
        with pytest.raises(AgentError) as err:
            await asyncio.wait_for(c.launch(str(big), upload=True), 60)
        assert err.value.code == "bad_request" and "MiB" in err.value.message
        assert "time" in await c.ping()  # the same agent still answers
    finally:
        await c.close()


async def test_host_samples_arrive_every_second_with_na_gpus(tmp_path: Path) -> None:
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        samples = []
        async for s in c.host_samples(interval_s=0.5):
            samples.append(s)
            if len(samples) == 3:
                break
        if not c.hello.gpus:  # no NVML (this machine): N/A and a message, not an error
            assert all(s.gpus is None and s.gpu_message for s in samples)
        assert samples[2].ts - samples[0].ts == pytest.approx(1.0, abs=0.5)
    finally:
        await c.close()
