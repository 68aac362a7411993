"""The agent's request loop: newline-delimited JSON on stdin, replies and events on stdout.

One agent per connection, one long-lived channel (a local pipe or one SSH channel).
Requests run concurrently, so a long ``kill`` does not hold up a ``watch``. Every request
is validated against its argument record (nsa.contract.protocol) before it runs. When
stdin closes (the client went away) the agent finishes what was asked and exits; runs are
detached and keep going. Several agents of one user may serve the same runs root at
once: the launcher locks a run around every change of its state.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any

from nsa.contract import PROTOCOL, Hello, Metric, RunStatusReport, RunView, decode_lines
from nsa.contract.appended import read_chunk
from nsa.contract.evals import EvalList
from nsa.contract.io import ContractError, convert, decode, encode, tail_lines
from nsa.contract.protocol import ErrorInfo, EventMsg, Reply, Request
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
from nsa.contract.rundir import METRICS_JSONL, NODE_FILES
from nsa_tui import __version__
from nsa_tui.agent import ckptfiles, evaluate, sample
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.housekeeping import Housekeeping
from nsa_tui.agent.launcher import Launcher
from nsa_tui.agent.owners import shown_part
from nsa_tui.agent.preflight import preflight
from nsa_tui.agent.procs import boot_id
from nsa_tui.agent.runlock import run_lock, run_lock_async
from nsa_tui.agent.runs import RunStore, latest_beats
from nsa_tui.agent.sampler import HostSampler
from nsa_tui.agent.watch import (
    METRIC_LINE_BYTES,
    RunWatch,
    SummaryCache,
    watch_alerts,
    watch_host,
    watch_runs,
)
from nsa_tui.health.ledger import AlertBooks, acknowledge, bounded

MAX_LINE = 16 << 20  # a request line longer than this is refused (and skipped), never fatal
_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*(\d+|"[^"]{0,64}")')
STATUS_METRICS = 64  # metric lines in a status report: enough for the median step time
EVIDENCE_FILE_BYTES = 1 << 20


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid: its number
        return str(os.getuid())


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class Agent:
    """Dispatches requests to ``op_<name>`` handlers, each with its argument record."""

    def __init__(self, runs_root: str, out: Any = None, sampler: HostSampler | None = None) -> None:
        self.store = RunStore(runs_root)
        self.out = out if out is not None else sys.stdout.buffer
        self.sampler = sampler or HostSampler(str(self.store.root))
        gpu = self.sampler.gpu
        self.launcher = Launcher(self.store, gpu_count=gpu.count(), read_gpus=gpu.read)
        self.housekeeping = Housekeeping(self.store)
        self.summaries = SummaryCache()
        self.books = AlertBooks()
        self.subs: dict[Any, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.gone = False
        self._flush_due = False
        self.ops: dict[str, tuple[type[Args | WatchArgs], Callable[[Any, Any], Awaitable[Any]]]] = {
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

    def send(self, msg: Any) -> None:
        """Write one line. A closed pipe means the client is gone: streams stop, but
        requests in flight (a kill) run to their end; stdin's EOF then ends the agent.

        Lines sent in one turn of the event loop (a poll's events of every watched stream)
        go out in one write: flushed once the turn ends, not once per line."""
        if self.gone:
            return
        try:
            self.out.write(encode(msg) + b"\n")
        except (BrokenPipeError, ConnectionResetError, ValueError):
            self._lost()
            return
        if self._flush_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (hello before serving, tests): at once
            self.flush()
            return
        self._flush_due = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send what :meth:`send` wrote."""
        self._flush_due = False
        if self.gone:
            return
        try:
            self.out.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError):
            self._lost()

    def _lost(self) -> None:
        self.gone = True
        for t in self.subs.values():
            t.cancel()

    def hello(self) -> Hello:
        """What the client needs to know first: versions, host, GPUs, runs root, problems."""
        problems = []
        try:
            import nsa

            nsa_version: str | None = getattr(nsa, "__version__", None)
        except ImportError as exc:
            nsa_version = None
            problems.append(f"nsa not importable: {exc}")
        torch_version = _version("torch")
        if torch_version is None:
            problems.append("torch not installed: this host cannot train (pip install 'nsa-tui[host]')")
        problems += getattr(self.sampler, "problems", [])
        gpus, gpu_message = self.sampler.gpu.read()
        return Hello(
            agent=PROTOCOL, nsa_tui=__version__, nsa_version=nsa_version, host=socket.gethostname(),
            python=platform.python_version(), python_exe=sys.executable, torch=torch_version,
            runs_root=str(self.store.root), gpus=len(gpus or []),
            gpu_names=[g.name for g in gpus or []], gpu_message=gpu_message, boot_id=boot_id(),
            pid=os.getpid(), time=time.time(), problems=problems)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """Read requests until EOF; cancel subscriptions on exit."""
        self.send({"hello": self.hello()})
        try:
            while True:
                line = await self._readline(reader)
                if line is None:
                    break
                if not line.strip():
                    continue
                try:
                    req = decode(line, Request, "request")
                except ContractError as exc:
                    self.send(Reply(ok=False, error=ErrorInfo(code="bad_request", message=str(exc))))
                    continue
                task = asyncio.create_task(self.handle(req))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        finally:
            for t in self.subs.values():
                t.cancel()
            if self.tasks:  # finish what was asked (a kill must not stop half-way)
                await asyncio.wait(list(self.tasks), timeout=120)
            self.flush()

    async def _readline(self, reader: asyncio.StreamReader) -> bytes | None:
        """One line, or None at EOF. A line over the reader's limit is skipped with an error
        reply (a 17 MiB upload must not end the agent and every watch with it); the reply
        carries the request's id when the line starts with it (our client's always does)."""
        try:
            return await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None
        except asyncio.LimitOverrunError as exc:
            head = b""
            while True:  # drop the rest of the long line
                try:
                    chunk = await reader.readexactly(exc.consumed)
                    head = head or chunk[:200]
                    await reader.readuntil(b"\n")
                    break
                except asyncio.LimitOverrunError as again:
                    exc = again
                except asyncio.IncompleteReadError:
                    return None
            m = _LEADING_ID.match(head)
            rid: int | str | None = None
            if m:
                g = m.group(1).decode()
                rid = int(g) if g.isdigit() else g.strip('"')
            self.send(Reply(id=rid, ok=False, error=ErrorInfo(
                code="bad_request", message=f"request line over {MAX_LINE >> 20} MiB refused "
                                            f"(a config to upload must be smaller)")))
            return b""

    async def handle(self, req: Request) -> None:
        rid = req.id
        op = self.ops.get(req.op)
        try:
            if op is None:
                raise OpError("unknown_op", f"unknown op {req.op!r}")
            try:
                args = convert(req.args, op[0], f"{req.op} arguments")
            except ContractError as exc:
                raise OpError("bad_request", str(exc)) from None
            result = await op[1](rid, args)
        except OpError as exc:
            self.send(Reply(id=rid, ok=False, error=ErrorInfo(code=exc.code, message=exc.message)))
        except KeyError as exc:
            self.send(Reply(id=rid, ok=False, error=ErrorInfo(code="no_such_run", message=f"no run {exc}")))
        except Exception as exc:  # noqa: BLE001 - report, never die on one request
            self.send(Reply(id=rid, ok=False, error=ErrorInfo(code="internal",
                                                              message=f"{type(exc).__name__}: {exc}")))
        else:
            self.send(Reply(id=rid, ok=True, result=result))
        finally:
            self.launcher.reap()

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

    async def op_launch(self, rid: Any, a: LaunchArgs) -> Any:
        overrides = list(a.overrides)
        if a.on_failure is not None:  # validated with the config: a wrong value is a bad_config naming it
            overrides.append(f"on_failure.action={a.on_failure}")
        if a.slurm is not None:  # a batch job from this login node (nsa_tui/slurm)
            from nsa_tui.slurm.ops import submit

            return await asyncio.to_thread(submit, self.launcher, a.slurm, a.config_path, a.config_text,
                                           a.nproc, overrides, a.name)
        return await asyncio.to_thread(self.launcher.launch, a.config_path, config_text=a.config_text,
                                       nproc=a.nproc, overrides=overrides, name=a.name, check=not a.force,
                                       run_id=a.run_id, nodes=a.nodes)

    async def op_describe(self, rid: Any, a: DescribeArgs) -> Any:
        return await asyncio.to_thread(self.launcher.describe, a.config_path, config_text=a.config_text,
                                       nproc=a.nproc, overrides=a.overrides)

    async def op_plan(self, rid: Any, a: PlanArgs) -> Any:
        return await asyncio.to_thread(self.launcher.plan, a.run, a.action)

    async def op_preflight(self, rid: Any, a: PreflightArgs) -> Any:
        return await asyncio.to_thread(preflight, self.launcher, self.hello(), a)

    async def op_kill(self, rid: Any, a: KillArgs) -> Any:
        from nsa_tui.slurm.ops import cancel
        from nsa_tui.slurm.view import read_job

        run_dir = self.store.run_dir(a.run)
        job = read_job(run_dir)
        if job is not None:  # a Slurm batch job: scancel, confirmed by the queue
            async with run_lock_async(run_dir):
                return await cancel(a.run, run_dir, job, float(a.grace_s))
        return await self.launcher.kill(a.run, float(a.grace_s))

    async def op_fallback(self, rid: Any, a: FallbackArgs) -> Any:
        job = self._slurm_job(a.run)
        if job is not None:  # a new Slurm job: one node, one process, the same global batch
            from nsa_tui.slurm.ops import relaunch

            return await relaunch(self.launcher, a.run, job, "fallback", float(a.grace_s))
        return await self.launcher.fallback(a.run, float(a.grace_s), a.nproc, a.checkpoint)

    def _slurm_job(self, run: str) -> Any:
        from nsa_tui.slurm.view import read_job

        return read_job(self.store.run_dir(run))

    async def op_resume(self, rid: Any, a: ResumeArgs) -> Any:
        job = self._slurm_job(a.run)
        if job is not None:  # a new Slurm job on the same allocation, from the newest checkpoint
            from nsa_tui.slurm.ops import relaunch

            return await relaunch(self.launcher, a.run, job, "resume")
        return await asyncio.to_thread(self.launcher.resume, a.run, a.nproc, a.checkpoint, a.run_id, a.nodes)

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

    def _subscribe(self, rid: Any, coro: Any) -> None:
        if rid in self.subs:
            coro.close()
            raise OpError("bad_request", f"id {rid!r} already has a subscription")

        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except KeyError as exc:
                self.send(EventMsg(id=rid, event="error", stream="error",
                                   data=ErrorInfo(code="no_such_run", message=f"no run {exc}")))
            except Exception as exc:  # noqa: BLE001 - tell the client why the stream ended
                self.send(EventMsg(id=rid, event="error", stream="error",
                                   data=ErrorInfo(code="internal", message=f"{type(exc).__name__}: {exc}")))

        self.subs[rid] = asyncio.get_running_loop().create_task(guarded())

