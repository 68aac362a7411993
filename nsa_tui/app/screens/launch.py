"""The launch dialog: config picker, nproc, strategy, data source, run name.

The host validates before anything starts; its error is shown here, in the dialog, and
the dialog stays open so the user can fix the field and try again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

import nsa_tui

Submit = Callable[[str, dict[str, Any]], Awaitable[str]]
DEMO_CONFIG = "demo-cpu.yaml"
DATA_SOURCES = ("stdlib", "synthetic", "fineweb-edu", "files")  # nsa.config DataConfig.source


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


class LaunchScreen(ModalScreen[str | None]):
    """Returns the new run's id, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "cancel"), Binding("ctrl+s", "launch", "launch")]

    def __init__(self, hosts: list[str], host: str, gpus: int, configs: list[str],
                 submit: Submit | None, config: str | None = None,
                 host_gpus: dict[str, int] | None = None) -> None:
        super().__init__()
        self._hosts, self._host, self._gpus = hosts, host, max(0, gpus)
        self._host_gpus = host_gpus or {}
        self._configs, self._submit = configs, submit
        self._config = config if config in configs else (configs[0] if configs else None)

    def compose(self) -> ComposeResult:
        with Vertical(classes="-dialog", id="launch"):
            yield Label(Text("Launch a run", style="bold"))
            if len(self._hosts) > 1:
                yield Label("host")
                yield Select([(h, h) for h in self._hosts], value=self._host, allow_blank=False,
                             id="host")
                yield Input(placeholder="…or one run over several: " + ",".join(self._hosts[:2]), id="hosts")
            yield Label("config (local files are uploaded with the run)")
            if self._configs:
                yield Select([(c, c) for c in self._configs], value=self._config, allow_blank=False,
                             id="config")
            yield Input(placeholder="…or type a path to a config file", id="config-path")
            with Horizontal(classes="-row"):
                with Vertical():
                    gpus = f"{self._gpus} GPU{'s' if self._gpus != 1 else ''}" if self._gpus else "no GPU"
                    yield Label(f"processes (host has {gpus})")
                    yield Input(str(max(1, self._gpus)), type="integer", id="nproc")
                with Vertical():
                    yield Label("strategy")
                    yield Select([("from the config", ""), ("DDP", "ddp"), ("FSDP", "fsdp")], value="",
                                 allow_blank=False, id="strategy")
            with Horizontal(classes="-row"):
                with Vertical():
                    yield Label("data source")
                    yield Select([("from the config", "")] + [(d, d) for d in DATA_SOURCES], value="",
                                 allow_blank=False, id="data")
                with Vertical():
                    yield Label("run name")
                    yield Input(placeholder="from the config", id="name")
            yield Static("", id="launch-error")
            with Horizontal(id="launch-buttons"):
                yield Button("Launch (ctrl+s)", variant="primary", id="go")
                yield Button("Cancel (esc)", id="cancel")

    def form(self) -> tuple[str, dict[str, Any]]:
        """The host and the launch options as typed (validation is the host's job)."""
        host = self.query_one("#host", Select).value if len(self._hosts) > 1 else self._host
        typed = self.query_one("#config-path", Input).value.strip()
        config = typed or (str(self.query_one("#config", Select).value) if self._configs else "")
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
        if len(self._hosts) > 1:  # several hosts, comma-separated: the first serves the rendezvous
            several = [h.strip() for h in self.query_one("#hosts", Input).value.split(",") if h.strip()]
            if len(several) > 1:
                opts["hosts"] = several
                host = several[0]
        return str(host), opts

    def show_error(self, message: str) -> None:
        err = self.query_one("#launch-error", Static)
        err.update(Text(message, style="bold red"))
        err.display = bool(message)

    def on_mount(self) -> None:
        self.query_one("#launch-error").display = False

    def on_select_changed(self, event: Select.Changed) -> None:
        """Another host: its GPU count becomes the default number of processes."""
        if event.select.id == "host" and event.value in self._host_gpus:
            self.query_one("#nproc", Input).value = str(max(1, self._host_gpus[str(event.value)]))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "go":
            self.action_launch()
        else:
            self.action_cancel()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_launch()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_launch(self) -> None:
        host, opts = self.form()
        if not opts["config"]:
            self.show_error("choose a config or type a path")
            return
        if self._submit is None:
            self.dismiss(None)
            return
        self.query_one("#go", Button).disabled = True
        self.show_error("")
        self._launch(host, opts)

    @work(exclusive=True, group="launch")
    async def _launch(self, host: str, opts: dict[str, Any]) -> None:
        try:
            run_id = await self._submit(host, opts)
        except Exception as exc:  # the host's validation message, shown where it belongs
            self.show_error(str(exc) or type(exc).__name__)
            self.query_one("#go", Button).disabled = False
            return
        self.dismiss(run_id)
