"""Checkpoints: full training state, written atomically, readable by any world size.

Layout of ``checkpoints/step-<N>/``: ``state.pt`` (full, unsharded model and optimizer
state dicts keyed by parameter name), ``ranks.pt`` (per-rank RNG states), ``meta.json``
(step, tokens, world size, batch geometry, data positions of every stream, resolved config)
written last. The directory is built under a temporary name and renamed into place, then
``checkpoints/latest`` is rewritten, then old checkpoints beyond ``keep`` are removed.

Why full state dicts (gathered through ``torch.distributed.checkpoint.state_dict`` for DDP
and FSDP2 alike): one format that loads on any world size and either strategy, which is what
the single-GPU fallback needs (LESSONS 13). Every rank reads the file on resume, so a
multi-node resume needs the checkpoint at the same path on every node.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from nsa.contract import write_json_atomic

STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, or does not fit this run."""


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                             "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def save(root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
         meta: dict[str, Any], rank_states: list[Any], keep: int, is_main: bool) -> Path | None:
    """Collective: every rank calls it. Rank 0 writes; returns the final path there."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
    final: Path | None = None
    if is_main:
        final = root / f"step-{step}"
        for stale in root.glob(".tmp-step-*") if root.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)  # a save that was killed half-way: space back
        tmp = root / f".tmp-step-{step}-{os.getpid()}-{int(time.time() * 1000)}"
        tmp.mkdir(parents=True)
        try:
            torch.save({"model": model_sd, "optimizer": optim_sd}, tmp / "state.pt")
            torch.save(rank_states, tmp / "ranks.pt")
            write_json_atomic(tmp / "meta.json", {**meta, "step": step, "saved_at": time.time()})
            _fsync_dir(tmp)
        except BaseException:
            # a partial checkpoint (a full disk) must not keep the disk full and block a resume
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():  # the same step saved again (e.g. a stop right after a save)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
        (root / ".latest.tmp").write_text(final.name + "\n")
        os.replace(root / ".latest.tmp", root / "latest")
        prune(root, keep, final.name)
    dist.barrier()
    return final


def complete_checkpoints(root: Path) -> list[Path]:
    """``step-N`` directories that have their ``meta.json`` (written last), oldest first."""
    found = []
    if root.is_dir():
        for p in root.iterdir():
            m = STEP_DIR.match(p.name)
            if m and p.is_dir() and (p / "meta.json").is_file() and (p / "state.pt").is_file():
                found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def prune(root: Path, keep: int, protect: str) -> None:
    for p in complete_checkpoints(root)[:-keep] if keep > 0 else []:
        if p.name != protect:
            shutil.rmtree(p, ignore_errors=True)


def find_latest(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``: ``latest`` if it is valid, else a scan."""
    try:
        name = (root / "latest").read_text().strip()
        p = root / name
        if STEP_DIR.match(name) and (p / "meta.json").is_file():
            newest = complete_checkpoints(root)
            if not newest or newest[-1] == p:
                return p
    except OSError:
        pass
    ckpts = complete_checkpoints(root)
    return ckpts[-1] if ckpts else None


def resolve(resume: str | None, run_dir: Path) -> Path | None:
    """``--resume auto``: this run directory's newest checkpoint, or None (a fresh start).
    ``--resume PATH``: a checkpoint directory, or a run/checkpoints directory to search."""
    if not resume:
        return None
    if resume == "auto":
        return find_latest(run_dir / "checkpoints")
    p = Path(resume).expanduser()
    if (p / "meta.json").is_file():
        return p
    for root in (p / "checkpoints", p):
        found = find_latest(root)
        if found is not None:
            return found
    raise CheckpointError(f"--resume {resume}: no complete checkpoint there")


def read_meta(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read meta.json ({exc})") from exc


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[Any]:
    """Load model and optimizer state into the (wrapped) model on every rank; returns the
    saved per-rank RNG states. Collective under FSDP2."""
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(full_state_dict=True))
    return torch.load(path / "ranks.pt", map_location="cpu", weights_only=False)
