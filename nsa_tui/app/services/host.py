"""One host: a HostClient in a worker, watches of its runs, host samples, alert checks.

Everything here runs in Textual workers on the app's event loop. Events only mutate plain
state (cheap appends to ring buffers); the app's 10 Hz timer draws. So a 10,000 lines/s
log costs appends, not redraws, and a dead host costs nothing but a "reconnecting" label.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import TYPE_CHECKING, Any

from nsa_tui.app.state import ALIVE_STATUSES, HostState, LogBuffer, RunState, alert_key
from nsa_tui.client import AgentError, ConnectionState, Event, HostClient

if TYPE_CHECKING:
    from nsa_tui.app.app import NsaApp

RUNS_POLL_S = 2.0
ALERT_CHECK_S = 1.0
MAX_ALERTS = 200
ANCESTORS = 3
WATCH_STREAMS: dict[str, list[str] | None] = {"full": None, "alerts": ["metrics", "heartbeats"],
                                              "chart": ["metrics"]}
LOG_BACKFILL_BYTES = 2 << 20
MAX_LINE_CHARS = 4_000  # with 20,000 lines kept, a log costs at most ~80 MB however wide


def _detector(host: str, thresholds: Any) -> Any:
    try:
        from nsa_tui.alerts import AlertDetector
    except ImportError:
        return None
    return AlertDetector(host=host, thresholds=thresholds)


class HostService:
    """Owns the HostClient of one destination; the app calls its async operations."""

    def __init__(self, app: NsaApp, dest: str, client: HostClient | None = None) -> None:
        self.app = app
        self.dest = dest
        self.host: HostState = app.state.host(dest)
        self.client = client
        self.focused: str | None = None
        self.watches: dict[str, tuple[asyncio.Task[None], str]] = {}  # run -> (task, mode)
        self.detector = _detector(dest, getattr(app, "alert_thresholds", None))
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False

    # -- life cycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect in a worker; the UI never waits for it."""
        self.app.run_worker(self._main(), group=f"host:{self.dest}", exit_on_error=False)

    async def _main(self) -> None:
        if self.client is None:
            self.client = HostClient(self.dest, on_state=self._on_state,
                                     confirm_host_key=self.confirm_host_key)
        else:
            self.client.on_state = self._on_state
            transport = self.client.transport
            if getattr(transport, "confirm_host_key", False) is None:
                transport.confirm_host_key = self.confirm_host_key
        delay = 1.0
        while True:  # an unreachable host is retried with backoff; the UI never waits on it
            try:
                await self.client.start()
                break
            except Exception as exc:
                self.host.detail = str(exc)
                if getattr(exc, "fatal", True) or self._stopped:
                    self.host.conn = "lost"
                    self.app.notify(str(exc), title=f"cannot connect to {self.dest}", severity="error",
                                    timeout=30)
                    return
                self.host.conn, self.host.retry_at = "reconnecting", time.time() + delay
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        self.host.hello = dict(self.client.hello)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._poll_runs()), loop.create_task(self._samples()),
                       loop.create_task(self._check_alerts())]
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def confirm_host_key(self, host: str, fingerprint: str) -> bool:
        """An unknown host key: ask the user (never for a changed key: the transport refuses)."""
        from nsa_tui.app.screens.dialogs import ConfirmScreen

        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def answered(yes: bool | None) -> None:
            if not answer.done():
                answer.set_result(bool(yes))

        self.app.push_screen(ConfirmScreen(
            f"Unknown host key: {host}",
            f"{fingerprint}\nCompare it with the host's key (ssh-keygen -lf on the host). Trust it and "
            "remember it in known_hosts?", yes="Trust"), answered)
        return await answer

    async def stop(self) -> None:
        """Close the connection; runs keep running on the host."""
        self._stopped = True
        for task, _full in self.watches.values():
            task.cancel()
        for task in self._tasks:
            task.cancel()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.close(), 5)

    def _on_state(self, st: ConnectionState) -> None:
        self.host.conn = st.status
        self.host.detail = st.message
        self.host.retry_at = time.time() + st.retry_in_s if st.retry_in_s is not None else None
        if st.status == "connected" and self.client is not None:
            self.host.hello = dict(self.client.hello)
        elif st.status != "connected" and self.detector is not None:
            # no heartbeat arrives while the link is down: that silence is the network's, not the
            # ranks'. Liveness rules wait until each watch's resubscription has synced again.
            for known in self.detector.runs.values():
                known.backfilling = True

    # -- streams --------------------------------------------------------------------------------------
    async def _poll_runs(self) -> None:
        while not self._stopped:
            try:
                records = await self.client.runs()
            except AgentError:
                await asyncio.sleep(1.0)
                continue
            for rec in records:
                self.merge_record(self.host.run(rec["run_id"]), rec)
            self.host.runs_loaded = True
            self._ensure_watches()
            await asyncio.sleep(RUNS_POLL_S)

    @staticmethod
    def merge_record(run: RunState, rec: dict[str, Any]) -> None:
        """Take the agent's record, keeping the newer step/tokens the metrics already gave."""
        step, tokens = run.record.get("step"), run.record.get("tokens")
        run.record.update(rec)
        if isinstance(step, int) and isinstance(rec.get("step"), int) and step > rec["step"]:
            run.record["step"], run.record["tokens"] = step, tokens
        run.version += 1

    def focus(self, run_id: str | None) -> None:
        """Stream `run_id` in full (log included) and its ancestors' metrics for the chart;
        None: this host has no selected run."""
        self.focused = run_id
        if self.client is not None and self.host.conn == "connected":
            self._ensure_watches()

    def _wanted(self) -> dict[str, str]:
        """run id -> watch mode: the focused run in "full" (log too), other alive runs for
        "alerts" (metrics and heartbeats), the focused run's ancestors for the "chart"."""
        wanted: dict[str, str] = {r.run_id: "alerts" for r in self.host.runs.values() if r.alive}
        if self.focused:
            wanted[self.focused] = "full"
            run = self.host.runs.get(self.focused)
            for _ in range(ANCESTORS):
                parent = run.record.get("parent_run") if run else None
                if not parent or parent in wanted:
                    break
                run = self.host.run(parent)
                if not run.synced:
                    wanted[parent] = "chart"
        return wanted

    def _ensure_watches(self) -> None:
        wanted = self._wanted()
        for run_id, (task, mode) in list(self.watches.items()):
            if task.done() or wanted.get(run_id) != mode:
                task.cancel()
                del self.watches[run_id]
                self._final_to_detector(run_id)
                if mode == "full":
                    self._forget_log(run_id)
        loop = asyncio.get_running_loop()
        for run_id, mode in wanted.items():
            if run_id not in self.watches:
                self.watches[run_id] = (loop.create_task(self._watch(run_id, mode)), mode)

    def _final_to_detector(self, run_id: str) -> None:
        """A watch stopped because the runs poll saw the run end: if its own final status had
        not arrived yet (the poll and the watch race), the detector gets the poll's, or it
        would keep a dead run as running forever (no_heartbeat alerts, never its crash)."""
        run = self.host.runs.get(run_id)
        known = self.detector.runs.get(run_id) if self.detector is not None else None
        if run is None or known is None or run.alive or not run.record.get("status"):
            return
        if known.record.get("status") not in ALIVE_STATUSES:
            return  # the watch delivered the end itself (with its log tail): keep that
        with contextlib.suppress(Exception):
            self.detector.feed(Event("status", run_id, "status", 0, {**run.record, "initial": False}))

    def _forget_log(self, run_id: str) -> None:
        """A run nobody looks at keeps its (bounded) series but not its log: memory stays flat
        however many runs are browsed, and looking at it again starts near the log's end
        instead of replaying everything written meanwhile."""
        run = self.host.runs.get(run_id)
        if run is not None:
            run.log = LogBuffer()
            run.offsets.pop("log", None)

    async def _watch(self, run_id: str, mode: str) -> None:
        run = self.host.run(run_id)
        streams = WATCH_STREAMS[mode]
        n = 0
        skip_partial = mode == "full" and "log" not in run.offsets and await self._start_log_near_end(run)
        try:
            async for ev in self.client.watch(run_id, offsets=dict(run.offsets), streams=streams):
                if skip_partial and ev.kind == "log":
                    skip_partial = False  # the first line after a mid-file start is cut
                    run.offsets["log"] = ev.offset
                    continue
                self.apply(run, ev)
                n += 1
                if n % 256 == 0:
                    await asyncio.sleep(0)  # a backlog of lines must not starve the UI
                if ev.kind == "synced" and mode == "chart":
                    return
        except AgentError as exc:
            if exc.code not in ("closed", "lost", "disconnected"):
                run.log.append_many([f"[nsa-tui] watch of {run_id} ended: {exc}"])

    async def _start_log_near_end(self, run: RunState) -> bool:
        """A long log starts LOG_BACKFILL_BYTES from its end (the ring keeps no more anyway),
        so selecting a week-old run does not stream gigabytes. True if started mid-file."""
        try:
            info = await self.client.read_log(run.run_id, offset=0, max_bytes=0)
        except AgentError:
            return False
        size = int(info.get("size") or 0)
        if size <= LOG_BACKFILL_BYTES:
            return False
        run.offsets["log"] = size - LOG_BACKFILL_BYTES
        where = f"{run.record.get('dir') or 'the run directory'}/train.log"
        run.log.append_many([f"[nsa-tui] train.log is {size / 2**20:.0f} MiB: showing its last "
                             f"{LOG_BACKFILL_BYTES >> 20} MiB; the whole file is {where} on the host"])
        return True

    def apply(self, run: RunState, ev: Event) -> None:
        """Fold one event into the run's state and feed the alert detector."""
        kind = ev.kind
        if kind == "log":
            run.log.append_many([str(ev.data.get("line", ""))[:MAX_LINE_CHARS]])
        elif kind == "metric":
            run.add_metric(ev.data)
        elif kind == "heartbeat":
            run.add_heartbeat(ev.data)
        elif kind == "status":
            self.merge_record(run, {k: v for k, v in ev.data.items() if k != "ts"})
        elif kind == "synced":
            run.synced = True
        if ev.stream in ("metrics", "log") or ev.stream.startswith("heartbeats/"):
            run.offsets[ev.stream] = ev.offset
        if self.detector is not None:
            with contextlib.suppress(Exception):
                self.detector.feed(ev)

    async def _samples(self) -> None:
        while not self._stopped:
            try:
                async for ev in self.client.host_events():
                    self.host.sample = ev.data
                    if self.detector is not None:
                        with contextlib.suppress(Exception):
                            self.detector.feed(ev)
            except AgentError:
                await asyncio.sleep(1.0)

    async def _check_alerts(self) -> None:
        while not self._stopped and self.detector is not None:
            await asyncio.sleep(ALERT_CHECK_S)
            try:
                alerts = self.detector.check(time.time())
            except Exception as exc:  # a detector bug must not take the panel down
                self.app.log.error(f"alert check failed: {exc}")
                continue
            self.merge_alerts(alerts)

    def merge_alerts(self, current: list[Any]) -> None:
        """This host's alerts become `current`: new ones first, resolved ones gone, order kept."""
        state = self.app.state
        keys = {alert_key(a) for a in current}
        mine = lambda a: getattr(a, "host", None) == self.dest  # noqa: E731
        kept = [a for a in state.alerts if not mine(a) or alert_key(a) in keys]
        # an alert that resolved forgets its acknowledgement and its toast: the same condition
        # coming back later (a second hang of the same rank) is new and must be seen
        resolved = {alert_key(a) for a in state.alerts if mine(a) and alert_key(a) not in keys}
        state.acked -= resolved
        seen = getattr(self.app, "_seen_alerts", None)
        if isinstance(seen, set):
            seen -= resolved
        known = {alert_key(a) for a in kept}
        fresh = [a for a in current if alert_key(a) not in known]
        # refresh evidence (heartbeat age, log tail) of alerts that still hold
        by_key = {alert_key(a): a for a in current}
        kept = [by_key.get(alert_key(a), a) if mine(a) else a for a in kept]
        state.alerts[:] = (fresh + kept)[:MAX_ALERTS]

    # -- operations (called from app workers) ------------------------------------------------------
    async def launch(self, opts: dict[str, Any]) -> str:
        """Launch from the dialog's options; returns the new run id or raises AgentError."""
        config = str(opts["config"])
        nproc = opts.get("nproc")
        if not isinstance(nproc, int):
            raise AgentError("bad_request", f"processes must be a whole number, got {nproc!r}")
        overrides = []
        if opts.get("strategy"):
            overrides.append(f"train.strategy={opts['strategy']}")
        if opts.get("data_source"):
            overrides.append(f"data.source={opts['data_source']}")
        overrides += list(opts.get("overrides") or [])
        upload = os.path.isfile(os.path.expanduser(config))
        res = await self.client.launch(config, nproc=nproc, overrides=overrides, name=opts.get("name"),
                                       upload=upload)
        run_id = res["run_id"]
        run = self.host.run(run_id)
        run.record.update({"run_id": run_id, "name": opts.get("name") or run_id, "status": "starting",
                           "alive": True, "started_at": time.time(), "config_path": config})
        self.focus(run_id)
        return run_id

    async def kill(self, run_id: str) -> str:
        res = await self.client.kill(run_id)
        if not res.get("was_running", True):
            return "was not running"
        forced = " (KILL after the grace period)" if res.get("forced") else ""
        left = res.get("remaining") or []
        return f"stopped{forced}" + (f"; {len(left)} process(es) remain!" if left else "")

    async def fallback(self, run_id: str) -> str:
        return self._relaunched(run_id, await self.client.fallback(run_id))

    async def resume(self, run_id: str) -> str:
        return self._relaunched(run_id, await self.client.resume(run_id))

    def _relaunched(self, parent: str, res: dict[str, Any]) -> str:
        new = res["run_id"]
        run = self.host.run(new)
        run.record.update({"run_id": new, "status": "starting", "alive": True, "parent_run": parent,
                           "started_at": time.time(), "resumed_from": res.get("resume_from")})
        self.focus(new)
        return new

    async def dump(self, run_id: str) -> str:
        res = await self.client.dump(run_id)
        parts = [f"ranks: {res.get('ranks')}"] + [f"note: {n}" for n in res.get("notes") or []]
        for f in res.get("files") or []:
            parts.append(f"===== {f.get('name')} =====\n{f.get('text', '')}")
        return "\n".join(parts)
