"""The async client API the panel and the CLI use to talk to one host's agent.

    client = HostClient("local" | "[user@]host[:port]" | "ssh-config-alias",
                        runs_root=None,            # default: the agent's ~/nsa-runs
                        confirm_host_key=None,     # async (host, fingerprint) -> bool
                        on_state=None)             # called with every ConnectionState
    await client.start()          # first connection; raises TransportError (see below)
    client.hello                  # agent hello: host, gpus, gpu_message, versions, runs_root
    client.state                  # ConnectionState(status, retry_in_s, message)
    await client.runs()           # [run record]; a record is run.json + "launch" + derived
                                  #   "status" (starting|running|stopping|stopped|finished|
                                  #   failed|crashed|lost), "alive", "pids", "exit_code"
    await client.run(run_id)      # one record, with "log_tail" for crashed/failed runs
    await client.launch(config_path, nproc=None, overrides=(), name=None, upload=False)
                                  # -> {"run_id", "dir", "nproc", "command", ...}
                                  # upload=True sends the local file's text (config picker)
    await client.kill(run_id)     # -> {"run_id", "was_running", "forced", "remaining": []}
    await client.fallback(run_id) # -> the new run: {"run_id", "parent_run", "resume_from", ...}
    await client.resume(run_id)   # same shape as fallback, same nproc as before
    await client.dump(run_id)     # -> {"files": [{"name", "text"}], "ranks", "notes"}
    await client.read_log(run_id, offset=0, max_bytes=1 << 20) # -> {"text", "offset", "size"}
    async for ev in client.watch(run_id): ...     # Event, survives reconnects (below)
    async for sample in client.host_samples(): ... # dict per second (docs/agent-protocol.md)
    async for ev in client.host_events(): ...      # the same as Events, for AlertDetector.feed
    client.drop_connection()      # cut the link now (a "reconnect" key; tests)
    await client.close()          # closes the channel; runs keep running

Events (``Event``): ``kind`` is ``heartbeat`` | ``metric`` | ``log`` | ``status`` |
``synced`` (backfill done: everything written so far has been delivered) | ``host``.
``stream`` names the source (``metrics``, ``log``, ``heartbeats/rank-R``, ``status``);
``offset`` is the byte offset after the line; ``data`` is the parsed JSON line (``log``:
``{"line": text}``; ``status``: the run record plus ``ts``, the agent's clock);
``received`` is this machine's clock when it arrived (alerts use it against clock skew).

Reconnects: when the channel drops, ``state`` becomes ``reconnecting`` (``retry_in_s``
counts the backoff: 0.5 s doubling to 30 s) and every open ``watch`` re-subscribes with
the last offset of each stream, so the iterator sees no gap and no duplicate. Requests
in flight when the channel drops raise ``AgentError("disconnected")``; they are not
retried (a launch must not happen twice). Fatal errors (changed host key, no agent on
the host) end in ``lost`` without retries.

Errors: ``AgentError(code, message)`` for a refused request (codes in
docs/agent-protocol.md, e.g. ``bad_config``, ``no_such_run``, ``no_checkpoint``);
``nsa_tui.transport.TransportError`` and subclasses (``HostKeyError``, ``AuthError``,
``AgentMissing``) from ``start``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nsa_tui import __version__
from nsa_tui.transport import AgentMissing, Channel, Transport, TransportError, make_transport

PROTOCOL = 1
HELLO_TIMEOUT_S = 60.0


@dataclass
class ConnectionState:
    """What the panel shows for a host's connection."""

    status: Literal["connecting", "connected", "reconnecting", "lost"] = "connecting"
    retry_in_s: float | None = None
    message: str = ""


@dataclass
class Event:
    """One event of a watch or host stream (see the module docstring)."""

    kind: str
    run: str | None
    stream: str
    offset: int
    data: dict[str, Any] = field(default_factory=dict)
    received: float = 0.0


