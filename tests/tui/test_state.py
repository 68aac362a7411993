"""Plain-data layer of the panel: bounded buffers, chart downsampling, units, keymap file."""

from __future__ import annotations

import time

from nsa_tui.app.fmt import fmt_bytes, fmt_count, fmt_duration, fmt_pair_bytes
from nsa_tui.app.keymap import load_keymap
from nsa_tui.app.state import LogBuffer, PanelState, Series, thin


def test_series_million_steps_is_bounded_fast_and_keeps_the_shape() -> None:
    s = Series(cap=2048)
    t0 = time.perf_counter()
    for step in range(1, 1_000_001):
        s.append(step, 10.0 - step / 1e5)
    elapsed = time.perf_counter() - t0
    steps, values = s.points()
    assert len(steps) <= 2048 and s.count == 1_000_000
    assert elapsed < 5.0
    assert steps == sorted(steps) and steps[-1] == 1_000_000
    # bucket means of a straight line stay on the line
    for st, v in zip(steps[::97], values[::97]):
        assert abs(v - (10.0 - st / 1e5)) < s.stride / 1e5 + 1e-9
    xs, ys = thin(steps, values, 80)
    assert len(xs) == 80 and xs[-1] == steps[-1]


def test_series_ignores_replayed_steps() -> None:
    s = Series()
    for step in (1, 2, 3, 2, 3, 4):
        s.append(step, float(step))
    assert s.points() == ([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])


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
    child.record["parent_run"] = "p"
    for step in range(1, 101):
        parent.add_metric({"kind": "train", "step": step, "loss": 5.0})
    for step in range(61, 81):  # resumed from the step-60 checkpoint
        child.add_metric({"kind": "train", "step": step, "loss": 3.0})
    steps, values = state.chart_series(child, "loss")
    assert steps == list(range(1, 81))
    assert values[:60] == [5.0] * 60 and values[60:] == [3.0] * 20


def test_units_on_every_number() -> None:
    gib = 1024**3
    assert fmt_bytes(80 * gib) == "80.0 GiB"
    assert fmt_bytes(300 * 1024**2) == "300 MiB"
    assert fmt_pair_bytes(61.2 * gib, 80 * gib) == "61.2/80.0 GiB"
    assert fmt_pair_bytes(100 * 1024**2, 512 * 1024**2) == "100/512 MiB"
    assert fmt_bytes(None) == "N/A" and fmt_pair_bytes(1, None) == "N/A"
    assert fmt_count(124_900_000, "params") == "124.90M params"
    assert fmt_duration(3725) == "1h02m" and fmt_duration(None) == "N/A"


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


def test_a_run_that_ends_between_its_watch_and_the_runs_poll_still_reaches_the_detector() -> None:
    """The runs poll can see a watched (not selected) run end before its watch delivers the final
    status; the watch is then stopped. The detector must still learn the end: a crash alert,
    and no endless no_heartbeat alert for a dead run."""
    import asyncio
    from types import SimpleNamespace

    from nsa_tui.alerts import Thresholds
    from nsa_tui.app.services.host import HostService
    from nsa_tui.client import Event

    async def scenario() -> list[str]:
        app = SimpleNamespace(state=PanelState(), alert_thresholds=Thresholds())
        svc = HostService(app, "h")  # type: ignore[arg-type]
        svc.host.conn = "connected"
        run = svc.host.run("r1")
        t0 = time.time()
        rec = {"status": "running", "alive": True, "initial": True, "ts": t0}
        svc.apply(run, Event("status", "r1", "status", 0, rec, t0))
        svc.apply(run, Event("heartbeat", "r1", "heartbeats/rank-0", 10,
                             {"rank": 0, "ts": t0, "step": 5, "phase": "train", "phase_since": t0}, t0))
        svc.apply(run, Event("synced", "r1", "synced", 0, {"ts": t0}, t0))
        svc._ensure_watches()  # alive and not selected: watched for alerts
        assert "r1" in svc.watches
        svc.watches["r1"][0].cancel()
        svc.merge_record(run, {"run_id": "r1", "status": "crashed", "alive": False, "exit_code": 1})
        svc._ensure_watches()  # the poll's record: no longer alive, the watch goes
        assert "r1" not in svc.watches
        return sorted(a.kind for a in svc.detector.check(t0 + 120))

    assert asyncio.run(scenario()) == ["crash"]


