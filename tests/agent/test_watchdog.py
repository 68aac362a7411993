"""The run's watchdog on real files and real processes (a ``sleep`` carrying the run id stands in
for each rank), with a clock of its own: rules, bounded reads, garbage, deliveries, policies."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsa.contract import (
    AlertEvent,
    Beat,
    LaunchInfo,
    Phase,
    Relaunch,
    RunInfo,
    RunStatus,
    TrainMetric,
    decode_lines,
    encode,
    write_json_atomic,
)
from nsa_tui.agent.policy import PolicyRunner, restarts_before
from nsa_tui.agent.watchdog import KEEP_BYTES, FileTail, Watchdog
from nsa_tui.health.ledger import ALERTS_FILE
from nsa_tui.user.settings import AlertSettings, NotifySettings, Settings, WatchdogSettings

RID = "20260101-000000-wd-0001"
T0 = 1_000_000.0


class NoGpu:
    def read(self):
        return None, "no GPU here"

    def count(self) -> int:
        return 0


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / RID
    (d / "heartbeats").mkdir(parents=True)
    write_json_atomic(d / "launch.json", LaunchInfo(run_id=RID, name="wd", created=T0, nproc=2))
    write_json_atomic(d / "run.json", RunInfo(run_id=RID, name="wd", status=RunStatus.RUNNING, world_size=2))
    return d


@pytest.fixture
def ranks() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two processes that belong to the run (NSA_RUN_ID), as its ranks' pids."""
    from nsa_tui.agent.procs import run_process

    procs = [subprocess.Popen(["sleep", "600"], env=dict(os.environ, NSA_RUN_ID=RID, RANK=str(r)))
             for r in range(2)]
    deadline = time.monotonic() + 10
    while any(run_process(p.pid, RID) is None for p in procs):  # until exec: the environ is the parent's
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield procs
    for p in procs:
        p.kill()
        p.wait()


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def settings(**alerts: float) -> Settings:
    base = {"stall_floor_s": 5.0, "stall_factor": 1.0, "no_heartbeat_s": 10.0, "resolve_after_s": 0.0}
    return Settings(alerts=AlertSettings(**{**base, **alerts}), watchdog=WatchdogSettings(evidence=False))


def quiet(run_dir: Path, s: Settings, clock: Clock) -> Watchdog:
    return Watchdog(run_dir, s, gpu=NoGpu(), clock=clock, log=lambda m: None)


def beat(rank: int, step: int, ts: float, pid: int, phase: str = "train") -> str:
    return encode(Beat(ts=ts, run_id=RID, rank=rank, step=step, pid=pid, phase=Phase(phase), phase_since=T0,
                       source="step")).decode()


def metric(step: int, ts: float) -> str:
    return encode(TrainMetric(ts=ts, step=step, loss=2.0, step_time_s=1.0, tokens_per_s=1000.0)).decode()


def append(path: Path, *lines: str | bytes) -> None:
    with open(path, "ab") as fh:
        for line in lines:
            fh.write((line if isinstance(line, bytes) else line.encode()) + b"\n")


def events(d: Path) -> list[AlertEvent]:
    try:
        return decode_lines((d / ALERTS_FILE).read_text().splitlines(), AlertEvent)
    except FileNotFoundError:
        return []


def garbage(rng: random.Random, good: str) -> list[bytes]:
    """Random, truncated, wrong-typed, invalid UTF-8 and huge lines."""
    return [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))).replace(b"\n", b" "),
            good[: rng.randint(1, len(good) - 1)].encode(),
            b'{"kind":"train","ts":1,"step":"abc","loss":2.0}', b'{"ts":"x","rank":"zero","run_id":7}',
            b"[1, 2, 3]", b'{"kind":"train","ts":1,"step":3,"loss":"abc"}', b"\xff\xfe\xfd not utf-8",
            b"NaN", b"x" * rng.choice([10, 100_000, 2_000_000])]


