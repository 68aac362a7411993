"""The launch-backend seam: one interface (backend.py), one place that chooses (backends.py).

The handlers reach a run's processes only through the backend its directory names, so a new
way of running jobs is one class in ``BACKENDS``; the Slurm package stays the pure half and
imports nothing of the agent (checked on the source, imports inside functions included).
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

import nsa_tui
from nsa.contract import RunStatus, write_json_atomic
from nsa.contract.requests import FallbackArgs, KillArgs, LaunchArgs, ResumeArgs
from nsa.contract.rundir import RUN_JSON, SLURM_JSON, STOP_JSON
from nsa.contract.slurm import SlurmJob, SlurmRequest, SlurmState
from nsa_tui.agent import backends
from nsa_tui.agent.backend import JobView, RunBackend
from nsa_tui.agent.direct_backend import DirectBackend
from nsa_tui.agent.launcher import Launcher
from nsa_tui.agent.ops import AgentOps
from nsa_tui.agent.runs import RunStore
from nsa_tui.agent.slurm_backend import SlurmBackend

PKG = Path(nsa_tui.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function; ``from P import x`` counts
    as ``P.x`` where that is a module of the package, else as ``P``."""
    package = "nsa_tui." + ".".join(path.relative_to(PKG).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                as_path = PKG.parent / sub.replace(".", "/")
                out.add(sub if as_path.with_suffix(".py").exists() or as_path.is_dir() else base)
    return out


def graph(*packages: str) -> dict[str, set[str]]:
    """module -> the modules of ``packages`` it imports."""
    mods = {f"nsa_tui.{p}.{f.stem}": f for p in packages for f in sorted((PKG / p).glob("*.py"))}
    for p in packages:  # ``nsa_tui.slurm`` itself is its __init__
        mods[f"nsa_tui.{p}"] = mods.pop(f"nsa_tui.{p}.__init__")
    return {m: {i for i in imported_modules(f) if i in mods} for m, f in mods.items()}


def reach(g: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in g[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_slurm_package_imports_nothing_of_the_agent() -> None:
    found = {f"{f.name}: {m}" for f in sorted((PKG / "slurm").glob("*.py")) for m in imported_modules(f)
             if m == "nsa_tui.agent" or m.startswith("nsa_tui.agent.")}
    assert not found, found


def test_no_import_cycle_between_the_agent_and_slurm() -> None:
    """Between the packages, not only their modules: the agent uses Slurm, one way only."""
    g = graph("agent", "slurm")
    uses = {(a.split(".")[1], b.split(".")[1]) for a, deps in g.items() for b in deps}
    assert {u for u in uses if u[0] != u[1]} == {("agent", "slurm")}, uses
    cycles = sorted(f"{a} <-> {s}" for a in g if a.startswith("nsa_tui.agent")
                    for s in reach(g, a) if s.startswith("nsa_tui.slurm") and a in reach(g, s))
    assert not cycles, cycles


def test_only_the_slurm_backend_imports_the_slurm_package() -> None:
    """The handlers and the run store reach Slurm through the seam, never directly."""
    g = graph("agent", "slurm")
    users = sorted(m for m, deps in g.items() if m.startswith("nsa_tui.agent")
                   and any(d.startswith("nsa_tui.slurm") for d in deps))
    assert users == ["nsa_tui.agent.slurm_backend"], users


def make_run(store: RunStore, run_id: str, world_size: int = 2) -> Path:
    d = store.root / run_id
    d.mkdir(parents=True, mode=0o700)
    (d / RUN_JSON).write_text(json.dumps({"run_id": run_id, "name": "x", "status": "running",
                                          "world_size": world_size}))
    return d


def slurm_job(job_id: str = "7", final: SlurmState | None = None) -> SlurmJob:
    return SlurmJob(job_id=job_id, script="/nowhere/slurm-job.sh", submitted=time.time(), sbatch=["sbatch"],
                    slurm_version="slurm 22.05.8", request=SlurmRequest(), nproc_per_node=1, final=final)


def test_the_run_directory_chooses_the_backend(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    direct = make_run(store, "20260101-000000-direct-0000")
    batch = make_run(store, "20260101-000000-batch-0000")
    write_json_atomic(batch / SLURM_JSON, slurm_job())
    assert backends.backend_class(direct) is DirectBackend
    assert backends.backend_class(batch) is SlurmBackend
    launcher = Launcher(store)
    assert isinstance(backends.backend_for_launch(launcher, LaunchArgs(config_path="c.yaml")), DirectBackend)
    assert isinstance(backends.backend_for_launch(launcher, LaunchArgs(slurm=SlurmRequest())), SlurmBackend)


def test_a_slurm_runs_view_comes_from_its_job_not_this_hosts_processes(tmp_path: Path) -> None:
    """A recorded end state (the queue forgets ended jobs): no squeue is asked, the stop asked for
    makes it ``stopped``, and the view shows the job."""
    store = RunStore(tmp_path)
    d = make_run(store, "20260101-000000-batch-0000")
    write_json_atomic(d / SLURM_JSON, slurm_job(final=SlurmState(job_id="7", state="CANCELLED")))
    (d / STOP_JSON).write_text(json.dumps({"ts": time.time()}))
    view = store.view(d.name)
    assert (view.status, view.alive) == (RunStatus.STOPPED, False)
    assert view.slurm is not None and view.slurm.state == "CANCELLED" and view.slurm.script.endswith(".sh")


class FakeBackend(RunBackend):
    """A third way of running jobs: its runs have ``fake-job.json``; it takes launches named ``fake``."""

    kind = "fake"
    calls: list[tuple[str, str]] = []

    @classmethod
    def owns(cls, run_dir: Path) -> bool:
        return (run_dir / "fake-job.json").exists()

    @classmethod
    def takes(cls, a: LaunchArgs) -> bool:
        return a.name == "fake"

    @classmethod
    def job_view(cls, run_dir: Path, trainer: RunStatus | None, stop_requested: bool) -> JobView | None:
        return JobView(status=RunStatus.QUEUED, alive=False)

    async def launch(self, a: LaunchArgs, overrides: list[str]) -> Any:
        self.calls.append(("launch", ",".join(overrides)))
        return "launched"

    async def kill(self, run_id: str, grace_s: float) -> Any:
        self.calls.append(("kill", run_id))
        return "killed"

    async def fallback(self, run_id: str, a: FallbackArgs) -> Any:
        self.calls.append(("fallback", run_id))
        return "fell back"

    async def resume(self, run_id: str, a: ResumeArgs) -> Any:
        self.calls.append(("resume", run_id))
        return "resumed"


def test_a_new_backend_is_one_entry_in_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Listed before the direct one, it gets its runs' kill, fallback, resume and view, and the
    launches it takes; the handlers are unchanged."""
    monkeypatch.setattr(backends, "BACKENDS", (FakeBackend, *backends.BACKENDS))
    FakeBackend.calls = []
    store = RunStore(tmp_path)
    d = make_run(store, "20260101-000000-fake-0000")
    (d / "fake-job.json").write_text("{}")
    ops = AgentOps()
    ops.store, ops.launcher = store, Launcher(store)
    rid = d.name
    assert store.view(rid).status == RunStatus.QUEUED  # its job_view, not the missing processes (crashed)

    async def go() -> list[Any]:
        return [await ops.op_kill(1, KillArgs(run=rid)), await ops.op_fallback(2, FallbackArgs(run=rid)),
                await ops.op_resume(3, ResumeArgs(run=rid)),
                await ops.op_launch(4, LaunchArgs(name="fake", on_failure="stop"))]

    assert asyncio.run(go()) == ["killed", "fell back", "resumed", "launched"]
    assert FakeBackend.calls == [("kill", rid), ("fallback", rid), ("resume", rid),
                                 ("launch", "on_failure.action=stop")]
    other = make_run(store, "20260101-000000-direct-0000")
    assert backends.backend_class(other) is DirectBackend


def test_a_slurm_runs_watchdog_is_its_lease_while_the_job_runs_then_its_exit_record(tmp_path: Path) -> None:
    """The watchdog beside a job renews lease.json on the job's node: fresh, it is alive; released
    or stale, it is not. Once the job has ended, exit.json says whether it wrote the final alerts."""
    from nsa.contract import ExitInfo, Lease
    from nsa.contract.rundir import EXIT_JSON, LEASE_JSON
    from nsa_tui.agent.slurm_backend import watch_alive

    d = make_run(RunStore(tmp_path), "20260101-000000-batch-0000")
    assert not watch_alive(d)
    now = time.time()
    write_json_atomic(d / LEASE_JSON, Lease(node="n1-0", hostname="n1", ts=now - 5, ttl_s=20, pid=7))
    assert watch_alive(d, now) and not watch_alive(d, now + 16)
    write_json_atomic(d / LEASE_JSON, Lease(node="n1-0", hostname="n1", ts=now, ttl_s=0, pid=7))
    assert not watch_alive(d, now)
    write_json_atomic(d / SLURM_JSON, slurm_job(final=SlurmState(job_id="7", state="FAILED")))
    store = RunStore(tmp_path)
    assert not store.view(d.name).watchdog  # ended, and no watchdog had the last word
    write_json_atomic(d / EXIT_JSON, ExitInfo(exit_code=1, watchdog=True))
    assert store.view(d.name).watchdog
