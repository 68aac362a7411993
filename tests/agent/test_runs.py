"""Run records, liveness (PID reuse, reboots), kill, line tailing and host samples.

Real processes and real files; only NVML readings are faked (behind GpuSource).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsa.contract import GpuReading, RunStatus
from nsa.contract.io import read_lines, tail_lines
from nsa_tui.agent.launcher import Launcher
from nsa_tui.agent.procs import boot_id, run_processes
from nsa_tui.agent.runs import RunStore
from nsa_tui.agent.sampler import HostSampler, NvmlSource


def write_json(path: Path, obj: dict) -> None:
    """A file as another process (trainer, agent, an older version) would have written it."""
    path.write_text(json.dumps(obj))

# a process tree like torchrun's: a leader and two "ranks"
TREE = ("import subprocess,sys,time; "
        "ps=[subprocess.Popen([sys.executable,'-c','import time; time.sleep(300)']) for _ in range(2)]; "
        "time.sleep(300)")


def fake_run(store: RunStore, run_id: str, env_id: str | None = None, boot: str | None = None,
             status: str | None = "running") -> tuple[Path, subprocess.Popen[bytes]]:
    """A run directory whose recorded group is a real detached process tree."""
    d = store.root / run_id
    d.mkdir(parents=True, mode=0o700)
    env = dict(os.environ)
    if env_id:
        env["NSA_RUN_ID"] = env_id
    proc = subprocess.Popen([sys.executable, "-c", TREE], env=env, start_new_session=True)
    write_json(d / "launch.json", {"run_id": run_id, "name": "fake", "created": time.time(),
                                   "launcher_pid": proc.pid, "launcher_pgid": proc.pid,
                                   "boot_id": boot or boot_id(), "nproc": 2})
    if status:
        write_json(d / "run.json", {"run_id": run_id, "name": "fake", "status": status, "step": 3})
    return d, proc


def wait_children(n: int, run_id: str, pgid: int) -> None:
    deadline = time.monotonic() + 10
    while len(run_processes(run_id, pgid)) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def launched(store: RunStore, rid: str, code: str) -> subprocess.Popen[bytes]:
    """``code`` started as a run's detached launcher (``NSA_RUN_ID``, its own group, recorded in
    launch.json), once it and the one child it starts are up."""
    d = store.root / rid
    d.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, NSA_RUN_ID=rid),
                            start_new_session=True)
    write_json(d / "launch.json", {"run_id": rid, "name": "k", "created": time.time(),
                                   "launcher_pid": proc.pid, "launcher_pgid": proc.pid, "boot_id": boot_id()})
    wait_children(2, rid, proc.pid)
    return proc


def reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait(5)


def test_read_lines_offsets_partial_lines_and_truncation(tmp_path: Path) -> None:
    f = tmp_path / "m.jsonl"
    assert read_lines(str(f), 0) == ([], 0)  # absent
    f.write_bytes(b'{"a":1}\n{"b":2}\n{"c"')
    lines, off = read_lines(str(f), 0)
    assert [ln.text for ln in lines] == ['{"a":1}', '{"b":2}'] and off == 16
    assert [ln.offset for ln in lines] == [8, 16]
    assert read_lines(str(f), off) == ([], 16)  # the half line waits for its newline
    with open(f, "ab") as fh:
        fh.write(b':3}\n')
    lines, off = read_lines(str(f), off)
    assert [ln.text for ln in lines] == ['{"c":3}'] and off == f.stat().st_size
    lines, _ = read_lines(str(f), 8)  # resume from a saved offset: exactly the rest
    assert [ln.text for ln in lines] == ['{"b":2}', '{"c":3}']
    f.write_bytes(b"new\n")  # replaced by a shorter file: start again
    assert [ln.text for ln in read_lines(str(f), 24)[0]] == ["new"]
    f.write_bytes(b"x" * 100)  # one line longer than the chunk is delivered cut, never stalls
    lines, off = read_lines(str(f), 0, max_bytes=40)
    assert len(lines) == 1 and off == 40
    (tmp_path / "log").write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail_lines(str(tmp_path / "log"), 3) == ["line 97", "line 98", "line 99"]


def test_liveness_needs_group_and_run_id(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    _, good = fake_run(store, "20260101-000000-a-0001", env_id="20260101-000000-a-0001")
    _, reused = fake_run(store, "20260101-000000-b-0002", env_id=None)  # PID reuse: right group, no id
    _, old = fake_run(store, "20260101-000000-c-0003", env_id="20260101-000000-c-0003", boot="other-boot")
    try:
        wait_children(3, "20260101-000000-a-0001", good.pid)
        rec = store.view("20260101-000000-a-0001")
        assert rec.alive and rec.status == RunStatus.RUNNING and len(rec.pids) == 3
        rec = store.view("20260101-000000-b-0002")
        assert not rec.alive and rec.status == RunStatus.CRASHED
        rec = store.view("20260101-000000-c-0003")  # launched before a reboot: lost, whatever runs now
        assert not rec.alive and rec.status == RunStatus.LOST
        assert [r.run_id for r in store.views()] == [
            "20260101-000000-c-0003", "20260101-000000-b-0002", "20260101-000000-a-0001"]
    finally:
        for p in (good, reused, old):
            reap(p)
    with pytest.raises(KeyError):
        store.run_dir("../etc")


def test_a_rank_that_outlived_its_launcher_keeps_the_run_alive(tmp_path: Path) -> None:
    """torchrun runs each rank in a session of its own: with the launcher group gone (KILL), a
    rank still up (checkpointing after its PDEATHSIG, or hung) means the run is not crashed."""
    store = RunStore(tmp_path)
    rid = "20260101-000000-o-0006"
    d, launcher = fake_run(store, rid, env_id=rid)
    reap(launcher)  # the recorded group is gone
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            env=dict(os.environ, NSA_RUN_ID=rid, RANK="0"), start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                             start_new_session=True)  # a pid that is not the run's: never counts
    try:
        (d / "heartbeats").mkdir()
        beat = {"ts": time.time(), "run_id": rid, "rank": 0, "pid": rank.pid}
        (d / "heartbeats" / "rank-0.jsonl").write_text(json.dumps(beat) + "\n")
        beat = {**beat, "rank": 1, "pid": other.pid}
        (d / "heartbeats" / "rank-1.jsonl").write_text(json.dumps(beat) + "\n")
        rec = store.view(rid)
        assert rec.alive and rec.status == RunStatus.RUNNING and rec.pids == [rank.pid]
        rank.kill()
        rank.wait(5)
        rec = store.view(rid)
        assert not rec.alive and rec.status == RunStatus.CRASHED
    finally:
        for p in (rank, other):
            p.kill()
            p.wait(5)


def test_crashed_record_has_exit_code_and_tail(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    d, p = fake_run(store, "20260101-000000-x-0004", env_id="20260101-000000-x-0004")
    reap(p)
    (d / "exit.json").write_text(json.dumps({"exit_code": 1}))
    (d / "train.log").write_text("boot\nTraceback (most recent call last):\nRuntimeError: boom\n")
    rec = store.view("20260101-000000-x-0004")
    assert rec.status == RunStatus.CRASHED and rec.exit is not None and rec.exit.exit_code == 1
    assert rec.log_tail[-1] == "RuntimeError: boom"
    write_json(d / "run.json", {"run_id": "20260101-000000-x-0004", "name": "x", "status": "finished"})
    assert store.view("20260101-000000-x-0004").status == RunStatus.FINISHED


def test_periodic_looks_share_a_recent_view_and_an_acting_look_never_does(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    rid = "20260101-000000-x-0005"
    d, p = fake_run(store, rid, env_id=rid)
    try:
        wait_children(3, rid, p.pid)
        first = store.view(rid, with_tail=False, max_age_s=60.0)
        assert first.status == RunStatus.RUNNING and first.alive
        reap(p)
        (d / "exit.json").write_text(json.dumps({"exit_code": 1}))
        (d / "train.log").write_text("RuntimeError: boom\n")
        assert store.view(rid, max_age_s=60.0) is first  # the periodic look: as it was a moment ago
        deadline = time.monotonic() + 30  # the host's process scan is shared for half a second
        while (now := store.view(rid)).status != RunStatus.CRASHED:  # kill, delete: what is true now
            assert time.monotonic() < deadline, now.status
            time.sleep(0.05)
        assert now.log_tail == ["RuntimeError: boom"]
        shared = store.view(rid, max_age_s=60.0)  # the newest view, the crash's tail added
        assert shared.status == RunStatus.CRASHED and shared.log_tail == ["RuntimeError: boom"]
        assert store.view(rid, with_tail=False, max_age_s=60.0).log_tail == []
    finally:
        reap(p)


async def test_kill_takes_the_whole_group_even_when_term_is_ignored(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    rid = "20260101-000000-k-0005"
    code = ("import signal,subprocess,sys,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "subprocess.Popen([sys.executable,'-c','import time; time.sleep(300)']); time.sleep(300)")
    proc = launched(store, rid, code)
    try:
        t0 = time.monotonic()
        res = await Launcher(store).kill(rid, grace_s=1.0)
        assert res.was_running and res.forced and res.remaining == []
        assert time.monotonic() - t0 < 8
        await asyncio.to_thread(proc.wait, 5)
        assert run_processes(rid) == []
        assert store.view(rid).status == RunStatus.STOPPED
        assert (await Launcher(store).kill(rid)).was_running is False
    finally:
        reap(proc)


class FakeGpus:
    """NVML readings for tests: two GPUs, the second lost (N/A values)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def count(self) -> int:
        return 2

    def read(self) -> tuple[list[GpuReading], str]:
        g0 = GpuReading(index=0, name="Fake H100", mem_used_bytes=10 << 30, mem_total_bytes=80 << 30,
                        util_pct=97, power_w=650.0, power_limit_w=700.0, temp_c=61, pids=[self.pid])
        return [g0, GpuReading(index=1)], "GPU 1 not reachable"


