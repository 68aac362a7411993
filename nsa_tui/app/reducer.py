"""The one writer of the panel's state: every fact from a host goes through these functions.

Pure: no I/O, no Textual, no clock of their own. The services (services/) receive events
from the agents and call exactly one function here per event; widgets only read. Why:
when the run list, a run's watch and an action's reply all wrote the same record, they
raced (a finished run flipped back to "running" by an older poll); here a run's status
only moves forward (RunStatus.advance) and each field has one source.
"""

from __future__ import annotations

import msgspec

from nsa.contract import Alert, Hello, HostSample, RunView
from nsa.contract.protocol import OFFSET_EVENTS, Gap, LogLines, RunsList
from nsa.contract.replies import AlertList, AlertState
from nsa.contract.rundir import TRAIN_LOG
from nsa_tui.app.state import LogBuffer, PanelState, RunState, recorded_key
from nsa_tui.hosts.client import ConnectionState, Event

MAX_ALERTS = 200
MAX_RECORDED = 2_000  # recorded alerts kept per host (the oldest resolved ones go first)
MAX_LINE_CHARS = 4_000  # with 20,000 lines kept, a log costs at most ~80 MB however wide


def connection(state: PanelState, dest: str, st: ConnectionState, now: float) -> None:
    host = state.host(dest)
    host.conn = st.status
    host.detail = st.message
    host.retry_at = now + st.retry_in_s if st.retry_in_s is not None else None


def hello(state: PanelState, dest: str, h: Hello) -> None:
    state.host(dest).hello = h


def host_sample(state: PanelState, dest: str, sample: HostSample) -> None:
    state.host(dest).sample = sample


def run_view(state: PanelState, dest: str, view: RunView) -> RunState:
    """The agent's view of a run (the run list, a watch's status, an action's reply). Its
    status never moves backwards: a late report of an earlier state cannot undo a later one."""
    run = state.host(dest).run(view.run_id)
    old = run.view
    requeued = (old is not None and old.slurm is not None and view.slurm is not None
                and view.slurm.restarts > old.slurm.restarts)  # a requeued job queues again: not late
    if old is not None and old.status != view.status and not requeued:
        status = old.status.advance(view.status)
        if status != view.status:
            view = msgspec.structs.replace(view, status=status, alive=old.alive and status.is_alive())
    if old is None or msgspec.json.encode(old) != msgspec.json.encode(view):
        run.view = view
        run.version += 1
    return run


def runs_list(state: PanelState, dest: str, runs: RunsList) -> None:
    """The whole list (a subscription's start, also after a reconnect): runs not in it are gone."""
    host = state.host(dest)
    ids = {v.run_id for v in runs.runs}
    gone = [r for r in host.runs if r not in ids and host.runs[r].view is not None]
    for rid in gone:
        del host.runs[rid]
    _forget_view(state, {(dest, r) for r in gone})
    _forget_alerts(state, dest, set(gone))
    for v in runs.runs:
        run_view(state, dest, v)
    host.runs_loaded = True


def run_removed(state: PanelState, dest: str, run_id: str) -> None:
    state.host(dest).runs.pop(run_id, None)
    if state.selected == (dest, run_id):
        state.selected = None
    _forget_view(state, {(dest, run_id)})
    _forget_alerts(state, dest, {run_id})


def _forget_alerts(state: PanelState, dest: str, gone: set[str]) -> None:
    """A deleted run's alerts leave the panel: nothing is left to look at or to acknowledge
    (its alerts.jsonl went with it)."""
    if not gone:
        return
    host = state.host(dest)
    for key in [k for k in host.recorded if k[0] in gone]:
        del host.recorded[key]
    dropped = {a.key for a in state.alerts if a.host == dest and a.run in gone}
    state.alerts[:] = [a for a in state.alerts if not (a.host == dest and a.run in gone)]
    state.acked -= dropped
    state.announced -= dropped


def _forget_view(state: PanelState, gone: set[tuple[str, str]]) -> None:
    """A deleted run leaves the marks (and the comparison, when fewer than two remain)."""
    v = state.view
    v.marks = [k for k in v.marks if k not in gone]
    v.expanded -= gone
    if len(v.marks) < 2:
        v.compare = False


def watch_event(state: PanelState, dest: str, ev: Event) -> None:
    """One event of a run's watch (docs/agent-protocol.md, "watch")."""
    if ev.run is None:
        return
    run = state.host(dest).run(ev.run)
    kind, data = ev.kind, ev.data
    if kind == "status":
        run_view(state, dest, data)
        return
    if kind == "beats":
        for b in data:
            old = run.beats.get(b.rank)
            if old is None or b.ts >= old.ts:
                run.beats[b.rank] = b
    elif kind == "metrics":
        for m in data:
            run.metrics.add(m)
    elif kind == "summary":
        from nsa.contract import MetricsFolder

        run.metrics.reset(MetricsFolder(cap=run.metrics.folder.cap, summary=data))
    elif kind == "log":
        lines = data.lines if isinstance(data, LogLines) else list(data)
        run.log.append_many([line[:MAX_LINE_CHARS] for line in lines])
    elif kind == "gap" and isinstance(data, Gap):
        run.log_gap = data
        where = f"{run.view.dir}/{TRAIN_LOG}" if run.view is not None else f"{TRAIN_LOG} in the run directory"
        run.log.append_many([f"[nsa-tui] {TRAIN_LOG} is {data.size / 2**20:.1f} MiB: showing its last "
                             f"{(data.size - data.skipped_bytes) / 2**10:.0f} KiB; the whole file is {where} "
                             f"on the host (or: nsa-tui logs {dest} {ev.run})"])
    elif kind == "synced":
        run.synced = True
    if kind in OFFSET_EVENTS:
        run.offsets[ev.stream] = ev.pos
    run.version += 1


