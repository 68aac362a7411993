"""The nsa-tui App: the shell (screens, keys from the footer, the command palette and the
keymap file, the tick, the services' messages, quitting); its actions are mixins: the run
actions (run_actions.py: launch, kill, fallback, resume, ...) and the view's (view_actions.py).

The app never waits on a host: every client call runs in a worker (services/), and the
screen is redrawn from plain state by a 10 Hz timer (new data at most once a second: the
refresh cap in screens/main.py), so log floods and dead hosts cost at most a few cheap
redraws per second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual.app import App, SystemCommand
from textual.screen import Screen

from nsa_tui.app import reducer
from nsa_tui.app.keymap import load_keymap
from nsa_tui.app.messages import AskHostKey, SelectRun, Toast
from nsa_tui.app.run_actions import RunActions
from nsa_tui.app.screens.dialogs import ConfirmScreen, HelpScreen
from nsa_tui.app.screens.launch import demo_config
from nsa_tui.app.screens.main import KEYS, MainScreen
from nsa_tui.app.services.host import HostService
from nsa_tui.app.state import PanelState
from nsa_tui.app.view_actions import ViewActions
from nsa_tui.app.viewprefs import state_dir
from nsa_tui.app.widgets.header import why_not_connected
from nsa_tui.app.widgets.runlist import RunList
from nsa_tui.hosts.spec import runs_root_for
from nsa_tui.user.settings import Settings, SettingsError, host_runs_roots, load_settings, settings_path

TICK_S = 0.1
PALETTE_TITLES = {"quit": "Quit", "help": "Keys"}  # Textual has commands of these names: ours replace them


class NsaApp(RunActions, ViewActions, App[str | None]):
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
            # the alerts the panel detects itself (runs no watchdog watches): this machine's thresholds
            thresholds = self.alert_thresholds
            if thresholds is None:
                thresholds = self.settings.alerts.thresholds()
            for dest in self.destinations:
                svc = HostService(self.state, dest, self.post_message, self.clients.get(dest),
                                  thresholds, log_error=self.log.error,
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
        toast and a bell. The main screen selects a run when none is (listing.shown_selection)."""
        self.tick_count += 1
        self.last_tick_at = time.monotonic()
        state = self.state
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

    def select_key(self, key: tuple[str, str] | None) -> None:
        """Select ``key``, or nothing (the run list shows no run): no host streams a run in full."""
        if key is not None:
            self.select(*key)
            return
        reducer.deselect(self.state)
        for svc in self.services.values():
            svc.focus(None)

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

    # -- help and quitting (the run actions are in run_actions.py) ------------------------------------
    def action_help(self) -> None:
        keys = []
        for bid, key, _action, _label, what in KEYS:
            mapped = self.keymap.get(bid, key)
            keys.append((self.get_key_display_for(mapped), what))
        keys += [("n / N", "next / previous search match"), ("↑ ↓ tab", "move; switch pane"),
                 ("ctrl+p", "command palette: every action by name; Screenshot saves an SVG of the screen "
                  "(the note says where: screenshots/ of the panel's state directory)")]
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

    # -- screenshots ------------------------------------------------------------------------------
    def deliver_screenshot(self, filename: str | None = None, path: str | None = None,
                           time_format: str | None = None) -> str | None:
        """Save an SVG of the screen (the palette's "Screenshot") in ``screenshots/`` of the
        panel's state directory, else the working directory, and say where it went. Why:
        Textual saves to ~/Downloads, which a server seldom has ("Failed to save screenshot")."""
        now = time.time()
        name = filename or time.strftime(time_format or "nsa-tui-%Y%m%d-%H%M%S", time.localtime(now))
        name += "" if filename else f"-{int(now * 1000) % 1000:03d}.svg"
        svg = self.export_screenshot()
        problems = []
        for folder in ([Path(path).expanduser()] if path else [state_dir() / "screenshots", Path.cwd()]):
            try:
                folder.mkdir(parents=True, exist_ok=True, mode=0o700)
                (folder / name).write_text(svg, encoding="utf-8")
            except OSError as exc:
                problems.append(f"{folder}: {exc.strerror or exc}")
                continue
            self.notify(f"saved {folder / name}", title="screenshot", timeout=15, markup=False)
            return None
        self.notify("not saved: " + "; ".join(problems), title="screenshot", severity="error", timeout=15,
                    markup=False)
        return None

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
