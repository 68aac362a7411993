"""Plain-data layer of the panel: bounded buffers, chart downsampling, units, keymap file."""

from __future__ import annotations

import asyncio
import time

from nsa.contract import RunInfo, RunStatus, RunView, SeriesSummary, TrainMetric
from nsa_tui.app.keymap import load_keymap
from nsa_tui.app.runmetrics import thin
from nsa_tui.app.state import LogBuffer, PanelState
from nsa_tui.fmt import fmt_age, fmt_bytes, fmt_count, fmt_duration, fmt_pair_bytes


def test_series_million_steps_is_bounded_fast_and_keeps_the_shape() -> None:
    s = SeriesSummary(cap=2048)
    t0 = time.perf_counter()
    for step in range(1, 1_000_001):
        s.append(step, 10.0 - step / 1e5)
    elapsed = time.perf_counter() - t0
    data = s.data()
    assert len(data.buckets) <= 2048 and sum(b.n for b in data.buckets) == 1_000_000
    assert elapsed < 10.0
    lasts = [b.last for b in data.buckets]
    assert lasts == sorted(lasts) and lasts[-1] == 1_000_000
    for b in data.buckets[::97]:  # bucket means of a straight line stay on the line
        assert b.mean is not None and abs(b.mean - (10.0 - (b.first + b.last) / 2 / 1e5)) < 1e-6
    xs, ys = thin(lasts, [b.mean or 0.0 for b in data.buckets], 80)
    assert len(xs) == 80 and xs[-1] == lasts[-1]


def test_series_ignores_replayed_steps() -> None:
    s = SeriesSummary()
    for step in (1, 2, 3, 2, 3, 4):
        s.append(step, float(step))
    assert [(b.first, b.end) for b in s.buckets] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


def test_log_buffer_is_a_ring_that_counts_everything() -> None:
    buf = LogBuffer(maxlen=100)
    for i in range(10):
        buf.append_many([f"line {i * 50 + j}" for j in range(50)])
    assert len(buf.lines) == 100 and buf.total == 500 and buf.dropped == 400
    assert buf.lines[0] == "line 400" and buf.lines[-1] == "line 499"


def test_chart_continues_from_the_parent_steps() -> None:
    state = PanelState.for_destinations(["local"])
    host = state.host("local")
    parent, child = host.run("p"), host.run("c")
    child.view = view("c", parent_run="p")
    for step in range(1, 101):
        parent.metrics.add(TrainMetric(ts=1.0, step=step, loss=5.0))
    for step in range(61, 81):  # resumed from the step-60 checkpoint
        child.metrics.add(TrainMetric(ts=1.0, step=step, loss=3.0))
    steps, values = state.chart_series(child, "loss")
    assert steps == list(range(1, 81))
    assert values[:60] == [5.0] * 60 and values[60:] == [3.0] * 20


def test_chart_joins_the_agents_summary_and_the_recent_lines_at_full_resolution() -> None:
    """A watch sends the summary of the whole run, then the newest lines: the chart shows the
    buckets before the recent window and every recent point."""
    from nsa.contract import MetricsFolder
    from nsa_tui.app import reducer
    from nsa_tui.hosts.client import Event

    state = PanelState.for_destinations(["h"])
    agent = MetricsFolder(cap=64)
    lines = [TrainMetric(ts=1.0, step=s, loss=1.0 + (s == 70_000)) for s in range(1, 100_001)]
    for m in lines:
        agent.add(m)
    reducer.watch_event(state, "h", Event("summary", "r", "metrics", 0, agent.summary(64)))
    reducer.watch_event(state, "h", Event("metrics", "r", "metrics", 10, lines[-100:]))
    run = state.host("h").runs["r"]
    steps, values = run.metrics.series("loss")
    assert steps[-100:] == list(range(99_901, 100_001)) and len(steps) <= 64 + 100
    assert steps == sorted(steps)
    spike = run.metrics.folder.series["loss"]
    assert max(b.hi for b in spike.buckets if b.hi is not None) == 2.0  # the one-step spike is kept


def test_units_on_every_number() -> None:
    gib = 1024**3
    assert fmt_bytes(80 * gib) == "80.0 GiB"
    assert fmt_bytes(300 * 1024**2) == "300 MiB"
    assert fmt_pair_bytes(61.2 * gib, 80 * gib) == "61.2/80.0 GiB"
    assert fmt_pair_bytes(100 * 1024**2, 512 * 1024**2) == "100/512 MiB"
    assert fmt_bytes(None) == "N/A" and fmt_pair_bytes(1, None) == "N/A"
    assert fmt_count(124_900_000, "params") == "124.90M params"
    assert fmt_duration(3725) == "1h02m" and fmt_duration(None) == "N/A"
    # a run's age in the list changes once a minute at most
    assert [fmt_age(s) for s in (42.7, 60, 1859, 3725, 3 * 86400 + 4 * 3600)] == ["<1m", "1m", "30m", "1h02m",
                                                                                "3d04h"]
    assert fmt_age(-1) == "N/A"