def note(run: RunState, text: str) -> None:
    """A line of the panel's own in a run's log (a watch that ended with an error)."""
    run.log.append_many([text])
    run.version += 1


def forget_log(run: RunState) -> None:
    """A run nobody looks at keeps its (bounded) series but not its log: memory stays flat
    however many runs are browsed; looking at it again starts from the log's tail."""
    run.log = LogBuffer()
    run.log_gap = None
    run.offsets.pop("log", None)


def alerts(state: PanelState, dest: str, current: list[Alert]) -> None:
    """This host's alerts become ``current``: new ones first, resolved ones gone, order kept.

    An alert that resolved forgets its acknowledgement and its announcement: the same
    condition coming back later (a second hang of the same rank) is new and must be seen."""
    keys = {a.key for a in current}
    resolved = {a.key for a in state.alerts if a.host == dest and a.key not in keys}
    state.acked -= resolved
    state.announced -= resolved
    by_key = {a.key: a for a in current}
    # alerts that still hold keep their place, with fresh evidence (heartbeat age, log tail)
    kept = [by_key.get(a.key, a) if a.host == dest else a for a in state.alerts
            if a.host != dest or a.key in keys]
    known = {a.key for a in kept}
    fresh = [a for a in current if a.key not in known]
    state.alerts[:] = (fresh + kept)[:MAX_ALERTS]


def acknowledge(state: PanelState, key: str) -> None:
    state.acked.add(key)


def recorded_alerts(state: PanelState, dest: str, lst: AlertList) -> tuple[int, int]:
    """The host's recorded alerts, whole (a subscription's start, also after a reconnect).
    The first list of a panel is old news: shown, not announced (a panel opened in the morning
    lists the night's alerts without ringing for each). Returns (alerts, still open)."""
    host = state.host(dest)
    first = not host.alerts_loaded
    host.recorded = {(st.run, st.id): st for st in lst.alerts}
    host.alerts_loaded = True
    if first:
        state.announced |= {recorded_key(dest, st.run, st.id) for st in lst.alerts}
    _bound(host.recorded)
    return len(lst.alerts), sum(1 for st in lst.alerts if st.state == "open")


def recorded_alert(state: PanelState, dest: str, st: AlertState) -> None:
    """One alert of the host changed (raised, updated, resolved, acknowledged)."""
    recorded = state.host(dest).recorded
    recorded[(st.run, st.id)] = st
    _bound(recorded)


def _bound(recorded: dict[tuple[str, str], AlertState]) -> None:
    if len(recorded) <= MAX_RECORDED:
        return
    done = sorted((k for k, st in recorded.items() if st.state == "resolved"),
                  key=lambda k: recorded[k].raised_at)
    for k in done[: len(recorded) - MAX_RECORDED]:
        del recorded[k]


def select(state: PanelState, host: str, run_id: str) -> None:
    state.selected = (host, run_id)


def deselect(state: PanelState) -> None:
    """Nothing selected: the run list shows no run (a filter that matches none)."""
    state.selected = None


# -- what the user chose to see (state.view) ---------------------------------------------------
def toggle_mark(state: PanelState, host: str, run_id: str) -> bool:
    """Mark a run for comparison, or unmark it; returns whether it is marked now."""
    v, key = state.view, (host, run_id)
    if key in v.marks:
        v.marks.remove(key)
        if len(v.marks) < 2:
            v.compare = False
        return False
    v.marks.append(key)
    return True


def set_compare(state: PanelState, on: bool) -> bool:
    """Overlay the marked runs (two or more); returns whether the comparison is on."""
    state.view.compare = on and len(state.marked_runs()) >= 2
    return state.view.compare


def set_x_axis(state: PanelState, axis: str) -> None:
    state.view.x_axis = "tokens" if axis == "tokens" else "step"


def set_charts(state: PanelState, charts: tuple[str, ...]) -> None:
    state.view.charts = tuple(charts)


def set_filter(state: PanelState, text: str) -> None:
    state.view.filter = " ".join(text.split())


def toggle_expanded(state: PanelState, root: tuple[str, str]) -> bool:
    """Unfold a lineage (by its root run) or fold it; returns whether it is unfolded now."""
    if root in state.view.expanded:
        state.view.expanded.discard(root)
        return False
    state.view.expanded.add(root)
    return True
