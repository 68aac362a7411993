"""One connection to a host's agent, kept alive across drops, with resumable subscriptions.

``AgentConnection`` owns the channel: the hello and its checks, one reader task that
routes replies to their requests and events to their subscriptions, reconnects with
backoff, and re-subscribing. ``HostClient`` (``nsa_tui.hosts.client``) adds the agent's
operations, typed, on top.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from nsa.contract import PROTOCOL, Hello, StreamPos
from nsa.contract.io import ContractError, convert, decode, encode
from nsa.contract.protocol import EVENT_DATA, OFFSET_EVENTS, ErrorInfo, EventEnvelope
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


OFFSET_KINDS = OFFSET_EVENTS  # events whose offset resumes their stream


class Subscription:
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


class AgentConnection:
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
        self._subs: dict[int, Subscription] = {}  # request id -> subscription
        self._open: set[Subscription] = set()
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
                    sub: Subscription | None = None) -> asyncio.Future[Any]:
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

    # -- streams ------------------------------------------------------------------
    async def _subscribe(self, sub: Subscription) -> None:
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

    async def _stream(self, sub: Subscription) -> AsyncIterator[Event]:
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
