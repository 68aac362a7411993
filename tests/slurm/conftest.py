"""Fixtures: a real one-node Slurm (tests/slurmcluster.py) and a real sshd as its login node."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.slurmcluster import SlurmCluster, slurm  # noqa: E402,F401,F811
from tests.sshd import SSHD, SshServer, make_server  # noqa: E402


@pytest.fixture
def login(slurm: SlurmCluster, tmp_path: Path) -> Iterator[SshServer]:  # noqa: F811
    """An sshd whose sessions reach the cluster (SLURM_CONF): the cluster's login node."""
    import os
    import shutil

    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    server = make_server(tmp_path / "sshd", home=tmp_path / "home", extra_env={"SLURM_CONF": str(slurm.conf)})
    server.start()
    try:
        yield server
    finally:
        server.stop()
