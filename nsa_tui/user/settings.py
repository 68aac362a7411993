"""The user's settings: ``~/.config/nsa-tui/settings.yaml``.

Where: ``$NSA_TUI_SETTINGS`` (tests, several profiles), else
``$XDG_CONFIG_HOME/nsa-tui/settings.yaml``, else ``~/.config/nsa-tui/settings.yaml``. A
missing file means the defaults. The same file serves both sides: on a training host the
watchdog of every run reads ``alerts`` (thresholds), ``notify`` (where alerts go) and
``watchdog``; on the machine of the panel, ``keys``, ``notify.bell`` and ``alerts`` (for a run
that no watchdog watches, whose alerts the panel and ``status`` detect themselves).

Strict like run configs (nsa/config.py): an unknown key or a wrong type is an error naming the
file, the key and the expected type. Example (docs/host-agent.md, "Settings")::

    keys: {kill: x, search: ctrl+f}
    alerts:
      stall_floor_s: 120
      disk_warn_bytes: 20000000000
    notify:
      command: [notify-send, nsa-tui]        # the alert as JSON on stdin
      webhook: {url: "https://hooks.slack.com/services/T0/B0/XXXX"}   # format: auto|json|slack|discord|ntfy
      bell: true
    hosts:
      gpu1: {runs_root: /scratch/nsa-runs}   # a host whose runs live elsewhere than ~/nsa-runs
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from nsa.typedyaml import ConfigError, build_section
from nsa_tui.health.thresholds import Thresholds

GIB = 1 << 30


class SettingsError(ValueError):
    """settings.yaml is wrong; the message names the file, the key and the expectation."""


@dataclass
class AlertSettings:
    """Thresholds of the alert rules (nsa_tui/health/alerts.py; docs/host-agent.md, "Alerts")."""

    stall_floor_s: float = 60.0  # train: no step for max(floor, factor x median step time)
    stall_factor: float = 10.0
    first_step_s: float = 900.0  # train, before any step time is known
    boot_s: float = 600.0
    data_s: float = 600.0
    compile_s: float = 1800.0
    checkpoint_s: float = 900.0
    eval_s: float = 900.0
    no_heartbeat_s: float = 30.0
    drift_steps: int = 2
    throughput_drop: float = 0.3  # tokens/s over a window below this share of the earlier median
    throughput_window_s: float = 60.0
    nccl_util_pct: float = 90.0
    nccl_power_frac: float = 0.4
    disk_warn_bytes: int = 10 * GIB
    disk_critical_bytes: int = 1 * GIB
    resolve_after_s: float = 10.0  # an alert is resolved once its condition has been gone this long

    def thresholds(self) -> Thresholds:
        return Thresholds(
            phase_s={"boot": self.boot_s, "data": self.data_s, "compile": self.compile_s,
                     "checkpoint": self.checkpoint_s, "eval": self.eval_s},
            first_step_s=self.first_step_s, train_factor=self.stall_factor, train_floor_s=self.stall_floor_s,
            no_heartbeat_s=self.no_heartbeat_s, drift_steps=self.drift_steps,
            throughput_drop=self.throughput_drop, throughput_window_s=self.throughput_window_s,
            nccl_util_pct=self.nccl_util_pct,
            nccl_power_frac=self.nccl_power_frac, disk_warn_bytes=self.disk_warn_bytes,
            disk_critical_bytes=self.disk_critical_bytes)


@dataclass
class WebhookSettings:
    url: str
    format: Literal["auto", "json", "slack", "discord", "ntfy"] = "auto"  # auto: from the URL's host


@dataclass
class NotifySettings:
    """Where alerts go. Delivery runs in a background thread: retried with exponential backoff
    (``backoff_s`` doubling, ``retries`` tries), never blocking training or the watchdog."""

    command: list[str] | str | None = None  # run with the alert event as JSON on stdin
    webhook: WebhookSettings | None = None
    bell: bool = True  # the terminal bell in an open panel
    min_severity: Literal["warning", "critical"] = "warning"
    events: list[Literal["raised", "updated", "resolved"]] = field(default_factory=lambda: ["raised"])
    retries: int = 5
    backoff_s: float = 2.0
    timeout_s: float = 20.0


@dataclass
class WatchdogSettings:
    interval_s: float = 1.0  # how often the watchdog reads the run's files
    host_every_s: float = 5.0  # GPU (NVML) and disk samples
    evidence: bool = True  # capture stacks (and the NCCL flight recorder) on a stall
    evidence_wait_s: float = 3.0


@dataclass
class HostSettings:
    """One host's own settings, for the machine that reaches it (the CLI, the panel)."""

    runs_root: str | None = None  # that host's runs root (default: its agent's NSA_RUNS_ROOT or ~/nsa-runs)


