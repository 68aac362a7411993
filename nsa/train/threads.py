"""CPU threads per rank: the CPUs this process may use, shared among the ranks of its host.

Why: torchrun sets ``OMP_NUM_THREADS=1`` only for more than one process per node, so a
single-process run (the demo, every fallback, every 1-process resume, ``nsa-train`` by hand)
got torch's default pool: a thread per CPU of the machine, whatever the affinity or the
container's CPU quota, busy-waiting between parallel regions. On a shared 2-core machine
that made steps 5-40x slower. Here every launch path picks the same number:

    usable CPUs = min(CPUs in the affinity mask, the cgroup CPU quota rounded down), at least 1
    threads per rank = max(1, usable CPUs // ranks on this host (LOCAL_WORLD_SIZE))

``NSA_THREADS=N`` in the environment chooses N instead (``OMP_NUM_THREADS`` cannot: torchrun
sets it itself). OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE``, unless set):
a spinning thread on a core another process needs stalls every rank's step. This module
must run before torch is imported (the OpenMP runtime reads its environment when it loads);
``apply`` then sets torch's pool. No torch import here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from nsa.contract import CpuThreads

OVERRIDE_ENV = "NSA_THREADS"


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (taskset, cpuset), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _cgroup_paths(proc_self: Path) -> tuple[str | None, dict[str, str]]:
    """(the cgroup v2 path, {v1 controller: path}) of this process from /proc/self/cgroup."""
    v2: str | None = None
    v1: dict[str, str] = {}
    try:
        text = (proc_self / "cgroup").read_text()
    except OSError:
        return None, {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        for c in controllers.split(","):
            if c:
                v1[c] = path
    return v2, v1


def _mounts(proc_self: Path) -> list[tuple[str, str, str, set[str]]]:
    """(fs type, mount point, root within the hierarchy, super options) of cgroup mounts."""
    out: list[tuple[str, str, str, set[str]]] = []
    try:
        text = (proc_self / "mountinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((rest[0], fields[4], fields[3], set(rest[2].split(","))))
    return out


def _under(mount_point: str, mount_root: str, path: str) -> Path:
    """The directory of cgroup ``path`` below a mount of the hierarchy's ``mount_root``."""
    rel = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path.lstrip("/")
    return Path(mount_point) / ("" if rel == "." else rel)


def _ancestors(directory: Path, mount_point: str) -> list[Path]:
    """``directory`` and its parents up to the mount point: a quota on any of them limits us."""
    out = [directory]
    top = Path(mount_point)
    while out[-1] != top and top in out[-1].parents:
        out.append(out[-1].parent)
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_quota_cpus(proc_self: Path = Path("/proc/self")) -> float | None:
    """The tightest CPU quota (in CPUs) of this process's cgroup and its ancestors, v2
    (``cpu.max``) or v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None: unlimited."""
    v2_path, v1_paths = _cgroup_paths(proc_self)
    quotas: list[float] = []
    for fstype, point, root, opts in _mounts(proc_self):
        if fstype == "cgroup2" and v2_path is not None:
            for d in _ancestors(_under(point, root, v2_path), point):
                text = _read(d / "cpu.max")
                if text:
                    quota, _, period = text.partition(" ")
                    if quota != "max" and quota.isdigit() and period.strip().isdigit() and int(period):
                        quotas.append(int(quota) / int(period))
        elif fstype == "cgroup" and "cpu" in opts and "cpu" in v1_paths:
            for d in _ancestors(_under(point, root, v1_paths["cpu"]), point):
                quota_us, period_us = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                if quota_us and period_us and quota_us.lstrip("-").isdigit() and period_us.isdigit():
                    if int(quota_us) > 0 and int(period_us) > 0:
                        quotas.append(int(quota_us) / int(period_us))
    return min(quotas) if quotas else None


def local_ranks(env: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """Processes of this run on this host: torchrun's LOCAL_WORLD_SIZE, else 1."""
    try:
        return max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def choose(env: dict[str, str] | os._Environ[str] = os.environ, affinity: int | None = None,
           quota: float | None = None, proc_self: Path = Path("/proc/self")) -> CpuThreads:
    """The threads per rank for this process (see the module docstring) and why."""
    aff = affinity if affinity is not None else affinity_cpus()
    q = quota if quota is not None else cgroup_quota_cpus(proc_self)
    usable = max(1, min(aff, math.floor(q) if q is not None else aff))
    ranks = local_ranks(env)
    per_rank = max(1, usable // ranks)
    source = "auto"
    wanted = env.get(OVERRIDE_ENV, "").strip()
    if wanted:
        if not wanted.isdigit() or int(wanted) < 1:
            raise ValueError(f"{OVERRIDE_ENV}={wanted!r}: expected a positive whole number of threads")
        per_rank, source = int(wanted), OVERRIDE_ENV
    return CpuThreads(per_rank=per_rank, usable_cpus=usable, affinity_cpus=aff, quota_cpus=q,
                      local_ranks=ranks, source=source,
                      wait_policy=env.get("OMP_WAIT_POLICY", "PASSIVE"))


def configure(env: os._Environ[str] | dict[str, str] = os.environ) -> CpuThreads:
    """Choose, and put the choice in the environment of this process (and its children) before
    torch loads its OpenMP runtime."""
    chosen = choose(env)
    n = str(chosen.per_rank)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = n
    env.setdefault("OMP_WAIT_POLICY", chosen.wait_policy)
    return chosen


def apply(chosen: CpuThreads) -> None:
    """Size torch's intra-op pool (torch may have been imported before ``configure``)."""
    import torch

    torch.set_num_threads(chosen.per_rank)


def describe(t: CpuThreads) -> str:
    """One line for the boot banner."""
    quota = f"cgroup quota {t.quota_cpus:g}" if t.quota_cpus is not None else "no cgroup quota"
    why = (f"{t.usable_cpus} usable CPU(s): affinity {t.affinity_cpus}, {quota}; "
           f"{t.local_ranks} rank(s) on this host")
    how = f"{OVERRIDE_ENV}" if t.source == OVERRIDE_ENV else "auto"
    return f"CPU threads per rank: {t.per_rank} ({how}; {why}; OpenMP wait policy {t.wait_policy})"
