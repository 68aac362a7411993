"""The agent's protocol through the local transport: replies, errors, watch offsets."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_tui.agent.runs import write_json
from nsa_tui.client import AgentError, Event, HostClient

RID = "20260101-000000-synthetic-0001"
REPO = Path(__file__).resolve().parents[2]


def test_raw_protocol_lines(tmp_path: Path) -> None:
    reqs = ['{"id":1,"op":"ping"}', "not json", '{"id":2,"op":"bogus"}',
            '{"id":3,"op":"run","args":{"run":"../x"}}',
            '{"id":4,"op":"kill","args":{"run":"x","bad_arg":1}}']
    out = subprocess.run([sys.executable, "-m", "nsa_tui.agent", "--runs-root", str(tmp_path)],
                         input="\n".join(reqs) + "\n", capture_output=True, text=True, timeout=60)
    msgs = [json.loads(line) for line in out.stdout.splitlines()]
    assert msgs[0]["hello"]["agent"] == 1 and msgs[0]["hello"]["runs_root"] == str(tmp_path)
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
        with pytest.raises(AgentError) as err:
            await c.launch(str(bad), upload=True)
        assert err.value.code == "bad_config"
        with pytest.raises(AgentError) as err:
            await c.launch(str(REPO / "configs/smoke-cpu.yaml"), overrides=["train.nope=1"])
        assert err.value.code == "bad_config"
        assert await c.runs() == []
        assert [p.name for p in (tmp_path / "runs").iterdir()] == []  # no run dir, no temp file
    finally:
        await c.close()


def _append(path: Path, obj: dict | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write((json.dumps(obj) if isinstance(obj, dict) else obj) + "\n")


async def _take(it, n: int, timeout: float = 20) -> list[Event]:
    out: list[Event] = []
    async def go() -> None:
        async for ev in it:
            if ev.kind in ("metric", "heartbeat", "log"):
                out.append(ev)
                if len(out) == n:
                    return
    await asyncio.wait_for(go(), timeout)
    return out


async def test_watch_backfills_then_streams_and_resumes_without_gaps(tmp_path: Path) -> None:
    d = tmp_path / RID
    d.mkdir(mode=0o700)
    write_json(d / "run.json", {"run_id": RID, "status": "finished", "step": 0})
    for s in range(1, 4):
        _append(d / "metrics.jsonl", {"kind": "train", "step": s, "loss": 1.0})
    _append(d / "heartbeats" / "rank-0.jsonl", {"rank": 0, "step": 3, "ts": 1.0})
    _append(d / "train.log", "hello log")
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        it = c.watch(RID)
        first = await _take(it, 5)
        assert {(e.kind, e.stream) for e in first} == {
            ("metric", "metrics"), ("heartbeat", "heartbeats/rank-0"), ("log", "log")}
        seen = {e.stream: e.offset for e in first}
        _append(d / "metrics.jsonl", {"kind": "train", "step": 4, "loss": 1.0})
        live = await _take(it, 1)
        assert live[0].data["step"] == 4
        await it.aclose()
        # a client that saw up to step 2 asks for the rest: exactly steps 3 and 4
        off2 = len((json.dumps({"kind": "train", "step": 1, "loss": 1.0}) + "\n").encode()) * 2
        rest = await _take(c.watch(RID, offsets={"metrics": off2, "log": seen["log"],
                                                 "heartbeats/rank-0": seen["heartbeats/rank-0"]}), 2)
        assert [e.data["step"] for e in rest] == [3, 4]
    finally:
        await c.close()


async def test_watch_of_an_ended_run_ends_with_a_final_status_after_its_backlog(tmp_path: Path) -> None:
    """The initial status already says finished; the non-initial one comes after every line."""
    d = tmp_path / RID
    d.mkdir(mode=0o700)
    write_json(d / "run.json", {"run_id": RID, "status": "finished", "step": 50})
    for s in range(1, 51):
        _append(d / "metrics.jsonl", {"kind": "train", "step": s, "loss": 1.0})
        _append(d / "heartbeats" / "rank-0.jsonl", {"rank": 0, "step": s, "ts": float(s)})
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    seen: list[Event] = []
    try:
        async def until_final() -> None:
            async for ev in c.watch(RID):
                seen.append(ev)
                if ev.kind == "status" and not ev.data["initial"] and ev.data["status"] == "finished":
                    return
        await asyncio.wait_for(until_final(), 20)
    finally:
        await c.close()
    assert seen[0].kind == "status" and seen[0].data["initial"] and seen[0].data["status"] == "finished"
    assert [e.data["step"] for e in seen if e.kind == "metric"] == list(range(1, 51))
    assert [e.data["step"] for e in seen if e.kind == "heartbeat"] == list(range(1, 51))
    assert [e.kind for e in seen[-2:]] == ["synced", "status"]


async def test_reconnect_after_agent_dies_has_no_gap_and_no_duplicate(tmp_path: Path) -> None:
    d = tmp_path / RID
    d.mkdir(mode=0o700)
    write_json(d / "run.json", {"run_id": RID, "status": "finished"})
    states: list[str] = []
    c = HostClient("local", runs_root=str(tmp_path), on_state=lambda s: states.append(s.status))
    await c.start()
    steps: list[int] = []

    async def consume() -> None:
        async for ev in c.watch(RID, streams=["metrics"]):
            if ev.kind == "metric":
                steps.append(ev.data["step"])
                if ev.data["step"] == 60:
                    return

    task = asyncio.create_task(consume())
    try:
        for s in range(1, 61):
            _append(d / "metrics.jsonl", {"kind": "train", "step": s})
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


async def test_host_samples_arrive_every_second_with_na_gpus(tmp_path: Path) -> None:
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    try:
        samples = []
        async for s in c.host_samples(interval_s=0.5):
            samples.append(s)
            if len(samples) == 3:
                break
        if not c.hello["gpus"]:  # no NVML (this machine): N/A and a message, not an error
            assert all(s["gpus"] is None and s["gpu_message"] for s in samples)
        assert samples[2]["ts"] - samples[0]["ts"] == pytest.approx(1.0, abs=0.5)
    finally:
        await c.close()
