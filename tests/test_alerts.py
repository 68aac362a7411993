"""The stall/failure detector on synthetic event sequences (pure: no I/O, no clock)."""

from __future__ import annotations

import math

import pytest

from nsa.contract import (
    Beat,
    DeviceInfo,
    ExitInfo,
    GpuReading,
    HostSample,
    Phase,
    RunInfo,
    RunStatus,
    RunView,
    TrainMetric,
)
from nsa.contract.protocol import Synced
from nsa_tui.health.alerts import AlertDetector, Thresholds, expected_from_name, traceback_tail
from nsa_tui.hosts.client import Event

T0 = 1_000_000.0
RUN = "r1"
INFO_FIELDS = ("step", "exit_reason", "config", "param_count", "seq_len")


def beat(rank: int, step: int, ts: float, phase: str = "train", since: float = T0, pid: int = 100,
         gpu: int | None = None, received: float = 0.0, uuid: str | None = None) -> Event:
    dev = DeviceInfo(type="cuda", index=gpu, uuid=uuid) if gpu is not None else DeviceInfo()
    b = Beat(ts=ts, run_id=RUN, rank=rank, step=step, phase=Phase(phase), phase_since=since, pid=pid + rank,
             device=dev, source="step")
    return Event("beats", RUN, f"heartbeats/rank-{rank}", 0, [b], received)


def view(st: str = "running", initial: bool = False, **kw: object) -> RunView:
    info = RunInfo(run_id=RUN, name=str(kw.get("name", "run")), status=RunStatus.RUNNING,
                   **{k: kw[k] for k in INFO_FIELDS if k in kw})  # type: ignore[arg-type]
    code = kw.get("exit_code")
    return RunView(run_id=RUN, dir="/x", name=info.name, status=RunStatus(st), info=info,
                   exit=ExitInfo(exit_code=code) if code is not None else None,  # type: ignore[arg-type]
                   alive=RunStatus(st).is_alive(), log_tail=list(kw.get("log_tail", [])))  # type: ignore[arg-type]


def status(st: str = "running", initial: bool = False, received: float = 0.0, **kw: object) -> Event:
    return Event("status", RUN, "status", 0, view(st, **kw), received, initial)


def metric(step: int, ts: float, step_time: float = 1.0, tps: float = 1000.0, loss: float = 2.0) -> Event:
    m = TrainMetric(ts=ts, step=step, loss=loss, step_time_s=step_time, tokens_per_s=tps)
    return Event("metrics", RUN, "metrics", 0, [m])


def host(ts: float, *gpus: GpuReading) -> Event:
    return Event("host", None, "host", 1, HostSample(ts=ts, gpus=list(gpus)))


def healthy(det: AlertDetector, steps: int = 20, world: int = 2, dt: float = 1.0) -> float:
    """Feed ``steps`` steps of a healthy run; returns the time of the last beat."""
    det.feed(status())
    t = T0
    for s in range(1, steps + 1):
        t = T0 + s * dt
        for r in range(world):
            det.feed(beat(r, s, t))
        det.feed(metric(s, t, step_time=dt))
    return t


def kinds(alerts: list) -> set[tuple[str, int | None]]:
    return {(a.kind, a.rank) for a in alerts}


def test_healthy_run_has_no_alerts() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=5, train_factor=3))
    t = healthy(det)
    assert det.check(t + 0.5) == []
    assert det.check(t + 4.9) == []


def test_train_stall_on_one_rank_after_threshold_only() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=5, train_factor=10))
    t = healthy(det, dt=1.0)  # median step 1 s -> threshold max(5, 10) = 10 s
    assert det.train_threshold(RUN) == 10
    det.feed(beat(0, 21, t + 1))  # rank 0 finishes one more step, then waits in a collective
    for k in range(1, 13):  # rank 1 hangs: its timer beats go on with a frozen step
        det.feed(beat(0, 21, t + k))
        det.feed(beat(1, 20, t + k))
    assert det.check(t + 9.9) == []
    alerts = det.check(t + 10.1)
    assert kinds(alerts) == {("stall", 1)}
    assert kinds(det.check(t + 11.2)) == {("stall", 0), ("stall", 1)}
    a = next(a for a in alerts if a.kind == "stall")
    assert (a.host, a.run, a.rank, a.phase, a.last_step) == ("h", RUN, 1, "train", 20)
    assert a.heartbeat_age_s is not None and a.heartbeat_age_s < 1
    assert "dump" in a.suggested_actions and a.severity == "critical"
    assert a.key == det.check(t + 11)[0].key  # stable while it lasts