def test_keymap_file(tmp_path) -> None:
    path = tmp_path / "keymap.yaml"
    path.write_text("kill: x\nsearch: [ctrl+f, slash]\nbogus: z\nhelp: 3\n")
    keymap, problems = load_keymap(path)
    assert keymap == {"kill": "x", "search": "ctrl+f,slash"}
    assert any("bogus" in p for p in problems) and any("help" in p for p in problems)
    assert load_keymap(tmp_path / "absent.yaml") == ({}, [])


def test_packaged_demo_config_is_the_repository_demo() -> None:
    """nsa_tui/configs/demo-cpu.yaml is the copy an installed package offers; keep it in step."""
    from pathlib import Path

    import nsa_tui

    repo = Path(__file__).resolve().parents[2]
    packaged = Path(nsa_tui.__file__).parent / "configs" / "demo-cpu.yaml"
    assert packaged.read_text() == (repo / "configs" / "tiny-cpu.yaml").read_text()


def test_a_watch_of_a_run_that_ended_is_kept_until_it_delivers_the_end() -> None:
    """The run list can show a watched (not selected) run as ended before its watch delivers the
    end status; the watch must not be stopped then, or the detector would never learn the end
    (no crash alert, an endless no_heartbeat alert for a dead run)."""
    from nsa_tui.app.services.watches import plan_watches

    state = PanelState.for_destinations(["h"])
    host = state.host("h")
    host.run("r1").view = view("r1", status="running", alive=True)
    assert plan_watches(host, None) == {"r1": "alerts"}
    host.run("r1").view = view("r1", status="crashed", alive=False)
    assert plan_watches(host, None) == {}  # not wanted any more; the manager lets it finish

    async def scenario() -> list[str]:
        from nsa_tui.app.services.watches import WatchManager

        class Stream:  # a watch whose end status has not arrived yet
            def __init__(self) -> None:
                self.cancelled = False

            def watch(self, *a: object, **k: object):
                async def gen():
                    await asyncio.sleep(3600)
                    yield None
                return gen()

        host.run("r1").view = view("r1", status="running", alive=True)
        mgr = WatchManager(host, Stream(), lambda ev: None, lambda rid, mode: None)  # type: ignore[arg-type]
        mgr.ensure(None)
        task = mgr.tasks["r1"][0]
        host.run("r1").view = view("r1", status="crashed", alive=False)
        mgr.ensure(None)
        await asyncio.sleep(0)
        kept = ["r1"] if "r1" in mgr.tasks and not task.cancelled() else []
        mgr.stop()
        return kept

    assert asyncio.run(scenario()) == ["r1"]


def test_an_acknowledged_alert_that_resolves_and_comes_back_is_shown_again() -> None:
    """Acknowledging a stall must not hide a later, new stall of the same rank."""
    from nsa.contract import Alert
    from nsa_tui.app import reducer

    state = PanelState()
    stall = Alert(kind="stall", severity="critical", host="h", run="r1", rank=1, message="rank 1 stalled")
    reducer.alerts(state, "h", [stall])
    state.announced.add(stall.key)  # the app toasted it
    reducer.acknowledge(state, stall.key)  # and the user acknowledged it
    assert state.open_alerts() == []
    reducer.alerts(state, "h", [stall])  # still the same stall: stays acknowledged
    assert state.open_alerts() == []
    reducer.alerts(state, "h", [])  # the rank advanced again
    reducer.alerts(state, "h", [stall])  # and hangs later
    assert [a.key for a in state.open_alerts()] == [stall.key]
    assert stall.key not in state.announced  # so the app toasts it again


def test_a_run_status_never_moves_backwards() -> None:
    """A late report of an earlier state (the run list read before the watch's end) cannot undo it."""
    from nsa_tui.app import reducer

    state = PanelState()
    reducer.run_view(state, "h", view("r1", status="running", alive=True))
    reducer.run_view(state, "h", view("r1", status="finished"))
    reducer.run_view(state, "h", view("r1", status="running", alive=True, step=9))
    run = state.host("h").runs["r1"]
    assert run.status == "finished" and not run.alive and run.view is not None and run.view.info.step == 9


