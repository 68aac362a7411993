"""The rendezvous port a Slurm job picks on its first node (nsa_tui/slurm/rdzvport.py): free
there, and never the port of another job starting on the same node."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsa.contract.slurm import SlurmRequest
from nsa_tui.slurm import script as S
from nsa_tui.slurm.rdzvport import PORTS, REGISTRY, RESERVE_S, port_is_free, rdzv_port

OLD_BASE = 29400  # the old formula: 29400 + job id % 1000


def free_job_id() -> int:
    """A job id whose old-formula port, and the one after it, are free here now."""
    for jid in range(4242, 4242 + 1000):
        port = OLD_BASE + jid % 1000
        if port_is_free(port) and port_is_free(port + 1):
            return jid
    pytest.skip("no two free ports in 29400-30399 on this machine")


@pytest.fixture
def listening() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def listen(socks: list[socket.socket], port: int) -> None:
    s = socket.socket()
    s.bind(("", port))
    s.listen()
    socks.append(s)


def test_the_old_formulas_port_in_use_is_skipped(tmp_path: Path, listening: list[socket.socket]) -> None:
    """Something listens on 29400 + id % 1000: the job gets another port, free here."""
    jid = free_job_id()
    old = OLD_BASE + jid % 1000
    listen(listening, old)
    port = rdzv_port(tmp_path, str(jid))
    assert port != old and port in PORTS and port_is_free(port)


def test_jobs_1000_apart_on_one_node_get_distinct_ports(tmp_path: Path) -> None:
    """Both start before either torchrun listens: the reservation, not the bind, keeps them apart;
    on another node the same port is fine."""
    jid = free_job_id()
    first = rdzv_port(tmp_path, str(jid), node="n1")
    second = rdzv_port(tmp_path, str(jid + 1000), node="n1")
    elsewhere = rdzv_port(tmp_path, str(jid + 2000), node="n2")
    assert first == OLD_BASE + jid % 1000  # the port it always had, while that is free
    assert second != first and port_is_free(second)
    assert elsewhere == first
    held = json.loads((tmp_path / REGISTRY).read_text())
    assert {v["job"] for v in held.values()} == {str(jid), str(jid + 1000), str(jid + 2000)}


def test_a_requeued_job_gets_its_port_again_and_old_reservations_expire(tmp_path: Path) -> None:
    jid = free_job_id()
    first = rdzv_port(tmp_path, str(jid), node="n1", now=1000.0)
    assert rdzv_port(tmp_path, str(jid), node="n1", now=1001.0) == first  # its own, not another's
    later = 1001.0 + RESERVE_S + 1
    assert rdzv_port(tmp_path, str(jid + 1000), node="n1", now=later) == first  # expired: free again
    assert len(json.loads((tmp_path / REGISTRY).read_text())) == 1


def test_a_full_range_falls_back_to_a_port_the_kernel_gives(tmp_path: Path) -> None:
    port = rdzv_port(tmp_path, "5", free=lambda p: False)
    assert port not in PORTS and port > 0


def test_without_a_registry_the_bind_check_still_decides(
    tmp_path: Path, listening: list[socket.socket]
) -> None:
    jid = free_job_id()
    listen(listening, OLD_BASE + jid % 1000)
    port = rdzv_port(tmp_path / "not-there", str(jid))
    assert port != OLD_BASE + jid % 1000 and port_is_free(port)


def test_the_script_asks_the_first_node_for_the_port(tmp_path: Path) -> None:
    spec = S.JobSpec(run_id="r", run_dir=str(tmp_path / "r"), name="n", python=sys.executable,
                     nproc_per_node=1, train_args=[], resume_from=None, env={}, log="train.log")
    body = S.build_script(SlurmRequest(nodes=2), spec, ["sbatch"])
    assert "% 1000" not in body
    assert "-m nsa_tui.slurm.jobside rdzv-port" in body and '--rdzv-endpoint="$head_node:$rdzv_port"' in body
    (tmp_path / "r").mkdir()
    argv = [sys.executable, "-m", "nsa_tui.slurm.jobside", "rdzv-port", str(tmp_path / "r"), "17"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert int(out) > 0
    assert (tmp_path / REGISTRY).exists()  # in the runs root, beside the run