def test_a_hang_where_every_rank_beats_is_said_at_most_quiet_s_late() -> None:
    """Both ranks' timers beat on (a collective deadlock): nobody stopped beating, so nobody is the
    culprit; while rank 1's beats lag rank 0's a little the stalls wait, never past quiet_s."""
    det = AlertDetector("h", Thresholds(train_floor_s=10, train_factor=1, quiet_s=5, no_heartbeat_s=30))
    t = healthy(det)
    said: dict[float, set] = {}
    for k in range(0, 18, 2):  # the timers: rank 1's at t+0.5, 2.5, ...; rank 0's half a second later
        det.feed(beat(1, 20, t + k + 0.5))
        said[k + 0.5] = kinds(det.check(t + k + 0.5))
        det.feed(beat(0, 20, t + k + 1))
        said[k + 1] = kinds(det.check(t + k + 1))
    assert said[10.5] == set()  # past the threshold, rank 0 lags by 1.5 s: frozen or late? not known
    assert said[11] == {("stall", 0), ("stall", 1)}  # in step again: said
    assert said[14.5] == set() and said[16.5] == {("stall", 0), ("stall", 1)}  # threshold + quiet_s: said
    assert not any("waiting for" in a.message for a in det.check(t + 16.5))


@pytest.mark.parametrize("frozen_at", ["checkpoint", "step ahead"])
def test_a_rank_frozen_outside_the_stuck_ranks_lockstep_is_still_the_culprit(frozen_at: str) -> None:
    """kill -STOP of rank 1 while it is in a checkpoint (its own threshold far off) or one step
    ahead of rank 0: rank 0 stalls first by its threshold, yet the first alert names rank 1."""
    det = AlertDetector("h", Thresholds(train_floor_s=3, train_factor=1, quiet_s=5, no_heartbeat_s=6))
    t = healthy(det)
    if frozen_at == "checkpoint":
        det.feed(beat(1, 20, t + 0.2, phase="checkpoint", since=t + 0.2))
    else:
        det.feed(beat(1, 21, t + 0.2))
    said: dict[float, list] = {}
    for k in range(1, 60):  # rank 0 waits in a collective, its timer beating every 0.2 s
        now = t + 0.2 + k * 0.2
        det.feed(beat(0, 20, now))
        said[round(k * 0.2, 1)] = [(a.kind, a.rank) for a in det.check(now)]
    lag, first = next((lag, a) for lag, a in sorted(said.items()) if a)
    assert first[0] == ("no_heartbeat", 1), said  # said first: the first alert on disk names it
    assert 5.0 < lag <= 5.4 and set(first) == {("no_heartbeat", 1), ("stall", 0)}  # quiet_s: known
    assert "waiting for rank 1" in next(a.message for a in det.check(t + 5.6) if a.kind == "stall")


def test_phase_aware_thresholds() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=5, phase_s={"checkpoint": 100, "boot": 50}))
    t = healthy(det)
    for k in range(0, 95, 4):
        for r in (0, 1):
            det.feed(beat(r, 20, t + k, phase="checkpoint", since=t))
    assert det.check(t + 95) == []  # a long checkpoint is not a stall
    det.feed(beat(0, 20, t + 101, phase="checkpoint", since=t))
    det.feed(beat(1, 20, t + 101, phase="checkpoint", since=t))
    assert ("stall", 0) in kinds(det.check(t + 101))


def test_first_step_uses_generous_threshold() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=5, first_step_s=300))
    det.feed(status())
    for k in range(0, 200, 5):
        det.feed(beat(0, 0, T0 + k))
    assert det.check(T0 + 200) == []


