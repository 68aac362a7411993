"""The agent's operations: one ``op_<name>`` handler per request, each with its argument record.

``Agent`` (server.py) reads requests, validates each against the record ``op_table`` names
and calls the handler; a handler returns the reply's result or raises ``OpError``. Handlers
that subscribe (``watch``, ``watch_runs``, ...) start a stream through ``Agent._subscribe``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nsa.contract import Metric, RunStatusReport, RunView, decode_lines
from nsa.contract.appended import read_chunk
from nsa.contract.evals import EvalList
from nsa.contract.io import tail_lines
from nsa.contract.protocol import Hello
from nsa.contract.replies import AlertList, AlertState, DumpFile, Evidence, LogChunk
from nsa.contract.requests import (
    AckArgs,
    AlertsArgs,
    ArchiveArgs,
    Args,
    CheckpointFileArgs,
    DeleteArgs,
    DescribeArgs,
    EvalArgs,
    EvidenceArgs,
    FallbackArgs,
    KillArgs,
    LaunchArgs,
    NoArgs,
    PlanArgs,
    PreflightArgs,
    ReadLogArgs,
    ResumeArgs,
    RunArgs,
    SampleArgs,
    UnwatchArgs,
    WatchArgs,
    WatchHostArgs,
    WriteCheckpointFileArgs,
)
from nsa.contract.rundir import METRICS_JSONL, NODE_FILES, nothing_to_fall_back
from nsa_tui.agent import ckptfiles, evaluate, sample
from nsa_tui.agent.backend import RunBackend
from nsa_tui.agent.backends import backend_for_launch, backend_for_run
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.housekeeping import Housekeeping
from nsa_tui.agent.launcher import Launcher
from nsa_tui.agent.owners import shown_part
from nsa_tui.agent.preflight import preflight
from nsa_tui.agent.runlock import run_lock
from nsa_tui.agent.runs import RunStore, latest_beats
from nsa_tui.agent.sampler import HostSampler
from nsa_tui.agent.watch import METRIC_LINE_BYTES, RunWatch, SummaryCache
from nsa_tui.agent.watchlists import watch_alerts, watch_host, watch_runs
from nsa_tui.health.ledger import AlertBooks, acknowledge, bounded

STATUS_METRICS = 64  # metric lines in a status report: enough for the median step time
EVIDENCE_FILE_BYTES = 1 << 20



def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid: its number
        return str(os.getuid())


class AgentOps:
    """The handlers of ``Agent``, which holds the state they use."""

    store: RunStore
    launcher: Launcher
    housekeeping: Housekeeping
    summaries: SummaryCache
    books: AlertBooks
    sampler: HostSampler
    subs: dict[Any, asyncio.Task[None]]

    if TYPE_CHECKING:
        def send(self, msg: Any) -> None: ...
        def hello(self) -> Hello: ...
        def _subscribe(self, rid: Any, coro: Any) -> None: ...

    def op_table(self) -> dict[str, tuple[type[Args | WatchArgs], Callable[[Any, Any], Awaitable[Any]]]]:
        """Each op's name -> (its argument record, its handler): what ``Agent.handle`` dispatches."""
        return {
            "ping": (NoArgs, self.op_ping), "runs": (NoArgs, self.op_runs), "run": (RunArgs, self.op_run),
            "status": (RunArgs, self.op_status), "launch": (LaunchArgs, self.op_launch),
            "kill": (KillArgs, self.op_kill), "fallback": (FallbackArgs, self.op_fallback),
            "resume": (ResumeArgs, self.op_resume), "dump": (RunArgs, self.op_dump),
            "archive": (ArchiveArgs, self.op_archive), "delete": (DeleteArgs, self.op_delete),
            "read_log": (ReadLogArgs, self.op_read_log), "watch": (WatchArgs, self.op_watch),
            "watch_runs": (NoArgs, self.op_watch_runs), "watch_host": (WatchHostArgs, self.op_watch_host),
            "unwatch": (UnwatchArgs, self.op_unwatch), "alerts": (AlertsArgs, self.op_alerts),
            "watch_alerts": (AlertsArgs, self.op_watch_alerts), "ack": (AckArgs, self.op_ack),
            "evidence": (EvidenceArgs, self.op_evidence),
            "describe": (DescribeArgs, self.op_describe), "plan": (PlanArgs, self.op_plan),
            "preflight": (PreflightArgs, self.op_preflight), "checkpoints": (RunArgs, self.op_checkpoints),
            "read_checkpoint_file": (CheckpointFileArgs, self.op_read_checkpoint_file),
            "write_checkpoint_file": (WriteCheckpointFileArgs, self.op_write_checkpoint_file),
            "sample": (SampleArgs, self.op_sample), "eval": (EvalArgs, self.op_eval),
            "evals": (RunArgs, self.op_evals),
        }

    # -- operations ---------------------------------------------------------------------------
    async def op_ping(self, rid: Any, a: NoArgs) -> dict[str, float]:
        return {"time": time.time()}

    async def op_runs(self, rid: Any, a: NoArgs) -> dict[str, list[RunView]]:
        return {"runs": await asyncio.to_thread(self.store.views)}

    async def op_run(self, rid: Any, a: RunArgs) -> RunView:
        return await asyncio.to_thread(self.store.view, a.run)

    async def op_status(self, rid: Any, a: RunArgs) -> RunStatusReport:
        """The run's view and the newest beat of each rank: O(ranks) whatever the run's age."""

        def report() -> RunStatusReport:
            view = self.store.view(a.run)
            d = self.store.run_dir(a.run)
            lines = tail_lines(d / METRICS_JSONL, STATUS_METRICS, STATUS_METRICS * METRIC_LINE_BYTES)
            beats = latest_beats(d)
            if view.shared and any(o.mine for o in view.owners):
                host = socket.gethostname()  # this host's part: its own ranks (the others report theirs)
                beats = [b for b in beats if b.host == host]
            now = time.time()  # the ages are measured here, on the clock the beats were written by
            return RunStatusReport(run=view, beats=beats, recent_metrics=decode_lines(lines, Metric), ts=now,
                                   heartbeat_age_s={b.rank: max(0.0, now - b.ts) for b in beats},
                                   slurm=view.slurm)

        return await asyncio.to_thread(report)

    def _backend(self, run: str) -> RunBackend:
        """The backend the run was started by (backends.py): it stops and relaunches it."""
        return backend_for_run(self.launcher, self.store.run_dir(run))

    async def op_launch(self, rid: Any, a: LaunchArgs) -> Any:
        overrides = list(a.overrides)
        if a.on_failure is not None:  # validated with the config: a wrong value is a bad_config naming it
            overrides.append(f"on_failure.action={a.on_failure}")
        return await backend_for_launch(self.launcher, a).launch(a, overrides)

    async def op_describe(self, rid: Any, a: DescribeArgs) -> Any:
        return await asyncio.to_thread(self.launcher.describe, a.config_path, config_text=a.config_text,
                                       nproc=a.nproc, overrides=a.overrides)

    async def op_plan(self, rid: Any, a: PlanArgs) -> Any:
        return await asyncio.to_thread(self.launcher.plan, a.run, a.action)

    async def op_preflight(self, rid: Any, a: PreflightArgs) -> Any:
        return await asyncio.to_thread(preflight, self.launcher, self.hello(), a)

    async def op_kill(self, rid: Any, a: KillArgs) -> Any:
        return await self._backend(a.run).kill(a.run, float(a.grace_s))

    async def op_fallback(self, rid: Any, a: FallbackArgs) -> Any:
        view = await asyncio.to_thread(self.store.view, a.run, False)
        why = nothing_to_fall_back(view.name, view.info.world_size)
        if why:  # the panel's f says the same (nsa.contract.rundir)
            raise OpError("bad_request", why)
        return await self._backend(a.run).fallback(a.run, a)

    async def op_resume(self, rid: Any, a: ResumeArgs) -> Any:
        return await self._backend(a.run).resume(a.run, a)

    async def op_checkpoints(self, rid: Any, a: RunArgs) -> Any:
        return await asyncio.to_thread(ckptfiles.checkpoint_list, self.store, a.run)

    async def op_read_checkpoint_file(self, rid: Any, a: CheckpointFileArgs) -> Any:
        return await asyncio.to_thread(ckptfiles.read_chunk, self.store, a)

    async def op_write_checkpoint_file(self, rid: Any, a: WriteCheckpointFileArgs) -> Any:
        return await asyncio.to_thread(ckptfiles.write_chunk, self.store, a)

    async def op_dump(self, rid: Any, a: RunArgs) -> Any:
        return await self.launcher.dump(a.run)

    async def op_archive(self, rid: Any, a: ArchiveArgs) -> RunView:
        return await asyncio.to_thread(self.housekeeping.archive, a.run, a.archived)

    async def op_delete(self, rid: Any, a: DeleteArgs) -> Any:
        return await asyncio.to_thread(self.housekeeping.delete, a.run, a.dry_run)

    async def op_read_log(self, rid: Any, a: ReadLogArgs) -> LogChunk:
        d = self.store.run_dir(a.run)  # one of two names, never a path from the client; the log is per node
        path = (shown_part(d) if a.file in NODE_FILES else d) / a.file

        def read() -> LogChunk:
            data, end, size, gen = read_chunk(path, int(a.offset), max(0, min(int(a.max_bytes), 16 << 20)))
            return LogChunk(text=data.decode("utf-8", "replace"), offset=end, size=size, gen=gen)

        return await asyncio.to_thread(read)

    async def op_watch(self, rid: Any, a: WatchArgs) -> dict[str, str]:
        watch = RunWatch(self.store, a, rid, self.send, self.summaries)
        self._subscribe(rid, watch.run())
        return {"watching": a.run}

    async def op_watch_runs(self, rid: Any, a: NoArgs) -> dict[str, str]:
        self._subscribe(rid, watch_runs(self.store, rid, self.send))
        return {"watching": "runs"}

    async def op_watch_host(self, rid: Any, a: WatchHostArgs) -> dict[str, str]:
        self._subscribe(rid, watch_host(self.sampler, rid, self.send, max(0.2, float(a.interval_s))))
        return {"watching": "host"}

    async def op_alerts(self, rid: Any, a: AlertsArgs) -> AlertList:
        """One run's alerts, or every run's: each unresolved one and the newest resolved ones."""

        def listing() -> AlertList:
            ids = [a.run] if a.run else self.store.ids()
            out: list[AlertState] = []
            bad = 0
            for run_id in ids:
                book = self.books.book(shown_part(self.store.run_dir(run_id)))
                book.refresh()
                out += book.listing(a.history)
                bad += book.stats.bad
            return AlertList(alerts=bounded(out, a.history * max(1, len(ids))), bad_lines=bad)

        return await asyncio.to_thread(listing)

    async def op_watch_alerts(self, rid: Any, a: AlertsArgs) -> dict[str, str]:
        self._subscribe(rid, watch_alerts(self.store, self.books, rid, self.send, a.history, a.run))
        return {"watching": "alerts"}

    async def op_ack(self, rid: Any, a: AckArgs) -> AlertState:
        """An ``acknowledged`` line in the run's alerts.jsonl, under the run's lock."""
        run_dir = self.store.run_dir(a.run)
        by = a.by or f"{_user()}@{socket.gethostname()}"

        def ack() -> AlertState:
            with run_lock(run_dir):
                try:
                    return acknowledge(shown_part(run_dir), a.alert, by)
                except KeyError:
                    raise OpError("no_such_alert", f"{a.run} has no alert {a.alert!r} (nsa-tui alerts HOST "
                                                   f"{a.run} lists them)") from None

        return await asyncio.to_thread(ack)

    async def op_evidence(self, rid: Any, a: EvidenceArgs) -> Evidence:
        """The files captured for an alert (only paths inside the run directory)."""
        run_dir = self.store.run_dir(a.run)

        def read() -> Evidence:
            book = self.books.book(shown_part(run_dir))
            book.refresh()
            st = book.find(a.alert)
            if st is None:
                raise OpError("no_such_alert", f"{a.run} has no alert {a.alert!r}")
            files, notes = [], []
            root = run_dir.resolve()
            for name in st.alert.evidence:
                path = (run_dir / name).resolve()
                if root not in path.parents:
                    notes.append(f"{name}: outside the run directory, not read")
                    continue
                try:
                    with open(path, "rb") as fh:
                        size = os.fstat(fh.fileno()).st_size
                        fh.seek(max(0, size - EVIDENCE_FILE_BYTES))
                        text = fh.read().decode("utf-8", "replace")
                except OSError as exc:
                    notes.append(f"{name}: {exc.strerror or exc}")
                    continue
                files.append(DumpFile(name=name, text=text))
            if not st.alert.evidence:
                notes.append("no evidence was captured for this alert")
            return Evidence(run_id=a.run, alert=st.id, files=files, notes=notes)

        return await asyncio.to_thread(read)

    async def op_sample(self, rid: Any, a: SampleArgs) -> dict[str, Any]:
        """Checked here (no run, no checkpoint, an unknown step: the reply's error), then a
        stream: the worker's ``sample_start``, ``sample_text``... and ``sample_done`` events."""
        gpus = (await asyncio.to_thread(self.sampler.gpu.read))[0]
        job = await asyncio.to_thread(sample.plan, self.store, a, gpus)
        self._subscribe(rid, sample.run_worker(self.launcher.python, job, rid, self.send))
        return {"sampling": a.run, "seed": job.job["seed"], "device": job.job["device"]}

    async def op_eval(self, rid: Any, a: EvalArgs) -> dict[str, Any]:
        """Checked here (no run, no checkpoint, lengths past the trained context: the reply's
        error), then a stream: ``eval_start``, ``eval_progress``... and ``eval_done``."""
        gpus = (await asyncio.to_thread(self.sampler.gpu.read))[0]
        job = await asyncio.to_thread(evaluate.plan, self.store, a, gpus)
        self._subscribe(rid, sample.run_worker(self.launcher.python, job, rid, self.send,
                                               module="nsa.infer.eval_worker", stream="eval"))
        return {"evaluating": a.run, "seed": job.job["seed"], "device": job.job["device"],
                "lengths": job.job["lengths"]}

    async def op_evals(self, rid: Any, a: RunArgs) -> EvalList:
        """The run's evaluation records (eval/passkey.jsonl), oldest first."""
        return await asyncio.to_thread(evaluate.records, self.store, a.run)

    async def op_unwatch(self, rid: Any, a: UnwatchArgs) -> dict[str, bool]:
        task = self.subs.pop(a.sub, None)
        if task:
            task.cancel()
        return {"stopped": task is not None}
