"""First contact with the panel: the launch dialog (preselection, what a config is, refusal,
``--set`` completion, recent launches), an unreachable host, the confirmations of k/f/r, the
palette, the stack viewer, the header's ETA and exit reason, the log pane while a run boots.

Live tests drive the real panel against the real local agent and real tiny runs; the others
draw fixed contract records (tests/tui/fixed_data.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from nsa.contract import Beat, LaunchInfo, Phase, RunInfo, RunStatus, RunView, TrainMetric
from nsa.contract.replies import ActionPlan, DumpFile, DumpResult, MissingRank
from nsa_tui.agent.procs import run_processes
from nsa_tui.app import reducer
from nsa_tui.app.app import NsaApp
from nsa_tui.app.confirm import kill_text, relaunch_text
from nsa_tui.app.screens.dialogs import ConfirmScreen
from nsa_tui.app.screens.launch import LaunchScreen
from nsa_tui.app.screens.main import MainScreen
from nsa_tui.app.state import PanelState, RunState
from nsa_tui.app.widgets.header import PanelHeader, clip_words, eta_s, run_progress
from nsa_tui.app.widgets.logview import LogView, waiting_note
from nsa_tui.health.stacks import dump_text, main_thread_first
from nsa_tui.user import recent as userstate
from tests.tui.fixed_data import NOW, fixed_state, view
from tests.tui.helpers import plain, wait_for

REPO = Path(__file__).resolve().parents[2]
SIZE = (100, 30)
CONFIGS = ["configs/dense-125m.yaml", "configs/smoke-cpu.yaml", "configs/tiny-cpu.yaml"]


def on(app: NsaApp, cls: type, ready: str = ""):
    """The app shows a screen of ``cls`` (with ``ready`` in it: a screen is pushed before its
    widgets are composed, which on a loaded machine is a moment later)."""
    return lambda: isinstance(app.screen, cls) and (not ready or bool(app.screen.query(ready))) and app.screen


# -- the launch dialog -------------------------------------------------------------------------------
async def test_the_dialog_preselects_the_hosts_last_config_else_the_demo(monkeypatch,
                                                                        private_user_state) -> None:
    monkeypatch.chdir(REPO)
    app = NsaApp(["local"], state=fixed_state(), live=False, clock=lambda: NOW, configs=CONFIGS)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        dialog = await wait_for(pilot, on(app, LaunchScreen), 5, "the dialog")
        assert dialog.query_one("#config").value == "configs/tiny-cpu.yaml"  # the demo, not dense-125m
        await pilot.press("escape")
        userstate.remember("local", userstate.RecentLaunch(config="configs/smoke-cpu.yaml", nproc=1))
        userstate.remember("gpu9", userstate.RecentLaunch(config="configs/dense-125m.yaml"))  # another host
        await pilot.press("l")
        dialog = await wait_for(pilot, on(app, LaunchScreen), 5, "the dialog")
        assert dialog.query_one("#config").value == "configs/smoke-cpu.yaml"
        assert dialog.query_one("#config-path").value == ""
        await pilot.press("escape")
        userstate.remember("local", userstate.RecentLaunch(config="/elsewhere/mine.yaml"))
        await pilot.press("l")
        dialog = await wait_for(pilot, on(app, LaunchScreen), 5, "the dialog")
        assert dialog.query_one("#config-path").value == "/elsewhere/mine.yaml"  # not in the list: typed
    assert private_user_state.stat().st_mode & 0o777 == 0o600


async def test_set_field_completes_config_keys(monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    app = NsaApp(["local"], state=fixed_state(), live=False, clock=lambda: NOW, configs=CONFIGS)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        dialog = await wait_for(pilot, on(app, LaunchScreen), 5, "the dialog")
        field = dialog.query_one("#overrides")
        field.focus()
        for ch in "model.n_k":
            await pilot.press(ch)
        await wait_for(pilot, lambda: field._suggestion, 5, "a completion")
        await pilot.press("right")
        assert field.value == "model.n_kv_heads="
        assert plain(dialog.query_one("#set-hint")).startswith("model.n_kv_heads: int, required")
        for ch in "1 train.s":
            await pilot.press(ch)
        await pilot.pause(0.2)
        hint = plain(dialog.query_one("#set-hint"))
        assert "train.steps" in hint and "train.seed" in hint  # the keys it could become
        _, opts = dialog.form()
        assert opts["overrides"] == ["model.n_kv_heads=1", "train.s"]


@pytest.mark.slow
async def test_the_dialog_says_what_a_config_is_and_refuses_what_cannot_run_here(runs_root: Path) -> None:
    app = NsaApp(["local"], offer_demo=False, configs=CONFIGS)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        gpus = app.state.hosts["local"].gpu_count
        await pilot.press("l")
        dialog = await wait_for(pilot, on(app, LaunchScreen), 5, "the dialog")
        dialog.query_one("#config-path").value = str(REPO / "configs" / "tiny-cpu.yaml")
        about = dialog.query_one("#launch-about")
        text = await wait_for(pilot, lambda: "params" in (t := plain(about)) and t, 30, "the description")
        assert "tiny-cpu" in text and "1.53M params" in text and "seq 256" in text
        assert "global batch 8" in text
        assert "needs CPU or CUDA" in text and "data: stdlib" in text
        if gpus:
            pytest.skip("the refusal needs a host without GPU")
        dialog.query_one("#overrides").value = "train.device=cuda"
        text = await wait_for(pilot, lambda: "cannot run" in (t := plain(about)) and t, 30, "the refusal")
        assert "✗ cannot run on local: needs CUDA (train.device is cuda) but this host has no GPU" in text
        assert dialog.query_one("#go").disabled
        await pilot.press("ctrl+s")  # refused: the key does nothing the button would not
        await pilot.pause(1.0)
        assert isinstance(app.screen, LaunchScreen) and app.state.all_runs() == []
        dialog.query_one("#overrides").value = "train.stepz=3"
        text = await wait_for(pilot, lambda: "unknown key" in (t := plain(about)) and t, 30, "--set's error")
        assert "--set train.stepz=3" in text


@pytest.mark.slow
async def test_a_recent_launch_runs_again_with_ctrl_r(runs_root: Path, make_config) -> None:
    config = make_config("again", train__steps=4)
    userstate.remember("local", userstate.RecentLaunch(config=config, nproc=1, overrides=["train.steps=3"],
                                                       name="rerun"))
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        await pilot.press("l")
        await wait_for(pilot, on(app, LaunchScreen), 5, "the dialog")
        await pilot.press("ctrl+r")
        run = await wait_for(pilot, lambda: app.state.selected_run(), 60, "the new run")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 10, "the dialog to close")
    launch = msgspec.json.decode((runs_root / run.run_id / "launch.json").read_bytes(), type=LaunchInfo)
    assert launch.name == "rerun" and launch.overrides == ["train.steps=3"] and launch.nproc == 1
    assert userstate.recent("local")[0].name == "rerun" and len(userstate.recent("local")) == 1


async def test_the_dialog_opens_in_the_config_field_and_enter_launches(runs_root: Path, make_config) -> None:
    """Typing a path goes into the config field at once; Enter launches the form as it is."""
    config = make_config("typed", train__steps=3)
    app = NsaApp(["local"], offer_demo=False, configs=CONFIGS)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        await pilot.press("l")
        dialog = await wait_for(pilot, on(app, LaunchScreen), 5, "the dialog")
        field = dialog.query_one("#config-path")
        await wait_for(pilot, lambda: app.focused is field, 5, "focus in the config field")
        await pilot.press(*config)
        assert field.value == config
        about = dialog.query_one("#launch-about")
        await wait_for(pilot, lambda: "params" in plain(about), 30, "the description")
        await pilot.press("enter")
        run = await wait_for(pilot, lambda: app.state.selected_run(), 60, "the new run")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), 10, "the dialog to close")
    launch = msgspec.json.decode((runs_root / run.run_id / "launch.json").read_bytes(), type=LaunchInfo)
    assert launch.config_file and Path(launch.config_file).name == Path(config).name


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_a_long_processes_label_wraps_in_its_column(runs_root: Path, size: tuple[int, int]) -> None:
    """With the host unreachable the processes label is long; it wraps in its own column, never runs
    into "strategy", and the fields under the two labels stay level."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = NsaApp([f"nobody@127.0.0.1:{port}"], offer_demo=False, configs=CONFIGS)
    async with app.run_test(size=size) as pilot:
        await pilot.press("l")
        dialog = await wait_for(pilot, on(app, LaunchScreen), 5, "the dialog")
        await pilot.pause()
        label = dialog.query_one("#nproc-label")
        strategy = next(w for w in dialog.query("Label") if plain(w).strip() == "strategy")
        assert "GPUs unknown" in plain(label)
        assert label.region.right <= strategy.region.x, (label.region, strategy.region)
        assert label.content_region.height >= 1 and label.region.y == strategy.region.y
        assert dialog.query_one("#nproc").region.y == dialog.query_one("#strategy").region.y
        strips = app.screen._compositor.render_strips()
        shown = "\n".join("".join(seg.text for seg in strip) for strip in strips)
        row = next(ln for ln in shown.splitlines() if "strategy" in ln)
        assert " strategy" in row and "unknown)" in shown, shown  # all of the label, apart from "strategy"