def test_no_heartbeat_and_drift() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=1000, no_heartbeat_s=30))
    t = healthy(det)
    for k in range(1, 40):
        det.feed(beat(0, 20 + k, t + k))
    alerts = det.check(t + 40)
    assert kinds(alerts) == {("no_heartbeat", 1)}  # silent, not "behind": no drift claim
    for k in range(1, 40):
        det.feed(beat(1, 20, t + k))  # beating again but stuck at step 20 while rank 0 is at 59
    assert ("drift", 1) in kinds(det.check(t + 40))


def test_crash_carries_exit_code_and_traceback() -> None:
    det = AlertDetector("h")
    healthy(det, steps=3)
    tail = ["step 3 loss 2.0", "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
            "RuntimeError: injected crash on rank 1"]
    det.feed(status("crashed", exit_code=1, log_tail=tail, step=3))
    alerts = det.check(T0 + 10)
    crash = [a for a in alerts if a.kind == "crash"]
    assert len(crash) == 1
    assert crash[0].log_tail[0].startswith("Traceback") and "injected crash" in crash[0].log_tail[-1]
    assert "code 1" in crash[0].message and "injected crash" in crash[0].message
    assert not any(a.kind == "stall" for a in alerts)  # a dead run is not stalled


def test_a_crash_message_is_built_from_facts_not_from_our_own_lines() -> None:
    """The supervisor and the watchdog write to train.log too; a crash message quoting the last
    line would quote an earlier alert (which quoted the one before). An unknown exit code is said
    as unknown, a signal by its name."""
    det = AlertDetector("h")
    error = ("/usr/bin/python3: Error while finding module specification for 'torch.distributed.run' "
             "(ModuleNotFoundError: No module named 'torch')")
    tail = [error, "nsa-tui watchdog: on_failure policy not read (ConfigError: x); none applies",
            "nsa-tui watchdog: alert 1-crash raised: [critical] crash: run processes exited with code None "
            "without a final status: nsa-tui watchdog: on_failure policy not read",
            "nsa-tui supervise: command exited with 1"]
    ended = view("crashed", log_tail=tail)
    det.feed_view(RUN, ended)
    crash = next(a for a in det.check(T0) if a.kind == "crash")
    assert "No module named 'torch'" in crash.message and "exit code unknown" in crash.message
    assert "None" not in crash.message and "nsa-tui" not in crash.message
    assert not any(ln.startswith("nsa-tui watchdog") for ln in crash.log_tail)
    det.feed_view(RUN, msgspec_replace(ended, exit=ExitInfo(exit_code=1)))
    assert "exit code 1" in next(a for a in det.check(T0) if a.kind == "crash").message
    det.feed_view(RUN, msgspec_replace(ended, exit=ExitInfo(signal=9)))
    crash = next(a for a in det.check(T0) if a.kind == "crash")
    assert "killed by signal 9 (SIGKILL)" in crash.message and "None" not in crash.message
    det.feed_log(RUN, ["step 3 loss 2.0", "nsa-tui watchdog: alert 2-stall raised: [critical] stall: ..."])
    assert list(det.runs[RUN].log) == ["step 3 loss 2.0"]  # every alert's log tail: the run's output only
    det.feed_view(RUN, msgspec_replace(view("failed", exit_reason="boom"), exit=None))
    failed = next(a for a in det.check(T0) if a.kind == "crash")
    assert failed.message.startswith("trainer failed") and "None" not in failed.message


def test_finished_run_raises_nothing_later() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=5))
    t = healthy(det)
    det.feed(status("finished"))
    assert det.check(t + 10_000) == []


def test_nan_loss_and_failed_and_lost() -> None:
    det = AlertDetector("h")
    healthy(det, steps=3)
    det.feed(metric(4, T0 + 4, loss=math.nan))
    assert ("nan", None) in kinds(det.check(T0 + 5))
    det2 = AlertDetector("h")
    det2.feed(status("failed", exit_reason="rank 1 failed at step 3: RuntimeError: CUDA out of memory"))
    assert ("crash", None) in kinds(det2.check(T0))
    det2.feed(status("failed", exit_reason="loss is NaN at step 7"))
    assert ("nan", None) in kinds(det2.check(T0))
    # the trainer's own words for a NaN failure (nsa/train/cli.py, tests/train/test_train_faults.py)
    det2.feed(status("failed", exit_reason="non-finite loss at step 3 on rank(s) [1]; every rank stopped; "
                                           "the last good checkpoint step-2 is kept"))
    assert ("nan", None) in kinds(det2.check(T0))
    det2.feed(status("failed", exit_reason="non-finite gradient norm at step 4 with a finite loss"))
    assert ("nan", None) in kinds(det2.check(T0))
    det2.feed(status("failed", exit_reason='rank 0 failed at step 4: OSError: disk full\n'
                                           '  File "/home/fernando/nsa/train/cli.py", line 9'))
    assert kinds(det2.check(T0)) == {("crash", None)}
    det2.feed(status("lost"))
    assert ("lost", None) in kinds(det2.check(T0))