def test_an_acknowledged_alert_that_resolves_and_comes_back_is_shown_again() -> None:
    """Acknowledging a stall must not hide a later, new stall of the same rank (LESSONS 10)."""
    from types import SimpleNamespace

    from nsa_tui.alerts import Alert
    from nsa_tui.app.services.host import HostService

    app = SimpleNamespace(state=PanelState(), alert_thresholds=None, _seen_alerts=set())
    svc = HostService(app, "h")  # type: ignore[arg-type]
    stall = Alert("stall", "critical", "h", "r1", rank=1, message="rank 1 stalled")
    svc.merge_alerts([stall])
    app._seen_alerts.add(stall.key)  # the app toasted it
    app.state.acked.add(stall.key)  # and the user acknowledged it
    assert app.state.open_alerts() == []
    svc.merge_alerts([stall])  # still the same stall: stays acknowledged
    assert app.state.open_alerts() == []
    svc.merge_alerts([])  # the rank advanced again
    svc.merge_alerts([stall])  # and hangs later
    assert [a.key for a in app.state.open_alerts()] == [stall.key]
    assert stall.key not in app._seen_alerts  # so the app toasts it again


def test_gpu_table_puts_a_renumbered_rank_on_its_own_gpu_only() -> None:
    """A fallback run on the host's GPU 1 (CUDA_VISIBLE_DEVICES=1) calls it cuda:0: the uuid decides."""
    from nsa_tui.app.widgets.gpus import gpu_line, ranks_by_gpu

    state = PanelState.for_destinations(["h"])
    run = state.host("h").run("r1")
    run.add_heartbeat({"rank": 0, "device": {"type": "cuda", "index": 0, "uuid": "GPU-bbb"}})
    state.selected = ("h", "r1")
    ranks = ranks_by_gpu(state)
    g0 = {"index": 0, "uuid": "GPU-aaa"}
    g1 = {"index": 1, "uuid": "GPU-bbb"}
    assert "no rank" in str(gpu_line(g0, 0, ranks, True))
    assert "rank 0" in str(gpu_line(g1, 1, ranks, True))
    run.add_heartbeat({"rank": 0, "device": {"type": "cuda", "index": 1, "uuid": None}})  # no uuid: by index
    assert "rank 0" in str(gpu_line(g1, 1, ranks_by_gpu(state), True))


def test_a_dropped_link_raises_no_liveness_alerts() -> None:
    """While a host is unreachable no heartbeat arrives: that is no reason to call its ranks gone,
    neither during the outage nor between the reconnect and the watch's new backlog."""
    from types import SimpleNamespace

    from nsa_tui.alerts import Thresholds
    from nsa_tui.app.services.host import HostService
    from nsa_tui.client import ConnectionState, Event

    app = SimpleNamespace(state=PanelState(), alert_thresholds=Thresholds())
    svc = HostService(app, "h")  # type: ignore[arg-type]
    run = svc.host.run("r1")
    t0 = time.time()

    def beat(t: float) -> None:
        data = {"rank": 0, "ts": t, "step": int(t - t0), "phase": "train", "phase_since": t0}
        svc.apply(run, Event("heartbeat", "r1", "heartbeats/rank-0", int(t), data, t))

    running = {"status": "running", "alive": True, "initial": True}
    svc.apply(run, Event("status", "r1", "status", 0, running, t0))
    beat(t0)
    svc.apply(run, Event("synced", "r1", "synced", 0, {}, t0))
    svc._on_state(ConnectionState("reconnecting", 30.0, "dropped"))
    assert svc.detector.check(t0 + 60) == []
    svc._on_state(ConnectionState("connected", None, ""))
    assert svc.detector.check(t0 + 61) == []  # the resubscription's backlog has not come yet
    svc.apply(run, Event("status", "r1", "status", 0, running, t0 + 62))
    beat(t0 + 62)
    svc.apply(run, Event("synced", "r1", "synced", 0, {}, t0 + 62))
    assert svc.detector.check(t0 + 63) == []
    assert [a.kind for a in svc.detector.check(t0 + 100)] == ["no_heartbeat"]  # real silence still counts