@dataclass
class Settings:
    keys: dict[str, str] = field(default_factory=dict)  # binding id -> key(s)
    hosts: dict[str, HostSettings] = field(default_factory=dict)  # destination -> its settings
    alerts: AlertSettings = field(default_factory=AlertSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    slurm: dict[str, Any] = field(default_factory=dict)  # Slurm login nodes: host -> SlurmRequest
    path: str = ""  # where they were read from ("" = defaults)


def host_runs_roots(settings: Settings) -> dict[str, str]:
    """destination -> the runs root the settings give it (hosts without one left out)."""
    return {h: hs.runs_root for h, hs in settings.hosts.items() if hs.runs_root}


def local_thresholds() -> Thresholds:
    """This machine's alert thresholds (``alerts:``), for the alerts the panel and the CLI detect
    themselves: a run that no watchdog watches (started by hand, its supervisor killed). The
    defaults when the file does not read: ``status`` goes on, as for the runs roots."""
    try:
        return load_settings().alerts.thresholds()
    except SettingsError:
        return Thresholds()


def settings_path() -> Path:
    env = os.environ.get("NSA_TUI_SETTINGS")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "nsa-tui" / "settings.yaml"


def load_settings(path: Path | None = None) -> Settings:
    """The settings at ``path`` (default :func:`settings_path`); defaults when absent.
    Raises SettingsError for a file that does not read, parse or validate."""
    path = path or settings_path()
    where = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Settings()
    except OSError as exc:
        raise SettingsError(f"{where}: cannot read settings ({exc.strerror or exc})") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{where}: not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SettingsError(f"{where}: expected a mapping at the top level, got {type(raw).__name__}")
    raw = dict(raw)
    keys = _keys(raw.pop("keys", None), where)
    hosts_raw = raw.pop("hosts", None) or {}
    known = {"alerts", "notify", "watchdog", "slurm"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SettingsError(f"{where}: unknown key {unknown[0]!r}; "
                            "known keys: alerts, hosts, keys, notify, slurm, watchdog")
    if not isinstance(hosts_raw, dict):
        raise SettingsError(f"{where}: key 'hosts': expected a mapping of host to its settings, "
                            f"got {type(hosts_raw).__name__}")
    from nsa_tui.slurm.settings import parse_slurm_hosts

    try:
        slurm = parse_slurm_hosts(raw.get("slurm"), where)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    notify = raw.get("notify") or {}
    try:
        webhook = None
        if isinstance(notify, dict) and notify.get("webhook") is not None:
            notify = dict(notify)
            hook = notify.pop("webhook")
            # a bare URL is the usual case; the URL is a secret: errors never quote it
            hook = {"url": hook} if isinstance(hook, str) else hook
            webhook = build_section(WebhookSettings, hook, where, "notify.webhook")
        hosts = {str(h): build_section(HostSettings, v or {}, where, f"hosts.{h}")
                 for h, v in hosts_raw.items()}
        out = Settings(
            keys=keys, hosts=hosts,
            alerts=build_section(AlertSettings, raw.get("alerts") or {}, where, "alerts"),
            notify=build_section(NotifySettings, notify, where, "notify"),
            watchdog=build_section(WatchdogSettings, raw.get("watchdog") or {}, where, "watchdog"),
            slurm=slurm, path=where)
        out.notify.webhook = webhook
    except ConfigError as exc:
        raise SettingsError(str(exc)) from None
    _validate(out, where)
    return out


def _keys(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SettingsError(f"{where}: key 'keys': expected a mapping of binding id to key, "
                            f"got {type(raw).__name__}")
    out = {}
    for bid, keys in raw.items():
        if isinstance(keys, list) and all(isinstance(k, str) for k in keys):
            keys = ",".join(keys)
        if not isinstance(keys, str) or not keys.strip():
            raise SettingsError(f"{where}: key 'keys.{bid}': expected a key like 'x' or 'ctrl+x', "
                                f"got {keys!r}")
        out[str(bid)] = keys.strip()
    return out


def _validate(s: Settings, where: str) -> None:
    def need(ok: bool, key: str, expected: str, value: Any) -> None:
        if not ok:
            raise SettingsError(f"{where}: key {key!r}: expected {expected}, got {value!r}")

    a, n, w = s.alerts, s.notify, s.watchdog
    for name in ("stall_floor_s", "stall_factor", "first_step_s", "boot_s", "data_s", "compile_s",
                 "checkpoint_s", "eval_s", "no_heartbeat_s"):
        need(getattr(a, name) > 0, f"alerts.{name}", "a positive number", getattr(a, name))
    need(a.disk_warn_bytes >= a.disk_critical_bytes >= 0, "alerts.disk_critical_bytes",
         "a non-negative number of bytes at most alerts.disk_warn_bytes", a.disk_critical_bytes)
    need(a.resolve_after_s >= 0, "alerts.resolve_after_s", "a non-negative number", a.resolve_after_s)
    need(n.retries >= 1, "notify.retries", "at least 1", n.retries)
    need(n.backoff_s >= 0, "notify.backoff_s", "a non-negative number", n.backoff_s)
    need(n.timeout_s > 0, "notify.timeout_s", "a positive number", n.timeout_s)
    if isinstance(n.command, list):
        need(bool(n.command), "notify.command", "a command (a list of words or a string)", n.command)
    if n.webhook is not None:
        need(n.webhook.url.startswith(("http://", "https://")), "notify.webhook.url", "an http(s) URL",
             "<redacted>")
    need(w.interval_s > 0, "watchdog.interval_s", "a positive number", w.interval_s)
    need(w.host_every_s > 0, "watchdog.host_every_s", "a positive number", w.host_every_s)
