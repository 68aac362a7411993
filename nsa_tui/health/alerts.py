"""Stall and failure detection: a pure function of the event stream and a clock.

Feed every ``Event`` of a host (``feed``; or the typed ``feed_*`` methods), then ask
``check(now)`` for the alerts that hold at ``now``. Inputs are the contract's records
(nsa.contract). Nothing here reads files, the network or the wall clock, so every rule is
unit-tested on synthetic event sequences (tests/test_alerts.py).

Clocks: heartbeats carry the host's clock; ``now`` is the caller's. The detector
estimates the offset from events that carry both (``Event.received`` set by the client
and the agent's ``ts``), taking the smallest difference seen lately (a backfilled old
line only makes the difference larger, so it never wins).

Rules (docs/lessons.md#every-rank-beats): a rank whose step stops advancing past a phase-aware threshold
(generous in boot/data/compile/checkpoint/eval; in train a multiple of the recent
median step time, with a floor); a rank with no heartbeat at all; ranks drifting apart
in step; processes gone without a final status (crash, with exit code and traceback);
a trainer-reported failure; a run lost across a reboot; NaN loss; throughput collapse;
a GPU at high utilisation but idle power while its rank is stalled (the NCCL hang
signature); a config whose parameter count or sequence length is far from its name;
the runs root's disk nearly full, and a run that failed for want of space; a rank whose
process vanished while the run goes on; a rank that outlived its launcher. A crash names
the rank that failed first (nsa_tui/health/rootcause.py), not the survivors that failed after it.

The same detector runs in each run's watchdog on the host (nsa_tui/agent/watchdog.py, fed
from the run's files) and in the panel and CLI for runs that have no watchdog.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from typing import Any, Literal

from nsa.contract import (
    FAILED_STATUSES,
    Alert,
    Beat,
    EvalMetric,
    HostSample,
    Metric,
    RunStatus,
    RunView,
    TrainMetric,
    on_gpu,
)
from nsa.contract.protocol import LogLines
from nsa_tui.fmt import fmt_bytes
from nsa_tui.health.rootcause import (
    ENOSPC_RE,
    OWN_LINE_RE,
    exit_text,
    rank_traceback,
    root_cause,
    summary_block,
    traceback_tail,
)
from nsa_tui.health.runfacts import RankFacts, RunFacts, finite
from nsa_tui.health.thresholds import BEAT_JITTER_S, THROUGHPUT_WINDOW_MAX_S, Thresholds

__all__ = ["AlertDetector", "Thresholds", "exit_text", "expected_from_name", "traceback_tail"]
_NAN_RE = re.compile(r"non-finite|\bnan\b", re.I)
_SIZE_RE = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)([mb])(?![a-z])", re.I)
_SEQ_RE = re.compile(r"(?:seq|ctx)[-_]?(\d+)(k?)(?![a-z0-9])", re.I)


def _ranks(ranks: list[int]) -> str:
    """"rank 1" or "ranks 0, 2"."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def expected_from_name(name: str) -> tuple[float | None, int | None]:
    """"nsa-125m-seq2048" -> (125e6, 2048): what a config's name promises."""
    params = seq = None
    m = _SIZE_RE.search(name or "")
    if m:
        params = float(m.group(1)) * (1e6 if m.group(2).lower() == "m" else 1e9)
    s = _SEQ_RE.search(name or "")
    if s:
        seq = int(s.group(1)) * (1024 if s.group(2) else 1)
    return params, seq


