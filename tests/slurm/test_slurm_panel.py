"""The panel on a host the settings file marks as a Slurm login node: its launch dialog submits
a batch job; the run shows the job's state; k cancels it (real Slurm, real sshd, real pilot)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from nsa_tui.app.app import NsaApp
from nsa_tui.app.screens.dialogs import ConfirmScreen
from nsa_tui.app.screens.launch import LaunchScreen
from nsa_tui.app.screens.main import MainScreen
from nsa_tui.app.widgets.summary import RunSummary
from nsa_tui.hosts.client import HostClient
from nsa_tui.transport.ssh import SshTransport
from tests.agent.e2e import SMOKE
from tests.slurmcluster import SlurmCluster
from tests.sshd import SshServer
from tests.tui.helpers import plain, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.ssh]


async def test_panel_launch_on_a_slurm_login_node(
    login: SshServer, slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"slurm": {login.dest: {"partition": "debug", "time": "00:20:00"}}}))
    monkeypatch.setenv("NSA_TUI_SETTINGS", str(settings))
    monkeypatch.setenv("NSA_TUI_KEYMAP", str(tmp_path / "no-keymap.yaml"))
    root = tmp_path / "login-runs"
    transport = SshTransport(
        login.dest, runs_root=str(root), remote_python=sys.executable, **login.ssh_options
    )  # type: ignore[arg-type]
    client = HostClient(login.dest, transport=transport)
    app = NsaApp([login.dest], offer_demo=False, clients={login.dest: client})
    async with app.run_test(size=(110, 34)) as pilot:
        host = app.state.hosts[login.dest]
        await wait_for(pilot, lambda: host.conn == "connected" and host.runs_loaded, 60, "connection")
        await pilot.press("l")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen, 5)
        dialog.query_one("#config-path").value = SMOKE
        await pilot.press("ctrl+s")
        run = await wait_for(pilot, lambda: app.state.selected_run(), 60, "the submitted run")
        view = run.view
        assert view is not None and view.slurm is not None, view
        job = view.slurm.job_id
        assert job in slurm.queue()
        await wait_for(pilot, lambda: run.view.slurm.state == "RUNNING" and run.alive, 60, "the job running")
        await pilot.pause(1.5)  # the summary pane redraws once a second
        summary = plain(app.screen.query_one(RunSummary))
        assert f"job {job} RUNNING on {slurm.node}" in summary, summary
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5)
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen) and not run.alive, 120, "the cancel")
        assert job not in slurm.queue()
        await pilot.press("q")