# -- an unreachable host -----------------------------------------------------------------------------
async def test_a_host_never_reached_says_why_not_no_gpu_or_no_runs(runs_root: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dest = f"nobody@127.0.0.1:{port}"
    app = NsaApp([dest], offer_demo=False, configs=CONFIGS)
    async with app.run_test(size=SIZE) as pilot:
        host = app.state.hosts[dest]
        await wait_for(pilot, lambda: host.conn == "reconnecting" and host.detail, 30, "the retry state")
        top = app.screen.query_one(PanelHeader)
        header = await wait_for(pilot, lambda: "reconnecting in" in (h := plain(top)) and h, 5)
        assert "refused" in header.lower() or "connect call failed" in header.lower(), header
        await pilot.press("l")
        dialog = await wait_for(pilot, on(app, LaunchScreen), 5, "the dialog")
        label = plain(dialog.query_one("#nproc-label"))
        assert "not reached" in label and "no GPU" not in label
        about = dialog.query_one("#launch-about")
        await wait_for(pilot, lambda: "cannot check" in plain(about), 10, "why the config is not checked")
        await pilot.press("escape")
        await pilot.press("q")
    assert "no runs are running" not in app.return_value
    assert f"{dest}: never reached (" in app.return_value and "were not seen" in app.return_value


# -- confirmations -------------------------------------------------------------------------------------
def running(run_id: str, world: int, **kw) -> RunState:
    state = PanelState.for_destinations(["local"])
    v = view(run_id, "exp", "running", alive=True, world_size=world, step=120, total_steps=1000, **kw)
    v = msgspec.structs.replace(v, pids=[4001, 4002, 4003][: world + 1])
    return reducer.run_view(state, "local", v)


def test_the_confirmations_say_exactly_what_will_happen() -> None:
    run = running("20261121-exp-1", 2, device="cpu")
    stop = ActionPlan(op="kill", run_id=run.run_id, alive=True, pids=[4001, 4002, 4003, 4004],
                      rank_pids=[4003, 4004], world_size=2)
    text = kill_text(run, 60, stop)
    assert text.startswith("SIGTERM to the 4 processes of 20261121-exp-1 on local: first its 2 ranks "
                           "(pids 4003, 4004), each of which finishes its current step, saves a checkpoint "
                           "and exits; then the launcher (pids 4001, 4002). Whatever remains after 60 s "
                           "gets SIGKILL."), text
    assert "step 120/1000" in text
    plan = ActionPlan(op="fallback", run_id=run.run_id, alive=True, pids=[4001, 4002, 4003],
                        world_size=2, nproc=1, name="exp-fallback", checkpoint="/r/checkpoints/step-100",
                        checkpoint_step=100, grad_accum=4, global_batch=16)
    title, body, yes = relaunch_text(plan, run, 60)
    assert title == "Fall back to one process: exp?" and yes == "Fall back"
    assert "1. Stop: SIGTERM to the 3 processes" in body
    assert "2. Start exp-fallback: 1 process on CPU, from the checkpoint the stop saves (newest now: " \
           "step-100 (/r/checkpoints/step-100))" in body
    assert "The global batch stays 16 sequences with grad_accum 4." in body
    resume = msgspec.structs.replace(plan, op="resume", alive=False, nproc=2, name="exp-resume", grad_accum=2)
    title, body, yes = relaunch_text(resume, run, 60)
    assert title == "Resume exp?" and body.startswith("Start exp-resume: 2 processes from step-100")
    assert "started from" not in body
    inherited = msgspec.structs.replace(resume, checkpoint="/r/parent/checkpoints/step-100",
                                        started_from=True)
    assert relaunch_text(inherited, run, 60)[1].startswith(
        "Start exp-resume: 2 processes from step-100 (/r/parent/checkpoints/step-100), the checkpoint it "
        "started from (it saved none of its own), with ")
    again = msgspec.structs.replace(plan, again="20261121-exp-fallback-2")
    assert "already started 20261121-exp-fallback-2" in relaunch_text(again, run, 60)[1]


async def test_f_on_a_one_process_run_says_there_is_nothing_to_fall_back_from() -> None:
    state = fixed_state()  # the selected run "nsa-125m-1gpu" runs on 1 process
    app = NsaApp(["local"], state=state, live=False, clock=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        assert app.state.selected_run().view.info.world_size == 1
        await pilot.press("f")
        await pilot.pause(0.3)
        assert isinstance(app.screen, MainScreen)  # no dialog
        assert any("nothing to fall back from" in str(n.message) for n in app._notifications)


@pytest.mark.slow
async def test_k_f_r_ask_first_with_the_hosts_facts(runs_root: Path, make_config) -> None:
    from tests.tui.test_panel_live import launch_through_dialog

    config = make_config("asked", train__steps=5000, train__save_every=2)
    app = NsaApp(["local"], offer_demo=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "connection")
        run_id = await launch_through_dialog(app, pilot, config, nproc="2")
        run = app.state.selected_run()
        latest = runs_root / run_id / "checkpoints" / "latest"
        await wait_for(pilot, lambda: latest.exists() and run.alive, 120, "a checkpoint")
        await pilot.press("k")
        ask = await wait_for(pilot, on(app, ConfirmScreen, "#confirm-body"), 30, "the stop confirmation")
        body = plain(ask.query_one("#confirm-body"))
        pids = run_processes(run_id)  # supervisor, torchrun, 2 ranks: every one is named
        assert f"SIGTERM to the {len(pids)} processes of {run_id} on local: first its 2 ranks" in body
        assert len(pids) >= 4 and all(str(p.pid) in body for p in pids)
        await pilot.press("n")
        await pilot.press("f")
        ask = await wait_for(pilot, on(app, ConfirmScreen, "#confirm-body"), 30, "the fallback confirmation")
        body = plain(ask.query_one("#confirm-body"))
        assert "1. Stop: SIGTERM" in body and "2. Start asked-fallback: 1 process on CPU" in body
        assert "newest now: step-" in body and "grad_accum 2" in body
        await pilot.press("n")
        await pilot.press("r")  # still running: the host's plan refuses, no dialog
        await wait_for(pilot, lambda: any("still running" in str(n.message) for n in app._notifications), 30,
                       "the refusal")
        assert isinstance(app.screen, MainScreen) and run.alive
        await pilot.press("q")


# -- palette, stacks, header, log ------------------------------------------------------------------------
async def test_the_palette_lists_quit_and_keys_once() -> None:
    app = NsaApp(["local"], state=fixed_state(), live=False, clock=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert sum(t.lower().startswith("quit") for t in titles) == 1, titles
        assert sum(t.lower().startswith("keys") or t.lower().startswith("help") for t in titles) == 1, titles
        assert "Screenshot" in titles and "Theme" in titles  # Textual's other commands stay


def real_faulthandler_dump() -> str:
    code = ("import faulthandler, threading, time\n"
            "def beat():\n    time.sleep(5)\n"
            "threading.Thread(target=beat, name='nsa-heartbeat', daemon=True).start()\n"
            "time.sleep(0.2)\n"
            "def train_step():\n    faulthandler.dump_traceback(all_threads=True)\n"
            "train_step()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stderr


def test_the_stack_viewer_shows_each_ranks_main_thread_first_and_why_a_rank_is_missing() -> None:
    raw = real_faulthandler_dump()
    assert raw.index("in beat") < raw.index("in train_step")  # faulthandler: the other threads first
    ordered = main_thread_first(raw)
    assert ordered.index("in train_step") < ordered.index("in beat")
    assert ordered.splitlines()[0].endswith("[main thread]")
    res = DumpResult(run_id="r1", ranks=[0], files=[DumpFile(name="stacks/rank-0-1.txt", text=raw)],
                     missing=[MissingRank(rank=1, reason="no live process of rank 1 on this host")])
    text = dump_text(res)
    assert text.index("===== rank 0: stacks/rank-0-1.txt") < text.index("===== rank 1: no stack =====")
    assert "no live process of rank 1 on this host" in text


def test_the_exit_reason_is_cut_at_a_word_and_says_so() -> None:
    reason = "rank 1 failed at step 2: RuntimeError: the collective operation timed out after 600 seconds"
    cut = clip_words(reason, 60)
    assert len(cut) <= 60 and cut.endswith("…") and reason.startswith(cut[:-1])
    assert reason[len(cut) - 1] == " "  # the next character starts a new word: nothing cut mid-word
    state = PanelState.for_destinations(["local"])
    run = reducer.run_view(state, "local", view("r", "x", "failed", exit_reason=reason, started_at=NOW - 10))
    assert "operation timed out…" in run_progress(run, NOW).plain or cut in run_progress(run, NOW).plain


def test_the_eta_is_smoothed_over_noisy_step_times() -> None:
    """Step times 0.9 s and 9.4 s alternating in bursts (a loaded machine): the ETA moves, it does
    not jump between the extremes from one step to the next."""
    state = PanelState.for_destinations(["local"])
    run = reducer.run_view(state, "local", view("r", "x", "running", alive=True, total_steps=10_000,
                                                started_at=NOW - 100))
    etas = []
    for step in range(1, 301):
        slow = (step // 5) % 2 == 1
        run.metrics.add(TrainMetric(ts=NOW + step, step=step, loss=3.0, step_time_s=9.4 if slow else 0.9))
        if step > 100:
            etas.append(eta_s(run, 10_000))
    assert max(etas) / min(etas) < 1.5, (min(etas), max(etas))
    mean_step = (0.9 + 9.4) / 2
    assert 0.6 * mean_step * 9_700 < etas[-1] < 1.4 * mean_step * 9_700


async def test_the_log_pane_of_a_booting_run_shows_its_phase_and_age() -> None:
    state = fixed_state(with_alert=False)
    rid = "20261121T200000Z-booting"
    launch = LaunchInfo(run_id=rid, name="booting", created=NOW - 40, nproc=1)
    reducer.run_view(state, "local", RunView(run_id=rid, dir="/r", name="booting", status=RunStatus.STARTING,
                                             alive=True, launch=launch, created=NOW - 40,
                                             info=RunInfo(run_id=rid, name="booting")))
    run = state.hosts["local"].runs[rid]
    assert waiting_note(run, NOW) == "booting is starting for 40s: no heartbeat and no log output yet"
    run.beats[0] = Beat(ts=NOW - 1, run_id=rid, rank=0, phase=Phase.DATA, phase_since=NOW - 12)
    assert waiting_note(run, NOW) == "booting is in phase data for 12s; no log output yet"
    reducer.select(state, "local", rid)
    app = NsaApp(["local"], state=state, live=False, clock=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        app.select("local", rid)
        await pilot.pause(0.4)
        log = app.screen.query_one(LogView)
        first = "".join(seg.text for seg in log.render_line(0))
        assert "booting is in phase data for 12s" in first