def test_garbage_in_every_stream_loses_no_good_line_and_alerting_goes_on(run_dir: Path, ranks) -> None:
    """One malformed line must never blind the watchdog: every good beat and metric line is taken,
    the bad ones are counted, and a rank that then stops still raises its alerts in time."""
    clock, logs = Clock(), []
    wd = Watchdog(run_dir, settings(), gpu=NoGpu(), clock=clock, log=logs.append)
    rng = random.Random(10)
    hb = [run_dir / "heartbeats" / f"rank-{r}.jsonl" for r in range(2)]
    for step in range(1, 31):
        clock.t = T0 + step
        for r in range(2):
            good = beat(r, step, clock.t, ranks[r].pid)
            append(hb[r], good, *rng.sample(garbage(rng, good), 3))
        good = metric(step, clock.t)
        append(run_dir / "metrics.jsonl", good, *rng.sample(garbage(rng, good), 3))
        append(run_dir / "train.log", f"step {step}", *rng.sample(garbage(rng, good), 2))
        if step % 4 == 0:
            assert wd.poll() == []  # healthy: no alert from any of that
    wd.poll()
    run = wd.det.runs[RID]
    assert len(run.step_times) == 30 and {k: r.step for k, r in run.ranks.items()} == {0: 30, 1: 30}
    assert wd.stats["metrics"].bad > 30 and all(wd.stats[f"heartbeats/rank-{r}"].bad > 30 for r in (0, 1))
    # rank 1 freezes (no beat at all); rank 0 keeps beating at a frozen step
    for k in range(1, 12):
        clock.t = T0 + 30 + k
        append(hb[0], beat(0, 30, clock.t, ranks[0].pid), b'{"step": "abc"}')
        append(run_dir / "metrics.jsonl", b'{"kind":"train","step":"abc"}')
        wd.poll()
    raised = {(e.alert.kind, e.alert.rank): e for e in events(run_dir) if e.action == "raised"}
    assert ("stall", 0) in raised and ("no_heartbeat", 1) in raised
    assert raised[("stall", 0)].ts <= T0 + 30 + 5 + 1  # the threshold (5 s) and one poll
    assert raised[("no_heartbeat", 1)].ts <= T0 + 30 + 10 + 1
    assert any("alert 1-" in line and "raised" in line for line in logs)  # a line in train.log too


