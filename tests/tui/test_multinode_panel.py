"""The panel and one run over two hosts (two real sshd on 127.0.0.1): launched from the
dialog over both, shown as one row with every rank and its host, stopped on both with k."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from nsa.contract import RunStatus
from nsa_tui.agent.procs import run_processes
from nsa_tui.app.app import NsaApp
from nsa_tui.app.screens.dialogs import ConfirmScreen
from nsa_tui.app.screens.launch import LaunchScreen
from nsa_tui.app.widgets.gpus import GpuTable
from nsa_tui.app.widgets.runlist import RunList
from nsa_tui.app.widgets.summary import RunSummary
from nsa_tui.hosts.client import HostClient
from nsa_tui.transport.ssh import SshTransport
from tests.sshd import SshNodes
from tests.tui.helpers import plain, wait_for

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


async def test_one_run_over_two_hosts_in_the_panel(sshd_nodes: SshNodes, make_config) -> None:
    config = make_config("overtwo", train__steps=5000, train__save_every=5, train__eval_every=5000)
    hosts = sshd_nodes.aliases
    clients = {h: HostClient(h, transport=SshTransport(h, config=[str(sshd_nodes.ssh_config)],
                                                       remote_python=sys.executable)) for h in hosts}
    app = NsaApp(hosts, offer_demo=False, clients=clients)
    rid = ""
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await wait_for(pilot, lambda: all(app.state.hosts[h].conn == "connected" for h in hosts), 60,
                           "both hosts")
            await pilot.press("l")
            dialog = await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen, 5)
            dialog.query_one("#hosts").value = ",".join(hosts)  # one run over both
            dialog.query_one("#config-path").value = config
            dialog.query_one("#nproc").value = "1"
            await pilot.press("ctrl+s")
            run = await wait_for(pilot, lambda: app.state.selected_run(), 60, "the launched run")
            rid = run.run_id

            def both_stepping():
                m = app.state.merged(app.state.selected_run())
                ok = len(m.ranks) == 2 and {h for h, _ in m.ranks} == set(hosts) and min(
                    b.step for _, b in m.ranks) >= 2
                return m if ok and m.status == RunStatus.RUNNING else None
            merged = await wait_for(pilot, both_stepping, 120, "steps from both hosts' ranks, running")
            table = app.screen.query_one(RunList)

            def row_running() -> list[str] | None:  # the panes redraw at a capped rate: wait for it
                row = [str(c) for c in table.get_row_at(0)] if table.row_count else []
                return row if row and row[2] == "running" else None
            row = await wait_for(pilot, row_running, 10, "the run list's row to say running")
            assert table.row_count == 1 and row[0] == "+".join(hosts), row  # one row
            summary = await wait_for(pilot, lambda: (t := plain(app.screen.query_one(RunSummary))) and
                                     f"r0@{merged.primary}" in t and t, 10, "the summary of both hosts")
            assert "(rank 0)" in summary, summary
            assert "timeouts" in summary and "steady 60 s" in summary
            gpus = await wait_for(pilot, lambda: (t := plain(app.screen.query_one(GpuTable))).count(
                "GPUs: N/A —") == 2 and t, 30, "both hosts' GPU tables")
            assert all(h in gpus for h in hosts), gpus  # per host, each with its own sample
            await pilot.press("k")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5)
            await pilot.press("y")
            stopped = lambda: app.state.merged(app.state.selected_run()).status == RunStatus.STOPPED  # noqa: E731
            await wait_for(pilot, stopped, 120, "the stop on both hosts")
            # the supervisor records the stop, then exits: on a loaded machine it may still be there
            await wait_for(pilot, lambda: not run_processes(rid, fresh=True), 30, "no process of the run")
            await pilot.press("q")
    finally:
        for p in run_processes(rid) if rid else []:
            os.kill(p.pid, signal.SIGKILL)
