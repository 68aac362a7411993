"""The run directory's layout and rules (nsa/contract/rundir.py), on real files."""

from __future__ import annotations

import json
from pathlib import Path

from nsa.contract.rundir import (
    RunDir,
    complete_checkpoints,
    heartbeat_stream,
    is_complete_checkpoint,
    latest_checkpoint,
    rank_of_file,
    rank_of_stack_file,
    read_checkpoint_meta,
    stack_file,
    step_name,
    step_of,
)

# meta.json as the first trainer wrote it: no device_type, no files
OLD_META = {"tokens": 256, "world_size": 1, "grad_accum": 2, "batch_size": 2, "global_batch": 4,
            "seq_len": 64, "n_streams": 1, "data_positions": {"0": {"epoch": 0, "doc": 10, "offset": 3}},
            "config": {},
            "run_id": "exp-a1b2c3d4e5", "strategy": "ddp", "step": 2, "saved_at": 1.0}


def test_names_round_trip() -> None:
    assert rank_of_file(RunDir("/r").heartbeat(3).name) == 3
    assert rank_of_file("rank-3.jsonl.1") is None and rank_of_file("rank-x.jsonl") is None
    assert step_of(step_name(12)) == 12 and step_of(".tmp-step-12-5") is None
    assert rank_of_stack_file(stack_file(2, 1700)) == 2
    assert rank_of_stack_file(stack_file(2, 1700, py_spy=True), py_spy=False) is None
    assert rank_of_stack_file(stack_file(2, 1700, py_spy=True), py_spy=True) == 2
    assert heartbeat_stream(1) == f"{RunDir('.').heartbeats.name}/rank-1"


def test_a_checkpoint_is_complete_when_its_meta_json_is_there(tmp_path: Path) -> None:
    root = RunDir(tmp_path).checkpoints
    for step in (2, 4, 6):
        RunDir(tmp_path).checkpoint(step).mkdir(parents=True)
    (root / ".tmp-step-8-1").mkdir()
    for step in (2, 4):
        (RunDir(tmp_path).checkpoint(step) / "meta.json").write_text(json.dumps({**OLD_META, "step": step}))
    assert [p.name for p in complete_checkpoints(root)] == ["step-2", "step-4"]
    assert not is_complete_checkpoint(root / "step-6")
    (root / "latest").write_text("step-6\n")  # names an interrupted save: the scan decides
    assert latest_checkpoint(root) == root / "step-4"
    (root / "latest").write_text("step-2\n")  # older than the newest complete one
    assert latest_checkpoint(root) == root / "step-4"
    (root / "latest").write_text("step-4\n")
    assert latest_checkpoint(root) == root / "step-4"
    assert latest_checkpoint(tmp_path / "nowhere") is None


def test_every_version_of_meta_json_reads_as_the_struct(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps(OLD_META))
    meta = read_checkpoint_meta(tmp_path)
    assert meta is not None and meta.global_batch == 4 and meta.files == [] and meta.device_type is None
    (tmp_path / "meta.json").write_text('{"step": 5}')  # not a checkpoint the trainer wrote
    assert read_checkpoint_meta(tmp_path) is None


def test_the_status_sets_agree_with_the_status_methods() -> None:
    from nsa.contract import FAILED_STATUSES, LIVE_STATUSES, TERMINAL_STATUSES, UNHEALTHY_STATUSES, RunStatus

    assert LIVE_STATUSES == {s for s in RunStatus if s.is_alive()}
    assert TERMINAL_STATUSES == {s for s in RunStatus if s.is_terminal()}
    assert FAILED_STATUSES == {RunStatus.CRASHED, RunStatus.FAILED}
    assert FAILED_STATUSES < UNHEALTHY_STATUSES <= TERMINAL_STATUSES
    assert UNHEALTHY_STATUSES - FAILED_STATUSES == {RunStatus.LOST}


def test_a_new_run_id_has_the_one_format_and_old_ids_still_list(tmp_path: Path) -> None:
    from nsa.contract import RunInfo, RunStatus, write_json_atomic
    from nsa.contract.rundir import NEW_RUN_ID_RE, RUN_ID_RE, new_run_id
    from nsa_tui.agent.runs import RunStore

    new = new_run_id("my run/1", when=0.0, token="abcd")
    assert new == "19700101-000000-my-run-1-abcd" and NEW_RUN_ID_RE.match(new) and RUN_ID_RE.match(new)
    assert NEW_RUN_ID_RE.match(new_run_id("x" * 90)) and NEW_RUN_ID_RE.match(new_run_id("//"))
    old = ["exp-20250101-120000-a1b2c3", "exp-1a2b3c4d5e"]  # the trainer's earlier formats
    for rid in [new, *old]:
        (tmp_path / rid).mkdir()
        write_json_atomic(RunDir(tmp_path / rid).run_json,
                          RunInfo(run_id=rid, name="exp", status=RunStatus.FINISHED))
    store = RunStore(tmp_path)
    assert sorted(store.ids()) == sorted([new, *old])
    assert [store.view(rid).info.run_id for rid in old] == old  # type: ignore[union-attr]


def test_the_ranks_of_one_torchrun_agree_on_a_new_id_without_talking() -> None:
    """Two processes of one parent with one rendezvous id (two ranks of one torchrun) compute
    the same id, of the one format; a --rdzv-id that is a run id is taken as it is."""
    import os
    import subprocess
    import sys

    from nsa.contract.rundir import NEW_RUN_ID_RE

    code = "from nsa.train.cli import run_id_for; print(run_id_for('smoke'))"
    env = {k: v for k, v in os.environ.items() if k != "NSA_RUN_ID"}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")

    def rank_id(elastic: str) -> str:
        out = subprocess.run([sys.executable, "-c", code], env={**env, "TORCHELASTIC_RUN_ID": elastic},
                             capture_output=True, text=True, check=True, cwd=root)
        return out.stdout.strip()

    a, b = rank_id("rdzv-1"), rank_id("rdzv-1")
    assert a == b and NEW_RUN_ID_RE.match(a) and "-smoke-" in a, (a, b)
    assert rank_id("20260101-000000-exp-0a1b") == "20260101-000000-exp-0a1b"