def test_gpu_table_puts_a_renumbered_rank_on_its_own_gpu_only() -> None:
    """A fallback run on the host's GPU 1 (CUDA_VISIBLE_DEVICES=1) calls it cuda:0: the uuid decides."""
    from nsa.contract import Beat, DeviceInfo, GpuReading
    from nsa_tui.app.widgets.gpus import gpu_lines, ranks_on

    def gpu_line(g: GpuReading, on: list[int], wide: bool) -> str:
        return " ".join(map(str, gpu_lines(g, on, 80 if wide else 30)))

    state = PanelState.for_destinations(["h"])
    run = state.host("h").run("r1")
    run.beats[0] = Beat(ts=1.0, run_id="r1", rank=0, device=DeviceInfo(type="cuda", index=0, uuid="GPU-bbb"))
    g0 = GpuReading(index=0, uuid="GPU-aaa")
    g1 = GpuReading(index=1, uuid="GPU-bbb")
    assert "no rank" in str(gpu_line(g0, ranks_on(g0, run), True))
    assert "rank 0" in str(gpu_line(g1, ranks_on(g1, run), True))
    run.beats[0] = Beat(ts=2.0, run_id="r1", rank=0, device=DeviceInfo(type="cuda", index=1))  # no uuid
    assert "rank 0" in str(gpu_line(g1, ranks_on(g1, run), True))


def test_a_dropped_link_raises_no_liveness_alerts() -> None:
    """While a host is unreachable no heartbeat arrives: that is no reason to call its ranks gone,
    neither during the outage nor between the reconnect and the watch's new backlog."""
    from nsa.contract import Beat, Phase
    from nsa.contract.protocol import Synced
    from nsa_tui.app.services.host import HostService
    from nsa_tui.health.alerts import Thresholds
    from nsa_tui.hosts.client import ConnectionState, Event

    state = PanelState()
    svc = HostService(state, "h", post=lambda m: None, thresholds=Thresholds())
    t0 = time.time()

    def beat(t: float) -> None:
        b = Beat(ts=t, run_id="r1", rank=0, step=int(t - t0), phase=Phase.TRAIN, phase_since=t0)
        svc._on_watch_event(Event("beats", "r1", "heartbeats/rank-0", int(t), [b], t))

    def running(t: float) -> None:
        st = view("r1", status="running", alive=True)
        svc._on_watch_event(Event("status", "r1", "status", 0, st, t, True))

    running(t0)
    beat(t0)
    svc._on_watch_event(Event("synced", "r1", "synced", 0, Synced(ts=t0), t0))
    svc._on_state(ConnectionState("reconnecting", 30.0, "dropped"))
    det = svc.alerts.detector
    assert det.check(t0 + 60) == []
    svc._on_state(ConnectionState("connected", None, ""))
    assert det.check(t0 + 61) == []  # the resubscription's backlog has not come yet
    running(t0 + 62)
    beat(t0 + 62)
    svc._on_watch_event(Event("synced", "r1", "synced", 0, Synced(ts=t0 + 62), t0 + 62))
    assert det.check(t0 + 63) == []
    assert [a.kind for a in det.check(t0 + 100)] == ["no_heartbeat"]  # real silence still counts
    assert state.host("h").conn == "connected"


def view(run_id: str, status: str = "running", alive: bool = False, parent_run: str | None = None,
         step: int = 0) -> RunView:
    info = RunInfo(run_id=run_id, name=run_id, status=RunStatus.RUNNING, parent_run=parent_run, step=step)
    return RunView(run_id=run_id, dir="/x", name=run_id, status=RunStatus(status), info=info, alive=alive,
                   parent_run=parent_run)


def node_view(run_id: str, host: str, rank0: bool, status: str = "running", alive: bool = True,
              signal: int | None = None) -> RunView:
    """One host's part of a run over hosts h1, h2 (records as the agent sends them)."""
    from nsa.contract import ExitInfo, LaunchInfo, NodeLayout

    hosts = ["h1", "h2"]
    nodes = NodeLayout(nnodes=2, node_rank=hosts.index(host), hosts=hosts, rdzv_endpoint="10.0.0.1:29400")
    info = RunInfo(run_id=run_id, name="big", status=RunStatus.RUNNING, world_size=2, step=7,
                   pid=1234 if rank0 else None)
    launch = LaunchInfo(run_id=run_id, name="big", created=100.0, nproc=1, nodes=nodes)
    return RunView(run_id=run_id, dir="/x", name="big", status=RunStatus(status), info=info, launch=launch,
                   alive=alive, exit=ExitInfo(signal=signal) if signal else None, created=100.0)


