"""A watch's live part at a small, steady cost (nsa_tui/agent/follow.py): each rank's beats
coalesced per poll, positions that still resume exactly, one poll per interval, one listing
of the heartbeat directory per change, one write per loop turn."""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
import time
from pathlib import Path

import msgspec

from nsa.contract import Beat, Phase, RunStatus, StreamPos
from nsa.contract.protocol import EventMsg
from nsa.contract.requests import WatchArgs
from nsa_tui.agent.follow import BeatFiles, coalesce_beats
from nsa_tui.agent.runs import RunStore
from nsa_tui.agent.server import Agent
from nsa_tui.agent.watch import RunWatch, SummaryCache
from nsa_tui.hosts.client import Event, HostClient

RID = "20260101-000000-synthetic-0002"


def _beat(rank: int, step: int, ts: float, source: str = "step") -> Beat:
    return Beat(ts=ts, run_id=RID, rank=rank, step=step, phase=Phase.TRAIN, source=source)  # type: ignore[arg-type]


def _beat_line(rank: int, step: int, ts: float, source: str = "step") -> str:
    return json.dumps({"ts": ts, "run_id": RID, "rank": rank, "step": step, "phase": "train",
                       "source": source})


def _metric_line(step: int) -> str:
    return json.dumps({"kind": "train", "ts": float(step), "step": step, "loss": 1.0})