def test_throughput_collapse_over_a_whole_window_not_a_few_slow_steps() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=1000, throughput_window_s=60))
    det.feed(status())
    for s in range(1, 201):
        det.feed(metric(s, T0 + s, tps=1000.0))
    assert det.check(T0 + 201) == []
    for s in range(201, 221):  # a busy scheduler: 20 s of slow steps among fast ones
        det.feed(metric(s, T0 + s, tps=100.0 if s % 3 else 1000.0))
    assert det.check(T0 + 221) == []
    for s in range(221, 241):  # 20 s of uniformly slow steps: not yet a window's median
        det.feed(metric(s, T0 + s, tps=100.0))
    assert det.check(T0 + 241) == []
    for s in range(241, 281):  # a minute of it
        det.feed(metric(s, T0 + s, tps=100.0))
    [drop] = det.check(T0 + 281)
    assert drop.kind == "throughput" and "last 60 s" in drop.message


def test_nccl_hang_signature_needs_busy_gpu_at_idle_power() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=5, train_factor=1))
    det.feed(status())
    det.feed(metric(21, T0, step_time=1.0))
    for k in range(0, 20):
        det.feed(beat(0, 21, T0 + k, gpu=0))
    gpu = GpuReading(index=0, util_pct=100, power_w=80.0, power_limit_w=400.0, pids=[100])
    det.feed(host(T0 + 19, gpu))
    alerts = det.check(T0 + 19)
    assert ("nccl_hang", 0) in kinds(alerts) and ("stall", 0) in kinds(alerts)
    gpu.power_w = 390.0  # busy and drawing power: working, not the hang signature
    det.feed(host(T0 + 19, gpu))
    assert ("nccl_hang", 0) not in kinds(det.check(T0 + 19))


def test_config_name_mismatch() -> None:
    assert expected_from_name("nsa-125m-seq2048") == (125e6, 2048)
    assert expected_from_name("tiny-cpu") == (None, None)
    det = AlertDetector("h")
    det.feed(status(config={"name": "nsa-125m-seq2048"}, param_count=2_000_000, seq_len=128))
    assert {("config_size", None), ("config_seq", None)} <= kinds(det.check(T0))
    det2 = AlertDetector("h")
    det2.feed(status(config={"name": "nsa-125m"}, param_count=124_000_000, seq_len=2048))
    assert det2.check(T0) == []
    det3 = AlertDetector("h")  # a toy config running under a big run name
    det3.feed(status(config={"name": "tiny-cpu"}, name="nsa-125m-main", param_count=970_000, seq_len=128))
    assert kinds(det3.check(T0)) == {("config_size", None)}


def test_clock_skew_between_client_and_host() -> None:
    skew = 3600.0  # the client's clock is an hour ahead of the host's
    det = AlertDetector("h", Thresholds(train_floor_s=5, train_factor=1))
    det.feed(status())
    for k in range(0, 4):
        det.feed(beat(0, k, T0 + k, received=T0 + k + skew + 0.05))
        det.feed(metric(k, T0 + k))
    assert det.check(T0 + 3 + skew + 1) == []
    assert ("stall", 0) in kinds(det.check(T0 + 3 + skew + 6))