class AlertDetector:
    """Alerts of one host from its events; pure: no I/O, no clock of its own."""

    def __init__(self, host: str = "local", thresholds: Thresholds | None = None) -> None:
        self.host = host
        self.t = thresholds or Thresholds()
        self.runs: dict[str, RunFacts] = {}
        self.gpus: list[Any] = []
        self.disk: Any = None  # the newest sample's Usage of the runs root's file system
        self._skews: deque[float] = deque(maxlen=120)

    # -- input ----------------------------------------------------------------------
    def feed(self, event: Any) -> None:
        """Take one client Event (kind, run, data, received, initial)."""
        kind, data, run_id = event.kind, event.data, event.run
        received = getattr(event, "received", 0.0) or 0.0
        if kind == "host":
            self.feed_host(data, received)
        elif run_id is None:
            return
        elif kind == "beats":
            for b in data:
                self.feed_beat(run_id, b, received)
        elif kind == "metrics":
            for m in data:
                self.feed_metric(run_id, m)
        elif kind == "log":
            self.feed_log(run_id, data.lines if isinstance(data, LogLines) else list(data))
        elif kind == "status":
            self.feed_view(run_id, data, getattr(event, "initial", False))
        elif kind == "synced":
            self._skew(received, getattr(data, "ts", None))  # the agent's clock when it sent it
            self.run(run_id).backfilling = False

    def run(self, run_id: str) -> RunFacts:
        return self.runs.setdefault(run_id, RunFacts())

    def _skew(self, received: float, ts: float | None) -> None:
        if received and finite(ts):
            self._skews.append(received - ts)

    def feed_host(self, sample: HostSample, received: float = 0.0) -> None:
        self._skew(received, sample.ts)
        self.gpus = list(sample.gpus or [])
        self.disk = sample.disk

    def feed_clock(self, received: float, ts: float) -> None:
        """A reading of the host's clock (``ts``, e.g. a status report's) taken when this clock
        read ``received``. Beats read from files carry when they were written, not when they
        were read, so they must not be fed with a ``received`` time: that would make every
        beat look fresh."""
        self._skew(received, ts)

    def feed_rank_gone(self, run_id: str, rank: int, ts: float) -> None:
        """The process of ``rank`` (the pid of its beats) no longer exists (the watchdog looks)."""
        self.run(run_id).gone.setdefault(rank, ts)

    def feed_view(self, run_id: str, view: RunView, initial: bool = False) -> None:
        """The run's status; ``initial``: a (re)subscription, whose backlog comes next."""
        run = self.run(run_id)
        run.view = view
        if initial:
            run.backfilling = True

    def feed_log(self, run_id: str, lines: list[str]) -> None:
        """The run's output: an alert's log tail (nsa-tui's own lines, earlier alerts, left out)."""
        self.run(run_id).log.extend(str(ln) for ln in lines if not OWN_LINE_RE.match(str(ln)))

    def feed_beat(self, run_id: str, b: Beat, received: float = 0.0) -> None:
        self._skew(received, b.ts)
        run = self.run(run_id)
        if not finite(b.ts):
            return
        r = run.ranks.setdefault(b.rank, RankFacts(advanced_at=b.ts))
        if b.ts < r.last_ts:
            return  # out of order: keep the newest
        if b.step != r.step:
            r.step, r.advanced_at = b.step, b.ts
        r.history.append((b.ts, b.step))
        r.phase = b.phase.value
        r.phase_since = b.phase_since if b.phase_since is not None and finite(b.phase_since) else b.ts
        r.last_ts = b.ts
        r.beat = b
        r.gpu = b.device.index if b.device.type == "cuda" else None

    def feed_metric(self, run_id: str, m: Metric) -> None:
        run = self.run(run_id)
        if isinstance(m, TrainMetric):
            if m.step_time_s is not None and finite(m.step_time_s):
                run.step_times.append(float(m.step_time_s))
            if m.tokens_per_s is not None and finite(m.tokens_per_s):
                run.tps.add(m.ts, float(m.tokens_per_s))
            value = m.loss
        elif isinstance(m, EvalMetric):
            value = m.val_loss
        else:
            return
        if not math.isfinite(value) and run.nan_step is None:
            run.nan_step = m.step

    # -- output ---------------------------------------------------------------------
    def skew(self) -> float:
        """Estimated (this clock - host clock), 0 without evidence."""
        return min(self._skews) if self._skews else 0.0

    def train_threshold(self, run_id: str) -> float:
        """Seconds without a step in phase train before a rank counts as stalled."""
        run = self.runs.get(run_id)
        if run is None or not run.step_times:
            return self.t.first_step_s
        return max(self.t.train_floor_s, self.t.train_factor * statistics.median(run.step_times))

    def check(self, now: float) -> list[Alert]:
        """Every alert that holds at ``now`` (the caller's clock)."""
        host_now = now - self.skew()
        out: list[Alert] = self._disk_alerts()
        for run_id, run in self.runs.items():
            out += self._check_run(run_id, run, host_now)
        return out

    def _disk_alerts(self) -> list[Alert]:
        """The runs root's file system nearly full: a host-level alert (``run`` None)."""
        d = self.disk
        if d is None or d.free_bytes is None:
            return []
        free = d.free_bytes
        if free >= self.t.disk_warn_bytes:
            return []
        critical = free < self.t.disk_critical_bytes
        severity: Literal["critical", "warning"] = "critical" if critical else "warning"
        total = f" of {fmt_bytes(d.total_bytes)}" if d.total_bytes else ""
        return [Alert(kind="disk", severity=severity, host=self.host, run=None,
                      message=f"disk of the runs root nearly full: {fmt_bytes(free)} free{total} "
                              f"(alert below {fmt_bytes(self.t.disk_warn_bytes)}); checkpoints will fail "
                              "with ENOSPC",
                      suggested_actions=["free space", "kill"])]

    def _alert(self, kind: str, severity: str, run_id: str, run: RunFacts, **kw: Any) -> Alert:
        kw.setdefault("log_tail", list(run.log)[-10:])
        return Alert(kind=kind, severity=severity, host=self.host, run=run_id, **kw)  # type: ignore[arg-type]

    def _check_run(self, run_id: str, run: RunFacts, now: float) -> list[Alert]:
        view = run.view
        status = view.status if view is not None else None
        out: list[Alert] = []
        tail = (list(view.log_tail) if view is not None else []) or list(run.log)
        step = view.info.step if view is not None else None
        if view is not None and status in FAILED_STATUSES:
            out.append(self._ended_alert(run_id, run, view, tail))
        elif status == RunStatus.LOST:
            out.append(self._alert("lost", "warning", run_id, run, last_step=step,
                                   message="run was running when the host rebooted; its processes are gone",
                                   suggested_actions=["resume"]))
        if run.nan_step is not None and not any(a.kind == "nan" for a in out):
            out.append(self._alert("nan", "critical", run_id, run, last_step=run.nan_step,
                                   message=f"loss is NaN/inf at step {run.nan_step}",
                                   suggested_actions=["kill", "resume"]))
        out += self._config_alerts(run_id, run)
        out += self._orphan_alerts(run_id, run)
        if (status is not None and not status.is_alive()) or run.backfilling:
            return out  # old lines of a backlog would look like stalls until it is in
        out += self._gone_alerts(run_id, run)
        stalled = self._stall_alerts(run_id, run, now)
        out += stalled
        out += self._nccl_alerts(run_id, run, stalled)
        out += self._drift_alerts(run_id, run)
        drop = self._throughput_drop(run_id, run)
        if drop is not None:
            recent, base = drop
            out.append(self._alert(
                "throughput", "warning", run_id, run,
                message=f"throughput collapsed: {recent:,.0f} tok/s over the last "
                        f"{self._throughput_window(run_id):.0f} s, was {base:,.0f} tok/s",
                suggested_actions=["dump"]))
        return out

    def _throughput_window(self, run_id: str) -> float:
        run = self.runs.get(run_id)
        step = statistics.median(run.step_times) if run is not None and run.step_times else 0.0
        return min(THROUGHPUT_WINDOW_MAX_S, max(self.t.throughput_window_s, 5 * step))

    def _throughput_drop(self, run_id: str, run: RunFacts) -> tuple[float, float] | None:
        """(median of the last window, median before it) when the first fell below
        ``throughput_drop`` of the second. A whole window, not a few steps: a loaded machine makes
        single steps slow (a busy scheduler), which is no collapse."""
        window = self._throughput_window(run_id)
        split = run.tps.split(window)
        if split is None:
            return None
        (recent, n_recent), (base, n_base) = split
        if min(n_recent, n_base) < self.t.throughput_min_points or base <= 0:
            return None
        return (recent, base) if recent < self.t.throughput_drop * base else None

    def _ended_alert(self, run_id: str, run: RunFacts, view: RunView, tail: list[str]) -> Alert:
        """A crashed or failed run: what failed first (the root cause), with its evidence."""
        step = view.info.step
        how = exit_text(view.exit)
        tail = [ln for ln in tail if not OWN_LINE_RE.match(ln)]  # facts of the run, not our own words
        beats = {k: r.beat for k, r in run.ranks.items() if r.beat is not None}
        cause = root_cause(beats, tail, run.gone)
        reason = (view.info.exit_reason or "").strip() if view.status == RunStatus.FAILED else ""
        evidence_text = "\n".join([reason, *tail])
        kind = "crash"
        if ENOSPC_RE.search(evidence_text):
            kind = "disk_full"
        elif reason and _NAN_RE.search(reason):
            # the trainer says "non-finite loss at step N ..." (docs/run-directory.md); a bare
            # substring test would miss it and call "maintenance" or "/home/fernando" a NaN
            kind = "nan"
        log_tail: list[str] = []
        if cause is not None and cause.rank is not None:
            block = summary_block(tail, cause.rank) if cause.by_signal else []
            log_tail = block or rank_traceback(tail, cause.rank)
        if not log_tail:
            source = tail if any("Traceback" in x for x in tail) else (reason.splitlines() or tail)
            log_tail = traceback_tail(source)
        if view.status == RunStatus.FAILED:
            first = reason.splitlines()[0] if reason else "no reason given"
            head = f"trainer failed ({how})"
            lines = reason.splitlines()
            if cause is not None and not first.startswith(cause.text.split(":")[0]):
                message = f"{head}: {cause.text}; then: {first}"
            elif len(lines) > 1 and lines[1].startswith("(then: "):  # the supervisor led with the cause
                message = f"{head}: {first}; then: {lines[1].removeprefix('(then: ').removesuffix(')')}"
            else:
                message = f"{head}: {first}"
        else:
            last = next((ln for ln in reversed(log_tail) if ln.strip()), "no output")
            what = cause.text if cause is not None else last.strip()
            message = f"run processes ended ({how}) without a final status: {what}"
        if kind == "disk_full":
            message = f"no space left on device: {message}"
        return self._alert(kind, "critical", run_id, run, rank=cause.rank if cause else None, last_step=step,
                           log_tail=log_tail, message=message,
                           suggested_actions=["logs", "free space", "resume"] if kind == "disk_full"
                           else ["logs", "resume"])

    def _gone_alerts(self, run_id: str, run: RunFacts) -> list[Alert]:
        """A rank's process vanished without a final beat while the run goes on (kill -9, the
        OOM killer): the crash, named at once, before torchrun tears the others down."""
        out: list[Alert] = []
        if run.view is not None and run.view.stop_requested:
            return out  # a person (or the run's policy) is stopping it: ranks are meant to go
        for rank, at in sorted(run.gone.items()):
            r = run.ranks.get(rank)
            if r is None or r.phase in ("done", "failed"):
                continue
            pid = r.beat.pid if r.beat is not None else None
            out.append(self._alert(
                "crash", "critical", run_id, run, rank=rank, phase=r.phase, last_step=r.step,
                heartbeat_age_s=at - r.last_ts,
                message=f"rank {rank}'s process (pid {pid}) is gone without a final heartbeat at step "
                        f"{r.step} (phase {r.phase}): killed?",
                suggested_actions=["logs", "resume"]))
        return out

    def _orphan_alerts(self, run_id: str, run: RunFacts) -> list[Alert]:
        """Ranks alive after their launcher (torchrun and its supervisor) ended: they hold their GPUs.
        Not for a Slurm job seen from its login node: its ranks are no processes there (the
        watchdog beside the job judges them on their node)."""
        view = run.view
        if view is None or not view.alive or view.launch is None or view.slurm is not None:
            return []
        launcher_gone = view.exit is not None or (
            view.launch.launcher_pid is not None and not view.launcher_alive)
        if not launcher_gone:
            return []
        pids = set(view.pids)
        ranks = sorted(k for k, r in run.ranks.items() if r.beat is not None and r.beat.pid in pids)
        who = ", ".join(f"rank {k}" for k in ranks) or f"pids {sorted(pids)}"
        rank = ranks[0] if len(ranks) == 1 else None
        return [self._alert("orphan_rank", "critical", run_id, run, rank=rank,
                            message=f"{who} outlived the run's launcher (torchrun has exited): it holds its "
                                    "GPU and will not be restarted; stop it",
                            suggested_actions=["kill"])]

    def _drift_alerts(self, run_id: str, run: RunFacts) -> list[Alert]:
        """Ranks compared at the same host time (the newest time every rank has reported),
        so a batch of one rank's lines that arrived before the other's is no drift."""
        ranks = {k: r for k, r in run.ranks.items() if r.history}
        if len(ranks) < 2:
            return []
        common = min(r.last_ts for r in ranks.values())
        spans = {k: r.steps_around(common) for k, r in ranks.items()}
        known = {k: s for k, s in spans.items() if s is not None}
        if len(known) < 2:
            return []
        lo, hi = min(s[1] for s in known.values()), max(s[0] for s in known.values())
        if hi - lo < self.t.drift_steps:  # the lagging rank's most against the leading one's least
            return []
        lag = min(known, key=lambda k: known[k][1])
        return [self._alert("drift", "warning", run_id, run, rank=lag, last_step=ranks[lag].step,
                            message=f"ranks drift apart: steps {lo}..{hi} (rank {lag} behind)",
                            suggested_actions=["dump"])]

    def _stall_alerts(self, run_id: str, run: RunFacts, now: float) -> list[Alert]:
        """Ranks that stopped beating (``no_heartbeat``) and ranks whose step stopped (``stall``).

        A hang of a multi-rank run is one event seen from every rank: the rank that froze stops
        beating, the others beat on while they wait for it in a collective. The culprit comes first
        and is named as such: a rank silent past ``no_heartbeat_s``, or, once the run is stuck, a
        rank whose beats lag the others' by more than ``quiet_s`` (heartbeats come at least every
        5 s). The waiting ranks' stalls follow, naming the rank they wait for; while a rank's beats
        lag too little to tell, they wait (at most ``quiet_s`` past their threshold)."""
        live = {k: r for k, r in sorted(run.ranks.items()) if k not in run.gone}  # gone: a crash
        stuck: dict[int, tuple[float, float]] = {}  # rank -> (seconds without a step, its threshold)
        for rank, r in live.items():
            if r.phase in ("done", "failed"):
                continue
            if r.phase == "train":
                since, limit = max(r.advanced_at, r.phase_since), self.train_threshold(run_id)
            else:
                since, limit = r.phase_since, self.t.phase_s.get(r.phase or "", self.t.first_step_s)
            stuck[rank] = (now - since, limit)
        hung = {k for k, (s, lim) in stuck.items() if s > lim}
        for k in list(hung):  # ranks in lockstep hang together: one at its step, not advanced lately
            hung |= {j for j, (s, lim) in stuck.items() if live[j].step <= live[k].step and s > lim / 2}
        ages = {k: now - r.last_ts for k, r in live.items()}
        freshest = min(ages.values(), default=0.0)
        lag = {k: ages[k] - freshest for k in live}  # behind the rank that beat last
        quiet_s = min(self.t.quiet_s, self.t.no_heartbeat_s)

        beating = [k for k in live if live[k].phase not in ("done", "failed")]  # ended ranks fall silent

        def quiet(k: int) -> bool:
            """Stopped beating while another rank of this stuck run beats on. Whatever its own
            phase and step: a rank frozen in a checkpoint, or one step ahead of the rank that
            waits for it, is no less the culprit."""
            return bool(hung) and k in beating and lag[k] > quiet_s

        culprits = sorted((k for k in live if ages[k] > self.t.no_heartbeat_s or quiet(k)),
                          key=lambda k: -ages[k])
        waiting = [k for k in sorted(hung) if k not in culprits and k in beating]
        unsure = [k for k in beating if k not in culprits and BEAT_JITTER_S < lag[k] <= quiet_s]
        if unsure and all(stuck[k][0] <= stuck[k][1] + quiet_s for k in waiting):
            # a rank's beats lag, too little yet to tell frozen from late: the stalls wait (at most
            # quiet_s), so the first alert of a frozen rank names it, not the ranks waiting for it
            waiting = []
        out = []
        for rank in culprits:
            r, age = live[rank], ages[rank]
            others = [k for k in waiting if k != rank]
            context = (f"; {_ranks(others)} {'waits' if len(others) == 1 else 'wait'} for it at step "
                       f"{live[others[0]].step}" if others else "")
            out.append(self._alert(
                "no_heartbeat", "critical", run_id, run, rank=rank, gpu=r.gpu, phase=r.phase,
                last_step=r.step, heartbeat_age_s=age,
                message=f"rank {rank}: no heartbeat for {age:.0f} s (process gone or frozen){context}",
                suggested_actions=["dump", "kill", "fallback"]))
        for rank in waiting:
            r, age = live[rank], ages[rank]
            gone_quiet = f"; waiting for {_ranks(culprits)} (no heartbeat)" if culprits else ""
            stuck_s, limit = stuck[rank]
            out.append(self._alert(
                "stall", "critical", run_id, run, rank=rank, gpu=r.gpu, phase=r.phase, last_step=r.step,
                heartbeat_age_s=age,
                message=f"rank {rank}: step {r.step} has not advanced for {stuck_s:.0f} s in phase "
                        f"{r.phase} (threshold {limit:.0f} s); last heartbeat {max(0.0, age):.1f} s ago"
                        f"{gone_quiet}",
                suggested_actions=["dump", "kill", "fallback"]))
        return out

    def _nccl_alerts(self, run_id: str, run: RunFacts, stalled: list[Alert]) -> list[Alert]:
        out = []
        for a in stalled:
            r = run.ranks.get(a.rank) if a.rank is not None else None
            if r is None or r.beat is None:
                continue
            for g in self.gpus:
                util, power, limit = g.util_pct, g.power_w, g.power_limit_w
                if not on_gpu(g, r.beat) or util is None or power is None or not limit:
                    continue
                if util >= self.t.nccl_util_pct and power < self.t.nccl_power_frac * limit:
                    out.append(self._alert(
                        "nccl_hang", "critical", run_id, run, rank=a.rank, gpu=g.index, phase=a.phase,
                        last_step=a.last_step, heartbeat_age_s=a.heartbeat_age_s,
                        message=f"GPU {g.index} reads {util:.0f}% busy at {power:.0f} W of "
                                f"{limit:.0f} W while rank {a.rank} is stalled: collective hang?",
                        suggested_actions=["dump", "kill", "fallback"]))
        return out

    def _config_alerts(self, run_id: str, run: RunFacts) -> list[Alert]:
        """The config's name and the run's name (a toy model can run under a big run name)."""
        if run.view is None:
            return []
        info = run.view.info
        cfg_name = (info.config or {}).get("name")
        names = [str(n) for n in (cfg_name, run.view.name) if n]
        f = self.t.size_factor
        pc, sl = info.param_count, info.seq_len
        out: dict[str, Alert] = {}
        for name in dict.fromkeys(names):
            params, seq = expected_from_name(name)
            if params and pc and not (params / f <= pc <= params * f):
                out.setdefault("config_size", self._alert(
                    "config_size", "warning", run_id, run, suggested_actions=["kill"],
                    message=f"{name!r} promises {params / 1e6:.0f}M parameters, model: {pc / 1e6:.1f}M"))
            if seq and sl and not (seq / f <= sl <= seq * f):
                out.setdefault("config_seq", self._alert(
                    "config_seq", "warning", run_id, run, suggested_actions=["kill"],
                    message=f"{name!r} promises seq_len {seq}, the run trains at {sl}"))
        return list(out.values())
