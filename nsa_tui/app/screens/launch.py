"""The launch dialog: config, processes, strategy, data source, run name, ``--set`` overrides.

It preselects the config last launched on the host (else the demo), says what the selected
config is before anything starts (the host's ``describe``: parameters, sequence length,
global batch, the device it needs, its data) and refuses, with the host's reason, a config
that cannot run there. The host's recent launches run again with ctrl+r. The host validates
once more at launch; its error is shown here and the dialog stays open.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

import nsa_tui
from nsa.contract.replies import ConfigSummary
from nsa_tui.app.widgets.setfield import OverrideSuggester, key_hint, split_overrides
from nsa_tui.fmt import fmt_count
from nsa_tui.user.recent import RecentLaunch

Submit = Callable[[str, dict[str, Any]], Awaitable[str]]
Describe = Callable[[str, dict[str, Any]], Awaitable[ConfigSummary]]
DEMO_CONFIG = "demo-cpu.yaml"
DATA_SOURCES = ("stdlib", "synthetic", "fineweb-edu", "files")  # nsa.config DataConfig.source
DESCRIBE_DEBOUNCE_S = 0.3
TYPED_PROMPT = "the typed path below"  # the config picker, blank: a typed path launches


def find_configs(cwd: Path | None = None) -> list[str]:
    """Configs the user can pick: ./configs/*.yaml, then the demo shipped in the package."""
    cwd = cwd or Path.cwd()
    found = [str(p.relative_to(cwd)) for p in sorted((cwd / "configs").glob("*.yaml"))]
    packaged = Path(nsa_tui.__file__).parent / "configs"
    found += [str(p) for p in sorted(packaged.glob("*.yaml"))]
    return found


def demo_config(cwd: Path | None = None) -> str:
    """configs/tiny-cpu.yaml from a checkout, else the packaged copy."""
    cwd = cwd or Path.cwd()
    local = cwd / "configs" / "tiny-cpu.yaml"
    if local.is_file():
        return str(local.relative_to(cwd))
    return str(Path(nsa_tui.__file__).parent / "configs" / DEMO_CONFIG)


def listed(typed: str, configs: list[str]) -> str | None:
    """The config of ``configs`` that the typed path names (``./configs/x.yaml`` is
    ``configs/x.yaml``; the path is not looked up: it may be the host's), else None."""
    want = os.path.normpath(os.path.expanduser(typed.strip()))
    return next((c for c in configs if os.path.normpath(os.path.expanduser(c)) == want), None)


def summary_text(s: ConfigSummary, host: str) -> Text:
    """What the config is, and why it cannot run on ``host`` (red) when it cannot."""
    t = Text()
    accum = f" × {s.grad_accum} accum" if s.grad_accum != 1 else ""
    t.append(f"{s.name}", style="bold")
    t.append(f" · {s.attention.upper() if s.attention == 'nsa' else s.attention} · "
             f"{fmt_count(s.params)} params · seq {s.seq_len} · global batch {s.global_batch} "
             f"({s.batch_size} × {s.nproc} proc{accum}) · {s.steps} steps\n")
    t.append(f"needs {s.needs}; here: {s.runs_on} · data: {s.data}")
    for p in s.problems:
        t.append(f"\n✗ cannot run on {host}: {p}", style="bold red")
    for n in s.notes:
        t.append(f"\n• {n}", style="dim")
    return t


class LaunchScreen(ModalScreen[str | None]):
    """Returns the new run's id, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "cancel"), Binding("ctrl+s", "launch", "launch"),
                Binding("ctrl+r", "rerun", "re-run recent")]
    AUTO_FOCUS = ""  # on_mount puts the focus in the config field
    DEFAULT_CSS = """
    #launch-form { height: auto; max-height: 65vh; }
    #launch { height: auto; max-height: 95%; }
    #launch-form Label { margin-top: 1; }
    #launch-form .-row { layout: grid; grid-size: 2; grid-columns: 1fr 1fr; grid-rows: auto;
                         grid-gutter: 0 2; height: auto; }
    #launch-form .-row Label { margin-top: 0; padding-top: 1; width: 100%; height: auto; }
    #launch Input { height: 1; border: none; padding: 0 1; background: $boost; }
    #launch Input:focus { background: $primary 25%; }
    #launch SelectCurrent { height: 1; border: none; padding: 0 1; background: $boost; }
    #launch Select:focus > SelectCurrent { background: $primary 25%; }
    #launch-about { margin-top: 1; min-height: 2; }
    #set-hint { color: $text-muted; }
    """

    def __init__(self, hosts: list[str], host: str, gpus: int | None, configs: list[str],
                 submit: Submit | None, config: str | None = None,
                 host_gpus: dict[str, int | None] | None = None, describe: Describe | None = None,
                 recent: Callable[[str], list[RecentLaunch]] | None = None) -> None:
        super().__init__()
        self._hosts, self._host = hosts, host
        self._host_gpus = dict(host_gpus or {})
        self._host_gpus.setdefault(host, gpus)
        self._configs, self._submit, self._describe = configs, submit, describe
        self._recent_of = recent or (lambda _host: [])
        self._recent: list[RecentLaunch] = self._recent_of(host)
        self._typed = config if config and config not in configs else ""
        self._config = config if config in configs else (configs[0] if configs else None)
        self._blocked: str | None = None  # why launching is refused (the host said so)

    # -- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Vertical(classes="-dialog", id="launch"):
            yield Label(Text("Launch a run", style="bold"))
            with VerticalScroll(id="launch-form", can_focus=False):  # Tab goes from field to field
                if len(self._hosts) > 1:
                    yield Label("host")
                    yield Select([(h, h) for h in self._hosts], value=self._host, allow_blank=False,
                                 id="host")
                    yield Input(placeholder="…or one run over several: " + ",".join(self._hosts[:2]),
                                id="hosts")
                yield Label("config (local files are uploaded with the run)")
                if self._configs:  # blank while a typed path that is not in the list is what launches
                    yield Select([(Text(c), c) for c in self._configs], prompt=TYPED_PROMPT,
                                 value=self._config if not self._typed else Select.NULL, id="config")
                yield Input(self._typed, placeholder="…or type a path to a config file", id="config-path")
                yield Static(Text("", style="dim"), id="launch-about")
                # two columns as a grid: a label that wraps (a long one on a narrow screen) keeps the
                # fields under it level with their neighbours and never runs into the next label
                with Grid(classes="-row"):
                    yield Label(self._gpu_label(self._host), id="nproc-label")
                    yield Label("strategy")
                    yield Input(str(max(1, self._host_gpus.get(self._host) or 0)), type="integer",
                                id="nproc")
                    yield Select([("from the config", ""), ("DDP", "ddp"), ("FSDP", "fsdp")], value="",
                                 allow_blank=False, id="strategy")
                with Grid(classes="-row"):
                    yield Label("data source")
                    yield Label("run name")
                    yield Select([("from the config", "")] + [(d, d) for d in DATA_SOURCES], value="",
                                 allow_blank=False, id="data")
                    yield Input(placeholder="from the config", id="name")
                yield Label("--set overrides (→ completes config keys)")
                yield Input(placeholder="train.steps=200 train.lr=1e-3", suggester=OverrideSuggester(),
                            id="overrides")
                yield Static(Text(key_hint("")), id="set-hint")
                yield Label("recent launches on this host (ctrl+r runs the chosen one, else the last)")
                yield Select(self._recent_options(), prompt="none yet" if not self._recent else
                             "choose one to fill the form", id="recent")
            yield Static("", id="launch-error")
            with Horizontal(id="launch-buttons"):
                yield Button("Launch (ctrl+s)", variant="primary", id="go")
                yield Button("Cancel (esc)", id="cancel")

    def _recent_options(self) -> list[tuple[Text, int]]:
        return [(Text(r.label()[:70]), i) for i, r in enumerate(self._recent)]  # text, never markup

    def _gpu_label(self, host: str) -> str:
        gpus = self._host_gpus.get(host)
        if gpus is None:
            return "processes (host not reached yet: GPUs unknown)"
        if not gpus:
            return "processes (host has no GPU)"
        return f"processes (host has {gpus} GPU{'s' if gpus != 1 else ''})"

    def on_mount(self) -> None:
        self.query_one("#launch-error").display = False
        self.query_one("#recent", Select).disabled = not self._recent
        # the dialog opens in the config field: type a path, or press Enter to launch the chosen
        # config; the form stays at its top, the chosen config in view
        self.query_one("#config-path", Input).focus(scroll_visible=False)
        self._refresh_about()

    # -- the form ---------------------------------------------------------------------------------
    def current_host(self) -> str:
        return str(self.query_one("#host", Select).value) if len(self._hosts) > 1 else self._host

    def form(self) -> tuple[str, dict[str, Any]]:
        """The host and the launch options as typed (validation is the host's job)."""
        typed = self.query_one("#config-path", Input).value.strip()
        picked = self.query_one("#config", Select).value if self._configs else None
        config = typed or (picked if isinstance(picked, str) else "")
        nproc_text = self.query_one("#nproc", Input).value.strip()
        opts: dict[str, Any] = {
            "config": config,
            "nproc": int(nproc_text) if nproc_text.lstrip("-").isdigit() else nproc_text,
        }
        for key, wid in (("strategy", "#strategy"), ("data_source", "#data")):
            value = str(self.query_one(wid, Select).value or "")
            if value:  # empty: keep what the config says (no silent override)
                opts[key] = value
        name = self.query_one("#name", Input).value.strip()
        if name:
            opts["name"] = name
        overrides = self.query_one("#overrides", Input).value.strip()
        if overrides:
            try:
                opts["overrides"] = split_overrides(overrides)
            except ValueError as exc:
                opts["overrides_error"] = f"--set: {exc}"
        host = self.current_host()
        if len(self._hosts) > 1:  # several hosts, comma-separated: the first serves the rendezvous
            several = [h.strip() for h in self.query_one("#hosts", Input).value.split(",") if h.strip()]
            if len(several) > 1:
                opts["hosts"] = several
                host = several[0]
        return host, opts

    def fill(self, launch: RecentLaunch) -> None:
        """Put a recent launch into the form (config, processes, overrides, name)."""
        self._set_blocked(None)  # a new form: the host is asked again (and at launch)
        if launch.config in self._configs:
            self.query_one("#config", Select).value = launch.config
            self.query_one("#config-path", Input).value = ""
        else:
            self.query_one("#config-path", Input).value = launch.config
        if launch.nproc:
            self.query_one("#nproc", Input).value = str(launch.nproc)
        self.query_one("#strategy", Select).value = ""
        self.query_one("#data", Select).value = ""
        self.query_one("#overrides", Input).value = " ".join(launch.overrides)
        self.query_one("#name", Input).value = launch.name or ""

    def show_error(self, message: str) -> None:
        err = self.query_one("#launch-error", Static)
        err.update(Text(message, style="bold red"))
        err.display = bool(message)

    # -- what the selected config is ----------------------------------------------------------------
    def _refresh_about(self) -> None:
        self._about(*self.form())

    @work(exclusive=True, group="describe")
    async def _about(self, host: str, opts: dict[str, Any]) -> None:
        about = self.query_one("#launch-about", Static)
        self._set_blocked(None)
        if not opts["config"]:
            about.update(Text("choose a config or type a path", style="dim"))
            return
        if opts.get("overrides_error"):
            self._set_blocked(opts["overrides_error"])
            about.update(Text(opts["overrides_error"], style="bold red"))
            return
        if self._describe is None:
            return
        await asyncio.sleep(DESCRIBE_DEBOUNCE_S)  # typing: ask once it pauses
        about.update(Text(f"asking {host} about {opts['config']} …", style="dim"))
        try:
            summary = await self._describe(host, opts)
        except Exception as exc:  # the host's own words: a bad config, or why it is not reachable
            code = getattr(exc, "code", "")
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            if code in ("bad_config", "bad_request"):
                self._set_blocked(message)
                about.update(Text(message, style="bold red"))
            else:
                about.update(Text(f"cannot check the config on {host}: {message}", style="yellow"))
            return
        about.update(summary_text(summary, host))
        if summary.problems:
            self._set_blocked(f"{summary.config} cannot run on {host}: " + "; ".join(summary.problems))

    def _set_blocked(self, why: str | None) -> None:
        self._blocked = why
        self.query_one("#go", Button).disabled = why is not None

    def on_select_changed(self, event: Select.Changed) -> None:
        sid = event.select.id
        if sid == "host":
            host = str(event.value)
            self.query_one("#nproc-label", Label).update(self._gpu_label(host))
            self.query_one("#nproc", Input).value = str(max(1, self._host_gpus.get(host) or 0))
            self._recent = self._recent_of(host)
            recent = self.query_one("#recent", Select)
            recent.set_options(self._recent_options())
            recent.disabled = not self._recent
        elif sid == "recent" and isinstance(event.value, int):
            self.fill(self._recent[event.value])
        elif sid == "config" and isinstance(event.value, str):
            self._config = event.value
            path = self.query_one("#config-path", Input)
            if path.value.strip() and listed(path.value, [event.value]) is None:
                path.value = ""  # a config picked from the list: the typed path no longer launches
        self._refresh_about()

    def _follow_typed(self, typed: str) -> None:
        """Keep the picker in step with the typed path: the listed config it names, blank (the
        prompt says the typed path launches) for a path not in the list, and back to the last
        picked config when the field is emptied. Why: the picker showed a config that the
        typed path had replaced."""
        if not self._configs:
            return
        picker = self.query_one("#config", Select)
        target = listed(typed, self._configs) if typed.strip() else self._config
        if target is None:
            if not picker.is_blank():
                picker.clear()
        elif picker.value != target:
            picker.value = target

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "config-path":
            self._follow_typed(event.value)
        if event.input.id == "overrides":
            self.query_one("#set-hint", Static).update(Text(key_hint(event.value)))  # typed text: no markup
        self._refresh_about()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "go":
            self.action_launch()
        else:
            self.action_cancel()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_launch()

    # -- actions --------------------------------------------------------------------------------------
    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_rerun(self) -> None:
        """Run the chosen recent launch again (the last one when none is chosen)."""
        if not self._recent:
            self.show_error("no recent launch on this host yet")
            return
        chosen = self.query_one("#recent", Select).value
        self.fill(self._recent[chosen if isinstance(chosen, int) else 0])
        self.action_launch()

    def action_launch(self) -> None:
        host, opts = self.form()
        if not opts["config"]:
            self.show_error("choose a config or type a path")
            return
        if opts.get("overrides_error"):
            self.show_error(opts["overrides_error"])
            return
        if self._blocked:  # the host said this form cannot run there: Enter does what the button would
            self.show_error(self._blocked)
            return
        if self._submit is None:
            self.dismiss(None)
            return
        self.query_one("#go", Button).disabled = True
        self.show_error("")
        self._launch(host, opts)

    @work(exclusive=True, group="launch")
    async def _launch(self, host: str, opts: dict[str, Any]) -> None:
        if self._describe is not None:
            self.workers.cancel_group(self, "describe")  # the form as it is now decides
            try:
                summary = await self._describe(host, opts)
                if summary.problems:
                    why = "; ".join(summary.problems)
                    raise RuntimeError(f"{summary.config} cannot run on {host}: {why}")
            except Exception as exc:  # refused here, with the host's reason: nothing starts
                if getattr(exc, "code", "") not in ("disconnected", "closed", "lost"):
                    self.query_one("#launch-about", Static).update(Text(str(exc), style="bold red"))
                    self.show_error(getattr(exc, "message", None) or str(exc))
                    return
        assert self._submit is not None  # the form launches only when it has somewhere to submit
        try:
            run_id = await self._submit(host, opts)
        except Exception as exc:  # the host's validation message, shown where it belongs
            self.show_error(getattr(exc, "message", None) or str(exc) or type(exc).__name__)
            self.query_one("#go", Button).disabled = False
            return
        self.dismiss(run_id)