def test_traceback_tail_picks_the_rank_traceback_not_torchruns() -> None:
    tb = "Traceback (most recent call last):"
    lines = ["step 4", tb, '  File "trainer.py", line 1', "InjectedCrash: boom", "other output", tb,
             '  File "torch/distributed/run.py", line 9',
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "=====", "summary"]
    assert traceback_tail(lines) == lines[1:4]
    assert traceback_tail(["a", "b"]) == ["a", "b"]
    long = ["Traceback (most recent call last):"] + [f"  File {i}" for i in range(30)] + ["E: x"]
    assert traceback_tail(long, 10) == [long[0], "...", *long[-8:]]


def test_partial_batches_of_one_rank_are_no_drift() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=1000))
    det.feed(status())
    for s in range(1, 11):  # rank 0's lines for 10 fast steps arrive before rank 1's
        det.feed(beat(0, s, T0 + s * 0.01))
    for s in range(1, 6):
        det.feed(beat(1, s, T0 + s * 0.01))
    assert det.check(T0 + 0.2) == []
    for s in range(6, 11):
        det.feed(beat(1, 5, T0 + s * 0.01))  # now rank 1 really stays behind at step 5
    assert ("drift", 1) in kinds(det.check(T0 + 0.2))


def test_no_liveness_alerts_while_a_backlog_arrives() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=5, train_factor=1))
    now = T0 + 3600  # an hour-old backlog of a run that is alive now
    det.feed(status("running", initial=True, received=now))
    for s in range(1, 10):
        det.feed(beat(0, s, T0 + s, received=now))
        det.feed(metric(s, T0 + s))
    assert det.check(now) == []
    det.feed(Event("synced", RUN, "synced", 0, Synced(ts=now), received=now))
    assert ("no_heartbeat", 0) in kinds(det.check(now))  # nothing newer came: now it counts


def test_nccl_signature_matches_gpu_by_uuid_when_indexes_are_renumbered() -> None:
    det = AlertDetector("h", Thresholds(train_floor_s=5, train_factor=1))
    det.feed(status())
    det.feed(metric(1, T0, step_time=1.0))
    for k in range(0, 20):  # CUDA_VISIBLE_DEVICES=1: the rank calls it cuda:0
        det.feed(beat(0, 1, T0 + k, gpu=0, pid=900, uuid="GPU-b"))
    busy = {"util_pct": 100, "power_w": 70.0, "power_limit_w": 700.0}
    det.feed(host(T0 + 19, GpuReading(index=0, uuid="GPU-a", **busy),
                  GpuReading(index=1, uuid="GPU-b", **busy)))
    hangs = [a for a in det.check(T0 + 19) if a.kind == "nccl_hang"]
    assert [a.gpu for a in hangs] == [1]


# torchrun's own words after `kill -9` of rank 1 (torch 2.13, tests/faults and bench/watchdog_faults.py)
KILLED_RANK_1 = [
    "step 30/100000 loss 3.2250",
    "[rank 0] FAILED at step 30:",
    "Traceback (most recent call last):",
    '  File "nsa/train/checkpoint.py", line 89, in save',
    "    dist.barrier()",
    "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:31457.",
    "E1123 05:23:40.474000 13591 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
    "(exitcode: -9) local_rank: 1 (pid: 13613) of binary: python",
    "Traceback (most recent call last):",
    '  File "torch/distributed/run.py", line 1028, in main',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "nsa.train FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "[1]:",
    "  time      : 2026-11-23_05:23:40",
    "  host      : localhost",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : 1 (pid: 13612) ",
    "  error_file: <N/A>",
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2026-11-23_05:23:39",
    "  host      : localhost",
    "  rank      : 1 (local_rank: 1)",
    "  exitcode  : -9 (pid: 13613)  (SIGKILL)",
    "  error_file: <N/A>",
    "  traceback : Signal 9 (SIGKILL) received by PID 13613",
    "============================================================",
]


def final_beat(rank: int, ts: float, phase: str, step: int, error: str | None = None) -> Event:
    b = Beat(ts=ts, run_id=RUN, rank=rank, step=step, phase=Phase(phase), pid=100 + rank, error=error)
    return Event("beats", RUN, f"heartbeats/rank-{rank}", 0, [b])


