"""``describe`` (what a config is, whether it can run here), ``launch``'s refusal, ``plan`` (what a
fallback or resume would do) and a dump's missing ranks: through the real agent (local
transport) over real files; the Hub probe against real sockets on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nsa.config import load_config
from nsa.contract import (
    WATCHDOG_STOP,
    Beat,
    CheckpointMeta,
    ExitInfo,
    LaunchInfo,
    Phase,
    RunInfo,
    RunStatus,
    StopInfo,
    write_json_atomic,
)
from nsa.size import param_count
from nsa_tui.agent.dump import _missing_ranks
from nsa_tui.hosts.client import AgentError, HostClient
from tests.agent.e2e import stop_all

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny-cpu.yaml")
DENSE_125M = str(REPO / "configs" / "dense-125m.yaml")


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


async def client(tmp_path: Path) -> HostClient:
    c = HostClient("local", runs_root=str(tmp_path / "runs"))
    await c.start()
    return c


async def test_describe_says_what_a_config_is_and_that_it_runs_here(tmp_path: Path) -> None:
    c = await client(tmp_path)
    try:
        d = await c.describe(TINY)
        cfg = load_config(TINY)
        assert d.params == param_count(cfg.model) == 1_528_240 and d.attention == "nsa"
        assert (d.seq_len, d.nproc, d.global_batch, d.steps) == (256, 1, 8, cfg.train.steps)
        assert d.needs == "CPU or CUDA" and d.runs_on == "cpu" and d.data.startswith("stdlib")
        assert d.problems == [] and d.config == TINY
        d = await c.describe(TINY, nproc=2, overrides=["train.grad_accum=3"])
        assert d.global_batch == 8 * 2 * 3
        with pytest.raises(AgentError) as err:
            await c.describe(TINY, overrides=["train.stepz=1"])
        assert err.value.code == "bad_config" and "--set train.stepz=1" in err.value.message
    finally:
        await c.close()


async def test_a_cuda_only_config_on_a_cpu_host_is_refused_with_the_reason(tmp_path: Path) -> None:
    c = await client(tmp_path)
    try:
        if c.hello.gpus:
            pytest.skip("this host has a GPU")
        for override, why in (("train.device=cuda", "train.device is cuda"),
                              ("train.dtype=bf16", "train.dtype bf16 runs on CUDA only")):
            d = await c.describe(TINY, overrides=[override])
            assert d.needs == "CUDA" and len(d.problems) == 1
            assert d.problems[0].startswith(f"needs CUDA ({why}) but this host has no GPU")
            with pytest.raises(AgentError) as err:
                await c.launch(TINY, overrides=[override])
            assert err.value.code == "cannot_run" and why in err.value.message
        assert await c.runs() == []
    finally:
        await c.close()


async def test_a_hub_source_without_network_is_refused(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe connects where datasets would (HF_ENDPOINT here): a closed port is "no network",
    a listening socket is reachable."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    c = await client(tmp_path)
    try:
        d = await c.describe(DENSE_125M, overrides=["train.device=auto", "train.dtype=auto"])
        assert d.params > 100_000_000 and d.data.startswith("fineweb-edu from the Hugging Face Hub")
        assert any("cannot reach" in p and "127.0.0.1" in p for p in d.problems), d.problems
        with pytest.raises(AgentError) as err:
            await c.launch(DENSE_125M, overrides=["train.device=auto", "train.dtype=auto"])
        assert err.value.code == "cannot_run" and "Hugging Face Hub" in err.value.message
    finally:
        await c.close()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    c = await client(tmp_path)
    try:
        d = await c.describe(DENSE_125M, overrides=["train.device=auto", "train.dtype=auto"])
        assert not [p for p in d.problems if "Hub" in p], d.problems
    finally:
        await c.close()
        server.close()


def stopped_run(root: Path, run_id: str, world: int = 2, checkpoint: bool = True) -> Path:
    d = root / run_id
    (d / "checkpoints" / "step-30").mkdir(parents=True)
    if checkpoint:  # complete: meta.json is there (written last by a save)
        write_json_atomic(d / "checkpoints" / "step-30" / "meta.json", CheckpointMeta(
            step=30, tokens=0, world_size=world, grad_accum=1, batch_size=2, global_batch=2 * world,
            seq_len=64, n_streams=world, data_positions={}))
        (d / "checkpoints" / "latest").write_text("step-30")
    (d / "config.yaml").write_text((REPO / "configs" / "smoke-cpu.yaml").read_text())
    write_json_atomic(d / "launch.json", LaunchInfo(run_id=run_id, name="exp-resume", created=time.time(),
                                                    nproc=world, overrides=["train.steps=100"]))
    write_json_atomic(d / "run.json", RunInfo(run_id=run_id, name="exp", status=RunStatus.STOPPED,
                                              world_size=world, batch_size=2, grad_accum=1,
                                              global_batch=2 * world, step=31))
    return d


async def test_plan_says_exactly_what_fallback_and_resume_would_do(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    stopped_run(root, "20260101-000000-exp-0001")
    stopped_run(root, "20260101-000000-exp-0002", checkpoint=False)
    c = await client(tmp_path)
    try:
        fb = await c.plan("20260101-000000-exp-0001", "fallback")
        assert (fb.nproc, fb.grad_accum, fb.global_batch, fb.checkpoint_step) == (1, 2, 4, 30)
        assert fb.name == "exp-fallback" and fb.world_size == 2 and not fb.alive and fb.problem is None
        assert fb.checkpoint is not None and fb.checkpoint.endswith("checkpoints/step-30")
        rs = await c.plan("20260101-000000-exp-0001", "resume")
        assert (rs.nproc, rs.grad_accum, rs.name) == (2, 1, "exp-resume")
        stop = await c.plan("20260101-000000-exp-0001", "kill")
        assert (stop.op, stop.alive, stop.pids, stop.world_size) == ("kill", False, [], 2)
        none = await c.plan("20260101-000000-exp-0002", "resume")
        assert none.problem is not None and "no complete checkpoint" in none.problem
        assert [v.run_id for v in await c.runs()] == ["20260101-000000-exp-0002", "20260101-000000-exp-0001"]
    finally:
        await c.close()


async def test_a_run_stopped_before_its_first_save_resumes_from_where_it_started(tmp_path: Path) -> None:
    """A fallback stopped before it saved has lost nothing: its resume starts from the checkpoint the
    fallback started from, and the plan says so; with that checkpoint gone there is nothing to start
    from."""
    root = tmp_path / "runs"
    parent = stopped_run(root, "20260101-000000-exp-0001")
    origin = parent / "checkpoints" / "step-30"
    child = stopped_run(root, "20260101-000000-exp-0002", world=1, checkpoint=False)
    write_json_atomic(child / "launch.json", LaunchInfo(
        run_id=child.name, name="exp-fallback", created=time.time(), nproc=1, parent_run=parent.name,
        resume_from=str(origin), overrides=["train.steps=100", "train.grad_accum=2"]))
    c = await client(tmp_path)
    try:
        rs = await c.plan(child.name, "resume")
        assert (rs.problem, rs.checkpoint, rs.checkpoint_step) == (None, str(origin), 30) and rs.started_from
        assert (rs.global_batch, rs.grad_accum) == (4, 2)  # the checkpoint's batch, on one rank
        own = await c.plan(parent.name, "resume")
        assert own.checkpoint == str(origin) and not own.started_from
        (origin / "meta.json").unlink()  # incomplete now: neither run has anything to start from
        gone = await c.plan(child.name, "resume")
        assert gone.checkpoint is None and "no complete checkpoint" in (gone.problem or "")
    finally:
        await c.close()


@pytest.fixture
def finishing_supervisor(tmp_path: Path) -> Iterator[Callable[[Path], int]]:
    """``start(run_dir)``: a live process of the run that is not a rank, as the run's supervisor
    is between torchrun's end and its own (its last alerts and deliveries, up to a minute), and
    like it deaf to SIGTERM: the agent tells a run's processes by their environment. Its pid;
    killed after the test."""
    procs: list[subprocess.Popen[bytes]] = []
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True);"
            "time.sleep(300)")

    def start(run_dir: Path) -> int:
        env = {**os.environ, "NSA_RUN_ID": run_dir.name, "NSA_RUN_DIR": str(run_dir)}
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      start_new_session=True))
        assert procs[-1].stdout is not None and procs[-1].stdout.readline() == b"\n"  # TERM is ignored now
        return procs[-1].pid

    yield start
    for p in procs:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


async def test_stop_fallback_and_resume_leave_the_supervisor_of_a_run_a_person_stopped_alone(
        tmp_path: Path, finishing_supervisor: Callable[[Path], int]) -> None:
    """After a person's stop, once torchrun has ended (exit.json), the supervisor only finishes
    its last alerts: the run shows stopped, a stop has nothing left to do and signals nothing,
    and fallback and resume go ahead at once (a fallback waited out its grace, then killed the
    supervisor and the deliveries with it). Before torchrun ends, or after a stop its own
    on_failure policy made (which relaunches next), the supervisor is still the run's and resume
    waits for it."""
    root = tmp_path / "runs"
    runs = {name: stopped_run(root, f"20260101-000000-exp-000{i}") for i, name in
            enumerate(("person", "person, fallback", "policy", "torchrun up"), start=1)}
    pids = {}
    for name, d in runs.items():
        pid = pids[name] = finishing_supervisor(d)
        write_json_atomic(d / "launch.json", LaunchInfo(run_id=d.name, name="exp", created=time.time(),
                                                        nproc=2, launcher_pid=pid, launcher_pgid=pid))
        by = f"{WATCHDOG_STOP} (on_failure=restart)" if name == "policy" else "nsa-tui agent"
        write_json_atomic(d / "stop.json", StopInfo(ts=time.time(), by=by))
        if name != "torchrun up":
            write_json_atomic(d / "exit.json", ExitInfo(exit_code=0, ended_at=time.time()))
    c = await client(tmp_path)
    children = []
    try:
        views = {v.run_id: v for v in await c.runs()}
        assert not views[runs["person"].name].alive and views[runs["person"].name].status == RunStatus.STOPPED
        assert (await c.plan(runs["person"].name, "resume")).problem is None
        stop = await c.plan(runs["person"].name, "kill")
        assert (stop.alive, stop.pids) == (False, [])
        assert (await c.plan(runs["torchrun up"].name, "kill")).pids == [pids["torchrun up"]]
        assert not (await c.kill(runs["person"].name, grace_s=60)).was_running
        for name in ("policy", "torchrun up"):
            problem = (await c.plan(runs[name].name, "resume")).problem
            assert problem is not None and "still running" in problem, (name, problem)
            with pytest.raises(AgentError) as err:
                await c.resume(runs[name].name)
            assert err.value.code == "running", name
        children.append((await c.resume(runs["person"].name)).run_id)
        assert children[-1] != runs["person"].name
        fb = await c.fallback(runs["person, fallback"].name, grace_s=60)
        children.append(fb.run_id)
        assert fb.killed is not None and not fb.killed.was_running and fb.nproc == 1
        for name in ("person", "person, fallback"):
            os.kill(pids[name], 0)  # never signalled: still finishing its deliveries
    finally:
        await stop_all(c, children)
        await c.close()


def test_a_dump_names_each_missing_rank_and_why(tmp_path: Path) -> None:
    d = stopped_run(tmp_path, "20260101-000000-exp-0003", world=4)
    (d / "heartbeats").mkdir()
    beat = Beat(ts=time.time() - 20, run_id="x", rank=2, step=17, phase=Phase.FAILED,
                error="rank 2 failed at step 18: RuntimeError: boom\ntraceback...")
    (d / "heartbeats" / "rank-2.jsonl").write_text(__import__("msgspec").json.encode(beat).decode() + "\n")
    missing = _missing_ranks(d, signalled=[0, 1], files={"stacks/rank-0-1.txt": "..."}, wait_s=3.0)
    why = {m.rank: m.reason for m in missing}
    assert sorted(why) == [1, 2, 3]
    assert why[1].startswith("signalled (SIGUSR1) but wrote no stack within 3 s")
    assert why[2].startswith("no live process of rank 2 on this host; its last heartbeat")
    assert "phase failed at step 17: rank 2 failed at step 18: RuntimeError: boom" in why[2]
    assert why[3] == "no process and no heartbeat of rank 3 on this host (never started here)"


@pytest.mark.parametrize("record", ["meta.json", "run.json and the config only"])
def test_a_fallback_keeps_the_global_batch_or_refuses(tmp_path: Path, record: str) -> None:
    """One rule (grad_accum = global batch / (batch_size x ranks)) for every way the agent learns
    the batch: a 3-rank run (global batch 6) cannot fall back to 2 ranks without changing it,
    and goes to 1 rank with grad_accum 3, whether meta.json or only run.json and the config
    say what the batch was."""
    from nsa_tui.agent.launcher import Launcher
    from nsa_tui.agent.runs import RunStore

    rid = "20260101-000000-exp-0003"
    d = stopped_run(tmp_path, rid, world=3)
    if record != "meta.json":  # a checkpoint without a readable batch, a run.json without it
        (d / "checkpoints" / "step-30" / "meta.json").write_text('{"step": 30}')
        write_json_atomic(d / "run.json", RunInfo(run_id=rid, name="exp", status=RunStatus.STOPPED,
                                                  world_size=3, grad_accum=1, step=31))
    launcher = Launcher(RunStore(tmp_path))
    two = launcher.plan(rid, "fallback", nproc=2)
    assert two.problem is not None and "global batch 6 is not a multiple of batch_size 2 x 2" in two.problem
    assert two.grad_accum is None
    one = launcher.plan(rid, "fallback", nproc=1)
    assert (one.problem, one.grad_accum, one.global_batch) == (None, 3, 6)