class AgentError(Exception):
    """The agent refused a request, or the channel dropped while it was in flight."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


FILE_STREAMS = ("metrics", "log")


class _Sub:
    """One open watch (or host stream): its queue and the offsets it has seen."""

    def __init__(self, op: str, args: dict[str, Any]) -> None:
        self.op = op
        self.args = args
        self.offsets: dict[str, int] = {}
        self.queue: asyncio.Queue[Event | AgentError] = asyncio.Queue()
        self.rid: int | None = None

    def accept(self, ev: Event) -> bool:
        """Drop what this subscription already saw (the backfill after a reconnect)."""
        if ev.stream in FILE_STREAMS or ev.stream.startswith("heartbeats/"):
            if ev.offset <= self.offsets.get(ev.stream, 0):
                return False
            self.offsets[ev.stream] = ev.offset
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
        self.hello: dict[str, Any] = {}
        self._chan: Channel | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
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

    async def start(self) -> None:
        """Connect and read the agent's hello; raises TransportError if that fails."""
        self._set_state("connecting", f"connecting to {self.dest}")
        try:
            await self._connect()
        except TransportError as exc:
            self._set_state("lost", str(exc))
            raise

    async def _connect(self) -> None:
        chan = await self.transport.connect()
        try:
            line = await asyncio.wait_for(chan.readline(), HELLO_TIMEOUT_S)
        except asyncio.TimeoutError:
            await chan.close()
            raise TransportError(
                f"{self.dest}: the agent did not answer within {HELLO_TIMEOUT_S:.0f} s") from None
        try:
            hello = json.loads(line)["hello"] if line else None
        except (ValueError, KeyError, TypeError):
            hello = None
        if not isinstance(hello, dict):
            err = (await chan.stderr_text()).strip()
            await chan.close()
            if not line and any(s in err for s in ("No module named", "not found", "No such file")):
                last = err.splitlines()[-1] if err else "no output"
                raise AgentMissing(
                    f"{self.dest}: no nsa_tui agent on the host ({last})",
                    f"install this version there with: nsa-tui setup {self.dest}")
            raise TransportError(f"{self.dest}: the agent did not start: {err or line[:200]!r}")
        if hello.get("agent") != PROTOCOL:
            await chan.close()
            raise AgentMissing(
                f"{self.dest}: agent protocol {hello.get('agent')}, this client speaks {PROTOCOL}",
                f"update the host with: nsa-tui setup {self.dest}")
        self.hello = hello
        self._chan = chan
        self._reader = asyncio.create_task(self._read(chan))
        notes = list(hello.get("problems") or [])
        if hello.get("nsa_tui") != __version__:
            notes.append(f"agent {hello.get('nsa_tui')} differs from this nsa-tui {__version__}: "
                         f"nsa-tui setup {self.dest}")
        head = f"{hello.get('host')}: agent {hello.get('nsa_tui')}"
        self._set_state("connected", "; ".join([head, *notes]))
        for sub in list(self._open):
            await self._subscribe(sub)

    async def _read(self, chan: Channel) -> None:
        while True:
            line = await chan.readline()
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            rid = msg.get("id")
            if "event" in msg:
                sub = self._subs.get(rid)
                if sub is None:
                    continue
                if msg["event"] == "error":
                    err = msg.get("data") or {}
                    sub.queue.put_nowait(AgentError(err.get("code", "internal"), err.get("message", "")))
                    continue
                ev = Event(msg["event"], msg.get("run"), msg.get("stream", ""), int(msg.get("offset") or 0),
                           msg.get("data") or {}, time.time())
                if sub.accept(ev):
                    sub.queue.put_nowait(ev)
            elif rid in self._pending:
                fut = self._pending.pop(rid)
                if not fut.done():
                    if msg.get("ok"):
                        fut.set_result(msg.get("result"))
                    else:
                        err = msg.get("error") or {}
                        fut.set_exception(AgentError(err.get("code", "internal"), err.get("message", "")))
        self._dropped(chan)

    def _dropped(self, chan: Channel) -> None:
        if self._chan is not chan:
            return
        self._chan = None
        for fut in self._pending.values():
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
        delay = 0.5
        while not self._closed:
            self._set_state("reconnecting", f"connection to {self.dest} dropped; retrying", delay)
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
                self.state.message = str(exc)
            delay = min(delay * 2, 30.0)

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
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(AgentError("closed", "client closed"))
        for sub in self._open:
            sub.queue.put_nowait(AgentError("closed", "client closed"))
        await self.transport.close()
        self._set_state("lost", "closed")

    # -- requests -----------------------------------------------------------------
    async def request(self, op: str, **args: Any) -> Any:
        """Send one request and wait for its reply; raises AgentError."""
        return await (await self._send(op, args))

    async def _send(self, op: str, args: dict[str, Any], sub: _Sub | None = None) -> asyncio.Future[Any]:
        """Write a request; the returned future gets its reply (kept even if it comes at once)."""
        if self._chan is None:
            raise AgentError("disconnected", f"not connected to {self.dest} ({self.state.status})")
        rid = next(self._ids)
        fut = self._pending[rid] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved" noise
        if sub is not None:
            sub.rid = rid
            self._subs[rid] = sub
        try:
            await self._chan.write(json.dumps({"id": rid, "op": op, "args": args}).encode() + b"\n")
        except TransportError as exc:
            self._pending.pop(rid, None)
            raise AgentError("disconnected", str(exc)) from exc
        return fut

    async def ping(self) -> dict[str, Any]:
        return await self.request("ping")

    async def runs(self) -> list[dict[str, Any]]:
        return (await self.request("runs"))["runs"]

    async def run(self, run_id: str) -> dict[str, Any]:
        return await self.request("run", run=run_id)

    async def launch(self, config_path: str, *, nproc: int | None = None, overrides: Sequence[str] = (),
                     name: str | None = None, upload: bool = False) -> dict[str, Any]:
        """Validate on the host and start; ``upload`` sends this machine's file text along."""
        args: dict[str, Any] = {"nproc": nproc, "overrides": list(overrides), "name": name}
        if upload:
            try:
                args["config_text"] = Path(config_path).expanduser().read_text()
            except OSError as exc:
                raise AgentError("bad_config", f"{config_path}: cannot read config file ({exc})") from exc
        args["config_path"] = config_path
        return await self.request("launch", **args)

    async def kill(self, run_id: str, grace_s: float = 60.0) -> dict[str, Any]:
        return await self.request("kill", run=run_id, grace_s=grace_s)

    async def fallback(self, run_id: str, grace_s: float = 60.0) -> dict[str, Any]:
        return await self.request("fallback", run=run_id, grace_s=grace_s)

    async def resume(self, run_id: str) -> dict[str, Any]:
        return await self.request("resume", run=run_id)

    async def dump(self, run_id: str) -> dict[str, Any]:
        return await self.request("dump", run=run_id)

    async def read_log(self, run_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> dict[str, Any]:
        return await self.request("read_log", run=run_id, offset=offset, max_bytes=max_bytes)

    # -- streams ------------------------------------------------------------------
    async def _subscribe(self, sub: _Sub) -> None:
        args = dict(sub.args)
        if sub.op == "watch":
            args["offsets"] = dict(sub.offsets)
        fut = await self._send(sub.op, args, sub)
        try:
            await fut
        except AgentError as exc:
            self._subs.pop(sub.rid, None)
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

    def watch(self, run_id: str, offsets: dict[str, int] | None = None,
              streams: Sequence[str] | None = None) -> AsyncIterator[Event]:
        """Events of one run from ``offsets`` on (default: from the start, full backfill)."""
        sub = _Sub("watch", {"run": run_id, "streams": list(streams) if streams else None})
        sub.offsets = dict(offsets or {})
        return self._stream(sub)

    async def host_samples(self, interval_s: float = 1.0) -> AsyncIterator[dict[str, Any]]:
        """Host samples (dicts), one per ``interval_s``; resumes after reconnects."""
        async for ev in self._stream(_Sub("watch_host", {"interval_s": interval_s})):
            yield ev.data

    def host_events(self, interval_s: float = 1.0) -> AsyncIterator[Event]:
        """Host samples as Events (kind ``host``), for feeding the alert detector."""
        return self._stream(_Sub("watch_host", {"interval_s": interval_s}))
