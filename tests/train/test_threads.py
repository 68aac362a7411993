"""Threads per rank (nsa/train/threads.py): the same choice on every launch path, recorded in
run.json; the cgroup quota read from real files laid out as a kernel lays them out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsa.train import threads
from tests.train.trainrun import REPO, run_json, run_train

ONE_STEP = ["train.steps=1", "train.eval_every=100", "train.save_every=100"]


def fake_proc(tmp: Path, cgroup: str, mountinfo: list[str]) -> Path:
    proc = tmp / "proc-self"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("\n".join(mountinfo) + "\n")
    return proc


def test_cgroup_v2_quota_of_the_process_or_an_ancestor(tmp_path: Path) -> None:
    fs = tmp_path / "sys-fs-cgroup"
    leaf = fs / "system.slice" / "job.scope"
    leaf.mkdir(parents=True)
    (fs / "system.slice" / "cpu.max").write_text("300000 100000\n")  # 3 CPUs on the parent
    (leaf / "cpu.max").write_text("max 100000\n")
    proc = fake_proc(tmp_path, "0::/system.slice/job.scope\n",
                     [f"30 23 0:26 / {fs} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"])
    assert threads.cgroup_quota_cpus(proc) == pytest.approx(3.0)
    (leaf / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: the tightest wins, rounded down
    assert threads.cgroup_quota_cpus(proc) == pytest.approx(1.5)
    t = threads.choose({}, affinity=8, proc_self=proc)
    assert (t.usable_cpus, t.per_rank, t.quota_cpus) == (1, 1, 1.5)


def test_cgroup_v1_quota_and_no_quota(tmp_path: Path) -> None:
    fs = tmp_path / "cpu,cpuacct"
    (fs / "docker" / "abc").mkdir(parents=True)
    (fs / "docker" / "abc" / "cpu.cfs_quota_us").write_text("400000\n")
    (fs / "docker" / "abc" / "cpu.cfs_period_us").write_text("100000\n")
    proc = fake_proc(tmp_path, "12:cpu,cpuacct:/docker/abc\n0::/\n",
                     [f"40 31 0:37 / {fs} rw,relatime - cgroup cgroup rw,cpu,cpuacct"])
    assert threads.cgroup_quota_cpus(proc) == pytest.approx(4.0)
    t = threads.choose({"LOCAL_WORLD_SIZE": "2"}, affinity=16, proc_self=proc)
    assert (t.usable_cpus, t.local_ranks, t.per_rank) == (4, 2, 2)
    (fs / "docker" / "abc" / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert threads.cgroup_quota_cpus(proc) is None
    # a container sees its own cgroup as the mount's root
    (fs / "docker" / "abc" / "cpu.cfs_quota_us").write_text("200000\n")
    inside = tmp_path / "inside"
    inside.mkdir()
    proc2 = fake_proc(inside, "12:cpu,cpuacct:/docker/abc\n",
                      [f"40 31 0:37 /docker/abc {fs / 'docker' / 'abc'} rw - cgroup cgroup rw,cpu,cpuacct"])
    assert threads.cgroup_quota_cpus(proc2) == pytest.approx(2.0)


def test_more_ranks_than_cpus_still_get_one_thread_and_the_override_is_checked() -> None:
    t = threads.choose({"LOCAL_WORLD_SIZE": "8"}, affinity=2, quota=None)
    assert t.per_rank == 1 and t.source == "auto" and t.wait_policy == "PASSIVE"
    t = threads.choose({"NSA_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}, affinity=2, quota=None)
    assert (t.per_rank, t.source, t.wait_policy) == (3, "NSA_THREADS", "ACTIVE")
    with pytest.raises(ValueError, match="NSA_THREADS"):
        threads.choose({"NSA_THREADS": "many"}, affinity=2, quota=None)


def test_torch_gets_the_chosen_pool_in_a_fresh_process() -> None:
    """configure() before torch loads, apply() after: torch's pool and OpenMP's agree."""
    code = ("from nsa.train import threads\nt = threads.configure()\nimport torch\nthreads.apply(t)\n"
            "import os\nprint(t.per_rank, torch.get_num_threads(), os.environ['OMP_NUM_THREADS'], "
            "os.environ['OMP_WAIT_POLICY'])")
    drop = ("OMP_NUM_THREADS", "NSA_THREADS", "OMP_WAIT_POLICY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["LOCAL_WORLD_SIZE"] = "1"
    one_cpu = {min(os.sched_getaffinity(0))}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=120, preexec_fn=lambda: os.sched_setaffinity(0, one_cpu))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1", "1", "PASSIVE"]  # one CPU allowed: one thread


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nproc", [None, 1, 2], ids=["by-hand", "torchrun-1", "torchrun-2"])
def test_every_launch_path_records_its_threads_and_logs_no_warning(tmp_path: Path, nproc: int | None) -> None:
    """nsa-train by hand and torchrun with 1 or 2 processes (the agent's launcher is torchrun: its
    test is tests/agent/test_e2e_local.py). The first line of the log is ours, not a FutureWarning."""
    done = run_train(tmp_path / "run", ONE_STEP, nproc=nproc, env={"OMP_NUM_THREADS": "7"})
    assert done.rc == 0, done.output[-3000:]
    usable = len(os.sched_getaffinity(0))
    rec = run_json(done.run_dir)["cpu_threads"]
    local = nproc or 1
    assert rec["usable_cpus"] <= usable and rec["local_ranks"] == local and rec["source"] == "auto"
    assert rec["per_rank"] == max(1, rec["usable_cpus"] // local)  # torchrun's OMP_NUM_THREADS ignored
    assert f"CPU threads per rank: {rec['per_rank']} (auto" in done.output
    assert "Warning" not in done.output, done.output[:2000]
