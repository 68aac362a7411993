"""A real two-node Slurm cluster for tests (fixture ``slurm2``), two machines on one box.

Each node is a ``slurmd`` in network, PID, UTS and mount namespaces of its own (``unshare``):
its own hostname (``nsa-n1``, ``nsa-n2``), its own address on a private /24 and its own
process table, while the filesystem (the runs root, the home, /tmp) is shared as a cluster's
NFS home is. The nodes' ``eth0`` are veth pairs on a bridge of the root namespace, where
munged and slurmctld run, reachable at the bridge's address; the login node (an sshd, see
tests/slurm/test_slurm_two_nodes.py) stays in the root namespace too.

- Names resolve as on a real cluster: each node bind-mounts a hosts file of its own over
  /etc/hosts (in its own mount namespace: the machine's file is untouched) that names both
  nodes and the controller, so torchrun resolves the batch script's ``head_node`` and gloo,
  which binds the address of the hostname, uses the node's ``eth0``.
- munge works across the namespaces: its socket is a file (a path in /tmp), and a Unix socket
  bound to a path is reached through the filesystem, whatever the network namespace.
- Beside the one-node cluster (tests/slurmcluster.py), even in another test session at the
  same time: its own ClusterName, ports, munge key and socket, state, spool and logs (all
  under the test's temp dir, ``SLURM_CONF``; nothing in /etc is written); its links are named
  after this process (``nsa2b<pid>``, ``nsa2v<pid><i>``) on a /24 of 10.213.0.0/16 no
  interface here uses. Links left by a session that died (its pid gone) are deleted first.
- Teardown, even after a failure: the queue cancelled and slurmctld and munged stopped by pid
  while the nodes are still up (with them gone slurmctld takes 15 s to stop), then each
  node's ``unshare`` SIGKILLed (with ``--kill-child`` that kills everything in its namespace:
  slurmd and any job step); its veth goes with its network namespace, and the veths and the
  bridge are deleted by name.

Skipped, with the reason, where this cannot run: Slurm or munge not installed, not root, no
``ip`` (iproute2), ``unshare`` or ``nsenter`` (util-linux), or the kernel refuses a bridge, a
veth pair or the namespaces (tried before anything is started).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.slurmcluster import MUNGED, SLURMCTLD, SLURMD, SlurmCluster, _free_port, _mem_mib
from tests.slurmcluster import missing as slurm_missing

NODES = ("nsa-n1", "nsa-n2")
CLUSTER = "nsatwo"
_LINK = re.compile(r"^nsa2[bvp](\d+)[a-z]?$")  # our links: bridge, veths, peers (+ the session's pid)

# PID 1 of a node: its hostname, its pids from a number of its own, its hosts file, lo up; then it
# waits for a line on stdin (the parent has moved and configured its eth0), runs slurmd, reaps
# every orphan (job steps double-fork) and ends when slurmd ends.
_INIT = """
import os, socket, subprocess, sys
name, pid_base, hosts = sys.argv[1:4]
socket.sethostname(name)
try:
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(pid_base)
except OSError:
    pass
