"""Fall back, resume and relaunch runs: a new run from a checkpoint, linked to its parent.

The new run keeps the checkpoint's global batch on its world size (the gradient accumulation
is recomputed), is recorded in the parent's ``relaunch.json`` (so a second fallback of the
same run returns the run the first one started), and happens under the parent's lock.
``plan`` says what each would do, without doing it, for a confirmation.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsa.contract import (
    CheckpointMeta,
    ExitInfo,
    NodeLayout,
    Relaunch,
    RunInfo,
    StopInfo,
    read_json,
    write_json_atomic,
)
from nsa.contract.replies import ActionPlan, KillResult, LaunchResult
from nsa.contract.rundir import (
    CHECKPOINTS,
    CONFIG_YAML,
    EXIT_JSON,
    LATEST,
    RELAUNCH_JSON,
    RUN_JSON,
    STOP_JSON,
    global_batch,
    grad_accum_for,
    is_complete_checkpoint,
    nothing_to_fall_back,
    read_checkpoint_meta,
    relaunch_name,
    step_of,
)
from nsa_tui.agent.describe import validate_config
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.owners import launch_of, own_part, owns_part, shown_part
from nsa_tui.agent.procs import RunProcess, run_processes
from nsa_tui.agent.runlock import run_lock, run_lock_async
from nsa_tui.agent.shared import live_elsewhere_words, refuse_live_elsewhere

if TYPE_CHECKING:
    from nsa_tui.agent.runs import RunStore


def in_the_way(procs: list[RunProcess], run_dir: Path) -> list[RunProcess]:
    """Of this host's processes of the run (``procs``), those a stop, fallback or resume must
    wait for: all, but for its supervisor once torchrun has ended (exit.json) after a person's
    stop. All it has left then is the run's last alerts and their deliveries (up to a minute),
    and no on_failure policy relaunches after a person's stop; after its own policy's stop it
    may, so then it counts. (The run's view stops counting it as soon as torchrun ends: the
    panel shows the run stopped, and a resume refused then said it was still running; a stop
    waited out its grace, then killed the supervisor and its deliveries with it.)"""
    part = own_part(run_dir)
    launch = launch_of(run_dir)
    stop = read_json(part / STOP_JSON, StopInfo)
    if launch is None or stop is None or stop.by_watchdog or read_json(part / EXIT_JSON, ExitInfo) is None:
        return procs
    return [p for p in procs if p.pid != launch.launcher_pid]


class RelaunchOps:
    """The relaunching operations of ``Launcher`` (nsa_tui.agent.launcher), which starts the
    new run and stops the old one."""

    store: RunStore

    if TYPE_CHECKING:
        def launch(self, config_path: str | None = None, **kw: Any) -> LaunchResult: ...
        async def _kill(self, run_id: str, run_dir: Path, grace_s: float) -> KillResult: ...
        def freest_gpu(self) -> int | None: ...

    def _done_before(self, run_dir: Path, op: str) -> LaunchResult | None:
        """The run an earlier ``op`` of this parent started, if any (the idempotent answer)."""
        done = read_json(shown_part(run_dir) / RELAUNCH_JSON, Relaunch)
        if done is None or done.op != op:
            return None
        try:
            view = self.store.view(done.child_run, with_tail=False)
        except KeyError:
            return None
        launch = view.launch
        return LaunchResult(run_id=done.child_run, dir=view.dir, nproc=launch.nproc if launch else 1,
                            command=launch.command if launch else [], view=view, parent_run=run_dir.name,
                            resume_from=done.resume_from, again=True)

    def _find_checkpoint(self, run_id: str,
                         name: str | None) -> tuple[str | None, CheckpointMeta | None, bool]:
        """(path, meta.json, started_from) of checkpoint ``name`` of the run, or of its newest
        complete one; (None, None, False) when there is none (meta None: unreadable).

        A run stopped before it saved a checkpoint of its own (a fallback stopped at once) has
        still lost nothing: it can go on from the checkpoint it was started from, when that is
        still complete (``started_from`` True)."""
        if name:
            try:
                path: Path | None = self.store.checkpoint_dir(run_id, name)
            except KeyError:
                raise OpError("no_checkpoint", f"{run_id} has no complete checkpoint {name!r}") from None
        else:
            latest = self.store.latest_checkpoint(run_id)
            path = Path(latest) if latest else None
        started_from = False
        if path is None and not name:
            launch = launch_of(self.store.run_dir(run_id))
            origin = Path(launch.resume_from) if launch and launch.resume_from else None
            if origin is not None and is_complete_checkpoint(origin):
                path, started_from = origin, True
        if path is None:
            return None, None, False
        return str(path), read_checkpoint_meta(path), started_from

    def _relaunch_args(self, run_id: str, nproc: int | None, op: str, checkpoint: str | None = None,
                       nodes: NodeLayout | None = None) -> tuple[ActionPlan, list[str]]:
        """What a fallback/resume of ``run_id`` starts (the plan) and the overrides it passes: the
        gradient accumulation that keeps the checkpoint's global batch on the new world size
        (``nproc`` per host, ``nodes`` hosts: a resume over several hosts)."""
        run_dir = self.store.run_dir(run_id)
        ckpt, meta, started_from = self._find_checkpoint(run_id, checkpoint)
        launch = launch_of(run_dir)
        run = read_json(run_dir / RUN_JSON, RunInfo)
        old = launch.overrides if launch else []
        overrides = [o for o in old if not o.startswith("train.grad_accum=")]
        nodes_now = launch.nodes.nnodes if launch and launch.nodes else 1
        world = (run.world_size if run else None) or (meta.world_size if meta else 0) or (
            (launch.nproc if launch else 1) * nodes_now)
        nproc = nproc or (1 if op == "fallback" else world)
        new_world = nproc * (nodes.nnodes if nodes else 1)
        g = (meta.global_batch if meta else None) or (run.global_batch if run else None)
        b = (meta.batch_size if meta else None) or (run.batch_size if run else None)
        if not (g and b) and op == "fallback":  # no record of the batch: the config's, on the old world
            cfg = validate_config(str(run_dir / CONFIG_YAML), old)
            b = b or cfg.train.batch_size
            g = g or global_batch(b, world, (run.grad_accum if run else None) or cfg.train.grad_accum)
        accum: int | None = None
        problem = None
        if g and b:
            accum = grad_accum_for(g, b, new_world)
            if accum is None:
                problem = (f"global batch {g} is not a multiple of batch_size {b} x {new_world} rank(s): "
                           f"{op} cannot keep it")
            else:
                overrides.append(f"train.grad_accum={accum}")  # the same global batch
        name = launch.name if launch else (run.name if run else run_id)
        step = None
        if ckpt is not None:
            step = step_of(Path(ckpt).name)
        plan = ActionPlan(op=op, run_id=run_id, alive=False, world_size=world, nproc=nproc,  # type: ignore[arg-type]
                          name=relaunch_name(name, op), checkpoint=ckpt, checkpoint_step=step,
                          started_from=started_from, grad_accum=accum, global_batch=g, problem=problem,
                          gpu=self.freest_gpu() if op == "fallback" and nproc == 1 else None)
        return plan, overrides

    def plan(self, run_id: str, op: str, nproc: int | None = None) -> ActionPlan:
        """Exactly what ``kill``/``fallback``/``resume`` would do now, without doing it (read only)."""
        run_dir = self.store.run_dir(run_id)
        procs = in_the_way(run_processes(run_id, run_dir=str(own_part(run_dir))), run_dir)
        # a run whose processes are all on other hosts: this host can do nothing to it (a run
        # with a part here is stopped on every host first by the coordinated commands)
        elsewhere = [] if owns_part(run_dir) else self.store.view(run_id, with_tail=False).live_elsewhere()
        if op == "kill":
            run = read_json(run_dir / RUN_JSON, RunInfo)
            launch = launch_of(run_dir)
            world = (run.world_size if run else None) or (launch.nproc if launch else 1)
            plan = ActionPlan(op="kill", run_id=run_id, alive=False, world_size=world, nproc=0)
        else:
            plan, _ = self._relaunch_args(run_id, nproc, op)
        plan.alive, plan.pids = bool(procs), [p.pid for p in procs]
        plan.rank_pids = [p.pid for p in procs if p.rank is not None]
        if op == "kill":
            if elsewhere:
                plan.problem = live_elsewhere_words(run_id, elsewhere, "stop")
            return plan
        done = read_json(shown_part(run_dir) / RELAUNCH_JSON, Relaunch)
        if done is not None and done.op == op:
            plan.again = done.child_run
        elif plan.checkpoint is None:
            plan.problem = f"{run_id} has no complete checkpoint yet: nothing to start from"
        elif op == "resume" and procs:
            plan.problem = f"{run_id} is still running: stop it first"
        if op == "fallback":
            view = self.store.view(run_id, with_tail=False)
            plan.problem = nothing_to_fall_back(view.name, view.info.world_size) or plan.problem
        if elsewhere:
            plan.problem = live_elsewhere_words(run_id, elsewhere, op)
        return plan

    def _relaunch(self, run_id: str, nproc: int | None, op: str, checkpoint: str | None = None,
                  new_run_id: str | None = None, nodes: NodeLayout | None = None) -> LaunchResult:
        """Relaunch from a checkpoint (default: the newest complete one) as a new run linked to
        ``run_id``, with the gradient accumulation that keeps its global batch (lock held)."""
        run_dir = self.store.run_dir(run_id)
        plan, overrides = self._relaunch_args(run_id, nproc, op, checkpoint, nodes)
        ckpt = plan.checkpoint
        if ckpt is None:
            raise OpError("no_checkpoint", f"{run_id} has no complete checkpoint ({CHECKPOINTS}/{LATEST})")
        if plan.problem:
            raise OpError("bad_request", plan.problem)
        res = self.launch(
            str(run_dir / CONFIG_YAML), nproc=plan.nproc, overrides=overrides, name=plan.name,
            parent_run=run_id, resume_from=ckpt, gpu=plan.gpu, check=False, run_id=new_run_id, nodes=nodes,
        )
        write_json_atomic(shown_part(run_dir) / RELAUNCH_JSON,
                          Relaunch(op=op, child_run=res.run_id, resume_from=ckpt, ts=time.time()))  # type: ignore[arg-type]
        return res

    async def fallback(self, run_id: str, grace_s: float = 60.0, nproc: int | None = None,
                       checkpoint: str | None = None) -> LaunchResult:
        """Stop the run, relaunch on ``nproc`` processes (default 1: one GPU) of this host from
        its newest (or the given) checkpoint, same global batch. Idempotent: a fallback already
        done (or under way in another agent) returns its run."""
        run_dir = self.store.run_dir(run_id)
        async with run_lock_async(run_dir):
            done = self._done_before(run_dir, "fallback")
            if done is not None:
                return done
            # another host's processes (the other part of a run over hosts sharing the runs root, or
            # a run of that host): refused before anything stops; the coordinated fallback stops
            # every host's part first
            refuse_live_elsewhere(self.store, run_id, "fallback")
            problem = self._relaunch_args(run_id, nproc or 1, "fallback", checkpoint)[0].problem
            if problem:  # refused before anything is stopped
                raise OpError("bad_request", problem)
            killed = await self._kill(run_id, run_dir, grace_s)
            res = await asyncio.to_thread(self._relaunch, run_id, nproc or 1, "fallback", checkpoint)
            res.killed = killed
            return res

    def resume(self, run_id: str, nproc: int | None = None, checkpoint: str | None = None,
               new_run_id: str | None = None, nodes: NodeLayout | None = None) -> LaunchResult:
        """Relaunch a stopped run from its newest (or the given) checkpoint as a new run linked
        to it. Idempotent: a run resumed before returns the run that resume started."""
        run_dir = self.store.run_dir(run_id)
        with run_lock(run_dir):
            done = self._done_before(run_dir, "resume")
            if done is not None:
                return done
            if in_the_way(run_processes(run_id, run_dir=str(own_part(run_dir))), run_dir):
                raise OpError("running", f"{run_id} is still running: kill it first")
            refuse_live_elsewhere(self.store, run_id, "resume")
            return self._relaunch(run_id, nproc, "resume", checkpoint, new_run_id, nodes)

    def relaunch(self, run_id: str, op: str, nproc: int | None = None) -> LaunchResult:
        """The relaunch a run's own watchdog asks for (its ``on_failure`` policy: ``restart`` or
        ``fallback``), under the run's lock and idempotent like a person's. No liveness check:
        the asking supervisor, the run's last process, is still there."""
        run_dir = self.store.run_dir(run_id)
        with run_lock(run_dir):
            done = self._done_before(run_dir, op)
            if done is not None:
                return done
            launch = launch_of(run_dir)
            if launch is not None and launch.nodes is not None:
                raise OpError("bad_request", f"{run_id} runs over several hosts: one host's watchdog does "
                              "not relaunch it (nsa-tui fallback/resume with its hosts does)")
            return self._relaunch(run_id, 1 if op == "fallback" else nproc, op)
