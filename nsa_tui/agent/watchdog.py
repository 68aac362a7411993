"""The run's watchdog: alerts detected on the host, always, whether or not anyone looks.

It lives in the run's supervisor (nsa_tui/agent/supervise.py), the parent of torchrun that
already outlives every agent and panel, as a thread that wakes every
``watchdog.interval_s`` (1 s) and:

- reads only what the run wrote since its last look (heartbeats of every rank, following
  their rotation to ``rank-R.jsonl.1``; metric lines; train.log; run.json when it changes):
  a malformed line is skipped and counted, never fatal; a file far ahead is skipped to its
  tail, so its cost follows the run's output rate, never its age;
- checks that each rank's process on this host (the pid of its beats, carrying the run id) still exists;
- samples the GPUs (NVML) and the runs root's free space every ``watchdog.host_every_s``;
- runs the same rules as the panel (nsa_tui/health/alerts.py) with the user's thresholds
  (settings.yaml) and writes every transition to alerts.jsonl (nsa_tui/health/ledger.py);
- hands each new alert to the notifier (nsa_tui/health/notify.py: a background thread, retries);
- on a stall captures evidence once (nsa_tui/agent/evidence.py) and links it to the alert;
- applies the run's ``on_failure`` policy (nsa_tui/agent/policy.py).

It never writes to the ranks, never takes the run's lock in its loop, and never blocks on
the network, so training is never slowed by it. If the supervisor is killed, nothing
watches the run on the host any more: the agent then derives ``crashed`` from process
liveness as before, and panels and the CLI detect alerts for that run themselves
(``RunView.watchdog`` is false).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from nsa.contract import (
    FAILED_STATUSES,
    Alert,
    AlertEvent,
    Beat,
    ExitInfo,
    HostSample,
    LaunchInfo,
    Metric,
    RunInfo,
    RunStatus,
    RunView,
    decode_lines,
    read_json,
)
from nsa.contract.appended import AppendedReader
from nsa.contract.io import LineStats, tail_lines
from nsa.contract.records import Usage
from nsa.contract.rundir import (
    LAUNCH_JSON,
    METRICS_JSONL,
    NODE_FILES,
    RUN_JSON,
    STOP_JSON,
    TRAIN_LOG,
    heartbeat_stream,
)
from nsa_tui.agent.owners import own_part
from nsa_tui.agent.procs import run_process
from nsa_tui.agent.runs import LOG_TAIL_LINES, beat_files, derive_status
from nsa_tui.health.alerts import AlertDetector
from nsa_tui.health.ledger import ALERTS_FILE, AlertLedger
from nsa_tui.health.notify import Delivery, Notifier
from nsa_tui.health.rootcause import OWN_LINE_RE, RootCause, root_cause
from nsa_tui.user.settings import Settings

SKIP_BEHIND_BYTES = 8 << 20  # a file further ahead than this is read from its last KEEP_BYTES
KEEP_BYTES = 256 << 10
HANG_KINDS = ("stall", "no_heartbeat", "nccl_hang")
EVIDENCE_EVERY_S = 60.0  # at most one capture per minute per run


class FileTail:
    """The new complete lines of one file since the last call, through the contract's
    rotation-aware reader (nsa.contract.appended): after a rotation to ``<name>.1`` what was
    written to the old file before it moved is read first, and the fresh file is never taken
    for the old one. A file further ahead than SKIP_BEHIND_BYTES (or whose generation was
    lost) is read from its last KEEP_BYTES."""

    def __init__(self, path: Path, rotates: bool = True) -> None:
        self.path = path
        self.reader = AppendedReader(path, rotates=rotates)
        self.skipped = 0  # bytes never read because the file ran far ahead

    def read(self) -> list[str]:
        behind = self.reader.behind()
        if behind is None or behind > SKIP_BEHIND_BYTES:
            self.skipped += self.reader.skip_to_tail(KEEP_BYTES)
        out: list[str] = []
        while lines := self.reader.read():
            out += [ln.text for ln in lines]
        return out


class Watchdog:
    """One run's watchdog (see the module docstring). The run is alive until :meth:`finish` says
    how torchrun ended (the supervisor knows: it is its child)."""

    def __init__(self, run_dir: Path, settings: Settings, *, host: str | None = None, gpu: Any = None,
                 log: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time,
                 settings_problem: str = "", policy: Any = None, by_host: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.run_id = self.run_dir.name
        # this host's per-node files (its launch, log, alerts); a shared run's other hosts have
        # their own watchdogs: only this host's ranks are watched here
        self.part = own_part(self.run_dir)
        self.shared = self.part != self.run_dir
        # a job over several nodes watched from one (Slurm): every rank's beats are judged, but
        # only this host's ranks by its process table (elsewhere "no such pid" says nothing)
        self.by_host = by_host
        self.s = settings
        self.clock = clock
        self.log = log or (lambda msg: print(msg, flush=True))
        self.host = host or socket.gethostname()
        self.det = AlertDetector(self.host, settings.alerts.thresholds())
        self.ledger = AlertLedger(self.part / ALERTS_FILE, self.run_id,
                                  resolve_after_s=settings.alerts.resolve_after_s, clock=clock)
        self.beat_tails: dict[int, FileTail] = {}
        self.metrics = FileTail(self.run_dir / METRICS_JSONL, rotates=False)
        self.train_log = FileTail(self.part / TRAIN_LOG, rotates=False)
        self.stats: dict[str, LineStats] = {}
        self.beats: dict[int, Beat] = {}
        self.gone: set[int] = set()
        self.exit: ExitInfo | None = None
        self.gpu = gpu
        self._gpu_tried = gpu is not None
        self._next_host = 0.0
        self._json_cache: dict[str, tuple[float, Any]] = {}
        self._tail_cache: tuple[RunStatus | None, list[str]] = (None, [])
        self.lock = threading.RLock()
        self.extra: dict[str, Alert] = {}  # alerts of the watchdog's own: delivery, policy, settings
        self.evidence_for: set[str] = set()
        self._last_evidence = 0.0
        self.policy = policy
        self.notifier: Notifier | None = None
        if settings.notify.command or settings.notify.webhook is not None:
            self.notifier = Notifier(settings.notify, on_failure=self._delivery_failed,
                                     on_success=self._delivered, log=self.log)
        if settings_problem:
            self.add_extra("settings", "warning", f"settings ignored (defaults used): {settings_problem}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0

    # -- the loop -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="nsa-watchdog", daemon=True)
        self._thread.start()

    def stop_loop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - the watchdog must outlive its own bugs
                self.errors += 1
                if self.errors <= 3:
                    self.log(f"nsa-tui watchdog: check failed: {type(exc).__name__}: {exc}")
            self._stop.wait(self.s.watchdog.interval_s)

    def poll(self, final: bool = False) -> list[AlertEvent]:
        """One look at the run: read what is new, check, record. Returns the events written."""
        now = self.clock()
        self._read_beats()
        metrics = decode_lines(self.metrics.read(), Metric, self._stats("metrics"), "metrics")
        if self.holds_rank0():
            for m in metrics:
                self.det.feed_metric(self.run_id, m)
        lines = self.train_log.read()
        if lines:
            self.det.feed_log(self.run_id, lines)
        view = self.view()
        self.det.feed_view(self.run_id, view)
        self._check_ranks(view, now)
        if now >= self._next_host:
            self._next_host = now + self.s.watchdog.host_every_s
            self.det.feed_host(self._host_sample(now))
        current = [a if a.run is not None else msgspec.structs.replace(a, run=self.run_id)
                   for a in self.det.check(now)]
        with self.lock:
            current += list(self.extra.values())
            events = self.ledger.step(current, now, final=final)
        for ev in events:
            self._announce(ev)
        hangs = [ev for ev in events if ev.action == "raised" and ev.alert.kind in HANG_KINDS]
        if hangs:
            self._maybe_capture(hangs)
            if self.policy is not None:
                self.policy.on_hang([ev.alert for ev in hangs])
        return events

    def holds_rank0(self) -> bool:
        """Whether this host's watchdog speaks for the run's metrics (rank 0's, one per run): on a
        shared runs root every host reads them, only rank 0's host alerts on them."""
        return not self.shared or (0 in self.beats and self.beats[0].host == self.host)

    def _stats(self, stream: str) -> LineStats:
        return self.stats.setdefault(stream, LineStats())

    def _read_beats(self) -> None:
        for rank, path in beat_files(self.run_dir).items():
            tail = self.beat_tails.get(rank)
            if tail is None:
                tail = self.beat_tails[rank] = FileTail(path)
            stream = heartbeat_stream(rank)
            for b in decode_lines(tail.read(), Beat, self._stats(stream), stream):
                if self.shared and b.host != self.host:
                    if b.rank == 0:
                        self.beats[0] = b  # who holds rank 0 (the metrics' host), never judged here
                    continue
                self.det.feed_beat(self.run_id, b)
                old = self.beats.get(b.rank)
                if old is None or b.ts >= old.ts:
                    self.beats[b.rank] = b

    def _check_ranks(self, view: RunView, now: float) -> None:
        """A rank whose process vanished without a final beat: fed to the detector (a crash)."""
        vanished = [r for r, b in self.beats.items()
                    if r not in self.gone and not b.phase.is_final() and b.pid and self._here(b)
                    and run_process(b.pid, self.run_id, str(self.part)) is None]
        if not vanished:
            return
        self._read_beats()  # a rank that wrote its last beat and exited since this look began
        for rank in vanished:
            if not self.beats[rank].phase.is_final():
                self.gone.add(rank)
                self.det.feed_rank_gone(self.run_id, rank, now)

    def live_rank_pids(self) -> list[int]:
        mine = str(self.part)
        return [b.pid for b in self.beats.values()
                if b.pid and self._here(b) and run_process(b.pid, self.run_id, mine) is not None]

    def _here(self, b: Beat) -> bool:
        """A beat of a rank on this host (only those are judged by this host's process table)."""
        return not (self.shared or self.by_host) or b.host == self.host

    def _host_sample(self, now: float) -> HostSample:
        if not self._gpu_tried:
            self._gpu_tried = True
            from nsa_tui.agent.sampler import NvmlSource

            self.gpu = NvmlSource()
        gpus, msg = self.gpu.read() if self.gpu is not None else (None, "")
        try:
            du = shutil.disk_usage(self.run_dir)
            disk = Usage(used_bytes=du.used, total_bytes=du.total, free_bytes=du.free)
        except OSError:
            disk = Usage()
        return HostSample(ts=now, gpus=gpus, gpu_message=msg, disk=disk)

    # -- the run as the agent would see it --------------------------------------------------------
    def _json(self, name: str, typ: Any) -> Any:
        path = (self.part if name in NODE_FILES else self.run_dir) / name
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return None
        cached = self._json_cache.get(name)
        if cached is not None and cached[0] == mtime and cached[1] is not None:
            return cached[1]
        rec = read_json(path, typ)
        self._json_cache[name] = (mtime, rec)
        return rec

    def view(self) -> RunView:
        """The run's view from its own files and the supervisor's knowledge of torchrun (no /proc
        scan): what the rules expect, as the agent would derive it."""
        info: RunInfo | None = self._json(RUN_JSON, RunInfo)
        launch: LaunchInfo | None = self._json(LAUNCH_JSON, LaunchInfo)
        # until finish() brings torchrun's exit, the run has not ended here, even once torchrun is
        # gone: the supervisor reaps it and calls finish() at once, and an end said before that
        # would lack its exit code (and be said twice)
        pids = self.live_rank_pids() if self.exit is not None else []
        alive = self.exit is None or bool(pids)
        stop = (self.part / STOP_JSON).exists()
        status = derive_status(info, launch, alive, True, stop, self.exit)
        if info is None:
            info = RunInfo(run_id=self.run_id, name=launch.name if launch else self.run_id,
                           status=RunStatus.STARTING, world_size=launch.nproc if launch else 1,
                           parent_run=launch.parent_run if launch else None)
        tail: list[str] = []
        if status in FAILED_STATUSES:
            if self._tail_cache[0] != status or self.exit is not None:
                self._tail_cache = (status, tail_lines(self.part / TRAIN_LOG, LOG_TAIL_LINES, 65536))
            tail = self._tail_cache[1]
        name = (launch.name if launch else "") or info.name
        parent = info.parent_run or (launch.parent_run if launch else None)
        return RunView(run_id=self.run_id, dir=str(self.run_dir), name=name, status=status, info=info,
                       launch=launch, exit=self.exit, alive=alive, pids=pids, stop_requested=stop,
                       parent_run=parent, created=launch.created if launch else (info.started_at or 0.0),
                       log_tail=tail, launcher_alive=self.exit is None, watchdog=True)

    # -- what it does with alerts -----------------------------------------------------------------
    def _announce(self, ev: AlertEvent) -> None:
        a = ev.alert
        if ev.action in ("raised", "resolved") or (ev.action == "updated" and not ev.note):
            rank = f" rank {a.rank}" if a.rank is not None else ""
            self.log(f"nsa-tui watchdog: alert {ev.id} {ev.action}: [{a.severity}] {a.kind}{rank}: "
                     f"{a.message}")
        if self.notifier is not None and a.kind != "delivery":
            self.notifier.submit(ev)

    def _maybe_capture(self, hangs: list[AlertEvent]) -> None:
        """Evidence once per stall: one capture (every rank) for the hangs raised in one look."""
        todo = [ev for ev in hangs if ev.id not in self.evidence_for]
        if not self.s.watchdog.evidence or not todo:
            return
        now = time.monotonic()
        if now - self._last_evidence < EVIDENCE_EVERY_S:
            return
        self._last_evidence = now
        self.evidence_for |= {ev.id for ev in todo}
        threading.Thread(target=self._capture, args=(todo[0],), name="nsa-evidence", daemon=True).start()

    def _capture(self, ev: AlertEvent) -> None:
        from nsa_tui.agent.evidence import capture

        try:
            here = {r: b for r, b in self.beats.items() if self._here(b)}  # this host's ranks only
            got = capture(self.run_dir, self.run_id, here, self.s.watchdog.evidence_wait_s,
                          why=f"alert {ev.id}: {ev.alert.message}")
        except Exception as exc:  # noqa: BLE001 - evidence is a bonus; the alert stands without it
            self.log(f"nsa-tui watchdog: evidence for alert {ev.id} failed: {type(exc).__name__}: {exc}")
            return
        note = f"evidence captured: {', '.join(got.files)}"
        if got.notes:
            note += f" ({'; '.join(got.notes)})"
        with self.lock:  # one capture shows every rank: it is the evidence of every hang now open
            keys = [k for k, rec in self.ledger.open.items() if rec.alert.kind in HANG_KINDS]
            ups = [self.ledger.attach(k, got.files, note=note) for k in keys]
        self.log(f"nsa-tui watchdog: alert {ev.id}: {note}")
        for up in ups:
            if up is not None and self.notifier is not None:
                self.notifier.submit(up)

    def add_extra(self, kind: str, severity: str, message: str, **kw: Any) -> None:
        """An alert of the watchdog's own (a failed delivery, a policy's action), held until
        :meth:`drop_extra`."""
        with self.lock:
            self.extra[kind] = Alert(kind=kind, severity=severity, host=self.host, run=self.run_id,  # type: ignore[arg-type]
                                     message=message, **kw)

    def drop_extra(self, kind: str) -> None:
        with self.lock:
            self.extra.pop(kind, None)

    def _delivery_failed(self, d: Delivery, why: str) -> None:
        assert self.notifier is not None
        via = self.notifier.describe(d.channel)
        self.add_extra("delivery", "warning",
                       f"notification of alert {d.event.id} via {via} failed after {d.attempts} tries: {why}",
                       suggested_actions=["check settings.yaml notify"])

    def _delivered(self, d: Delivery) -> None:
        if "delivery" in self.extra:
            self.drop_extra("delivery")  # the channel works again: the failure resolves

    # -- the end ----------------------------------------------------------------------------------
    def finish(self, exit_info: ExitInfo) -> list[AlertEvent]:
        """torchrun has exited: the run's last lines and its end, recorded before exit.json."""
        self.stop_loop()
        self.exit = exit_info
        self._tail_cache = (None, [])
        return self.poll(final=True)

    def root_cause(self) -> RootCause | None:
        """After :meth:`finish`: the rank that failed first and how (its failed beat, torchrun's
        summary, or its process seen gone), from this host's files."""
        tail = [ln for ln in self.view().log_tail if not OWN_LINE_RE.match(ln)]
        facts = self.det.runs.get(self.run_id)
        return root_cause(dict(self.beats), tail, dict(facts.gone) if facts is not None else {})

    def close(self, drain_s: float = 60.0) -> None:
        """Deliver what is queued (bounded), record how that went, then stop."""
        if self.notifier is not None:
            self.notifier.drain(drain_s)
            self.notifier.close()
            if self.notifier.failed:
                self.poll(final=True)  # a delivery that failed after the run's end is still said
        self.ledger.close()