def test_host_sample_without_nvml_is_na_not_an_error(tmp_path: Path) -> None:
    src = NvmlSource()  # the real path: this machine has no NVML library
    pytest.importorskip("pynvml")
    if src.ok:
        pytest.skip("NVML present here")
    assert src.count() == 0
    s = HostSampler(str(tmp_path), src).sample()
    assert s.gpus is None and "NVML" in s.gpu_message
    assert s.ram.total_bytes and s.disk.total_bytes and s.cpu_pct is not None and 0 <= s.cpu_pct <= 100


def test_host_sample_names_the_rank_on_each_gpu(tmp_path: Path) -> None:
    rid = "20260101-000000-g-0006"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env=dict(os.environ, NSA_RUN_ID=rid, RANK="1"))
    try:
        time.sleep(0.2)
        s = HostSampler(str(tmp_path), FakeGpus(proc.pid)).sample()
        assert s.gpus is not None
        assert [(r.pid, r.run, r.rank) for r in s.gpus[0].ranks] == [(proc.pid, rid, 1)]
        assert s.gpus[1].util_pct is None and s.gpu_message == "GPU 1 not reachable"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.gpu
def test_real_nvml_readings_on_a_gpu_host(tmp_path: Path) -> None:
    src = NvmlSource()
    if not src.ok or src.count() == 0:
        pytest.skip("no NVML GPU on this machine")
    s = HostSampler(str(tmp_path), src).sample()
    assert s.gpus
    g = s.gpus[0]
    assert g.mem_total_bytes and g.util_pct is not None and g.name
    assert g.power_w is None or g.power_w > 0
    assert Launcher(RunStore(tmp_path), gpu_count=src.count()).gpu_count == src.count()


