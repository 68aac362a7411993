"""settings.yaml: where it is found, what it holds, and strict errors naming file, key and type."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsa_tui.user.settings import SettingsError, load_settings, settings_path


def test_where_settings_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSA_TUI_SETTINGS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert settings_path() == tmp_path / "xdg" / "nsa-tui" / "settings.yaml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert settings_path() == tmp_path / "home" / ".config" / "nsa-tui" / "settings.yaml"
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(tmp_path / "s.yaml"))
    assert settings_path() == tmp_path / "s.yaml"
    assert load_settings().alerts.stall_floor_s == 60.0  # absent: the defaults


def test_a_full_file(tmp_path: Path) -> None:
    p = tmp_path / "settings.yaml"
    p.write_text("keys: {kill: x, search: [ctrl+f, slash]}\n"
                 "alerts: {stall_floor_s: 120, no_heartbeat_s: 45, disk_warn_bytes: 20000000000}\n"
                 "notify:\n  command: notify-send nsa-tui\n  webhook: https://hooks.slack.com/services/T/B/X\n"
                 "  bell: false\n  min_severity: critical\n  events: [raised, resolved]\n"
                 "watchdog: {interval_s: 2}\n")
    s = load_settings(p)
    assert s.keys == {"kill": "x", "search": "ctrl+f,slash"} and s.path == str(p)
    th = s.alerts.thresholds()
    assert (th.train_floor_s, th.no_heartbeat_s, th.disk_warn_bytes) == (120.0, 45.0, 20_000_000_000)
    assert th.phase_s["compile"] == 1800.0
    assert s.notify.webhook is not None and s.notify.webhook.url.endswith("/T/B/X")
    assert s.notify.webhook.format == "auto" and s.notify.command == "notify-send nsa-tui"
    assert (s.notify.bell, s.notify.min_severity) == (False, "critical")
    assert s.notify.events == ["raised", "resolved"]
    assert s.watchdog.interval_s == 2.0


@pytest.mark.parametrize("text,where", [
    ("alerts: {stall_floor: 1}", "unknown key 'alerts.stall_floor'"),
    ("alerts: {stall_floor_s: soon}", "key 'alerts.stall_floor_s': expected float"),
    ("alerts: {stall_floor_s: -1}", "key 'alerts.stall_floor_s': expected a positive number"),
    ("notify: {bell: maybe}", "key 'notify.bell': expected bool"),
    ("notify: {events: [raised, oops]}", "key 'notify.events[1]'"),
    ("notify: {webhook: {url: https://x.org/h, format: teams}}", "key 'notify.webhook.format'"),
    ("notify: {webhook: {url: 3}}", "key 'notify.webhook.url': expected str"),
    ("notify: {retries: 0}", "key 'notify.retries': expected at least 1"),
    ("keys: [kill]", "key 'keys': expected a mapping"),
    ("nonsense: 1", "unknown key 'nonsense'"),
    ("- a list", "expected a mapping at the top level"),
    ("alerts: {", "not valid YAML"),
])
def test_errors_name_the_file_the_key_and_the_expectation(tmp_path: Path, text: str, where: str) -> None:
    p = tmp_path / "settings.yaml"
    p.write_text(text)
    with pytest.raises(SettingsError) as err:
        load_settings(p)
    assert str(p) in str(err.value) and where in str(err.value)


def test_a_webhook_url_is_never_quoted_in_an_error(tmp_path: Path) -> None:
    p = tmp_path / "settings.yaml"
    p.write_text("notify: {webhook: 'ftp://hooks.example.org/T0/s3cr3t'}\n")
    with pytest.raises(SettingsError) as err:
        load_settings(p)
    assert "s3cr3t" not in str(err.value) and "notify.webhook.url" in str(err.value)


def test_a_host_may_have_its_own_runs_root(tmp_path: Path) -> None:
    from nsa_tui.user.settings import host_runs_roots

    p = tmp_path / "s.yaml"
    p.write_text("hosts:\n  gpu1: {runs_root: /scratch/runs}\n  gpu2: {}\n")
    assert host_runs_roots(load_settings(p)) == {"gpu1": "/scratch/runs"}
    p.write_text("hosts:\n  gpu1: {runs_rot: /scratch/runs}\n")
    with pytest.raises(SettingsError, match="runs_rot"):
        load_settings(p)
    p.write_text("hosts: [gpu1]\n")
    with pytest.raises(SettingsError, match="hosts"):
        load_settings(p)
