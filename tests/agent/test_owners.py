"""Runs whose processes live on another host (a shared runs root): judged by the owner's lease and
heartbeats, never by this host's process table, and never archived, deleted or stopped from here
while alive. The other host's files are written as that host writes them; the two-machine
end-to-end version is tests/transport/test_shared_root.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from nsa.contract import RunStatus
from nsa.contract.rundir import node_name
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.housekeeping import Housekeeping
from nsa_tui.agent.owners import LEASE_TTL_S, this_node
from nsa_tui.agent.runs import RunStore

OTHER = node_name("gpu9", "0123456789abcdef")


def other_hosts_run(store: RunStore, run_id: str, lease_age: float | None, ttl: float = LEASE_TTL_S,
                    beat_age: float | None = None, exit_code: int | None = None) -> Path:
    """A run launched by host gpu9 in a runs root this host shares (pid 1 there: alive here too)."""
    d = store.root / run_id
    (d / "heartbeats").mkdir(parents=True)
    now = time.time()
    (d / "launch.json").write_text(json.dumps({
        "run_id": run_id, "name": "x", "created": now - 60, "launcher_pid": 1, "launcher_pgid": 1,
        "boot_id": "0123456789abcdef", "node": OTHER, "hostname": "gpu9"}))
    if lease_age is not None:
        (d / "lease.json").write_text(json.dumps({"node": OTHER, "hostname": "gpu9", "ts": now - lease_age,
                                                  "ttl_s": ttl}))
    if beat_age is not None:
        (d / "heartbeats" / "rank-0.jsonl").write_text(json.dumps({
            "ts": now - beat_age, "run_id": run_id, "rank": 0, "pid": 1, "host": "gpu9", "phase": "train",
            "step": 5}) + "\n")
    if exit_code is not None:
        (d / "exit.json").write_text(json.dumps({"exit_code": exit_code, "ended_at": now - 1}))
    return d


def test_this_host_has_a_node_name_of_hostname_and_boot_id() -> None:
    assert this_node() != OTHER and len(this_node().rsplit("-", 1)[1]) == 8
    assert node_name("a b/c", "xyz-123") == "a-b-c-xyz123"


def test_a_fresh_lease_is_alive_and_refuses_archive_delete_and_stop(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    d = other_hosts_run(store, "r1", lease_age=2)
    v = store.view("r1")
    assert v.alive and v.status == RunStatus.STARTING and v.pids == []
    assert [(o.hostname, o.how, o.mine) for o in v.owners] == [("gpu9", "lease", False)]
    hk = Housekeeping(store)
    for op in (lambda: hk.delete("r1"), lambda: hk.archive("r1")):
        with pytest.raises(OpError, match="alive on gpu9 \\(lease renewed 2 s ago\\)"):
            op()
    assert d.is_dir() and not (d / "archived.json").exists()


def test_fresh_heartbeats_are_alive_without_a_lease(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    other_hosts_run(store, "r2", lease_age=None, beat_age=3)
    v = store.view("r2")
    assert v.alive and [o.how for o in v.owners] == ["beats"]


def test_an_expired_lease_and_old_beats_are_lost_and_the_directory_is_kept(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    d = other_hosts_run(store, "r3", lease_age=LEASE_TTL_S + 5, beat_age=LEASE_TTL_S + 5)
    v = store.view("r3")
    assert not v.alive and v.status == RunStatus.LOST and [o.how for o in v.owners] == ["expired"]
    assert d.is_dir()


def test_a_released_lease_is_ended_at_once(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    other_hosts_run(store, "r4", lease_age=1, ttl=0.0, beat_age=1, exit_code=0)
    v = store.view("r4")
    assert not v.alive and [o.how for o in v.owners] == ["exit"] and v.status == RunStatus.CRASHED
    Housekeeping(store).archive("r4")  # ended: archive is allowed
    assert store.view("r4").archived
