"""The async client the panel and the CLI use to talk to one host's agent.

    client = HostClient("local" | "[user@]host[:port]" | "ssh-config-alias",
                        runs_root=None,            # default: the agent's ~/nsa-runs
                        confirm_host_key=None,     # async (host, fingerprint) -> bool
                        on_state=None)             # called with every ConnectionState
    await client.start()          # first connection; raises TransportError (retry=True: keep trying)
    client.hello                  # Hello: host, gpus, gpu_message, versions, runs_root, problems
    client.state                  # ConnectionState(status, retry_in_s, message)
    await client.runs()           # [RunView] newest first
    await client.run(run_id)      # RunView, with log_tail for crashed/failed runs
    await client.status(run_id)   # RunStatusReport: the view and every rank's newest beat
    await client.launch(config_path, nproc=None, overrides=(), name=None, upload=False)  # LaunchResult
    await client.describe(config_path, nproc=None, overrides=(), upload=False)  # ConfigSummary
    await client.plan(run_id, "fallback" | "resume")  # ActionPlan: what it would do
    await client.kill(run_id)     # KillResult
    await client.fallback(run_id, nproc=None, checkpoint=None)  # LaunchResult of the new run
                                  # (``again``: an earlier fallback's run)
    await client.resume(run_id)   # LaunchResult, same world size as before
    await client.preflight(...)   # PreflightResult: versions, rendezvous port, config (runs over hosts)
    await client.checkpoints(run_id)  # CheckpointList; read_/write_checkpoint_file move shards
    await client.dump(run_id)     # DumpResult
    await client.archive(run_id, archived=True)   # RunView (hidden from the default list)
    await client.delete(run_id, dry_run=False)    # DeleteResult: bytes it frees / freed
    await client.read_log(run_id, offset=0, max_bytes=1 << 20)  # LogChunk
    await client.alerts(run_id=None)  # AlertList: the host's recorded alerts (alerts.jsonl)
    await client.ack(run_id, alert)   # AlertState, acknowledged
    await client.evidence(run_id, alert)  # Evidence: the files captured for it
    async for ev in client.watch_alerts(): ...    # "alerts" once, then "alert" per change
    async for ev in client.watch(run_id): ...     # Event, survives reconnects (below)
    async for ev in client.watch_runs(): ...      # "runs" once, then "run" / "run_removed"
    async for sample in client.host_samples(): ... # HostSample per second
    client.drop_connection()      # cut the link now (a "reconnect" key; tests)
    await client.close()          # closes the channel; runs keep running

Records are the contract's (nsa.contract); an ``Event``'s ``data`` is already validated
for its kind (nsa.contract.protocol.EVENT_DATA). ``received`` is this machine's clock when
it arrived (alerts use it against clock skew).

Reconnects: when the channel drops, ``state`` becomes ``reconnecting`` (``retry_in_s``
counts the backoff: 0.5 s doubling to 30 s; ``message`` says why the last try failed) and
every open subscription re-subscribes, a ``watch`` with the positions it saw (each a file
generation and an offset in it: nsa.contract.StreamPos), so the iterator sees no gap and no
duplicate, across a rotation of the file too (or, after a long outage, a fresh bounded view).
Requests in flight when the channel drops raise ``AgentError("disconnected")``; they are
not retried (a launch must not happen twice). Fatal errors (changed host key, no agent on
the host) end in ``lost`` without retries.

Errors: ``AgentError(code, message)`` for a refused request (codes in
docs/agent-protocol.md); ``nsa_tui.transport.TransportError`` and subclasses
(``HostKeyError``, ``AuthError``, ``AgentMissing``) from ``start``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from nsa.contract import (
    PROTOCOL,
    Hello,
    HostSample,
    Metric,
    NodeLayout,
    RunStatusReport,
    RunView,
    StreamPos,
    decode_lines,
)
from nsa.contract.io import ContractError, convert, decode, encode
from nsa.contract.protocol import (
    EVENT_DATA,
    ActionPlan,
    AlertList,
    AlertState,
    CheckpointList,
    ConfigSummary,
    DeleteResult,
    DumpResult,
    ErrorInfo,
    EventEnvelope,
    Evidence,
    FileChunk,
    KillResult,
    LaunchResult,
    LogChunk,
    PreflightResult,
)
from nsa.contract.rundir import METRICS_JSONL, TRAIN_LOG
from nsa_tui import __version__
from nsa_tui.transport import AgentMissing, Channel, Transport, TransportError, make_transport

HELLO_TIMEOUT_S = 60.0
T = TypeVar("T")


class Backoff:
    """Reconnect delays: 0.5 s doubling to 30 s, reset after a success (the one policy)."""

    first_s, max_s = 0.5, 30.0

    def __init__(self) -> None:
        self.delay = self.first_s

    def next(self) -> float:
        d = self.delay
        self.delay = min(self.delay * 2, self.max_s)
        return d


@dataclass
class ConnectionState:
    """What the panel shows for a host's connection; ``message`` says why when not connected."""

    status: Literal["connecting", "connected", "reconnecting", "lost"] = "connecting"
    retry_in_s: float | None = None
    message: str = ""


