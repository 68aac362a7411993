"""The run actions, mixed into NsaApp: launch (the dialog, the demo, one run over several
hosts), kill, fallback, resume, sample, the evaluations screen, dump and an alert's evidence,
and acknowledging an alert.

Kept apart from the app shell (app.py: mounting, the tick, the services' messages, quitting)
because these act on a run's host and share one discipline: kill, fallback and resume ask the
host what they would do (services/actions.py ``plan``), show exactly that in a confirmation and
act only on yes; every action shows what the agent answered, or why it failed; a run over
several hosts goes through services/multiactions.py. Nothing here blocks the panel: every host
call runs in a worker.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from textual import work

from nsa.contract.rundir import nothing_to_fall_back
from nsa_tui.app import confirm, reducer
from nsa_tui.app.screens.dialogs import ConfirmScreen, StacksScreen
from nsa_tui.app.screens.launch import LaunchScreen, demo_config, find_configs
from nsa_tui.app.state import PanelState, recorded_key
from nsa_tui.app.widgets.alerts import AlertsPane
from nsa_tui.user import recent as userstate
from nsa_tui.user.recent import RecentLaunch
from nsa_tui.user.settings import Settings

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel

    from nsa_tui.app.services.host import HostService

KILL_GRACE_S = 60.0  # what the agent's kill waits before KILL (its default)


class RunActions:
    """Actions for NsaApp (``self`` is the app: state, services, notify, push_screen, select)."""

    state: PanelState
    services: dict[str, HostService]
    destinations: list[str]
    configs: list[str] | None
    live: bool
    settings: Settings
    # NsaApp's and textual's App's, declared for the type checker
    push_screen: Callable[..., Any]
    select: Callable[[str, str], None]
    focused: Any
    log: Any

    if TYPE_CHECKING:
        def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
                   timeout: float | None = None, markup: bool = True) -> None: ...

    @work(group="actions")
    async def _launch_now(self, host: str, opts: dict[str, Any]) -> None:
        try:
            run_id = await self.submit_launch(host, opts)
        except Exception as exc:
            self.notify(str(exc), title="launch failed", severity="error", timeout=15, markup=False)
            return
        self.select(host, run_id)

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
        slurm = self.settings.slurm.get(host)  # a Slurm login node (settings: slurm:): a batch job
        run_id = await self._service(host).actions.launch(dict(opts, slurm=slurm) if slurm else opts)
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
        """What the dialog's config is on ``host`` (the agent's ``describe``). On a Slurm login
        node the job runs on compute nodes, not there: the login node's lack of GPUs is no problem."""
        import msgspec

        summary = await self._service(host).actions.describe(opts)
        if host in self.settings.slurm and summary.problems:
            summary = msgspec.structs.replace(summary, problems=[])
        return summary

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
        why = nothing_to_fall_back(run.name, run.view.info.world_size if run.view else 1)
        if why:  # the host's fallback op refuses it too (the CLI's path)
            self.notify(f"{why} (r resumes a stopped run, k stops it)", title="fallback", severity="warning",
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

    def action_evals(self) -> None:
        """``e``: the recorded evaluations of the marked runs side by side (the selected run
        when none is marked)."""
        runs = self.state.marked_runs()
        if not runs:
            run = self._selected_or_warn("show the evaluations of")
            if run is None:
                return
            runs = [run]
        from nsa_tui.app.evalview import RunEvals
        from nsa_tui.app.screens.evals import EvalScreen

        async def load() -> list[RunEvals]:
            out = []
            for r in runs:
                label = f"{r.name} ({r.host})" if len(self.services) > 1 else r.name
                svc = self.services.get(r.host)
                client = svc.client if svc is not None else None
                if client is None:
                    out.append(RunEvals(label, [], error=f"not connected to {r.host}"))
                    continue
                try:
                    out.append(RunEvals(label, (await client.evals(r.run_id)).evals))
                except Exception as exc:  # noqa: BLE001 - said on the screen, per run
                    out.append(RunEvals(label, [], error=getattr(exc, "message", None) or str(exc)))
            return out

        title = "long-context evaluation: " + ", ".join(r.name for r in runs)
        self.push_screen(EvalScreen(title, load))

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