def two_host_state() -> PanelState:
    from nsa.contract import Beat, Phase

    state = PanelState.for_destinations(["h1", "h2"])
    for host, rank in (("h1", 1), ("h2", 0)):  # c10d put rank 0 on the second host
        state.host(host).conn = "connected"
        run = state.host(host).run("r")
        run.view = node_view("r", host, rank0=rank == 0)
        run.beats[rank] = Beat(ts=90.0, run_id="r", rank=rank, world_size=2, step=7, phase=Phase.TRAIN)
    return state


def test_a_run_over_two_hosts_is_one_row_with_every_rank_and_its_host() -> None:
    from nsa_tui.app.widgets.runlist import RunList
    from nsa_tui.app.widgets.summary import hosts_text, ranks_text

    state = two_host_state()
    (row,) = state.all_runs()  # one row: the part with rank 0
    assert row.host == "h2"
    state.selected = ("h1", "r")  # selecting any part shows the run's rank-0 part
    assert state.selected_run() is row
    merged = state.merged(row)
    assert merged.status == RunStatus.RUNNING and merged.primary == "h2" and not merged.lost
    from nsa_tui.app.listing import run_rows

    (listed,) = run_rows(state)
    assert listed.run is row
    cells = [c.plain for c in RunList._row(listed, 100.0, True, 20, None, merged)]
    assert (cells[0], cells[2]) == ("h1+h2", "running")
    assert ranks_text(row, 100.0, merged).plain.splitlines() == [
        "r0@h2 train step 7 · beat 10s ago", "r1@h1 train step 7 · beat 10s ago"]
    assert hosts_text(merged).plain == "h1 + h2 (rank 0)"


def test_a_host_that_drops_off_is_lost_not_the_run_crashed_until_the_others_fail() -> None:
    from nsa_tui.app import reducer
    from nsa_tui.hosts.client import ConnectionState

    state = two_host_state()
    reducer.connection(state, "h1", ConnectionState("reconnecting", 2.0, "connection to h1 dropped"), 100.0)
    merged = state.merged(state.all_runs()[0])
    assert merged.status == RunStatus.RUNNING and merged.problem is None
    assert merged.lost == {"h1": "connection to h1 dropped"}
    # the other ranks then fail at their next collective: now the run has failed, naming why
    failed = node_view("r", "h2", rank0=True, status="failed", alive=False)
    failed.info.exit_reason = "rank 0 failed at step 8: a collective timed out"
    reducer.run_view(state, "h2", failed)
    merged = state.merged(state.all_runs()[0])
    assert merged.status == RunStatus.FAILED
    assert merged.problem == "h2 (rank 0): rank 0 failed at step 8: a collective timed out"


def test_a_torchrun_killed_by_a_signal_makes_the_run_crashed_naming_its_host() -> None:
    from nsa_tui.app import reducer

    state = two_host_state()
    reducer.run_view(state, "h1", node_view("r", "h1", rank0=False, status="crashed", alive=False, signal=9))
    merged = state.merged(state.all_runs()[0])
    assert merged.status == RunStatus.CRASHED
    assert merged.problem == "h1 (rank 1): torchrun was killed by signal 9"


def test_a_rank_that_died_without_a_word_is_shown_gone_once_the_run_ended() -> None:
    """kill -9 of rank 1: its last beat says ``train``; once the run has ended the summary must
    not show it training. Rank 0's own failed beat is shown as it is."""
    from nsa.contract import Beat, Phase
    from nsa_tui.app.widgets.summary import ranks_text

    state = PanelState()
    run = state.host("local").run("r")
    run.view = RunView(run_id="r", dir="/x", name="n", status=RunStatus.FAILED,
                       info=RunInfo(run_id="r", name="n", status=RunStatus.FAILED, world_size=2, step=1221),
                       alive=False, created=100.0)
    run.beats[0] = Beat(ts=95.0, run_id="r", rank=0, world_size=2, step=1221, phase=Phase.FAILED)
    run.beats[1] = Beat(ts=90.0, run_id="r", rank=1, world_size=2, step=1220, phase=Phase.TRAIN)
    assert ranks_text(run, 100.0).plain.splitlines() == [
        "r0 failed step 1221 · beat 5s ago", "r1 gone at step 1220 (train, no final heartbeat)"]
    run.view = RunView(run_id="r", dir="/x", name="n", status=RunStatus.RUNNING, info=run.view.info,
                       alive=True, created=100.0)
    assert ranks_text(run, 100.0).plain.splitlines()[1] == "r1 train step 1220 · beat 10s ago"