class _NvmlError(Exception):
    pass


class LostGpuNvml:
    """A stand-in for the pynvml module: GPU 0 answers, GPU 1 fell off the bus."""

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's names
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        if i == 1:
            raise _NvmlError("GPU is lost")
        return i

    def __getattr__(self, name: str):  # every other getter of GPU 0
        values = {"nvmlDeviceGetMemoryInfo": type("M", (), {"used": 1 << 30, "total": 80 << 30})(),
                  "nvmlDeviceGetUtilizationRates": type("U", (), {"gpu": 50})(),
                  "nvmlDeviceGetPowerUsage": 300_000, "nvmlDeviceGetEnforcedPowerLimit": 700_000,
                  "nvmlDeviceGetTemperature": 55, "nvmlDeviceGetComputeRunningProcesses": [],
                  "nvmlDeviceGetName": b"Fake", "nvmlDeviceGetUUID": "GPU-0"}
        if name not in values:
            raise AttributeError(name)
        if name == "nvmlDeviceGetTemperature":
            return lambda h, sensor: values[name]
        return lambda h: values[name]


def test_lost_gpu_gives_na_values_and_a_message(tmp_path: Path) -> None:
    src = NvmlSource()
    src.ok, src.nv = True, LostGpuNvml()  # readings faked behind the real NvmlSource code
    gpus, msg = src.read()
    assert gpus is not None
    assert gpus[0].power_w == 300.0 and gpus[0].mem_total_bytes == 80 << 30
    assert gpus[0].name == "Fake" and gpus[0].temp_c == 55
    assert gpus[1].util_pct is None and gpus[1].mem_used_bytes is None and "GPU 1" in msg