def test_rotation_is_followed_and_a_far_ahead_file_is_read_from_its_tail(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    append(path, *[f"line {i}" for i in range(10)])
    tail = FileTail(path)
    assert tail.read() == [f"line {i}" for i in range(10)]
    append(path, *[f"line {i}" for i in range(10, 15)])
    os.replace(path, tmp_path / "rank-0.jsonl.1")  # the trainer rotates ...
    append(path, *[f"line {i}" for i in range(15, 18)])  # ... and goes on in a new file
    assert tail.read() == [f"line {i}" for i in range(10, 18)]  # nothing lost, nothing twice
    assert tail.read() == []
    big = tmp_path / "train.log"
    append(big, *[f"{i:09d} " + "x" * 90 for i in range(200_000)])  # 20 MB written before the first look
    t = FileTail(big)
    lines = t.read()
    assert t.skipped > 19_000_000 and len(lines) < KEEP_BYTES // 100 + 1
    assert lines[-1].startswith("000199999") and all(len(ln) == 100 for ln in lines)  # whole lines only


def test_a_vanished_rank_is_a_crash_at_once_and_the_disk_is_watched(run_dir: Path, ranks) -> None:
    clock = Clock()
    s = settings(disk_warn_bytes=10**18, disk_critical_bytes=0)  # any real disk is "nearly full"
    wd = Watchdog(run_dir, s, gpu=NoGpu(), clock=clock, log=lambda m: None)
    for step in range(1, 4):
        clock.t = T0 + step
        for r in range(2):
            append(run_dir / "heartbeats" / f"rank-{r}.jsonl", beat(r, step, clock.t, ranks[r].pid))
    wd.poll()
    ranks[1].kill()
    ranks[1].wait()
    clock.t += 1
    wd.poll()
    kinds = {(e.alert.kind, e.alert.rank, e.alert.severity) for e in events(run_dir) if e.action == "raised"}
    assert ("crash", 1, "critical") in kinds and ("disk", None, "warning") in kinds
    crash = next(e for e in events(run_dir) if e.alert.kind == "crash")
    assert crash.alert.run == RID and f"pid {ranks[1].pid}" in crash.alert.message


def test_notifications_run_the_command_and_a_failed_delivery_is_an_alert(run_dir: Path, ranks,
                                                                         tmp_path: Path) -> None:
    out = tmp_path / "notified.jsonl"
    script = f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read())"
    clock = Clock()
    s = settings()
    s.notify = NotifySettings(command=[sys.executable, "-c", script], retries=2, backoff_s=0.05)
    wd = Watchdog(run_dir, s, gpu=NoGpu(), clock=clock, log=lambda m: None)
    append(run_dir / "heartbeats" / "rank-0.jsonl", beat(0, 1, T0, ranks[0].pid))
    clock.t = T0 + 11
    [ev] = wd.poll()  # no heartbeat for 11 s
    assert wd.notifier is not None and wd.notifier.drain(30)
    [sent] = decode_lines(out.read_text().splitlines(), AlertEvent)
    assert (sent.id, sent.action, sent.alert.kind) == (ev.id, "raised", "no_heartbeat")
    # the command starts failing: after its retries, the failure is an alert of its own
    wd.notifier.s.command = [sys.executable, "-c", "import sys; sys.exit('no route to the pager')"]
    ranks[0].kill()
    ranks[0].wait()
    clock.t += 1
    wd.poll()  # the rank is gone: a crash, delivered ... and failing
    assert wd.notifier.drain(30)
    clock.t += 1
    wd.poll()
    delivery = [e for e in events(run_dir) if e.alert.kind == "delivery"]
    assert delivery and "failed after 2 tries" in delivery[0].alert.message
    assert "no route to the pager" in delivery[0].alert.message
    wd.close(5)


def test_the_restart_policy_counts_restarts_in_a_row_and_stops_at_its_limit(tmp_path: Path) -> None:
    """r0 -> r1 -> r2 by `restart`; r2 crashing again with max_restarts=2 is not restarted, and says so."""
    from nsa.config import FailurePolicy
    from nsa.contract import ExitInfo, RunView

    ids = [f"20260101-00000{i}-r-000{i}" for i in range(3)]
    for i, rid in enumerate(ids):
        (tmp_path / rid).mkdir()
        write_json_atomic(tmp_path / rid / "launch.json", LaunchInfo(
            run_id=rid, name="r", created=T0 + i, parent_run=ids[i - 1] if i else None))
        if i:
            write_json_atomic(tmp_path / ids[i - 1] / "relaunch.json",
                              Relaunch(op="restart", child_run=rid, resume_from="ck", ts=T0 + i))
    assert [restarts_before(tmp_path, rid) for rid in ids] == [0, 1, 2]
    said: list[str] = []
    slept: list[float] = []
    runner = PolicyRunner(tmp_path / ids[2], FailurePolicy(action="restart", max_restarts=2, backoff_s=10),
                          child=None, announce=said.append, sleep=slept.append)
    from nsa.contract import Alert

    crash = Alert(kind="crash", severity="critical", host="h", run=ids[2], message="rank 1 was killed")
    view = RunView(run_id=ids[2], dir=str(tmp_path / ids[2]), name="r", status=RunStatus.CRASHED,
                   info=RunInfo(run_id=ids[2]), exit=ExitInfo(exit_code=1))
    runner.after_exit(view, [crash])
    assert slept == [] and runner.started is None
    assert said and "not restarting" in said[0] and "max_restarts=2" in said[0]
    nan = Alert(kind="nan", severity="critical", host="h", run=ids[0], message="loss is NaN")
    first = PolicyRunner(tmp_path / ids[0], FailurePolicy(action="restart"), child=None, announce=said.append,
                         sleep=slept.append)
    first.after_exit(view, [nan])  # a NaN would come back at the same step: no restart
    assert slept == [] and "it would fail the same way" in said[-1]