@dataclass
class Event:
    """One event of a subscription: ``data`` is the contract record of its ``kind``."""

    kind: str
    run: str | None
    stream: str
    offset: int
    data: Any = None
    received: float = 0.0
    initial: bool = False
    gen: str = ""  # the file generation ``offset`` counts in (file streams)

    @property
    def pos(self) -> StreamPos:
        """Where this event leaves its stream: what a later watch continues from."""
        return StreamPos(gen=self.gen, offset=self.offset)


class AgentError(Exception):
    """The agent refused a request, or the channel dropped while it was in flight."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


OFFSET_KINDS = ("beats", "metrics", "log")  # events whose offset resumes their stream


class _Sub:
    """One open subscription: its queue and, for a watch, the offsets it has seen."""

    def __init__(self, op: str, args: dict[str, Any]) -> None:
        self.op = op
        self.args = args
        self.offsets: dict[str, StreamPos] = {}
        self.queue: asyncio.Queue[Event | AgentError] = asyncio.Queue()
        self.rid: int | None = None

    def accept(self, ev: Event) -> bool:
        """Drop what this subscription already saw (a resumed stream's overlap): an event at or
        before the last one seen in the same file generation. Another generation is the file
        after a rotation or replacement (the agent sends a stream in order): always new."""
        if ev.kind in OFFSET_KINDS:
            last = self.offsets.get(ev.stream)
            if last is not None and last.gen == ev.gen and ev.offset <= last.offset:
                return False
            self.offsets[ev.stream] = ev.pos
        return True


class HostClient:
    """A connection to one host's agent, kept alive across drops (see module docstring)."""

    def __init__(
        self, dest: str, *, runs_root: str | None = None,
        confirm_host_key: Callable[[str, str], Awaitable[bool]] | None = None,
        on_state: Callable[[ConnectionState], None] | None = None,
        transport: Transport | None = None, reconnect: bool = True,
    ) -> None:
        self.dest = dest
        self.transport = transport or make_transport(
            dest, runs_root=runs_root, confirm_host_key=confirm_host_key)
        self.on_state = on_state
        self.reconnect = reconnect
        self.state = ConnectionState()
        self.hello = Hello(agent=0, nsa_tui="")
        self.bytes_received = 0  # everything read from the channel (benchmarks)
        self._chan: Channel | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], Any]] = {}
        self._subs: dict[int, _Sub] = {}  # request id -> subscription
        self._open: set[_Sub] = set()
        self._reader: asyncio.Task[None] | None = None
        self._retry: asyncio.Task[None] | None = None
        self._closed = False

    # -- connection ---------------------------------------------------------------
    def _set_state(self, status: str, message: str = "", retry_in_s: float | None = None) -> None:
        self.state = ConnectionState(status, retry_in_s, message)  # type: ignore[arg-type]
        if self.on_state:
            self.on_state(self.state)

    async def start(self, retry: bool = False) -> None:
        """Connect and read the agent's hello. Raises TransportError if that fails; with
        ``retry`` a failure that a retry could fix is retried with backoff until it works
        (the state says why each try failed), a fatal one still raises."""
        self._set_state("connecting", f"connecting to {self.dest}")
        backoff = Backoff()
        while True:
            try:
                await self._connect()
                return
            except TransportError as exc:
                if exc.fatal or not retry or self._closed:
                    self._set_state("lost", str(exc))
                    raise
                delay = backoff.next()
                self._set_state("reconnecting", str(exc), delay)
                await asyncio.sleep(delay)

    async def _connect(self) -> None:
        chan = await self.transport.connect()
        try:
            line = await asyncio.wait_for(chan.readline(), HELLO_TIMEOUT_S)
        except asyncio.TimeoutError:
            await chan.close()
            raise TransportError(
                f"{self.dest}: the agent did not answer within {HELLO_TIMEOUT_S:.0f} s") from None
        hello = _hello(line)
        if hello is None:
            err = (await chan.stderr_text()).strip()
            await chan.close()
            if not line and any(s in err for s in ("No module named", "not found", "No such file")):
                last = err.splitlines()[-1] if err else "no output"
                raise AgentMissing(
                    f"{self.dest}: no nsa_tui agent on the host ({last})",
                    f"install this version there with: nsa-tui setup {self.dest}")
            raise TransportError(f"{self.dest}: the agent did not start: {err or line[:200]!r}")
        if hello.agent != PROTOCOL:
            await chan.close()
            raise AgentMissing(
                f"{self.dest}: agent protocol {hello.agent} (nsa-tui {hello.nsa_tui}), this client "
                f"speaks {PROTOCOL} (nsa-tui {__version__})",
                f"update the host with: nsa-tui setup {self.dest}")
        self.hello = hello
        self._chan = chan
        self.bytes_received += len(line)
        self._reader = asyncio.create_task(self._read(chan))
        notes = list(hello.problems)
        if hello.nsa_tui != __version__:
            notes.append(f"agent {hello.nsa_tui} differs from this nsa-tui {__version__}: "
                         f"nsa-tui setup {self.dest}")
        self._set_state("connected", "; ".join([f"{hello.host}: agent {hello.nsa_tui}", *notes]))
        for sub in list(self._open):
            await self._subscribe(sub)

    async def _read(self, chan: Channel) -> None:
        while True:
            line = await chan.readline()
            if not line:
                break
            self.bytes_received += len(line)
            try:
                msg = decode(line, EventEnvelope)
            except ContractError:
                continue
            if msg.event is not None:
                self._on_event(msg)
            elif isinstance(msg.id, int) and msg.id in self._pending:
                fut, typ = self._pending.pop(msg.id)
                if fut.done():
                    continue
                if msg.ok:
                    try:
                        fut.set_result(decode(msg.result, typ, f"{self.dest}: reply") if typ else None)
                    except ContractError as exc:
                        fut.set_exception(AgentError("bad_reply", str(exc)))
                else:
                    err = msg.error or ErrorInfo(code="internal", message="no error given")
                    fut.set_exception(AgentError(err.code, err.message))
        self._dropped(chan)

    def _on_event(self, msg: EventEnvelope) -> None:
        sub = self._subs.get(msg.id) if isinstance(msg.id, int) else None
        if sub is None or msg.event is None:
            return
        typ = EVENT_DATA.get(msg.event)
        if typ is None:
            return  # a newer agent's event kind: not ours to show
        try:
            data = decode(msg.data, typ, f"{self.dest}: {msg.event} event")
        except ContractError:
            return  # validated at the edge: a bad event is dropped, never fatal
        if msg.event == "error":
            sub.queue.put_nowait(AgentError(data.code, data.message))
            return
        ev = Event(msg.event, msg.run, msg.stream, msg.offset, data, time.time(), msg.initial, msg.gen)
        if sub.accept(ev):
            sub.queue.put_nowait(ev)

    def _dropped(self, chan: Channel) -> None:
        if self._chan is not chan:
            return
        self._chan = None
        for fut, _typ in self._pending.values():
            if not fut.done():
                fut.set_exception(AgentError("disconnected", f"connection to {self.dest} dropped"))
        self._pending.clear()
        self._subs.clear()
        asyncio.ensure_future(chan.close())
        if self._closed:
            return
        if not self.reconnect:
            self._set_state("lost", "connection dropped")
            for sub in self._open:
                sub.queue.put_nowait(AgentError("disconnected", f"connection to {self.dest} dropped"))
            return
        self._retry = asyncio.create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        backoff = Backoff()
        why = f"connection to {self.dest} dropped"
        while not self._closed:
            delay = backoff.next()
            self._set_state("reconnecting", f"{why}; retrying", delay)
            await asyncio.sleep(delay)
            try:
                await self._connect()
                return
            except TransportError as exc:
                if exc.fatal:
                    self._set_state("lost", str(exc))
                    for sub in self._open:
                        sub.queue.put_nowait(AgentError("lost", str(exc)))
                    return
                why = str(exc)

    def drop_connection(self) -> None:
        """Cut the link as a network failure would (tests and the panel's "reconnect" key)."""
        abort = getattr(self.transport, "abort", None)
        if abort is not None:
            abort()
        elif self._chan is not None:
            asyncio.ensure_future(self._chan.close())

    async def close(self) -> None:
        """Stop talking to the host. Runs keep running; the agent exits."""
        self._closed = True
        if self._retry:
            self._retry.cancel()
        chan, self._chan = self._chan, None
        if chan is not None:
            await chan.close()
        if self._reader:
            self._reader.cancel()
        for fut, _typ in self._pending.values():
            if not fut.done():
                fut.set_exception(AgentError("closed", "client closed"))
        for sub in self._open:
            sub.queue.put_nowait(AgentError("closed", "client closed"))
        await self.transport.close()
        self._set_state("lost", "closed")

    # -- requests -----------------------------------------------------------------
    async def request(self, op: str, result: type[T] | Any = None, **args: Any) -> T:
        """Send one request and wait for its reply, validated as ``result``; raises AgentError."""
        return await (await self._send(op, args, result))

    async def _send(self, op: str, args: dict[str, Any], result: Any = None,
                    sub: _Sub | None = None) -> asyncio.Future[Any]:
        """Write a request; the returned future gets its reply (kept even if it comes at once)."""
        if self._chan is None:
            why = f": {self.state.message}" if self.state.message else ""
            raise AgentError("disconnected", f"not connected to {self.dest} ({self.state.status}{why})")
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (fut, result)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved" noise
        if sub is not None:
            sub.rid = rid
            self._subs[rid] = sub
        try:
            await self._chan.write(encode({"id": rid, "op": op, "args": args}) + b"\n")
        except TransportError as exc:
            self._pending.pop(rid, None)
            raise AgentError("disconnected", str(exc)) from exc
        return fut

    async def ping(self) -> dict[str, float]:
        return await self.request("ping", dict[str, float])

    async def runs(self) -> list[RunView]:
        return (await self.request("runs", dict[str, list[RunView]]))["runs"]

    async def run(self, run_id: str) -> RunView:
        return await self.request("run", RunView, run=run_id)

    async def status(self, run_id: str) -> RunStatusReport:
        return await self.request("status", RunStatusReport, run=run_id)

    async def launch(self, config_path: str, *, nproc: int | None = None, overrides: Sequence[str] = (),
                     name: str | None = None, upload: bool = False, on_failure: str | None = None,
                     force: bool = False, config_text: str | None = None, run_id: str | None = None,
                     nodes: NodeLayout | None = None) -> LaunchResult:
        """Validate on the host and start; ``upload`` sends this machine's file text along (errors
        still name ``config_path``; ``config_text``: that text, read already); ``on_failure``: the
        watchdog's policy for the run (restart, fallback, stop, none); ``force`` starts what
        ``describe`` would refuse; ``run_id``/``nodes``: one node of a run over several hosts."""
        args = _config_args(config_path, upload and config_text is None)
        if config_text is not None:
            args["config_text"] = config_text
        args.update(nproc=nproc, overrides=list(overrides), name=name)
        if on_failure is not None:
            args["on_failure"] = on_failure
        if force:
            args["force"] = True
        if run_id is not None:
            args["run_id"] = run_id
        if nodes is not None:
            args["nodes"] = nodes
        return await self.request("launch", LaunchResult, **args)

    async def preflight(self, *, port: int | None = None, want_port: bool = False, nproc: int | None = None,
                        config_path: str | None = None, config_text: str | None = None,
                        overrides: Sequence[str] = (), marker_write: str | None = None,
                        marker_look: str | None = None, marker_remove: str | None = None) -> PreflightResult:
        """What the host says about taking part in a run over several hosts; starts nothing.
        ``marker_*``: the sharing probe of the runs root (sent only when asked for)."""
        markers = {k: v for k, v in (("marker_write", marker_write), ("marker_look", marker_look),
                                     ("marker_remove", marker_remove)) if v is not None}
        return await self.request("preflight", PreflightResult, port=port, want_port=want_port, nproc=nproc,
                                  config_path=config_path, config_text=config_text, overrides=list(overrides),
                                  **markers)

    async def describe(self, config_path: str, *, nproc: int | None = None, overrides: Sequence[str] = (),
                       upload: bool = False) -> ConfigSummary:
        """What the config is and whether it can run on the host; nothing starts."""
        args = _config_args(config_path, upload)
        args.update(nproc=nproc, overrides=list(overrides))
        return await self.request("describe", ConfigSummary, **args)

    async def plan(self, run_id: str, op: str) -> ActionPlan:
        """What ``fallback``/``resume`` of the run would do now (for a confirmation)."""
        return await self.request("plan", ActionPlan, run=run_id, action=op)

    async def kill(self, run_id: str, grace_s: float = 60.0) -> KillResult:
        return await self.request("kill", KillResult, run=run_id, grace_s=grace_s)

    async def fallback(self, run_id: str, grace_s: float = 60.0, nproc: int | None = None,
                       checkpoint: str | None = None) -> LaunchResult:
        return await self.request("fallback", LaunchResult, run=run_id, grace_s=grace_s, nproc=nproc,
                                  checkpoint=checkpoint)

    async def resume(self, run_id: str, nproc: int | None = None, checkpoint: str | None = None,
                     new_run_id: str | None = None, nodes: NodeLayout | None = None) -> LaunchResult:
        args: dict[str, Any] = {"run": run_id, "nproc": nproc, "checkpoint": checkpoint, "run_id": new_run_id}
        if nodes is not None:
            args["nodes"] = nodes
        return await self.request("resume", LaunchResult, **args)

    async def checkpoints(self, run_id: str) -> CheckpointList:
        return await self.request("checkpoints", CheckpointList, run=run_id)

    async def read_checkpoint_file(self, run_id: str, checkpoint: str, file: str, offset: int = 0,
                                   max_bytes: int = 4 << 20) -> FileChunk:
        return await self.request("read_checkpoint_file", FileChunk, run=run_id, checkpoint=checkpoint,
                                  file=file, offset=offset, max_bytes=max_bytes)

    async def write_checkpoint_file(self, run_id: str, checkpoint: str, file: str, offset: int, data: bytes,
                                    final: bool = False) -> dict[str, int]:
        return await self.request("write_checkpoint_file", dict[str, int], run=run_id, checkpoint=checkpoint,
                                  file=file, offset=offset, data=data, final=final)

    def peer_address(self) -> str | None:
        """The address this client reached the host at (SSH: the peer's IP), None for local."""
        get = getattr(self.transport, "peer_address", None)
        return get() if get is not None else None

    async def dump(self, run_id: str) -> DumpResult:
        return await self.request("dump", DumpResult, run=run_id)

    async def archive(self, run_id: str, archived: bool = True) -> RunView:
        """Hide a run that is not alive from the default run list (False: show it again)."""
        return await self.request("archive", RunView, run=run_id, archived=archived)

    async def delete(self, run_id: str, dry_run: bool = False) -> DeleteResult:
        """Remove a run that is not alive; ``dry_run``: only say how many bytes that frees."""
        return await self.request("delete", DeleteResult, run=run_id, dry_run=dry_run)

    async def read_log(self, run_id: str, offset: int = 0, max_bytes: int = 1 << 20,
                       file: str = TRAIN_LOG) -> LogChunk:
        """A piece of the run's train.log (or, ``file="metrics.jsonl"``, of its metrics lines)."""
        args: dict[str, Any] = {"run": run_id, "offset": offset, "max_bytes": max_bytes}
        if file != TRAIN_LOG:
            args["file"] = file
        return await self.request("read_log", LogChunk, **args)

    async def metrics(self, run_id: str) -> list[Metric]:
        """Every line of the run's metrics.jsonl as contract records (exports: O(run length),
        read in 4 MiB pieces; a malformed line is skipped)."""
        out: list[Metric] = []
        offset, carry = 0, b""
        while True:
            chunk = await self.read_log(run_id, offset, 4 << 20, file=METRICS_JSONL)
            data = carry + chunk.text.encode()
            lines = data.split(b"\n")
            carry = lines.pop()  # a line still being written waits for its newline
            out += decode_lines([ln for ln in lines if ln.strip()], Metric)
            if chunk.offset >= chunk.size or chunk.offset == offset:
                return out
            offset = chunk.offset

    async def alerts(self, run_id: str | None = None, history: int = 100) -> AlertList:
        return await self.request("alerts", AlertList, run=run_id, history=history)

    async def ack(self, run_id: str, alert: str, by: str | None = None) -> AlertState:
        return await self.request("ack", AlertState, run=run_id, alert=alert, by=by)

    async def evidence(self, run_id: str, alert: str) -> Evidence:
        return await self.request("evidence", Evidence, run=run_id, alert=alert)

    # -- streams ------------------------------------------------------------------
    async def _subscribe(self, sub: _Sub) -> None:
        args = dict(sub.args)
        if sub.op == "watch":
            args["offsets"] = dict(sub.offsets)
        fut = await self._send(sub.op, args, None, sub)
        try:
            await fut
        except AgentError as exc:
            self._subs.pop(sub.rid, None)  # type: ignore[arg-type]
            if exc.code != "disconnected":
                sub.queue.put_nowait(exc)

    async def _stream(self, sub: _Sub) -> AsyncIterator[Event]:
        self._open.add(sub)
        try:
            if self._chan is not None:
                await self._subscribe(sub)
            while True:
                ev = await sub.queue.get()
                if isinstance(ev, AgentError):
                    raise ev
                yield ev
        finally:
            self._open.discard(sub)
            rid = sub.rid
            if rid is not None and self._subs.pop(rid, None) is not None and self._chan is not None:
                try:
                    await self._send("unwatch", {"sub": rid})  # the reply is not awaited
                except AgentError:
                    pass

    def watch(self, run_id: str, offsets: dict[str, StreamPos] | None = None,
              streams: Sequence[str] | None = None, **bounds: int) -> AsyncIterator[Event]:
        """Events of one run (docs/agent-protocol.md, "watch"): its bounded current view, then
        live. ``offsets`` continues streams from those positions (an event's ``pos``);
        ``bounds``: summary_points, recent_metrics, log_tail_bytes."""
        sub = _Sub("watch", {"run": run_id, "streams": list(streams) if streams else None, **bounds})
        sub.offsets = dict(offsets or {})
        return self._stream(sub)

    def watch_runs(self) -> AsyncIterator[Event]:
        """The run list (a ``runs`` event), then ``run`` for every change, ``run_removed``; after
        a reconnect the whole list again."""
        return self._stream(_Sub("watch_runs", {}))

    def watch_alerts(self, history: int = 100, run_id: str | None = None) -> AsyncIterator[Event]:
        """The host's recorded alerts: an ``alerts`` event (AlertList), then ``alert`` (AlertState)
        for every change; after a reconnect the whole list again."""
        return self._stream(_Sub("watch_alerts", {"history": history, "run": run_id}))

    async def sample(self, run_id: str, *, checkpoint: str | None = None, prompt: str = "",
                     max_new_tokens: int = 200, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None, seed: int | None = None,
                     device: str | None = None) -> AsyncIterator[Event]:
        """Text from the run's checkpoint as it is generated (docs/agent-protocol.md, "sample"):
        ``sample_start``, ``sample_text``..., then ``sample_done``, where the iteration ends;
        a failure is raised as AgentError."""
        args = {"run": run_id, "checkpoint": checkpoint, "prompt": prompt, "max_new_tokens": max_new_tokens,
                "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed, "device": device}
        events = self._stream(_Sub("sample", args))
        try:
            async for ev in events:
                yield ev
                if ev.kind == "sample_done":
                    return
        finally:
            await events.aclose()  # type: ignore[attr-defined]  # unwatch now, not when collected

    async def host_samples(self, interval_s: float = 1.0) -> AsyncIterator[HostSample]:
        """Host samples, one per ``interval_s``; resumes after reconnects."""
        async for ev in self._stream(_Sub("watch_host", {"interval_s": interval_s})):
            yield ev.data

    def host_events(self, interval_s: float = 1.0) -> AsyncIterator[Event]:
        """Host samples as Events (kind ``host``)."""
        return self._stream(_Sub("watch_host", {"interval_s": interval_s}))


def _config_args(config_path: str, upload: bool) -> dict[str, Any]:
    """``config_path`` (a path on the host), or with ``upload`` this machine's file's text too."""
    args: dict[str, Any] = {"config_path": config_path}
    if upload:
        try:
            args["config_text"] = Path(config_path).expanduser().read_text()
        except OSError as exc:
            raise AgentError("bad_config", f"{config_path}: cannot read config file ({exc})") from exc
    return args


def read_config_text(config_path: str) -> str:
    """This machine's config file, to send along (``--upload``)."""
    return str(_config_args(config_path, True)["config_text"])


def _hello(line: bytes) -> Hello | None:
    """The agent's first line, or None when it is not a hello. A hello of another protocol
    version that does not validate still says its version (for the "update" message)."""
    try:
        raw = decode(line, dict[str, Any]).get("hello") if line else None
    except ContractError:
        return None
    if not isinstance(raw, dict):
        return None
    try:
        return convert(raw, Hello)
    except ContractError:
        agent = raw.get("agent")
        return Hello(agent=agent if isinstance(agent, int) else 0, nsa_tui=str(raw.get("nsa_tui", "?")))
