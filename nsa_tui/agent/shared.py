"""A run directory on a runs root that several hosts share: making this host's part of a run
over several hosts, the config copy written once, and refusing what would touch a run whose
processes live on another host (nsa_tui/agent/owners.py says who owns what)."""

from __future__ import annotations

import os
from pathlib import Path

from nsa.contract.replies import Owner
from nsa.contract.rundir import RunDir
from nsa_tui.agent.diskroom import creating
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.owners import owner_words
from nsa_tui.agent.runs import RunStore


def make_shared_part(run_dir: Path, node: str) -> Path:
    """This host's ``nodes/<node>/`` in the one directory of a run whose hosts share the runs
    root (the first host to come creates the run directory). Refused: a directory of another
    run by that id (one with per-node files at its top), or a part of this node already there."""
    rd = RunDir(run_dir)
    try:
        run_dir.mkdir(mode=0o700)
        made = run_dir  # this host made it: removed again if the launch fails
    except FileExistsError:
        made = None
        if rd.launch_json.exists() or not rd.nodes.is_dir():
            raise OpError("run_exists",
                          f"{run_dir} already exists and is no shared run's directory") from None
    rd.nodes.mkdir(mode=0o700, exist_ok=True)
    part = rd.node(node)
    try:
        part.mkdir(mode=0o700)
    except FileExistsError:
        raise OpError("run_exists", f"{part} already exists: this host ({node}) already has a part of "
                      f"{run_dir.name} (the same machine named twice in the host list?)") from None
    creating.dir = made or part  # what a failed launch removes: never another host's part
    return part


def write_config_once(path: Path, text: str) -> None:
    """The run's config copy, written by one host only: on a shared runs root the other hosts
    of the run find it there and must have been given the same text."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.read_text() != text:
            raise OpError("bad_config", f"{path} was written by another host of the run with a different "
                          "config: every host must be given the same") from None
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def live_elsewhere_words(run_id: str, owners: list[Owner], verb: str) -> str:
    who = ", ".join(owner_words(o) for o in owners)
    return (f"{run_id} is alive on {who}: its processes are on that host, so this host cannot {verb} "
            "it; stop it through that host first")


def refuse_live_elsewhere(store: RunStore, run_id: str, verb: str) -> None:
    """Refuse ``verb`` on a run whose processes live on another host and are alive there (its
    lease or heartbeats fresh), naming that host."""
    elsewhere = store.view(run_id, with_tail=False).live_elsewhere()
    if elsewhere:
        raise OpError("running", live_elsewhere_words(run_id, elsewhere, verb))
