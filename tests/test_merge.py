"""One run over several hosts merged into one status (nsa_tui/hosts/merge.py), pure: the
parts as the hosts' agents report them."""

from __future__ import annotations

from nsa.contract import Beat, LaunchInfo, NodeLayout, Phase, RunInfo, RunStatus, RunView
from nsa_tui.hosts.merge import Part, merge

RID = "20261127-100000-two-hosts-0001"
LAYOUT = NodeLayout(hosts=["gpu1", "gpu2"], nnodes=2, node_rank=1, rdzv_endpoint="gpu1:29400")


def part_view(status: RunStatus, with_run_json: bool) -> RunView:
    """A host's part: rank 0's host has run.json (the trainer's pid); the other's view of the
    run is made from its launch alone."""
    info = RunInfo(run_id=RID, name="two", status=status, pid=4242 if with_run_json else None)
    return RunView(run_id=RID, dir=f"/r/{RID}", name="two", status=status, info=info, alive=True,
                   launch=LaunchInfo(run_id=RID, name="two", nproc=1, nodes=LAYOUT, created=1.0), created=1.0)


def beat(rank: int, step: int) -> Beat:
    return Beat(ts=1.0, run_id=RID, rank=rank, step=step, phase=Phase.TRAIN if step else Phase.BOOT)


def test_a_run_whose_rank_0_host_is_unreachable_runs_while_the_other_ranks_train() -> None:
    lost = Part(host="gpu1", reachable=False, why="host down")
    training = Part(host="gpu2", view=part_view(RunStatus.STARTING, with_run_json=False), beats=[beat(1, 7)])
    m = merge(RID, [lost, training])
    assert m.status == RunStatus.RUNNING and m.lost == {"gpu1": "host down"} and m.problem is None
    booting = Part(host="gpu2", view=part_view(RunStatus.STARTING, with_run_json=False), beats=[beat(1, 0)])
    assert merge(RID, [lost, booting]).status == RunStatus.STARTING  # no step yet: it may not start


def test_rank_0_hosts_status_is_the_runs_while_it_is_reachable() -> None:
    primary = Part(host="gpu1", view=part_view(RunStatus.STOPPING, with_run_json=True), beats=[beat(0, 9)])
    other = Part(host="gpu2", view=part_view(RunStatus.STARTING, with_run_json=False), beats=[beat(1, 9)])
    assert merge(RID, [primary, other]).status == RunStatus.STOPPING
    assert merge(RID, [other, primary]).primary == "gpu1"
