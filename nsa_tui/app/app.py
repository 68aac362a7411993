"""The nsa-tui App: screens, keys (footer, command palette, keymap file) and actions.

The app never waits on a host: every client call runs in a worker (services/), and the
screen is redrawn from plain state by a 10 Hz timer (new data at most once a second: the
refresh cap in screens/main.py), so log floods and dead hosts cost at most a few cheap
redraws per second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, SystemCommand
from textual.screen import Screen

from nsa_tui import userstate
from nsa_tui.app import confirm, reducer
from nsa_tui.app.keymap import load_keymap
from nsa_tui.app.messages import AskHostKey, SelectRun, Toast
from nsa_tui.app.screens.dialogs import ConfirmScreen, HelpScreen, StacksScreen
from nsa_tui.app.screens.launch import LaunchScreen, demo_config, find_configs
from nsa_tui.app.screens.main import KEYS, MainScreen
from nsa_tui.app.services.host import HostService
from nsa_tui.app.state import PanelState, recorded_key
from nsa_tui.app.view_actions import ViewActions
from nsa_tui.app.widgets.alerts import AlertsPane
from nsa_tui.app.widgets.header import why_not_connected
from nsa_tui.app.widgets.runlist import RunList
from nsa_tui.hostspec import runs_root_for
from nsa_tui.settings import Settings, SettingsError, host_runs_roots, load_settings, settings_path
from nsa_tui.userstate import RecentLaunch

TICK_S = 0.1
KILL_GRACE_S = 60.0  # what the agent's kill waits before KILL (its default)
PALETTE_TITLES = {"quit": "Quit", "help": "Keys"}  # Textual has commands of these names: ours replace them


class NsaApp(ViewActions, App[str | None]):
    """The control panel for one or more hosts."""

    CSS_PATH = "panel.tcss"
    TITLE = "nsa-tui"
    ENABLE_COMMAND_PALETTE = True

    def __init__(self, destinations: list[str], *, state: PanelState | None = None, live: bool = True,
                 clock: Callable[[], float] | None = None, keymap_file: Path | None = None,
                 offer_demo: bool = True, configs: list[str] | None = None,
                 alert_thresholds: Any = None, clients: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.destinations = list(destinations) or ["local"]
        self.state = state or PanelState.for_destinations(self.destinations, clock or time.time)
        if clock is not None:
            self.state.clock = clock
        self.live = live
        self.offer_demo = offer_demo
        self.configs = configs
        self.alert_thresholds = alert_thresholds
        self.clients = clients or {}  # dest -> a HostClient built elsewhere (tests, custom transports)
        self._keymap_file = keymap_file
        self.keymap: dict[str, str] = {}  # binding id -> key(s), from the user's settings (keys:)
        self.settings = Settings()
        self.services: dict[str, HostService] = {}
        self.tick_count = 0
        self.last_tick_at = 0.0
        self._demo_offered = False

    # -- life cycle -------------------------------------------------------------------------------
    def on_mount(self) -> None:
        try:
            self.settings = load_settings()
        except SettingsError as exc:  # the panel still starts, with the defaults, and says why
            self.notify(f"{exc}; using the defaults", title="settings", severity="error", timeout=30,
                        markup=False)
        keymap, problems = load_keymap(self._keymap_file, self.settings)
        if keymap:
            self.keymap = keymap
            self.set_keymap(keymap)
        for p in problems:
            self.notify(p, title="keys", severity="warning", timeout=10, markup=False)
        self.load_view_prefs()
        self.push_screen(MainScreen(), callback=None)
        self.state.announced |= {a.key for a in self.state.alerts}
        if self.live:
            for dest in self.destinations:
                svc = HostService(self.state, dest, self.post_message, self.clients.get(dest),
                                  self.alert_thresholds, log_error=self.log.error,
                                  runs_root=runs_root_for(dest, None, host_runs_roots(self.settings)))
                self.services[dest] = svc
                self.run_worker(svc.run(), group=f"host:{dest}", exit_on_error=False)
        self.set_interval(TICK_S, self.tick)
        self.call_after_refresh(self.tick)

    def main_screen(self) -> MainScreen | None:
        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                return screen
        return None

    def tick(self) -> None:
        """Redraw from state (10x/s, capped for new data); also where new alerts turn into a
        toast and a bell."""
        self.tick_count += 1
        self.last_tick_at = time.monotonic()
        state = self.state
        if state.selected is None or state.selected_run() is None:
            runs = state.all_runs()
            if runs:
                alive = [r for r in runs if r.alive]
                self.select((alive or runs)[0].host, (alive or runs)[0].run_id)
        self._announce_alerts()
        screen = self.main_screen()
        if screen is not None and screen.ready:
            screen.update_from(state, state.clock())
        self._maybe_offer_demo()

    def _announce_alerts(self) -> None:
        """A toast (and the bell, unless settings say ``notify: {bell: false}``) for each new open alert."""
        for item in self.state.shown_alerts(history=0):
            if item.state != "open" or item.key in self.state.announced:
                continue
            self.state.announced.add(item.key)
            alert = item.alert
            self.notify(alert.message or alert.key, title=f"alert: {alert.kind}", markup=False,
                        severity="error" if alert.severity == "critical" else "warning", timeout=8)
            if self.settings.notify.bell:
                self.bell()

    def select(self, host: str, run_id: str) -> None:
        """Show `run_id` of `host` everywhere; its service streams it in full."""
        reducer.select(self.state, host, run_id)
        for dest, svc in self.services.items():  # other hosts stop streaming their last run's log
            svc.focus(run_id if dest == host else None)

    def on_run_list_selected(self, message: RunList.Selected) -> None:
        self.select(message.host, message.run_id)

    # -- messages from the services -------------------------------------------------------------
    def on_toast(self, message: Toast) -> None:
        self.notify(message.text, title=message.title, severity=message.severity,  # type: ignore[arg-type]
                    timeout=message.timeout, markup=False)

    def on_select_run(self, message: SelectRun) -> None:
        self.select(message.host, message.run_id)

    def on_ask_host_key(self, message: AskHostKey) -> None:
        """An unknown host key: ask the user (never for a changed key: the transport refuses)."""

        def answered(yes: bool | None) -> None:
            if not message.answer.done():
                message.answer.set_result(bool(yes))

        self.push_screen(ConfirmScreen(
            f"Unknown host key: {message.host}",
            f"{message.fingerprint}\nCompare it with the host's key (ssh-keygen -lf on the host). Trust it "
            "and remember it in known_hosts?", yes="Trust"), answered)

    # -- demo offer for a newcomer ----------------------------------------------------------------
    def _maybe_offer_demo(self) -> None:
        if self._demo_offered or not self.offer_demo or not self.live:
            return
        host = self.state.hosts.get("local")
        if host is None or not host.runs_loaded:
            return
        self._demo_offered = True
        if host.runs or not isinstance(self.screen, MainScreen):
            return
        config = demo_config()

        def answered(yes: bool | None) -> None:
            if yes:
                self._launch_now("local", {"config": config, "nproc": 1, "name": "demo"})

        self.push_screen(ConfirmScreen(
            "No runs on this host yet",
            f"Launch the demo? {config}: a tiny NSA model training on CPU from the Python "
            "standard library's own source; the first steps show within a minute.",
            yes="Launch demo"), answered)

    @work(group="actions")
    async def _launch_now(self, host: str, opts: dict[str, Any]) -> None:
        try:
            run_id = await self.submit_launch(host, opts)
        except Exception as exc:
            self.notify(str(exc), title="launch failed", severity="error", timeout=15, markup=False)
            return
        self.select(host, run_id)

    # -- actions ------------------------------------------------------------------------------------
    def _service(self, host: str) -> HostService:
        svc = self.services.get(host)
        if svc is None:
            raise RuntimeError(f"not connected to {host}")
        return svc

    def _connected(self, host: str) -> HostService | None:
        """The host's service, or None after saying that the panel is not connected to it."""
        svc = self.services.get(host)
        if svc is None:
            self.notify(f"not connected to {host}", severity="error", markup=False)
        return svc

    async def submit_launch(self, host: str, opts: dict[str, Any]) -> str:
        """Launch through the host's service; raises with the host's message on a bad config.
        A launch that started is remembered for the host (the dialog's preselection, ctrl+r).
        ``opts["hosts"]``: one run over these hosts (services/multiactions.py)."""
        if len(opts.get("hosts") or []) > 1:
            from nsa_tui.app.services import multiactions

            run_id = await multiactions.launch(self.state, self.services, opts["hosts"], opts)
            self.select(opts["hosts"][0], run_id)
            return run_id
        run_id = await self._service(host).actions.launch(opts)
        try:
            userstate.remember(host, RecentLaunch(
                config=str(opts["config"]), nproc=opts.get("nproc") if isinstance(opts.get("nproc"), int)
                else None, overrides=self._dialog_overrides(opts), name=opts.get("name")))
        except OSError as exc:  # history is a convenience: never fail a launch over it
            self.log.warning(f"cannot remember the launch: {exc}")
        self.select(host, run_id)
        return run_id

    @staticmethod
    def _dialog_overrides(opts: dict[str, Any]) -> list[str]:
        out = [f"train.strategy={opts['strategy']}"] if opts.get("strategy") else []
        out += [f"data.source={opts['data_source']}"] if opts.get("data_source") else []
        return out + list(opts.get("overrides") or [])

    async def describe_config(self, host: str, opts: dict[str, Any]) -> Any:
        """What the dialog's config is on ``host`` (the agent's ``describe``)."""
        return await self._service(host).actions.describe(opts)

    def action_launch(self) -> None:
        host = self.state.current_host()
        dest = host.dest if host else self.destinations[0]
        # None: never reached, so its GPUs are unknown (not "no GPU")
        gpus = {d: (h.gpu_count if h.hello is not None else None) for d, h in self.state.hosts.items()}

        def done(run_id: str | None) -> None:
            if run_id:
                self.notify(f"launched {run_id}", title="launch", markup=False)

        self.push_screen(LaunchScreen(
            list(self.state.hosts), dest, gpus.get(dest), self.configs if self.configs is not None
            else find_configs(), self.submit_launch if self.live else None,
            config=userstate.last_config(dest) or demo_config(), host_gpus=gpus,
            describe=self.describe_config if self.live else None, recent=userstate.recent), done)

    def _selected_or_warn(self, verb: str) -> Any:
        run = self.state.selected_run()
        if run is None:
            self.notify(f"no run selected to {verb}", severity="warning", markup=False)
        return run

    def action_kill(self) -> None:
        run = self._selected_or_warn("kill")
        if run is None:
            return
        self._confirm_kill(run)

    @work(group="actions")
    async def _confirm_kill(self, run: Any) -> None:
        """Ask the host which processes the run has now, name exactly those, act on yes."""
        try:
            plan = await self._service(run.host).actions.plan(run.run_id, "kill")
        except Exception as exc:
            self.notify(getattr(exc, "message", None) or str(exc), title="kill failed", severity="error",
                        markup=False)
            return
        if not plan.alive:
            self.notify(f"{run.name} is not running ({run.status.value}): nothing to stop", title="kill",
                        markup=False)
            return
        ask = ConfirmScreen(f"Stop {run.name}?", confirm.kill_text(run, KILL_GRACE_S, plan), yes="Stop run")
        self.push_screen(ask, partial(self._confirmed, "kill", run.host, run.run_id))

    def action_fallback(self) -> None:
        run = self._selected_or_warn("fall back")
        if run is None:
            return
        world = run.view.info.world_size if run.view else 1
        if world <= 1:
            self.notify(f"{run.name} already runs on one process: there is nothing to fall back from "
                        "(r resumes a stopped run, k stops it)", title="fallback", severity="warning",
                        markup=False)
            return
        self._confirm_relaunch("fallback", run)

    def action_resume(self) -> None:
        run = self._selected_or_warn("resume")
        if run is not None:
            self._confirm_relaunch("resume", run)

    @work(group="actions")
    async def _confirm_relaunch(self, op: str, run: Any) -> None:
        """Ask the host what the relaunch would do, show exactly that, act on yes."""
        try:
            plan = await self._service(run.host).actions.plan(run.run_id, op)
        except Exception as exc:
            self.notify(getattr(exc, "message", None) or str(exc), title=f"{op} failed", severity="error",
                        timeout=15, markup=False)
            return
        if plan.problem and not plan.again:
            self.notify(plan.problem, title=f"cannot {op}", severity="error", timeout=15, markup=False)
            return
        title, body, yes = confirm.relaunch_text(plan, run, KILL_GRACE_S)
        ask = ConfirmScreen(title, body, yes=yes)
        self.push_screen(ask, partial(self._confirmed, op, run.host, run.run_id))

    def action_sample(self) -> None:
        """``p``: a prompt for the selected run; its host generates from the newest checkpoint."""
        run = self._selected_or_warn("sample from")
        if run is None:
            return
        svc = self._connected(run.host)
        if svc is None or svc.client is None:
            return
        from nsa_tui.app.screens.sample import SampleScreen

        client, run_id = svc.client, run.run_id
        self.push_screen(SampleScreen(run.name, lambda prompt: client.sample(run_id, prompt=prompt)))

    def _focused_alert(self) -> Any:
        """The alert under the pane's cursor, as the state holds it now: the pane redraws at a
        capped rate, so its own copy can predate the alert's newest facts (its evidence)."""
        focused = self.focused
        item = focused.selected() if isinstance(focused, AlertsPane) else None
        if item is None:
            return None
        return next((s for s in self.state.shown_alerts() if s.key == item.key), item)

    def action_dump(self) -> None:
        """``d``: on an alert (alerts pane focused) the evidence captured for it; else a dump of
        every rank of the selected run, now."""
        item = self._focused_alert()
        if item is not None:
            if item.id and item.alert.evidence and item.alert.run:
                self._evidence(item.dest, item.alert.run, item.id)
                return
            self.notify("no evidence was captured for this alert (the watchdog captures stacks on a stall); "
                        "d in the run list dumps the selected run now", title="evidence", markup=False)
            return
        run = self._selected_or_warn("dump")
        if run is not None:
            self._do("dump", run.host, run.run_id)

    @work(group="actions")
    async def _evidence(self, host: str, run_id: str, alert_id: str) -> None:
        svc = self._connected(host)
        if svc is None:
            return
        try:
            text = await svc.actions.evidence(run_id, alert_id)
        except Exception as exc:
            self.notify(str(exc) or type(exc).__name__, title="evidence failed", severity="error", timeout=15,
                        markup=False)
            return
        self.push_screen(StacksScreen(f"evidence of alert {alert_id} of {run_id}", text))

    def _confirmed(self, op: str, host: str, run_id: str, yes: bool | None) -> None:
        if yes:
            self._do(op, host, run_id)

    @work(group="actions")
    async def _do(self, op: str, host: str, run_id: str) -> None:
        svc = self._connected(host)
        if svc is None:
            return
        run = self.state.host(host).runs.get(run_id)
        try:
            if run is not None and len(self.state.parts_of(run)) > 1:  # a run over several hosts
                from nsa_tui.app.services import multiactions

                result, host = await multiactions.act(op, self.state, self.services, run)
            else:
                result = await getattr(svc.actions, op)(run_id)
        except Exception as exc:
            self.notify(str(exc) or type(exc).__name__, title=f"{op} failed", severity="error", timeout=15,
                        markup=False)
            return
        if op == "dump":
            self.push_screen(StacksScreen(f"stacks of {run_id}", str(result)))
        elif op in ("fallback", "resume") and result:
            self.select(host, str(result))
            self.notify(f"{op}: new run {result}", title=op, markup=False)
        else:
            self.notify(f"{op}: {run_id} — {result}" if result else f"{op}: {run_id}", title=op, markup=False)

    def action_ack(self) -> None:
        """``a``: acknowledge the chosen alert (alerts pane focused), else the newest open one. A
        recorded alert is acknowledged on its host (an ``acknowledged`` line in alerts.jsonl)."""
        item = self._focused_alert()
        if item is None:
            items = [s for s in self.state.shown_alerts(history=0) if s.state == "open"]
            if not items:
                self.notify("no open alerts", markup=False)
                return
            item = items[0]
        if item.id is None:
            reducer.acknowledge(self.state, item.alert.key)
        else:
            self._ack_on_host(item.dest, item.alert.run or "", item.id)

    @work(group="actions")
    async def _ack_on_host(self, host: str, run_id: str, alert_id: str) -> None:
        svc = self._connected(host)
        if svc is None:
            return
        try:
            await svc.actions.ack(run_id, alert_id)
        except Exception as exc:
            if getattr(exc, "code", "") == "no_such_run":  # deleted before the panel heard of it
                reducer.run_removed(self.state, host, run_id)
                self.notify(f"{run_id} no longer exists on {host}: its alerts are dismissed", title="alerts",
                            markup=False)
                return
            self.notify(str(exc) or type(exc).__name__, title="acknowledge failed", severity="error",
                        timeout=15, markup=False)
            return
        self.state.announced.add(recorded_key(host, run_id, alert_id))

    def action_help(self) -> None:
        keys = []
        for bid, key, _action, _label, what in KEYS:
            mapped = self.keymap.get(bid, key)
            keys.append((self.get_key_display_for(mapped), what))
        keys += [("n / N", "next / previous search match"), ("↑ ↓ tab", "move; switch pane"),
                 ("ctrl+p", "command palette")]
        self.push_screen(HelpScreen(keys, f"remap keys under `keys:` in {settings_path()} (binding id: key)"))

    def get_key_display_for(self, key: str) -> str:
        return ",".join({"slash": "/", "question_mark": "?"}.get(k, k) for k in key.split(","))

    def alive_runs(self) -> list[Any]:
        return [r for r in self.state.all_runs() if r.alive]

    def quit_message(self) -> str:
        """Which runs keep going; a host whose runs were never seen is named, never counted as
        having none."""
        alive = self.alive_runs()
        unseen = [h for h in self.state.hosts.values() if not h.runs_loaded]
        seen = [h.label for h in self.state.hosts.values() if h.runs_loaded]
        if alive:
            lines = [f"nsa-tui: {len(alive)} run(s) keep going (the panel only watched them):"]
            lines += [f"  {r.host}: {r.run_id} ({r.status.value}, step {r.step})" for r in alive]
        elif seen:
            lines = [f"nsa-tui: no runs are running on {', '.join(seen)}."]
        else:
            lines = ["nsa-tui: no host was reached: nothing is known of their runs."]
        for h in unseen:
            why = f" ({why_not_connected(h)})" if h.detail else ""
            lines.append(f"  {h.label}: never reached{why}: its runs, if any, were not seen and keep going.")
        if alive or unseen:
            lines.append("Reconnect with `nsa-tui` (local) or `nsa-tui connect HOST`.")
        return "\n".join(lines)

    async def action_quit(self) -> None:
        """ctrl+q too: leave like `q`, saying which runs keep going."""
        await self.action_quit_panel()

    async def action_quit_panel(self) -> None:
        message = self.quit_message()
        for svc in self.services.values():
            await svc.stop()
        self.exit(result=message)

    # -- command palette --------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's commands and ours, each once: our "Quit" (runs keep going) and "Keys" (our
        keys and panes) stand in for Textual's commands of the same name."""
        ours = isinstance(screen, MainScreen)
        for cmd in super().get_system_commands(screen):
            if not (ours and cmd.title in PALETTE_TITLES.values()):
                yield cmd
        if not ours:
            return
        for bid, _key, action, label, what in KEYS:
            target = screen if action in ("follow", "search") else self
            title = PALETTE_TITLES.get(bid, f"{label.capitalize()} ({bid})")
            yield SystemCommand(title, what, getattr(target, f"action_{action}"))
