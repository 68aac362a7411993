"""The single-file checkpoint format of earlier versions: read for runs written before DCP,
written only by the benchmark (bench/checkpoint_formats.py) and the compatibility test.

``step-N/state.pt``: ``{"model": full state dict, "optimizer": full optimizer state dict}``
keyed by parameter name, gathered to rank 0 and written by it alone; ``ranks.pt``: per-rank
RNG states (numpy and python objects too); ``meta.json`` as in the current format. Reading
uses ``torch.load(weights_only=True)``, which reads ``state.pt`` (tensors, numbers, strings,
lists, dicts) but not the numpy objects of ``ranks.pt``: the RNG states are not restored
(training draws no global random numbers; the data positions are in ``meta.json``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from nsa.contract import write_json_atomic
from nsa.contract.rundir import META_JSON
from nsa.train.checkpoint_error import CheckpointError


def save_single_file(final: Path, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any],
                     is_main: bool) -> None:
    """Collective: the full state gathered to rank 0, which writes ``final`` (tmp + rename)."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
    if is_main:
        tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{int(time.time() * 1000)}"
        tmp.mkdir(parents=True)
        torch.save({"model": model_sd, "optimizer": optim_sd}, tmp / "state.pt")
        torch.save([{"torch": torch.get_rng_state()}], tmp / "ranks.pt")
        write_json_atomic(tmp / META_JSON, {**meta, "saved_at": time.time()})
        os.rename(tmp, final)
    dist.barrier()


def load_single_file(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank reads the whole file (weights only) and takes its part."""
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}/state.pt: cannot load it with weights_only=True: {exc}") from exc
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(full_state_dict=True))