def test_fallback_picks_the_gpu_with_most_free_memory(tmp_path: Path) -> None:
    gpus = [GpuReading(index=0, mem_used_bytes=70 << 30, mem_total_bytes=80 << 30),
            GpuReading(index=1, mem_used_bytes=1 << 30, mem_total_bytes=80 << 30), GpuReading(index=2)]
    assert Launcher(RunStore(tmp_path), read_gpus=lambda: (gpus, "")).freest_gpu() == 1
    assert Launcher(RunStore(tmp_path), read_gpus=lambda: (None, "NVML unavailable")).freest_gpu() is None


async def test_a_stop_leaves_the_supervisor_to_its_last_deliveries(tmp_path: Path) -> None:
    """Once torchrun has ended after a person's stop, all the supervisor has left is the run's
    last alerts and their deliveries (up to a minute): the stop returns, unforced, and leaves it
    to them. It waited out its grace, then killed the supervisor and the deliveries with it."""
    store = RunStore(tmp_path)
    rid = "20260101-000000-k-0006"
    d = store.root / rid
    # deaf to TERM as the real supervisor is (a handler, not SIG_IGN, which "torchrun" would
    # inherit); after torchrun's end it writes exit.json, then delivers slowly
    code = ("import signal,subprocess,sys,time; from pathlib import Path;"
            "from nsa.contract import ExitInfo, write_json_atomic;"
            "signal.signal(signal.SIGTERM, lambda *a: None);"
            "subprocess.Popen([sys.executable,'-c','import time; time.sleep(300)']).wait();"
            f"write_json_atomic(Path({str(d / 'exit.json')!r}), ExitInfo(exit_code=0, ended_at=time.time()));"
            "time.sleep(300)")
    proc = launched(store, rid, code)
    try:
        res = await Launcher(store).kill(rid, grace_s=30.0)
        assert res.was_running and not res.forced
        assert (d / "exit.json").is_file() and proc.poll() is None  # still delivering, never signalled
        assert [p.pid for p in run_processes(rid)] == [proc.pid]
        assert store.view(rid).status == RunStatus.STOPPED
        assert not (await Launcher(store).kill(rid)).was_running  # nothing left to stop
    finally:
        reap(proc)


def _sleeping_launcher(tmp_path: Path) -> tuple[Launcher, Path]:
    """A Launcher whose supervisor runs for real while "torchrun" is a long sleep."""
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/sh\nif [ "$2" = nsa_tui.agent.supervise ]; then exec {sys.executable} "$@"; fi\n'
                    "exec sleep 300\n")
    shim.chmod(0o755)
    config = Path(__file__).resolve().parents[2] / "configs" / "smoke-cpu.yaml"
    return Launcher(RunStore(tmp_path / "runs"), python=str(shim)), config


async def test_launcher_processes_never_count_as_ranks(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent whose own environment has RANK (a PyTorchJob pod) must not pass it to the supervisor
    and torchrun: RANK marks the ranks, which dump sends SIGUSR1 (fatal to torchrun)."""
    monkeypatch.setenv("RANK", "3")
    launcher, config = _sleeping_launcher(tmp_path)
    res = await asyncio.to_thread(launcher.launch, str(config), nproc=1)
    rid = res.run_id
    try:
        wait_children(2, rid, res.launcher_pid)
        procs = run_processes(rid)
        assert len(procs) == 2 and [p.rank for p in procs] == [None, None], procs
        with pytest.raises(Exception, match="no live rank"):
            await launcher.dump(rid)
    finally:
        await launcher.kill(rid, grace_s=1.0)
    assert run_processes(rid) == []


async def test_a_run_launched_a_moment_ago_is_not_crashed(tmp_path: Path) -> None:
    """The agent shares one /proc scan for half a second; one taken just before a launch must not
    make the new run look dead (crashed: a false crash alert, `logs -f` ending at once)."""
    from nsa_tui.agent.procs import process_groups

    launcher, config = _sleeping_launcher(tmp_path)
    process_groups(0.0)  # a watch of another run just scanned /proc
    res = launcher.launch(str(config), nproc=1)
    try:
        rec = launcher.store.view(res.run_id)
        assert rec.alive and rec.status == RunStatus.STARTING, rec.status
    finally:
        await launcher.kill(res.run_id, grace_s=1.0)
    assert run_processes(res.run_id) == []
