"""The agent's view of processes (nsa_tui/agent/procs.py): a run's processes are found by
their process group and the run id in their environment, with one cheap scan of the host."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from nsa_tui.agent.procs import environ_of, pgrp, process_groups, run_processes, settle


def test_a_run_is_found_by_its_group_and_its_id_and_a_gone_process_has_no_group() -> None:
    env = {**os.environ, "NSA_RUN_ID": "20990101-000000-procs-test", "NSA_RUN_DIR": "/nowhere"}
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "time.sleep(60)"], env=env, start_new_session=True)
    try:
        assert pgrp(leader.pid) == leader.pid  # a session of its own: its own group
        deadline = time.monotonic() + 30
        while len(process_groups(0.0).get(leader.pid, [])) < 2:  # the child joins the group
            assert time.monotonic() < deadline, process_groups(0.0).get(leader.pid)
            time.sleep(0.05)
        found = run_processes("20990101-000000-procs-test", leader.pid, fresh=True, run_dir="/nowhere")
        assert len(found) == 2 and {p.pgid for p in found} == {leader.pid}
        assert leader.pid in {p.pid for p in found}
        assert run_processes("20990101-000000-other", leader.pid, fresh=True) == []  # another run's id
        assert pgrp(os.getpid()) == os.getpgrp()
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()
    deadline = time.monotonic() + 30
    while process_groups(0.0).get(leader.pid):  # the child, reparented, goes too
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert pgrp(leader.pid) is None


def test_a_few_variables_of_an_environment_read_as_the_whole_parse_reads_them() -> None:
    env = {"PATH": os.environ.get("PATH", ""), "XRANK": "9", "RANK_X": "8", "NSA_RUN_ID": "a=b",
           "NSA_RUN_DIR": "", "RANK": "3", "Z": "é"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 30  # just after exec the kernel shows an empty environment
        while not (whole := environ_of(proc.pid)).get("XRANK"):
            assert time.monotonic() < deadline, whole
            time.sleep(0.02)
        assert whole["XRANK"] == "9" and whole["RANK"] == "3"
        some = environ_of(proc.pid, ("NSA_RUN_ID", "NSA_RUN_DIR", "RANK", "Z", "MISSING"))
        assert some == {k: whole[k] for k in ("NSA_RUN_ID", "NSA_RUN_DIR", "RANK", "Z")}
        assert environ_of(proc.pid, ("PATH",)) == {"PATH": whole["PATH"]}  # the first variable
    finally:
        proc.kill()
        proc.wait()
    assert environ_of(proc.pid, ("RANK",)) == {} and environ_of(proc.pid) == {}  # gone


def test_settle_waits_for_an_environment_and_gives_up_on_one_that_is_empty() -> None:
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, "NSA_RUN_ID": "x"})
    try:
        assert settle(proc.pid) and environ_of(proc.pid, ("NSA_RUN_ID",)) == {"NSA_RUN_ID": "x"}
    finally:
        proc.kill()
        proc.wait()
    assert not settle(proc.pid)  # gone: at once
    dead = subprocess.Popen(["true"])  # exited, not reaped: reading a zombie's environment fails
    deadline = time.monotonic() + 30
    while Path(f"/proc/{dead.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.monotonic()
    assert not settle(dead.pid, timeout_s=10) and time.monotonic() - t0 < 5  # at once, not at 10 s
    dead.wait()
    empty = subprocess.Popen(["/bin/sleep", "60"], env={})  # an empty environment for good
    try:
        t0 = time.monotonic()
        assert not settle(empty.pid, timeout_s=0.2)
        assert time.monotonic() - t0 >= 0.2
    finally:
        empty.kill()
        empty.wait()