def test_a_killed_rank_is_the_root_cause_not_the_survivor_that_failed_after_it() -> None:
    """kill -9 of rank 1: rank 0 then fails on the broken collective and writes run.json's reason.
    The alert names rank 1 and its signal, with torchrun's summary of it as evidence."""
    det = AlertDetector("h")
    healthy(det, steps=30)  # rank 1's last beat: T0 + 30 (then it was killed)
    det.feed(final_beat(0, T0 + 30.4, "failed", 30, "rank 0 failed during checkpoint (after step 30): "
                                                    "RuntimeError: Connection closed by peer"))
    det.feed(status("failed", exit_code=1, step=30, log_tail=KILLED_RANK_1,
                    exit_reason="rank 0 failed during checkpoint (after step 30): RuntimeError: Connection "
                                "closed by peer"))
    [crash] = [a for a in det.check(T0 + 40) if a.kind == "crash"]
    assert crash.rank == 1
    assert crash.message.index("rank 1 was killed by signal 9 (SIGKILL)") < crash.message.index("rank 0")
    assert any("exitcode  : -9" in ln for ln in crash.log_tail)
    assert not any("Connection closed" in ln for ln in crash.log_tail)
    # rank 0 killed instead: no end status from anyone (crashed); rank 1's connection error is not the cause
    det2 = AlertDetector("h")
    healthy(det2, steps=30)
    det2.feed(final_beat(1, T0 + 30.4, "failed", 30, "rank 1 failed at step 31: RuntimeError: reset"))
    swapped = [ln.replace("rank      : 1 (", "rank      : X (").replace("rank      : 0 (", "rank      : 1 (")
               .replace("rank      : X (", "rank      : 0 (") for ln in KILLED_RANK_1]
    det2.feed(status("crashed", exit_code=1, step=30, log_tail=swapped))
    [crash] = [a for a in det2.check(T0 + 40) if a.kind == "crash"]
    assert crash.rank == 0 and "rank 0 was killed by signal 9" in crash.message


def test_the_rank_that_raised_first_is_the_cause_when_both_wrote_tracebacks() -> None:
    det = AlertDetector("h")
    healthy(det, steps=4)
    det.feed(final_beat(1, T0 + 5.0, "failed", 4, "rank 1 failed at step 5: InjectedCrash: boom"))
    det.feed(final_beat(0, T0 + 5.2, "failed", 4, "rank 0 failed at step 5: RuntimeError: Connection reset"))
    det.feed(status("failed", exit_code=1, exit_reason="rank 1 failed at step 5: InjectedCrash: boom"))
    [crash] = [a for a in det.check(T0 + 9) if a.kind == "crash"]
    assert crash.rank == 1 and "InjectedCrash" in crash.message and "then" not in crash.message


def test_a_rank_process_gone_while_the_run_lives_is_a_crash_at_once() -> None:
    det = AlertDetector("h", Thresholds(no_heartbeat_s=30))
    t = healthy(det, steps=10)
    det.feed_rank_gone(RUN, 1, t + 0.5)
    [crash] = [a for a in det.check(t + 1) if a.kind == "crash"]
    assert crash.rank == 1 and crash.severity == "critical" and "gone" in crash.message
    assert ("no_heartbeat", 1) not in kinds(det.check(t + 60))  # said once, as a crash


def test_disk_nearly_full_and_a_run_that_failed_for_want_of_space() -> None:
    from nsa.contract.records import Usage

    def disk(free: int) -> Event:
        sample = HostSample(ts=T0, disk=Usage(free_bytes=free, total_bytes=10**6))
        return Event("host", None, "host", 1, sample)

    det = AlertDetector("h", Thresholds(disk_warn_bytes=1000, disk_critical_bytes=100))
    det.feed(status())
    det.feed(disk(5000))
    assert det.check(T0) == []
    det.feed(disk(500))
    [low] = det.check(T0)
    assert (low.kind, low.severity, low.run) == ("disk", "warning", None)
    det.feed(disk(50))
    assert det.check(T0)[0].severity == "critical"
    det2 = AlertDetector("h")
    det2.feed(status("failed", exit_reason="rank 0 failed during checkpoint (after step 3): OSError: "
                                           "[Errno 28] No space left on device"))
    [full] = det2.check(T0)
    assert full.kind == "disk_full" and "no space left" in full.message


