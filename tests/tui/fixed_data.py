"""Deterministic panel state for snapshot tests: fixed clock, fixed runs, metrics, log, GPUs.

Everything here is the contract's records (nsa.contract), as the agents send them, applied
through the panel's reducer, so a snapshot changes only when the panel's drawing does.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from nsa.contract import (
    Alert,
    Beat,
    DeviceInfo,
    EvalMetric,
    ExitInfo,
    GateShares,
    GpuReading,
    Hello,
    HostSample,
    LaunchInfo,
    Phase,
    RunInfo,
    RunStatus,
    RunView,
    TrainMetric,
)
from nsa.contract.protocol import PROTOCOL
from nsa.contract.records import Usage
from nsa.contract.replies import AlertList, AlertState
from nsa_tui import __version__
from nsa_tui.app import reducer
from nsa_tui.app.state import PanelState

NOW = 1_800_000_000.0
GIB = 1024**3


def make_alert(**fields: Any) -> Alert:
    """A real Alert (nsa.contract), as the detector makes them."""
    return Alert(**fields)


def view(run_id: str, name: str, status: str, *, alive: bool = False, launch: LaunchInfo | None = None,
         exit_code: int | None = None, **info: Any) -> RunView:
    """A RunView as an agent sends it."""
    st = RunStatus(status)
    ri = RunInfo(run_id=run_id, name=name, status=st if st != RunStatus.CRASHED else RunStatus.RUNNING,
                 **info)
    return RunView(run_id=run_id, dir=f"/runs/{run_id}", name=name, status=st, info=ri, launch=launch,
                   exit=ExitInfo(exit_code=exit_code) if exit_code is not None else None, alive=alive,
                   parent_run=ri.parent_run, created=launch.created if launch else (ri.started_at or 0.0))


def fixed_state(with_alert: bool = True) -> PanelState:
    state = PanelState.for_destinations(["local"], clock=lambda: NOW)
    host = state.host("local")
    host.conn = "connected"
    host.hello = Hello(agent=PROTOCOL, nsa_tui=__version__, host="trainbox", gpus=2)
    reducer.host_sample(state, "local", HostSample(
        ts=NOW, cpu_pct=37.5, ram=Usage(used_bytes=int(21.3 * GIB), total_bytes=int(125.7 * GIB)),
        disk=Usage(used_bytes=412 * GIB, total_bytes=1800 * GIB), gpu_message="",
        gpus=[GpuReading(index=0, name="NVIDIA A100", uuid="GPU-a", mem_used_bytes=int(61.2 * GIB),
                         mem_total_bytes=80 * GIB, util_pct=97, power_w=312.4, temp_c=64),
              GpuReading(index=1, name="NVIDIA A100", uuid="GPU-b", mem_used_bytes=int(60.9 * GIB),
                         mem_total_bytes=80 * GIB, util_pct=96, power_w=None, temp_c=63)]))
    cfg = {"model": {"dim": 768, "n_layers": 12, "attention": {"kind": "nsa"}},
           "train": {"seq_len": 2048, "warmup_steps": 200}, "data": {"source": "fineweb-edu"}}
    parent_id = "20261121T180000Z-nsa-125m"
    run_id = "20261121T192000Z-nsa-125m-1gpu"
    old_id = "20261120T090000Z-tiny-cpu"
    reducer.run_view(state, "local", view(
        parent_id, "nsa-125m", "stopped", config_path="configs/nsa-125m.yaml", param_count=124_900_000,
        world_size=2, started_at=NOW - 7200, ended_at=NOW - 1900, step=1500, total_steps=50000,
        batch_size=8, grad_accum=1, global_batch=16, seq_len=2048, dtype="bfloat16", device="cuda:0",
        train_flops_per_token=2.1e9))
    reducer.run_view(state, "local", view(
        run_id, "nsa-125m-1gpu", "running", alive=True, config_path="configs/nsa-125m.yaml", config=cfg,
        param_count=124_900_000, world_size=1, batch_size=8, grad_accum=2, global_batch=16, seq_len=2048,
        dtype="bfloat16", device="cuda", data_source="fineweb-edu", started_at=NOW - 1800, step=2400,
        total_steps=50000, tokens=78_643_200, parent_run=parent_id, train_flops_per_token=2.1e9,
        resumed_from="runs/20261121T180000Z-nsa-125m/checkpoints/step-1500"))
    reducer.run_view(state, "local", view(
        old_id, "tiny-cpu", "finished", config_path="configs/tiny-cpu.yaml", param_count=1_020_000,
        world_size=1, started_at=NOW - 120000, step=600, total_steps=600))
    parent, run = host.runs[parent_id], host.runs[run_id]
    for step in range(1, 1501):
        parent.metrics.add(TrainMetric(ts=NOW, step=step, loss=5.6 * math.exp(-step / 600) + 1.9,
                                       tokens_per_s=41000 + 800 * math.sin(step / 40)))
    for step in range(1501, 2401):
        run.metrics.add(TrainMetric(
            ts=NOW, step=step, loss=5.6 * math.exp(-step / 600) + 1.9, lr=5.8e-4,
            tokens_per_s=23000 + 500 * math.sin(step / 40), step_time_s=1.42, tokens=step * 16 * 2048,
            grad_norm=0.8 + 0.1 * math.cos(step / 30), mem_allocated_bytes=int((52.0 + step / 1000) * GIB),
            gate_shares=GateShares(compressed=0.27, selected=0.46, window=0.27)))
        if step % 250 == 0:
            run.metrics.add(EvalMetric(ts=NOW, step=step, val_loss=5.6 * math.exp(-step / 600) + 2.0))
    for step in (250, 500, 750, 1000, 1250, 1500):
        parent.metrics.add(EvalMetric(ts=NOW, step=step, val_loss=5.6 * math.exp(-step / 600) + 2.0))
    run.beats[0] = Beat(ts=NOW - 1, run_id=run_id, rank=0, phase=Phase.TRAIN, phase_since=NOW - 1500,
                        step=2400, device=DeviceInfo(type="cuda", index=0, uuid="GPU-a"), source="step")
    lines = [f"step {s} | loss {5.6 * math.exp(-s / 600) + 1.9:.4f} | 23.1k tok/s" for s in range(2380, 2401)]
    lines.insert(5, "WARNING: NCCL_ASYNC_ERROR_HANDLING is deprecated")
    lines.insert(9, "RuntimeError: example error line, highlighted in red")
    run.log.append_many(lines)
    if with_alert:  # as the host's watchdog recorded them (alerts.jsonl), one open, one resolved
        stall = make_alert(
            kind="stall", severity="critical", host="local", run=parent.run_id, rank=1, gpu=1, phase="train",
            last_step=1500, heartbeat_age_s=312.0, log_tail=["step 1500 | loss 2.11"],
            message="rank 1 has not advanced for 5m12s (timer beats continue: hung collective?)",
            suggested_actions=["dump", "fallback"], evidence=["stacks/watchdog-1.txt", "stacks/rank-1-1.txt"])
        disk = make_alert(kind="disk", severity="warning", host="local", run=parent.run_id,
                          message="disk of the runs root nearly full: 9.1 GiB free of 1.8 TiB")
        reducer.recorded_alerts(state, "local", AlertList(alerts=[
            AlertState(id="1-disk", run=parent.run_id, state="resolved", raised_at=NOW - 2500,
                       updated_at=NOW - 2400, resolved_at=NOW - 2400, alert=disk),
            AlertState(id="2-stall", run=parent.run_id, state="open", raised_at=NOW - 2000,
                       updated_at=NOW - 1990, alert=stall)]))
    state.selected = ("local", run.run_id)
    return state


def two_hosts_state() -> PanelState:
    """The fixed state plus a second host, reconnecting, whose selected run crashed."""
    state = fixed_state(with_alert=False)
    gpu2 = state.host("gpu2")
    gpu2.conn, gpu2.retry_at = "reconnecting", NOW + 7
    gpu2.hello = Hello(agent=PROTOCOL, nsa_tui=__version__, host="gpu2", gpus=8)
    gpu2.runs_loaded = True
    rid = "20261121T195000Z-dense-125m"
    launch = LaunchInfo(run_id=rid, name="dense-125m", created=NOW - 905,
                        config_file="configs/dense-125m.yaml")
    reducer.run_view(state, "gpu2", view(
        rid, "dense-125m", "crashed", launch=launch, exit_code=1, config_path="configs/dense-125m.yaml",
        param_count=124_400_000, world_size=8, started_at=NOW - 900, step=311, total_steps=50000))
    run = gpu2.runs[rid]
    run.log.append_many(["step 311 | loss 3.912", "Traceback (most recent call last):",
                         '  File "nsa/train/trainer.py", line 301, in step',
                         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                         "nsa-tui supervise: command exited with 1"])
    state.alerts.append(make_alert(
        kind="crash", severity="critical", host="gpu2", run=run.run_id, phase="train", last_step=311,
        log_tail=["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
        message="processes exited with code 1 without a final status", suggested_actions=["logs", "resume"]))
    state.selected = ("gpu2", run.run_id)
    return state


def eight_gpus_state() -> PanelState:
    """The fixed state on a host with 8 GPUs; the selected run has a rank on each (one GPU's
    memory nearly full, one without a power reading)."""
    state = fixed_state(with_alert=False)
    host = state.host("local")
    name = "NVIDIA H100 80GB HBM3"
    host.hello = Hello(agent=PROTOCOL, nsa_tui=__version__, host="trainbox", gpus=8, gpu_names=[name] * 8)
    gpus = [GpuReading(index=i, name=name, uuid=f"GPU-{i}", mem_total_bytes=80 * GIB,
                       mem_used_bytes=int((78.9 if i == 5 else 61.0 + i / 10) * GIB),
                       util_pct=97 - i, power_w=None if i == 3 else 610.0 + i, temp_c=60 + i)
            for i in range(8)]
    reducer.host_sample(state, "local", HostSample(
        ts=NOW, cpu_pct=61.0, cpu_count=96, ram=Usage(used_bytes=int(412 * GIB), total_bytes=2015 * GIB),
        disk=Usage(used_bytes=2900 * GIB, total_bytes=7000 * GIB), gpus=gpus))
    run = state.selected_run()
    assert run is not None and run.view is not None
    info = msgspec.structs.replace(run.view.info, world_size=8, batch_size=1, grad_accum=2)
    reducer.run_view(state, "local", msgspec.structs.replace(run.view, info=info))
    for i in range(8):
        run.beats[i] = Beat(ts=NOW - 1, run_id=run.run_id, rank=i, local_rank=i, world_size=8,
                            phase=Phase.TRAIN, phase_since=NOW - 1500, step=2400, source="step",
                            device=DeviceInfo(type="cuda", index=i, uuid=f"GPU-{i}"))
    return state


def compare_state() -> PanelState:
    """NSA (a 2-GPU run and its 1-GPU fallback) against a dense run of the same size, all three
    marked and compared. The dense run has 4,000 steps (more than a summary's 2,048 buckets:
    its chart is bucket means with their min/max), a one-step loss spike and a NaN gradient
    norm."""
    state = fixed_state(with_alert=False)
    host = state.host("local")
    rid = "20261121T100000Z-dense-125m"
    reducer.run_view(state, "local", view(
        rid, "dense-125m", "finished", config_path="configs/dense-125m.yaml", param_count=124_400_000,
        world_size=2, batch_size=8, grad_accum=1, global_batch=16, seq_len=2048, dtype="bfloat16",
        device="cuda:0", started_at=NOW - 30000, ended_at=NOW - 9000, step=4000, total_steps=4000,
        train_flops_per_token=2.3e9))
    dense = host.runs[rid]
    for step in range(1, 4001):
        loss = 5.6 * math.exp(-step / 700) + 2.15 + 0.03 * math.sin(step / 7)
        dense.metrics.add(TrainMetric(
            ts=NOW, step=step, loss=9.5 if step == 2600 else loss, tokens=step * 16 * 2048,
            tokens_per_s=61000 + 900 * math.sin(step / 90), lr=6e-4 * min(1.0, step / 200),
            grad_norm=float("nan") if step == 3000 else 0.9 + 0.2 * math.cos(step / 50)))
        if step % 500 == 0:
            dense.metrics.add(EvalMetric(ts=NOW, step=step, val_loss=5.6 * math.exp(-step / 700) + 2.25))
    for run_id in ("20261121T180000Z-nsa-125m", "20261121T192000Z-nsa-125m-1gpu", rid):
        reducer.toggle_mark(state, "local", run_id)
    reducer.set_compare(state, True)
    return state


def many_runs_state() -> PanelState:
    """Fourteen runs: lineages of resumes, two archived, long names cut in the middle."""
    state = fixed_state(with_alert=False)
    statuses = ("finished", "stopped", "crashed", "failed")
    ids = [f"20261119T{10 + i:02d}0000Z-ablation-window-{64 * (i + 1)}" for i in range(11)]
    for i, rid in enumerate(ids):
        parent = ids[i - 1] if i % 4 == 3 else None
        name = f"ablation-window-{64 * (i + 1)}-seed{i % 3}" + ("-resume" if parent else "")
        reducer.run_view(state, "local", view(
            rid, name, statuses[i % 4], config_path="configs/nsa-125m.yaml", param_count=124_900_000,
            world_size=2, started_at=NOW - 90000 + i * 3000, step=100 * i, parent_run=parent))
    for rid in (ids[1], ids[5]):
        old = state.host("local").runs[rid].view
        assert old is not None
        reducer.run_view(state, "local", msgspec.structs.replace(old, archived=True))
    return state