subprocess.run(["mount", "--bind", hosts, "/etc/hosts"], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
print("ns-ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit(3)
child = subprocess.Popen(sys.argv[4:], stdin=subprocess.DEVNULL)
while True:
    pid, status = os.wait()
    if pid == child.pid:
        sys.exit(1)
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: rc={res.returncode} {res.stderr.strip()}")
    return res


def _links() -> list[str]:
    out = _ip("-o", "link", "show").stdout
    return [m.group(1).split("@")[0] for m in re.finditer(r"^\d+:\s+(\S+):", out, re.M)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_stale_links() -> list[str]:
    """Delete the bridges and veths of sessions of this fixture that are gone (their pid)."""
    gone = []
    for name in _links():
        m = _LINK.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            if _ip("link", "del", name, check=False).returncode == 0:
                gone.append(name)
    return gone


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.213.0.0/16 that no address here is in (another session's bridge included)."""
    used = [ipaddress.ip_interface(a).network
            for a in re.findall(r"inet (\S+)", _ip("-4", "-o", "addr", "show").stdout)]
    start = os.getpid() % 200 + 20
    for i in range(230):
        net = ipaddress.ip_network(f"10.213.{(start + i) % 230 + 20}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free /24 in 10.213.0.0/16")


def _ns(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


@dataclass
class Node:
    """One machine: ``proc`` is its ``unshare`` (in its network, UTS and mount namespaces; its
    child, PID 1 of its PID namespace, runs slurmd)."""

    name: str
    addr: str
    veth: str  # the host end, on the bridge
    proc: subprocess.Popen[str] | None = None
    uts: str = ""  # its UTS namespace (``uts:[inode]``): which processes are this machine's

    def pids(self) -> list[int]:
        """Every process of this machine (PID 1 of its namespace included), as root sees them."""
        out = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if _ns(int(entry.name), "uts") == self.uts and int(entry.name) != self.proc_pid:
                        out.append(int(entry.name))
        return out

    @property
    def proc_pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def vanish(self) -> None:
        """SIGKILL to ``unshare`` (it ignores TERM): with ``--kill-child`` its namespace's PID 1
        dies, and the kernel kills every process left there."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None


@dataclass
class TwoNodeCluster(SlurmCluster):
    """Two nodes (``nodes``), one partition (``debug``); ``node`` is the first (the batch shell's)."""

    bridge: str = ""
    bridge_addr: str = ""
    nodes: list[Node] = field(default_factory=list)

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def logs(self) -> str:
        out = [super().logs()]
        for n in self.nodes:
            for p in (self.dir / f"slurmd-{n.name}.log", self.dir / f"node-{n.name}.out"):
                if p.exists():
                    out.append(f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until both nodes accept jobs (``idle``), or fail with the daemons' logs."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}\n{self.logs()}")
            for n in self.nodes:
                if n.proc is None or n.proc.poll() is not None:
                    raise RuntimeError(f"node {n.name} ended\n{self.logs()}")
            try:
                out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
                states = dict(line.split() for line in out.splitlines() if line.strip())
            except (RuntimeError, subprocess.TimeoutExpired, ValueError):
                states = {}
            if all(states.get(n) == "idle" for n in self.node_names):
                return
            time.sleep(0.3)
        raise RuntimeError(f"nodes not idle after {timeout:.0f} s: {states}\n{self.logs()}")

    def stop(self) -> None:
        """Cancel what is queued and stop slurmctld and munged by pid (``SlurmCluster.stop``: while
        the nodes are up, slurmctld ends at once; with them gone it waits on them 15 s), then make
        the nodes vanish with everything on them and delete the links."""
        try:
            super().stop()
        finally:
            for n in self.nodes:
                n.vanish()
            links = _links()
            for name in [n.veth for n in self.nodes] + [self.bridge]:
                if name and name in links:
                    _ip("link", "del", name, check=False)


def missing() -> str | None:
    """Why two nodes cannot run here, or None (the kernel's word on a bridge comes at start)."""
    why = slurm_missing()
    if why:
        return why
    absent = [t for t in ("ip", "unshare", "nsenter", "mount") if shutil.which(t) is None]
    if absent:
        return (f"two Slurm nodes on one box need iproute2 and util-linux: missing {', '.join(absent)} "
                "(apt-get install -y iproute2 util-linux)")
    return None


_PROBE = """
import socket, subprocess
socket.sethostname("nsa-probe")
subprocess.run(["mount", "--bind", "/etc/hosts", "/etc/hosts"], check=True)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
"""


def _cannot() -> str | None:
    """Why this kernel will not make the nodes (namespaces, a hostname, a bind mount, a veth), or
    None: asked before anything is started, so a machine that cannot is a skip, not a failure."""
    veth = f"nsa2v{os.getpid()}z"
    res = _ip("link", "add", veth, "type", "veth", "peer", "name", f"nsa2p{os.getpid()}z", check=False)
    if res.returncode != 0:
        return f"ip link add ... type veth: {res.stderr.strip()}"
    _ip("link", "del", veth, check=False)
    try:
        res = subprocess.run(["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts",
                              sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "unshare --net --pid --uts --mount-proc: no answer in 60 s"
    if res.returncode != 0:
        return f"unshare --net --pid --uts --mount-proc: {res.stderr.strip()[-500:]}"
    return None


def _start_node(cluster: TwoNodeCluster, node: Node, index: int, hosts: Path, conf: Path) -> None:
    """The node's namespaces, its eth0 (a veth on the bridge) and, once that is up, its slurmd."""
    out = open(cluster.dir / f"node-{node.name}.out", "ab")
    argv = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts",
            sys.executable, "-c", _INIT, node.name, str(100 + 20000 * index), str(hosts),
            SLURMD, "-D", "-N", node.name, "-f", str(conf)]
    node.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out,
                                 text=True, env=cluster.env(), start_new_session=True)
    out.close()
    assert node.proc.stdout is not None and node.proc.stdin is not None
    if node.proc.stdout.readline().strip() != "ns-ready":  # hostname, hosts file and lo done
        raise RuntimeError(f"node {node.name} did not start\n{cluster.logs()}")
    node.uts = _ns(node.proc.pid, "uts")
    peer = f"nsa2p{os.getpid()}{'ab'[index]}"
    _ip("link", "add", node.veth, "type", "veth", "peer", "name", peer)
    _ip("link", "set", node.veth, "master", cluster.bridge, "up")
    _ip("link", "set", peer, "netns", str(node.proc.pid))
    netns = ["nsenter", f"--net=/proc/{node.proc.pid}/ns/net", "ip"]
    bridge = ipaddress.ip_interface(cluster.bridge_addr)
    for args in (["link", "set", peer, "name", "eth0"],
                 ["addr", "add", f"{node.addr}/{bridge.network.prefixlen}", "dev", "eth0"],
                 ["link", "set", "eth0", "up"],
                 ["route", "add", "default", "via", str(bridge.ip)]):
        res = subprocess.run([*netns, *args], capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            raise RuntimeError(f"{node.name}: ip {' '.join(args)}: {res.stderr.strip()}")
    node.proc.stdin.write("go\n")
    node.proc.stdin.flush()


def start_cluster(base: Path) -> TwoNodeCluster:
    """Bridge, munged, slurmctld, the two nodes; waits until both are ``idle``. Raises
    ``pytest.skip`` when the kernel refuses the bridge."""
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    delete_stale_links()
    pid = os.getpid()
    bridge = f"nsa2b{pid}"
    if bridge in _links():  # this session's own, left by an earlier test of it
        _ip("link", "del", bridge, check=False)
    res = _ip("link", "add", bridge, "type", "bridge", check=False)
    why = f"ip link add ... type bridge: {res.stderr.strip()}" if res.returncode != 0 else _cannot()
    if why:
        _ip("link", "del", bridge, check=False)
        pytest.skip(f"two Slurm nodes need network, PID, UTS and mount namespaces, a bridge and veths: {why}")
    munge_dir = Path(tempfile.mkdtemp(prefix="nsa-test-munge2-"))
    cluster = TwoNodeCluster(base, base / "slurm.conf", NODES[0], munge_dir, bridge=bridge)
    try:
        net = _free_subnet()
        hosts_ = list(net.hosts())
        cluster.bridge_addr = f"{hosts_[0]}/{net.prefixlen}"
        _ip("addr", "add", cluster.bridge_addr, "dev", bridge)
        _ip("link", "set", bridge, "up")
        ctl_addr = str(hosts_[0])
        cluster.nodes = [Node(name, str(hosts_[10 + i]), f"nsa2v{pid}{'ab'[i]}")
                         for i, name in enumerate(NODES)]
        ctl_host = socket.gethostname().split(".")[0]
        # the nodes' /etc/hosts: both nodes and the controller, at their bridge addresses
        hosts = base / "hosts"
        hosts.write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
                         + "".join(f"{n.addr} {n.name}\n" for n in cluster.nodes)
                         + f"{ctl_addr} {ctl_host}\n")
        os.chmod(hosts, 0o644)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        sock = munge_dir / "munge.socket"
        shutil.chown(munge_dir, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        os.chmod(munge_dir, 0o755)
        os.chmod(key, 0o400)
        (base / "state").mkdir()
        for n in cluster.nodes:
            (base / f"spool-{n.name}").mkdir()
        ctld_port, d_port = _free_port(), _free_port()
        cpus, mem = os.cpu_count() or 1, _mem_mib() // 2
        nodes_conf = "".join(
            f"NodeName={n.name} NodeAddr={n.addr} NodeHostname={n.name} CPUs={cpus} RealMemory={mem} "
            "State=UNKNOWN\n" for n in cluster.nodes)
        cluster.conf.write_text(f"""ClusterName={CLUSTER}
SlurmctldHost={ctl_host}({ctl_addr})
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={base / "state"}
SlurmdSpoolDir={base}/spool-%n
SlurmctldPidFile={base / "slurmctld.pid"}
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base / "slurmctld.log"}
SlurmdLogFile={base}/slurmd-%n.log
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
{nodes_conf}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        env = cluster.env()
        log = open(base / "munged.log", "ab")
        cluster.procs.append(subprocess.Popen(
            ["runuser", "-u", "munge", "--", MUNGED, "-F", f"--key-file={key}", f"--socket={sock}",
             f"--pid-file={munge_dir / 'munged.pid'}", f"--seed-file={munge_dir / 'munged.seed'}",
             f"--log-file={munge_dir / 'munged.log'}"],
            stdout=log, stderr=log, start_new_session=True))
        log.close()
        deadline = time.monotonic() + 20
        while not sock.exists():
            if cluster.procs[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start\n{cluster.logs()}")
            time.sleep(0.05)
        out = open(base / "slurmctld.out", "ab")
        cluster.procs.append(subprocess.Popen([SLURMCTLD, "-D", "-i", "-f", str(cluster.conf)], env=env,
                                              stdout=out, stderr=out, start_new_session=True))
        out.close()
        for i, n in enumerate(cluster.nodes):
            _start_node(cluster, n, i, hosts, cluster.conf)
        cluster.wait_idle(90)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture
def slurm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodeCluster]:
    """A running two-node Slurm for one test; torn down (jobs, nodes, links, daemons) after."""
    why = missing()
    if why:
        pytest.skip(why)
    cluster = start_cluster(tmp_path_factory.mktemp("slurm2"))
    try:
        yield cluster
    finally:
        cluster.stop()


def _main() -> None:  # pragma: no cover - by hand: python -m tests.slurmtwonode (starts, shows, stops)
    cluster = start_cluster(Path(tempfile.mkdtemp(prefix="nsa-slurm2-")))
    try:
        print(cluster.run("sinfo", "-N"))
        print(cluster.run("srun", "-N2", "--ntasks-per-node=1", "sh", "-c", "hostname; hostname -i"))
    finally:
        cluster.stop()
        print("stopped; links left:", [x for x in _links() if _LINK.match(x)], file=sys.stderr)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    _main()
