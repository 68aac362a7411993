"""End to end through a real OpenSSH server, side by side with the local host: connect,
launch on the SSH host (config uploaded), watch, survive a dropped connection without
gaps, kill, quit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nsa_tui.app.app import NsaApp
from nsa_tui.app.screens.dialogs import ConfirmScreen
from nsa_tui.app.screens.launch import LaunchScreen
from nsa_tui.app.screens.main import MainScreen
from nsa_tui.app.widgets.gpus import GpuTable
from nsa_tui.app.widgets.header import PanelHeader
from nsa_tui.hosts.client import HostClient
from nsa_tui.transport.ssh import SshTransport
from tests.sshd import SshServer
from tests.tui.helpers import plain, points, wait_for

pytestmark = pytest.mark.ssh


@pytest.mark.slow
async def test_panel_over_ssh(sshd: SshServer, runs_root: Path, tmp_path: Path, make_config) -> None:
    config = make_config("overssh", train__steps=5000, train__save_every=5000)
    remote_root = tmp_path / "ssh-runs"  # the SSH "host" keeps its runs apart from the local ones
    transport = SshTransport(sshd.dest, runs_root=str(remote_root), remote_python=sys.executable,
                             **sshd.ssh_options)  # type: ignore[arg-type]
    client = HostClient(sshd.dest, transport=transport)
    app = NsaApp(["local", sshd.dest], offer_demo=False, clients={sshd.dest: client})
    async with app.run_test(size=(100, 30)) as pilot:
        host = app.state.hosts[sshd.dest]
        await wait_for(pilot, lambda: host.conn == "connected" and host.runs_loaded, 60, "connection")
        await wait_for(pilot, lambda: app.state.hosts["local"].conn == "connected", 30, "the local host")
        await pilot.press("l")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen, 5)
        dialog.query_one("#host").value = sshd.dest  # two hosts: the dialog asks which
        dialog.query_one("#config-path").value = config
        await pilot.press("ctrl+s")
        run = await wait_for(pilot, lambda: app.state.selected_run(), 60, "the launched run")
        assert run.host == sshd.dest and (remote_root / run.run_id).is_dir()
        await wait_for(pilot, lambda: points(run) >= 3, 120, "metrics over ssh")
        await wait_for(pilot, lambda: host.sample, 10, "a host sample")
        await pilot.pause(0.3)
        header = plain(app.screen.query_one(PanelHeader))
        assert header.count("connected") == 2, header  # both hosts, side by side
        assert "N/A" in plain(app.screen.query_one(GpuTable))  # no GPU here, said so
        # the network drops: the header says so, the watch resumes from its offsets
        client.drop_connection()
        await wait_for(pilot, lambda: "reconnecting" in plain(app.screen.query_one(PanelHeader))
                       or host.conn == "reconnecting", 10, "the reconnecting state")
        await wait_for(pilot, lambda: host.conn == "connected", 60, "the reconnect")
        seen = run.metrics.count
        await wait_for(pilot, lambda: run.metrics.count >= seen + 3, 60, "metrics after the reconnect")
        steps, _ = run.metrics.series("loss")
        assert steps == list(range(int(steps[0]), int(steps[-1]) + 1)), "no gap, no duplicate"
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5)
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen) and not run.alive, 90, "the stop")
        await pilot.press("q")
    assert "no runs are running" in app.return_value


async def test_unknown_host_key_is_asked_in_the_panel(sshd: SshServer, runs_root: Path,
                                                      tmp_path: Path) -> None:
    known = tmp_path / "empty_known_hosts"
    known.write_text("")
    transport = SshTransport(sshd.dest, runs_root=str(tmp_path / "ssh-runs"), remote_python=sys.executable,
                             known_hosts=str(known), client_keys=[str(sshd.client_key)], config=[])
    client = HostClient(sshd.dest, transport=transport)
    app = NsaApp([sshd.dest], offer_demo=False, clients={sshd.dest: client})
    async with app.run_test(size=(100, 30)) as pilot:
        ask = await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen, 30, "ask")
        assert "SHA256:" in plain(ask.query_one("#confirm-body"))
        await pilot.press("y")
        await wait_for(pilot, lambda: app.state.hosts[sshd.dest].conn == "connected", 30, "connection")
        await pilot.press("q")
    assert "127.0.0.1" in known.read_text(), "the accepted key is remembered"
