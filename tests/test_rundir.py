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

