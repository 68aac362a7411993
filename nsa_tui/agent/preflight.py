"""``preflight``: can this host take part in a run over several hosts? Nothing is started.

The client asks every host before it starts any (docs/multi-node.md): versions (nsa-tui,
nsa, torch must be the same everywhere), what would stop a launch here (nsa or torch
missing), the config validated as a launch would, and, on the first host, the rendezvous
port: bind-tested on every interface, or a free one chosen (:func:`rendezvous_port`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from nsa.contract import Hello
from nsa.contract.io import private_dir
from nsa.contract.replies import PreflightResult
from nsa.contract.requests import PreflightArgs
from nsa.contract.rundir import share_marker
from nsa_tui.agent.errors import OpError
from nsa_tui.agent.launcher import Launcher, check_policy_over_hosts
from nsa_tui.agent.owners import this_node

PORTS = range(29400, 29500)  # torchrun's usual c10d port first, then its neighbours


def port_free(port: int) -> tuple[bool, str]:
    """Whether a server could listen on ``port`` on every interface (as the c10d store does,
    address reuse allowed: a port in TIME_WAIT is free, one with a listener is not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as exc:
            return False, f"port {port} is in use ({exc.strerror or exc})"
    return True, ""


def rendezvous_port(want: int | None) -> tuple[int | None, bool, str]:
    """(port, free, why not): ``want`` tested, or the first free one of :data:`PORTS`."""
    if want is not None:
        if not 0 < want < 65536:
            return want, False, f"port {want} is not a TCP port"
        ok, why = port_free(want)
        return want, ok, why
    for p in PORTS:
        if port_free(p)[0]:
            return p, True, ""
    return None, False, f"no free port in {PORTS.start}-{PORTS.stop - 1}"


def _marker(root: Path, a: PreflightArgs, res: PreflightResult) -> None:
    """The sharing probe: write, look for or remove a marker file in this host's runs root."""
    try:
        if a.marker_write:
            private_dir(root)
            fd = os.open(root / share_marker(a.marker_write), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
        if a.marker_look:
            res.marker_seen = (root / share_marker(a.marker_look)).exists()
        if a.marker_remove:
            (root / share_marker(a.marker_remove)).unlink(missing_ok=True)
    except OSError as exc:
        res.marker_error = f"runs root {root}: {exc.strerror or exc}"


def preflight(launcher: Launcher, hello: Hello, a: PreflightArgs) -> PreflightResult:
    res = PreflightResult(host=hello.host, nsa_tui=hello.nsa_tui, nsa_version=hello.nsa_version,
                          torch=hello.torch, python=hello.python, runs_root=hello.runs_root,
                          problems=list(hello.problems))
    res.node = this_node()
    _marker(launcher.store.root, a, res)
    if a.want_port or a.port is not None:
        res.port, res.port_free, res.port_message = rendezvous_port(a.port)
    if a.config_path or a.config_text is not None:
        try:
            cfg: Any = launcher.validated(a.config_path, a.config_text, list(a.overrides))
            check_policy_over_hosts(cfg)
            summary = launcher.describe(a.config_path, config_text=a.config_text, nproc=a.nproc,
                                        overrides=list(a.overrides))
        except OpError as exc:
            res.config_error = exc.message
        else:
            res.config_name = cfg.name
            res.join_timeout_s = cfg.train.pg_timeout_start_s
            if summary.problems:  # what launch would refuse here (cannot_run)
                res.config_error = "cannot run on this host: " + "; ".join(summary.problems)
    return res
