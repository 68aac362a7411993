"""Prove, before the first step, that checkpoints work on this host with this torch.

A run whose first save fails has trained for nothing up to that save (an hour, with
``save_every: 1000``). So at start every rank saves, commits and loads a tiny model and its
optimizer state through the run's own ``Checkpointer`` (its process group, its async mode, its
committers, DCP and the allow-listed reader) into a scratch directory under the run's
``checkpoints/``, checks that what comes back is what was saved, and removes the directory.
A failure ends the run before step 1, naming the torch version.

The probe draws no random numbers the run would see (the RNG is forked) and touches neither
the run's model nor its ``latest``. Its directory starts with the prefix of an interrupted
save, so a probe killed half-way is removed by the next save like one.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from nsa.contract import CheckpointMeta
from nsa.contract.rundir import CHECKPOINT_TMP_PREFIX, latest_checkpoint, step_name
from nsa.train import distributed as D
from nsa.train.checkpoint import (
    Checkpointer,
    CheckpointError,
    broadcast_object,
    load,
    missing_files,
    read_meta,
)

PROBE_PREFIX = f"{CHECKPOINT_TMP_PREFIX}probe-"
PROBE_STEP = 1


class _ProbeModel(nn.Module):
    """Two blocks, so FSDP2 shards it the way it shards the real model (per block, then the root)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return x


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (an FSDP2 DTensor's shard, or the tensor)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter and every optimizer-state tensor, in a fixed order."""
    out: list[torch.Tensor] = list(model.parameters())
    for p in model.parameters():
        for _key, value in sorted(optimizer.state.get(p, {}).items()):
            if isinstance(value, torch.Tensor):
                out.append(value)
    return [_local(t) for t in out]


def prove(ckpt: Checkpointer, strategy: str, info: D.DistInfo, bf16: bool,
          log: Callable[[str], None]) -> float:
    """Save, commit and load a tiny model and its AdamW state through ``ckpt``'s path, then
    remove it. Collective (every rank). Returns the seconds it took; raises CheckpointError,
    naming torch's version, when any part fails."""
    t0 = time.time()
    name = broadcast_object(f"{PROBE_PREFIX}{int(t0 * 1000)}-{os.getpid()}", ckpt.group)
    scratch = ckpt.root / name
    how = "an async" if ckpt.use_async else "a blocking"
    try:
        note = _save_and_load(ckpt, scratch, strategy, info, bf16)
    except (Exception, CheckpointException) as exc:  # DCP's own error is a BaseException
        if ckpt.committer:
            shutil.rmtree(scratch, ignore_errors=True)
        raise CheckpointError(
            f"checkpoints do not work on this host with torch {torch.__version__}: {how} save, commit "
            f"and load of a tiny model into {scratch} failed before the first step (nothing was "
            f"trained): {type(exc).__name__}: {exc}") from exc
    dist.barrier(group=ckpt.group)  # every rank has loaded: the directory can go
    if ckpt.committer:
        shutil.rmtree(scratch, ignore_errors=True)
    dist.barrier(group=ckpt.group)  # and is gone when any rank goes on
    seconds = time.time() - t0
    log(f"checkpoints: {how} save, commit and load proven in {ckpt.root} before the first step "
        f"(torch {torch.__version__}, {seconds:.1f} s){note}")
    return seconds


def _save_and_load(ckpt: Checkpointer, scratch: Any, strategy: str, info: D.DistInfo, bf16: bool) -> str:
    devices = [info.device] if info.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        model = D.wrap(_ProbeModel().to(info.device), strategy, info, bf16=bf16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.ones(2, 8, device=info.device)).sum().backward()
        optimizer.step()  # optimizer state to save (exp_avg, exp_avg_sq, step)
        optimizer.zero_grad(set_to_none=True)
        saved = [t.detach().clone() for t in _tensors(model, optimizer)]
        probe = Checkpointer(scratch, keep=1, committer=ckpt.committer, use_async=ckpt.use_async,
                             timeout_s=0, group=ckpt.group)
        meta = CheckpointMeta(step=PROBE_STEP, tokens=0, world_size=info.world_size, grad_accum=1,
                              batch_size=1, global_batch=info.world_size, seq_len=1,
                              n_streams=info.world_size, data_positions={}, strategy=strategy,
                              device_type=info.device.type)
        probe.save(PROBE_STEP, model, optimizer, meta, info.rank, info.device)
        probe.wait()  # an async save: written and committed
        dist.barrier(group=ckpt.group)  # every committer has renamed its directory
        path = scratch / step_name(PROBE_STEP)
        if ckpt.committer and latest_checkpoint(scratch) != path:
            raise CheckpointError(f"the committed checkpoint is not {path}'s latest")
        meta = read_meta(path)
        absent = D.all_gather_objects(bool(missing_files(path, meta)))
        if any(absent):  # runs roots of their own per node: a load needs the files gathered first
            return "; load not tried: each node holds only its own shards (docs/multi-node.md)"
        with torch.no_grad():
            for t in _tensors(model, optimizer):
                t.zero_()  # so that a load that reads nothing is caught
        load(path, meta, model, optimizer, info.rank, info.device)
        got = _tensors(model, optimizer)
        wrong = sum(1 for a, b in zip(saved, got) if not torch.equal(a, b)) + abs(len(saved) - len(got))
        if wrong:
            raise CheckpointError(f"{wrong} of {len(saved)} tensors loaded back differ from the ones saved")
    return ""