def _append(path: Path, lines: list[str]) -> None:
    """All ``lines`` in one write, as one poll would find them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write("".join(ln + "\n" for ln in lines))


def _running_run(root: Path) -> Path:
    d = root / RID
    (d / "heartbeats").mkdir(parents=True, mode=0o700)
    (d / "run.json").write_text(json.dumps({"run_id": RID, "name": "synthetic", "status": "running"}))
    return d


def test_a_polls_beats_become_the_newest_and_the_first_of_a_step_that_began_in_it() -> None:
    steps = [_beat(0, s, float(s)) for s in range(1, 6)]
    assert [(b.step, b.ts) for b in coalesce_beats(steps, 0)] == [(5, 5.0)]
    timers = [*steps, _beat(0, 5, 5.5, "timer"), _beat(0, 5, 6.0, "timer")]
    # the stall rule measures from when step 5 began (5.0): that beat goes too
    assert [(b.step, b.ts) for b in coalesce_beats(timers, 0)] == [(5, 5.0), (5, 6.0)]
    later = [_beat(0, 5, 7.0, "timer"), _beat(0, 5, 8.0, "timer")]
    assert [b.ts for b in coalesce_beats(later, 5)] == [8.0]  # step 5 began in an earlier poll
    assert [b.ts for b in coalesce_beats(later, None)] == [7.0, 8.0]  # nothing sent before
    assert coalesce_beats([], 3) == []


def test_the_heartbeat_directory_is_listed_again_only_when_it_changed(tmp_path: Path) -> None:
    hb = tmp_path / "heartbeats"
    hb.mkdir()
    for r in range(3):
        (hb / f"rank-{r}.jsonl").write_text("")
    (hb / "rank-0.jsonl.1").write_text("")
    old = time.time_ns() - 60 * 10**9
    os.utime(hb, ns=(old, old))  # settled: its stamp is trusted
    files = BeatFiles(tmp_path)
    assert list(files.files()) == [0, 1, 2] and files.listings == 1
    for _ in range(5):
        assert list(files.files()) == [0, 1, 2]
    assert files.listings == 1
    (hb / "rank-3.jsonl").write_text("")  # a rank's first beat: the directory changed
    assert list(files.files()) == [0, 1, 2, 3] and files.listings == 2
    # changed a moment ago: a file made in the same clock tick must not be missed
    (hb / "rank-4.jsonl").write_text("")
    files.files()
    (hb / "rank-5.jsonl").write_text("")
    assert list(files.files()) == [0, 1, 2, 3, 4, 5]


async def test_a_coalesced_beat_stream_sends_each_ranks_newest_beat_and_resumes_after_a_reconnect(
        tmp_path: Path) -> None:
    """Many beats of a rank in one poll arrive as its newest (and the first of its step); the
    event's position is after every line read, so a client that reconnects after more beats
    were written gets the newest of those, never an older one, and every metrics line once."""
    d = _running_run(tmp_path)
    hb = [d / "heartbeats" / f"rank-{r}.jsonl" for r in range(2)]
    for r in range(2):
        _append(hb[r], [_beat_line(r, 0, 0.0)])
    c = HostClient("local", runs_root=str(tmp_path))
    await c.start()
    events: list[Event] = []
    it = c.watch(RID, streams=["status", "heartbeats", "metrics"])

    async def until(pred, what: str, timeout: float = 30.0) -> None:
        async def go() -> None:
            if pred():
                return
            async for ev in it:
                events.append(ev)
                if pred():
                    return
        try:
            await asyncio.wait_for(go(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"no {what} in {timeout:.0f} s; events: "
                                 f"{[(e.kind, e.stream, e.offset) for e in events]}") from None

    def beats(rank: int, after: int = 0) -> list[Beat]:
        return [b for e in events[after:] if e.kind == "beats" and e.stream == f"heartbeats/rank-{rank}"
                for b in e.data]

    def metric_steps(after: int = 0) -> list[int]:
        return [m.step for e in events[after:] if e.kind == "metrics" for m in e.data]

    try:
        await until(lambda: any(e.kind == "synced" for e in events), "synced")
        start = len(events)
        for r in range(2):  # 40 steps and 3 timer beats of rank 0, 40 steps of rank 1, at once
            extra = [_beat_line(0, 40, 40.0 + k, "timer") for k in (0.25, 0.5, 0.75)] if r == 0 else []
            _append(hb[r], [_beat_line(r, s, float(s)) for s in range(1, 41)] + extra)
        _append(d / "metrics.jsonl", [_metric_line(s) for s in range(1, 41)])
        await until(lambda: beats(0, start)[-1:] and beats(0, start)[-1].ts == 40.75
                    and beats(1, start)[-1:] and beats(1, start)[-1].step == 40
                    and metric_steps(start)[-1:] == [40], "the newest beats and step 40's metrics")
        got0, got1 = beats(0, start), beats(1, start)
        assert len(got0) <= 4 and len(got1) <= 3, (got0, got1)  # not 43 and 40 beats
        assert (40, 40.0) in [(b.step, b.ts) for b in got0]  # when step 40 began (the stall rule's)
        assert metric_steps(start) == list(range(1, 41))  # metrics are never coalesced
        seen = {e.stream: e.pos for e in events if e.kind in ("beats", "metrics")}
        for r in range(2):
            assert seen[f"heartbeats/rank-{r}"].offset == hb[r].stat().st_size

        c.drop_connection()  # the agent dies; 20 more steps are written while nobody reads
        mark = len(events)
        for r in range(2):
            _append(hb[r], [_beat_line(r, s, float(s)) for s in range(41, 61)])
        _append(d / "metrics.jsonl", [_metric_line(s) for s in range(41, 61)])
        await until(lambda: beats(0, mark)[-1:] and beats(0, mark)[-1].step == 60
                    and beats(1, mark)[-1:] and beats(1, mark)[-1].step == 60
                    and metric_steps(mark)[-1:] == [60], "step 60 after the reconnect")
        for r in range(2):
            after = beats(r, mark)
            assert len(after) <= 2 and min(b.step for b in after) > 40, after  # nothing old again
            last = [e for e in events[mark:] if e.stream == f"heartbeats/rank-{r}"][-1]
            assert last.pos == StreamPos(gen=seen[f"heartbeats/rank-{r}"].gen, offset=hb[r].stat().st_size)
        assert metric_steps(mark) == list(range(41, 61))  # no gap, no duplicate
    finally:
        await it.aclose()
        await c.close()


async def test_a_live_watch_polls_once_per_interval_while_lines_keep_coming(tmp_path: Path) -> None:
    """A poll that found lines is not followed by another at once (that one would find
    nothing: the writer is slower than the agent), unless a read was cut at its chunk."""
    d = _running_run(tmp_path)
    sent: list[EventMsg] = []
    watch = RunWatch(RunStore(tmp_path), WatchArgs(run=RID, streams=["heartbeats", "metrics", "log"]), 1,
                     sent.append, SummaryCache(), poll_s=0.1)
    stop = threading.Event()

    def writer() -> None:
        s = 0
        while not stop.is_set():
            s += 1
            _append(d / "heartbeats" / "rank-0.jsonl", [_beat_line(0, s, time.time())])
            _append(d / "metrics.jsonl", [_metric_line(s)])
            stop.wait(0.005)  # far more often than the polls: a poll finding nothing is the watch's doing

    task = asyncio.create_task(watch.run())
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not any(m.event == "synced" for m in sent):
            assert time.monotonic() < deadline, [m.event for m in sent]
            await asyncio.sleep(0.05)
        polls, empty = watch.polls, watch.empty_polls
        await asyncio.sleep(2.0)
        polls, empty = watch.polls - polls, watch.empty_polls - empty
    finally:
        stop.set()
        thread.join()
        task.cancel()
    assert polls >= 3, polls
    assert empty <= polls // 5, (polls, empty)  # an immediate re-poll after each would be half


async def test_lines_sent_in_one_loop_turn_go_out_in_one_write(tmp_path: Path) -> None:
    class Out(io.BytesIO):
        flushes = 0

        def flush(self) -> None:
            self.flushes += 1
            super().flush()

    out = Out()
    agent = Agent(str(tmp_path), out=out)
    for n in range(3):
        agent.send({"n": n})
    assert out.flushes == 0
    await asyncio.sleep(0)  # the loop turns
    assert out.flushes == 1
    assert [json.loads(ln) for ln in out.getvalue().splitlines()] == [{"n": 0}, {"n": 1}, {"n": 2}]
    agent.send({"n": 3})
    await asyncio.sleep(0)
    assert out.flushes == 2 and out.getvalue().endswith(b'{"n":3}\n')


def test_a_line_sent_with_no_loop_running_goes_out_at_once(tmp_path: Path) -> None:
    out = io.BytesIO()
    agent = Agent(str(tmp_path), out=out)
    agent.send({"status": RunStatus.RUNNING})
    assert out.getvalue() == b'{"status":"running"}\n'


async def test_live_lines_go_out_as_read_and_decode_to_the_same_records(tmp_path: Path) -> None:
    """A live line is passed on as it was read (not decoded and encoded again): what the
    client decodes equals what the file's lines decode to, NaN written as text included; an
    older writer's line with a bare NaN literal (not JSON) goes as its record, NaN as text."""
    from nsa.contract import Metric, decode, decode_lines, encode
    from nsa.contract.protocol import EVENT_DATA

    d = _running_run(tmp_path)
    sent: list[EventMsg] = []
    watch = RunWatch(RunStore(tmp_path), WatchArgs(run=RID, streams=["heartbeats", "metrics"]), 1,
                     sent.append, SummaryCache(), poll_s=0.05)
    task = asyncio.create_task(watch.run())
    try:
        deadline = time.monotonic() + 30
        while not any(m.event == "synced" for m in sent):
            assert time.monotonic() < deadline, [m.event for m in sent]
            await asyncio.sleep(0.02)
        metrics = [_metric_line(7), json.dumps({"kind": "train", "ts": 8.0, "step": 8, "loss": "NaN",
                                                "grad_norm": "Infinity"}),
                   '{"kind": "train", "ts": 9.0, "step": 9, "loss": NaN}',  # Python's json of old
                   '{"kind": "train", "step": "not a step"}']  # bad: skipped and counted
        _append(d / "metrics.jsonl", metrics)
        _append(d / "heartbeats" / "rank-0.jsonl", [_beat_line(0, 3, 1.0), _beat_line(0, 4, 2.0)])
        got: dict[str, list] = {}
        while len(got.get("metrics", [])) < 3 or not got.get("beats"):
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.02)
            got = {}
            for m in sent:
                if m.event in ("metrics", "beats"):
                    wire = json.loads(encode(m))  # what goes down the pipe, as the client reads it
                    got.setdefault(m.event, []).extend(decode(json.dumps(wire["data"]), EVENT_DATA[m.event]))
    finally:
        task.cancel()
    want = decode_lines(metrics, Metric)
    assert len(want) == 3
    for a, b in zip(got["metrics"], want, strict=True):
        assert encode(a) == encode(b)  # NaN and infinity compare by their encoding
    assert [(b.step, b.ts) for b in got["beats"]] == [(4, 2.0)]
    assert any(isinstance(x, msgspec.Raw) for m in sent if m.event == "metrics" for x in m.data)
    assert watch.stats["metrics"].bad == 1