def test_a_rank_alive_after_its_launcher_is_an_orphan() -> None:
    from nsa.contract import LaunchInfo

    det = AlertDetector("h")
    healthy(det, steps=3)
    launch = LaunchInfo(run_id=RUN, name="run", created=T0, launcher_pid=42)
    v = view("running")
    det.feed_view(RUN, msgspec_replace(v, launch=launch, launcher_alive=True, alive=True, pids=[101]))
    assert det.check(T0 + 3.5) == []
    det.feed_view(RUN, msgspec_replace(v, launch=launch, launcher_alive=False, alive=True, pids=[101]))
    [orphan] = [a for a in det.check(T0 + 3.5) if a.kind == "orphan_rank"]
    assert orphan.rank == 1 and "outlived" in orphan.message


def msgspec_replace(obj, **kw):
    import msgspec

    return msgspec.structs.replace(obj, **kw)


def test_a_non_numeric_loss_is_no_nan_alert() -> None:
    """A metrics line whose loss is not a number is skipped (and counted) at the edge; only a real
    non-finite loss ("NaN", as the trainer writes it) is a NaN."""
    from nsa.contract import Metric, decode_lines
    from nsa.contract.io import LineStats

    stats = LineStats()
    lines = ['{"kind":"train","ts":1,"step":5,"loss":"abc"}', '{"kind":"train","ts":1,"step":6,"loss":true}',
             '{"kind":"train","ts":1,"step":7,"loss":"1e999x"}']
    det = AlertDetector("h")
    healthy(det, steps=4)
    det.feed(Event("metrics", RUN, "metrics", 0, decode_lines(lines, Metric, stats)))
    assert stats.bad == 3 and not [a for a in det.check(T0 + 5) if a.kind == "nan"]
    nan = decode_lines(['{"kind":"train","ts":1,"step":8,"loss":"NaN"}'], Metric)
    det.feed(Event("metrics", RUN, "metrics", 0, nan))
    assert ("nan", None) in kinds(det.check(T0 + 5))


def test_a_gap_in_a_ranks_beats_is_no_drift() -> None:
    """Beats that never arrived (a heartbeat file rotated twice before it was read) leave a gap:
    the step within it lies between the gap's ends, so the other rank's newer step is no drift."""
    det = AlertDetector("h", Thresholds(train_floor_s=1000))
    det.feed(status())
    for s in range(1, 86):
        det.feed(beat(0, s, T0 + s * 0.1))
        det.feed(beat(1, s, T0 + s * 0.1 + 0.001))
    det.feed(beat(0, 95, T0 + 9.5))  # a second later, ten steps on: both ranks' files were rotated
    det.feed(beat(1, 95, T0 + 9.5003))
    assert det.check(T0 + 9.6) == []
    for s in range(96, 100):  # rank 1 really stays at step 95
        det.feed(beat(0, s, T0 + s * 0.1))
        det.feed(beat(1, 95, T0 + s * 0.1 + 0.001))
    assert ("drift", 1) in kinds(det.check(T0 + 10))


def test_the_exit_reason_leads_with_the_rank_that_failed_first() -> None:
    """run.json's exit_reason is rank 0's knock-on error after rank 1 was killed: the supervisor
    puts the root cause first and keeps rank 0's words after it."""
    from nsa_tui.health.rootcause import RootCause, headline

    cause = RootCause(1, "rank 1 was killed by signal 9 (SIGKILL) at step 1220 (phase train), without a "
                         "final heartbeat", by_signal=True)
    reason = ("rank 0 failed at step 1221: RuntimeError: [pair.cc:537] Read error: Connection reset by peer\n"
              "Traceback (most recent call last):\n  ...")
    lines = (headline(reason, cause) or "").splitlines()
    assert lines[0] == cause.text
    assert lines[1] == "(then: rank 0 failed at step 1221: RuntimeError: [pair.cc:537] Read error: " \
                       "Connection reset by peer)"
    assert lines[2:] == ["Traceback (most recent call last):", "  ..."]
    assert headline("rank 1 failed at step 3: ValueError: x", cause) is None  # already the root cause
    assert headline("rank 10 failed at step 3: ValueError: x", cause) is not None  # rank 10 is not rank 1