def test_alerts_json_lines_are_private(run_dir: Path, ranks) -> None:
    old = os.umask(0o022)  # even under a permissive umask
    try:
        clock = Clock()
        wd = quiet(run_dir, settings(), clock)
        append(run_dir / "heartbeats" / "rank-0.jsonl", beat(0, 1, T0, ranks[0].pid))
        clock.t = T0 + 20
        assert wd.poll()
    finally:
        os.umask(old)
    assert (run_dir / ALERTS_FILE).stat().st_mode & 0o777 == 0o600
    assert json.loads((run_dir / ALERTS_FILE).read_text().splitlines()[0])["action"] == "raised"


def test_a_watchdog_costs_little_per_look(run_dir: Path, ranks) -> None:
    """Each look reads only what is new: after a long run's files are read once, a look with nothing
    new reads no line and takes well under the interval."""
    clock = Clock()
    wd = quiet(run_dir, settings(), clock)
    for r in range(2):
        append(run_dir / "heartbeats" / f"rank-{r}.jsonl",
               *[beat(r, s, T0 + s * 0.01, ranks[r].pid) for s in range(1, 20_001)])
    append(run_dir / "metrics.jsonl", *[metric(s, T0 + s * 0.01) for s in range(1, 20_001)])
    clock.t = T0 + 200.5
    wd.poll()
    t = time.perf_counter()
    for _ in range(20):
        wd.poll()
    per_look = (time.perf_counter() - t) / 20
    print(f"\nMEASURE watchdog look with nothing new: {per_look * 1000:.2f} ms")
    assert per_look < 0.2


