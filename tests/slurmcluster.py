"""A real one-node Slurm cluster for tests (fixture ``slurm``).

munged, slurmctld and slurmd run from a temporary directory: their own munge key and
socket, a slurm.conf for this machine (its hostname, CPU count and 80 % of its memory),
free ports, state, spool, logs and pid files all under the test's temp dir. Client
commands find the cluster through ``SLURM_CONF`` (``SlurmCluster.env``), so nothing in
/etc is written. The daemons are stopped by the pids this fixture started, and any job
left in the queue is cancelled first. Skipped, with the reason, where the Debian
packages ``slurmctld slurmd slurm-client munge`` are not installed (scripts/test.sh
installs them).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
NEEDED = (MUNGED, SLURMCTLD, SLURMD, "/usr/bin/sbatch", "/usr/bin/squeue", "/usr/bin/scontrol")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 8 // 10 // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


@dataclass
class SlurmCluster:
    """One node, one partition (``debug``); ``conf`` is its slurm.conf."""

    dir: Path
    conf: Path
    node: str
    munge_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return dict(base if base is not None else os.environ, SLURM_CONF=str(self.conf))

    def run(self, *args: str, check: bool = True) -> str:
        """A Slurm client command against this cluster; its stdout."""
        res = subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=60)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: rc={res.returncode} {res.stderr.strip()}")
        return res.stdout

    def queue(self) -> list[str]:
        """Job ids in the queue (any state)."""
        return self.run("squeue", "-h", "-o", "%i").split()

    def logs(self) -> str:
        out = []
        for p in (
            self.dir / "slurmctld.log",
            self.dir / "slurmd.log",
            self.dir / "munged.log",
            self.munge_dir / "munged.log",
        ):
            name = p.name
            if p.exists():
                out.append(f"--- {name}\n" + p.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until the node accepts jobs (``idle``), or fail with the daemons' logs."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}\n{self.logs()}")
            try:
                state = self.run("sinfo", "-h", "-n", self.node, "-o", "%t").strip()
            except (RuntimeError, subprocess.TimeoutExpired):
                state = "?"
            if state == "idle":
                return
            time.sleep(0.3)
        raise RuntimeError(
            f"node {self.node} not idle after {timeout:.0f} s (state {state!r})\n{self.logs()}"
        )

    def stop(self) -> None:
        """Cancel what is queued, then stop each daemon by its pid (TERM, KILL after 15 s)."""
        try:
            ids = self.queue()
            if ids:
                self.run("scancel", *ids, check=False)
                deadline = time.monotonic() + 30
                while self.queue() and time.monotonic() < deadline:
                    time.sleep(0.3)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        self.procs.clear()
        shutil.rmtree(self.munge_dir, ignore_errors=True)


def missing() -> str | None:
    """Why the cluster cannot run here, or None."""
    absent = [p for p in NEEDED if not os.path.exists(p)]
    if absent:
        return (
            "Slurm not installed (scripts/test.sh installs slurmctld slurmd slurm-client munge): "
            f"missing {', '.join(absent)}"
        )
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (SlurmUser=root): not root"
    return None


def start_cluster(base: Path) -> SlurmCluster:
    """Write the key and slurm.conf, start munged, slurmctld and slurmd, wait for ``idle``."""
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)  # munged (user munge) reaches its files here
    node = socket.gethostname().split(".")[0]
    # munged runs as user munge: its directory must be reachable by it (pytest's temp dirs are
    # private to root), so it lives in a directory of its own, removed in ``stop``
    munge_dir = Path(tempfile.mkdtemp(prefix="nsa-test-munge-"))
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    sock = munge_dir / "munge.socket"
    shutil.chown(munge_dir, "munge", "munge")
    shutil.chown(key, "munge", "munge")
    os.chmod(munge_dir, 0o755)
    os.chmod(key, 0o400)
    for sub in ("state", "spool"):
        (base / sub).mkdir()
    ctld_port, d_port = _free_port(), _free_port()
    conf = base / "slurm.conf"
    conf.write_text(f"""ClusterName=nsatest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={base / "state"}
SlurmdSpoolDir={base / "spool"}
SlurmctldPidFile={base / "slurmctld.pid"}
SlurmdPidFile={base / "slurmd.pid"}
SlurmctldLogFile={base / "slurmctld.log"}
SlurmdLogFile={base / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
KillWait=20
MinJobAge=600
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory={_mem_mib()} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    cluster = SlurmCluster(base, conf, node, munge_dir)
    env = cluster.env()
    log = open(base / "munged.log", "ab")
    cluster.procs.append(
        subprocess.Popen(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                MUNGED,
                "-F",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
                f"--log-file={munge_dir / 'munged.log'}",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    )
    log.close()
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            if cluster.procs[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start\n{cluster.logs()}")
            time.sleep(0.05)
        for argv in ([SLURMCTLD, "-D", "-i", "-f", str(conf)], [SLURMD, "-D", "-f", str(conf)]):
            out = open(base / f"{Path(argv[0]).name}.out", "ab")
            cluster.procs.append(
                subprocess.Popen(argv, env=env, stdout=out, stderr=out, start_new_session=True)
            )
            out.close()
        cluster.wait_idle()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running one-node Slurm for one test; stopped (jobs cancelled, daemons by pid) after."""
    why = missing()
    if why:
        pytest.skip(why)
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()
