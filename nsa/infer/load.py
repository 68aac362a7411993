"""A run's checkpoint as a model to decode with, in one process, without a process group.

The model is built from the config saved in the checkpoint's ``meta.json`` (the resolved
config the run trained with, so the weights fit), and only its weights are read: DCP
reshards whatever world size wrote them onto this single process, and the optimizer state
and RNG states stay on disk.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from nsa.config import Config, config_from_dict
from nsa.contract.records import CheckpointMeta
from nsa.contract.rundir import CHECKPOINTS, META_JSON, step_name, step_of
from nsa.model.transformer import Transformer, build_model
from nsa.train.checkpoint import (
    CheckpointError,
    SafeReader,
    complete_checkpoints,
    is_legacy,
    missing_files,
    read_meta,
)


class NoCheckpoint(CheckpointError):
    """The run has no complete checkpoint, or none at the step asked for."""


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the run's complete checkpoints, oldest first."""
    steps = (step_of(p.name) for p in complete_checkpoints(run_dir / CHECKPOINTS))
    return [s for s in steps if s is not None]


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    """``checkpoints/step-<step>`` of the run (None: the newest complete one). A run without
    one, or a step it does not have, is a NoCheckpoint naming the steps that exist."""
    ckpts = complete_checkpoints(run_dir / CHECKPOINTS)
    if not ckpts:
        raise NoCheckpoint(f"{run_dir.name} has no complete checkpoint yet (one is written every "
                              "train.save_every steps)")
    if step is None:
        return ckpts[-1]
    for p in ckpts:
        if p.name == step_name(step):
            return p
    steps = ", ".join(str(s) for s in checkpoint_steps(run_dir))
    raise NoCheckpoint(f"{run_dir.name} has no checkpoint at step {step}; its checkpoints are at "
                          f"steps {steps}")


def load_model(path: Path, device: torch.device | str = "cpu") -> tuple[Transformer, Config, CheckpointMeta]:
    """(the model with the checkpoint's weights, in eval mode on ``device``; the run's config;
    meta.json). Off CUDA the attention backend is the reference (weights-neutral)."""
    device = torch.device(device)
    meta = read_meta(path)
    raw = meta.config
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: {META_JSON} holds no config: cannot build the model that wrote it")
    cfg = config_from_dict(raw, str(path / META_JSON))
    if device.type != "cuda" and cfg.model.attention.backend == "triton":
        cfg.model.attention = dataclasses.replace(cfg.model.attention, backend="reference")
    model = build_model(cfg.model)
    if is_legacy(path):
        try:
            state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{path}/state.pt: cannot load it with weights_only=True: {exc}") from exc
        model.load_state_dict(state["model"])
    else:
        missing = missing_files(path, meta)
        if missing:
            raise CheckpointError(f"{path}: files of this checkpoint are missing: {', '.join(missing)} "
                                  "(written on another node: gather them first, docs/multi-node.md)")
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        try:
            with warnings.catch_warnings():  # "no process group: loading in one process" is the point
                warnings.simplefilter("ignore", UserWarning)
                dcp.load({"model": sd}, storage_reader=SafeReader(str(path)))
        except CheckpointError:
            raise
        except (Exception, CheckpointException) as exc:  # DCP's own is a BaseException
            lines = str(exc).strip().splitlines()  # DCP's holds each rank's traceback: its last line says why
            why = lines[-1] if lines else type(exc).__name__
            raise CheckpointError(f"{path}: cannot load: {why}") from exc
        model.load_state_dict(sd)
    return model.to(device).eval(), cfg, meta