def test_a_run_that_fails_at_once_gets_one_crash_alert_from_facts(tmp_path: Path, monkeypatch) -> None:
    """The real supervisor and its watchdog, a command that fails before writing anything of its own
    (no traceback: what ``python -m`` says of a missing module): one crash alert, raised with the exit
    code, whose text quotes the command's error, never a line the watchdog itself wrote."""
    d = tmp_path / RID
    d.mkdir()
    write_json_atomic(d / "launch.json", LaunchInfo(run_id=RID, name="wd", created=time.time(), nproc=1))
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(tmp_path / "settings.yaml"))  # absent: the defaults
    with open(d / "train.log", "wb") as log:
        subprocess.run([sys.executable, "-m", "nsa_tui.agent.supervise", str(d), "--", sys.executable, "-m",
                        "no_such_module_here.run"], stdout=log, stderr=subprocess.STDOUT, timeout=120,
                       check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    said = [(e.action, e.alert.kind, e.alert.message) for e in events(d)]
    assert [(a, k) for a, k, _ in said] == [("raised", "crash")], said
    message = said[0][2]
    assert "No module named 'no_such_module_here'" in message and "exit code 1" in message, message
    assert "None" not in message and "nsa-tui" not in message, message


@pytest.mark.parametrize("stall_floor_s, no_heartbeat_s", [(3.0, 6.0), (10.0, 10.0)])
def test_a_frozen_rank_is_the_first_alert_and_notification_not_the_rank_waiting_for_it(
        run_dir: Path, ranks, tmp_path: Path, stall_floor_s: float, no_heartbeat_s: float) -> None:
    """``kill -STOP`` of rank 1 after step 20: its beats stop; rank 0 waits in the next collective,
    its step frozen while its timer beats every 2 s. Whichever threshold is crossed first, the first
    alert and the first notification name rank 1, and rank 0's stall names the rank it waits for."""
    out = tmp_path / "notified.jsonl"
    clock = Clock()
    s = settings(stall_floor_s=stall_floor_s, no_heartbeat_s=no_heartbeat_s, resolve_after_s=10.0)
    s.notify = NotifySettings(command=[sys.executable, "-c", f"import sys; open({str(out)!r}, 'a').write("
                                                             "sys.stdin.read())"])
    wd = Watchdog(run_dir, s, gpu=NoGpu(), clock=clock, log=lambda m: None)
    hb = [run_dir / "heartbeats" / f"rank-{r}.jsonl" for r in range(2)]
    for step in range(1, 21):
        clock.t = T0 + step
        for r in range(2):
            append(hb[r], beat(r, step, clock.t, ranks[r].pid))
        append(run_dir / "metrics.jsonl", metric(step, clock.t))
        assert wd.poll() == []
    os.kill(ranks[1].pid, signal.SIGSTOP)
    try:
        timer = T0 + 21
        while clock.t < T0 + 40:
            clock.t += 0.5
            if clock.t >= timer:
                append(hb[0], beat(0, 20, timer, ranks[0].pid))  # rank 0's timer: alive, step frozen
                timer += 2
            wd.poll()
    finally:
        os.kill(ranks[1].pid, signal.SIGCONT)
    raised = [e for e in events(run_dir) if e.action == "raised"]
    assert [(e.alert.kind, e.alert.rank) for e in raised][:2] == [("no_heartbeat", 1), ("stall", 0)], raised
    assert "rank 0 waits for it" in raised[0].alert.message, raised[0].alert.message
    assert "waiting for rank 1" in raised[1].alert.message, raised[1].alert.message
    assert wd.notifier is not None and wd.notifier.drain(30)
    first = decode_lines(out.read_text().splitlines(), AlertEvent)[0]
    assert (first.id, first.alert.kind, first.alert.rank) == (raised[0].id, "no_heartbeat", 1)
    wd.close(5)


def test_a_job_over_nodes_judges_only_this_hosts_ranks_by_their_processes(run_dir: Path, ranks) -> None:
    """A Slurm job watched from its first node (``by_host``): rank 1 on another node, its pid no
    process here, is never called gone (its beats say whether it lives: when they stop, that is
    ``no_heartbeat``), while rank 0 on this node is a crash the moment its process vanishes."""
    clock = Clock()
    wd = Watchdog(run_dir, settings(), gpu=NoGpu(), clock=clock, log=lambda m: None, host="node1",
                  by_host=True)
    hb = [run_dir / "heartbeats" / f"rank-{r}.jsonl" for r in range(2)]
    ranks[1].kill()  # its pid means nothing on this node
    ranks[1].wait()

    def beat_on(host: str, rank: int, step: int) -> str:
        return encode(Beat(ts=clock.t, run_id=RID, rank=rank, step=step, pid=ranks[rank].pid, host=host,
                           phase=Phase.TRAIN, phase_since=T0, source="step")).decode()

    for step in range(1, 4):
        clock.t = T0 + step
        append(hb[0], beat_on("node1", 0, step))
        append(hb[1], beat_on("node2", 1, step))
        assert wd.poll() == []
    for _ in range(12):  # rank 1's beats stop; rank 0 beats on (the same step: it waits)
        clock.t += 1
        append(hb[0], beat_on("node1", 0, 3))
        wd.poll()
    raised = [(e.alert.kind, e.alert.rank) for e in events(run_dir) if e.action == "raised"]
    assert ("no_heartbeat", 1) in raised and ("crash", 1) not in raised, raised
    ranks[0].kill()
    ranks[0].wait()
    clock.t += 1
    wd.poll()
    assert ("crash", 0) in [(e.alert.kind, e.alert.rank) for e in events(run_dir) if e.action == "raised"]
