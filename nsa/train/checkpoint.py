"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): every rank writes its shard.

Layout of ``checkpoints/step-<N>/`` (docs/run-directory.md):
- ``__<R>_0.distcp``: rank R's shard (tensors only: model, optimizer state, rank R's RNG);
- ``.metadata``: DCP's index of every tensor, written by rank 0 once every rank's shard is
  written (DCP's own commit);
- ``meta.json``: ours, written last: step, tokens, world size, batch geometry, every data
  stream's position, the resolved config, the checkpoint's files. It is what makes a
  checkpoint complete.

The commit takes the checkpoint's files from the written directories themselves (every rank
lists what it sees, the lists are gathered), never from what ``dcp.save`` returns: that
changes between torch releases (torch 2.11's returned index has no ``storage_data``). It reads
``.metadata`` back through the same allow-listed reader a load uses, so a checkpoint that
could not be loaded is never committed. ``checkpoint_probe`` runs this whole path once before
the first step.

A save builds ``.tmp-step-<N>-<stamp>`` and renames it to ``step-<N>`` only after DCP's commit
and ``meta.json``; then ``latest`` is rewritten and old checkpoints beyond ``keep`` removed.
An interrupted save (a crash, a KILL) leaves a ``.tmp-`` directory that is never read and
is removed by the next save: it never becomes ``latest``.

Several nodes sharing the runs root (``NSA_SHARED_RUN_DIR=1``, set by the agent): one run
directory, every rank writes its shards once into the one ``.tmp-`` directory and rank 0
commits it; resume and fallback read it in place. Several nodes with runs roots of their own:
each node writes its own ranks' shards into its own run directory (rank 0's node also gets
``.metadata``) and each node's local rank 0 commits its directory; a load needs every file of
the checkpoint in one directory, so ``nsa-tui fallback``/``resume`` gather them first
(docs/multi-node.md).

Resume on any world size: DCP reshards on load (DDP and FSDP2 alike). Loading never runs
arbitrary pickles: shards are read by DCP with ``torch.load(weights_only=True)``, the state
holds no pickled objects, and ``.metadata`` is unpickled with an allow-list of DCP's own
record types. A checkpoint written by another model config is refused, naming the keys.
The single-file format of earlier versions (``state.pt``) is still read (checkpoint_legacy).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from nsa.contract import CheckpointMeta, ContractError, decode, write_json_atomic
from nsa.contract.rundir import (
    CHECKPOINT_TMP_PREFIX,
    CHECKPOINTS,
    LATEST,
    META_JSON,
    SHARED_ENV,
    complete_checkpoints,
    latest_checkpoint,
    step_name,
)

# re-exported: the trainer and callers catch it as checkpoint.CheckpointError
from nsa.train.checkpoint_error import CheckpointError as CheckpointError

# re-exported: the loaders read an index through it (one allow-list)
from nsa.train.checkpoint_index import DCP_METADATA as DCP_METADATA
from nsa.train.checkpoint_index import SafeReader as SafeReader
from nsa.train.checkpoint_index import check_index

TMP_PREFIX = CHECKPOINT_TMP_PREFIX
META = META_JSON
# the model keys that do not change the weights (which kernels compute them)
MODEL_KEYS_FREE = ("attention.backend",)


# -- RNG: tensors, so a shard holds nothing but tensors --------------------------------------
def rng_tensors(rank: int, device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's RNG states under keys of its own. Training draws no global numpy/python random
    numbers (data order comes from seeded generators and the saved positions): torch's only."""
    out = {f"rng/rank-{rank}/torch": torch.get_rng_state()}
    if device.type == "cuda":
        out[f"rng/rank-{rank}/cuda"] = torch.cuda.get_rng_state(device)
    return out


def _set_rng(state: dict[str, torch.Tensor], rank: int, device: torch.device) -> None:
    torch.set_rng_state(state[f"rng/rank-{rank}/torch"])
    key = f"rng/rank-{rank}/cuda"
    if device.type == "cuda" and key in state:
        torch.cuda.set_rng_state(state[key], device)


def _tensor_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], Any]:
    """(model and optimizer state as DCP sees it, the optimizer's param_groups). The param
    groups are left out of the checkpoint: they are the config's hyperparameters (the learning
    rate is set every step), and leaving them out keeps every saved leaf a tensor."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": {"state": optim_sd["state"]}}, optim_sd["param_groups"]


# -- files ------------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def prune(root: Path, keep: int, protect: str) -> None:
    """Remove complete checkpoints beyond the newest ``keep`` (never ``protect``)."""
    for p in complete_checkpoints(root)[:-keep] if keep > 0 else []:
        if p.name != protect:
            shutil.rmtree(p, ignore_errors=True)


def remove_interrupted(root: Path, keep: Path | None = None) -> None:
    """``.tmp-step-*`` directories of saves that never finished (a crash, a KILL)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for p in entries:
        if p.name.startswith(TMP_PREFIX) and p != keep:
            shutil.rmtree(p, ignore_errors=True)


# the one rule for a complete checkpoint is the contract's
find_latest = latest_checkpoint


def resolve(resume: str | None, run_dir: Path) -> Path | None:
    """``--resume auto``: this run directory's newest checkpoint, or None (a fresh start).
    ``--resume PATH``: a checkpoint directory, or a run/checkpoints directory to search."""
    if not resume:
        return None
    if resume == "auto":
        return find_latest(run_dir / CHECKPOINTS)
    p = Path(resume).expanduser()
    if (p / META).is_file():
        return p
    for root in (p / CHECKPOINTS, p):
        found = find_latest(root)
        if found is not None:
            return found
    raise CheckpointError(f"--resume {resume}: no complete checkpoint there")


def read_meta(path: Path) -> CheckpointMeta:
    """The checkpoint's meta.json, typed; CheckpointError when it is missing or not one."""
    try:
        data = (path / META).read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read {META} ({exc})") from exc
    try:
        return decode(data, CheckpointMeta, str(path / META))
    except ContractError as exc:
        raise CheckpointError(f"{path}: cannot read {META} ({exc})") from exc


def is_legacy(path: Path) -> bool:
    """The single-file format of earlier versions (state.pt + ranks.pt)."""
    return (path / "state.pt").is_file() and not (path / DCP_METADATA).is_file()


def missing_files(path: Path, meta: CheckpointMeta) -> list[str]:
    """Files of the checkpoint that are not in ``path`` (shards written on another node)."""
    return [f for f in meta.files if not (path / f).is_file()]


# -- the model config must be the same -------------------------------------------------------
def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def model_config_differences(saved: dict[str, Any] | None, mine: dict[str, Any]) -> list[str]:
    """``model.<key>: saved -> this run`` for every model key that differs (weights-neutral
    keys such as the attention backend excepted). Empty when they match."""
    if saved is None:
        return []
    a, b = _flat(saved), _flat(mine)
    out = []
    for key in sorted(set(a) | set(b)):
        if key in MODEL_KEYS_FREE:
            continue
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            out.append(f"model.{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}")
    return out


def check_model_config(path: Path, meta: CheckpointMeta, model_cfg: dict[str, Any]) -> None:
    saved = (meta.config or {}).get("model")
    diffs = model_config_differences(saved, model_cfg)
    if diffs:
        raise CheckpointError(f"{path} was written by another model config; differing keys (saved -> this "
                              f"run): {'; '.join(diffs)}")


# -- save -------------------------------------------------------------------------------------
class _Pending:
    """An async save under way: committed by its future's callback the moment the write ends
    (also while the training thread is busy or failing); ``done`` is set after the commit."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.done = threading.Event()
        self.error: BaseException | None = None


def is_committer(rank: int, local_rank: int) -> bool:
    """Whether this rank commits checkpoints: the one rank 0 when every node writes one shared
    run directory (DCP writes each shard once, into it), else each node's local rank 0 (its
    node's own directory)."""
    return rank == 0 if os.environ.get(SHARED_ENV) == "1" else local_rank == 0


class Checkpointer:
    """Saves of one run. Collective: every rank calls ``save``, ``poll`` and ``wait`` alike.

    ``committer``: this rank commits its node's directory (its node's local rank 0).
    ``use_async``: DCP ``async_save`` (tensors are copied to CPU memory, then written by a
    thread while training goes on; the commit follows as soon as the write ends).
    Checkpoint collectives run on a gloo group of their own, so a background write never
    interleaves with the training step's collectives (and works under NCCL too).
    """

    def __init__(self, root: Path, keep: int, committer: bool, use_async: bool, timeout_s: float,
                 log: Any = None, before_commit: Any = None, group: Any = None) -> None:
        self.root, self.keep, self.committer, self.use_async = root, keep, committer, use_async
        self.log = log or (lambda msg: None)
        self.before_commit = before_commit or (lambda step: None)  # fault injection (tests)
        # ``group``: another Checkpointer's (the start-up probe shares the run's)
        self.group = group if group is not None else dist.new_group(
            backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.pending: _Pending | None = None
        self.last_saved: str | None = None  # the newest committed checkpoint of this run

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, meta: CheckpointMeta,
             rank: int, device: torch.device, block: bool = False) -> None:
        """Write step ``step``. ``block``: return only once it is committed (a stop, the end)."""
        self.wait()  # one save at a time: the previous one is committed first
        if self.committer:
            remove_interrupted(self.root)  # a save killed half-way: its space back before this one
        t0 = time.time()
        stamp = broadcast_object(f"{int(t0 * 1000)}-{os.getpid()}", self.group)  # one name per node
        tmp, final = self.root / f"{TMP_PREFIX}{step}-{stamp}", self.root / step_name(step)
        state, _groups = _tensor_state(model, optimizer)
        state.update(rng_tensors(rank, device))
        meta = msgspec.structs.replace(meta, step=step)
        if self.use_async and not block:
            pending = _Pending(final)

            def written(fut: Future) -> None:
                try:
                    fut.result()  # the write's error, if any; its value is DCP's, and unused
                    self._commit(tmp, final, meta, t0)
                except BaseException as exc:  # handed to the training thread by wait()
                    pending.error = exc
                    self._discard(tmp)
                finally:
                    pending.done.set()

            fut = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self.group)
            self.pending = pending
            fut.add_done_callback(written)  # type: ignore[union-attr]
            return
        try:
            dcp.save(state, checkpoint_id=str(tmp), process_group=self.group)
            self._commit(tmp, final, meta, t0)
        except BaseException:
            self._discard(tmp)
            raise

    def _discard(self, tmp: Path) -> None:
        """A save that failed (a full disk): its partial files must not keep the disk full and
        block a resume."""
        if self.committer:
            shutil.rmtree(tmp, ignore_errors=True)

    def poll(self) -> None:
        """Raise the error of an async save that failed (every step; cheap)."""
        if self.pending is not None and self.pending.done.is_set():
            self.wait()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the pending async save (if any) is written and committed (or ``timeout``
        seconds have passed: then it is left to finish, or not, on its own)."""
        p, self.pending = self.pending, None
        if p is None:
            return
        if not p.done.wait(timeout):
            return
        if p.error is not None:
            raise CheckpointError(f"checkpoint {p.final.name} failed while being written: "
                                  f"{type(p.error).__name__}: {p.error}") from p.error

    def _commit(self, tmp: Path, final: Path, meta: CheckpointMeta, t0: float) -> None:
        """DCP has written every shard and ``.metadata``: write meta.json, rename, point latest.
        Collective on the checkpoint group (the file lists are gathered)."""
        self.before_commit(meta.step)
        files = written_files(tmp, self.group)
        self.last_saved = final.name
        if not self.committer:
            return
        check_index(tmp, files)
        write_json_atomic(tmp / META, msgspec.structs.replace(meta, files=files, saved_at=time.time()))
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again (e.g. a stop right after a save)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        (self.root / f".{LATEST}.tmp").write_text(final.name + "\n")
        os.replace(self.root / f".{LATEST}.tmp", self.root / LATEST)
        prune(self.root, self.keep, final.name)
        remove_interrupted(self.root)
        self.log(f"checkpoint {final} ({time.time() - t0:.1f} s)")

    def close(self) -> None:
        """Finish a pending save (the run ends)."""
        self.wait()


def listing(directory: Path) -> list[str]:
    """The files a save left in ``directory`` (paths relative to it), without our ``meta.json``
    and without files still being written (``*.tmp``)."""
    out = []
    for parent, _dirs, names in os.walk(directory):
        for name in names:
            rel = os.path.relpath(os.path.join(parent, name), directory)
            if rel != META and not name.endswith(".tmp"):
                out.append(rel)
    return sorted(out)


def written_files(tmp: Path, group: Any) -> list[str]:
    """Every file of the checkpoint being committed, over every node: each rank lists ``tmp``
    as it sees it (its node's directory, or the one shared directory) and the lists are
    gathered. DCP's save has returned on every rank, so every shard and ``.metadata`` are
    written. Collective on ``group``."""
    lists: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(lists, listing(tmp), group=group)
    files = sorted({name for part in lists for name in part})
    if DCP_METADATA not in files:
        raise CheckpointError(f"{tmp}: the save wrote no {DCP_METADATA} (torch {torch.__version__}): "
                              f"files written: {', '.join(files) or 'none'}")
    return files


def broadcast_object(obj: Any, group: Any = None) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


# -- load -------------------------------------------------------------------------------------
def load(path: Path, meta: CheckpointMeta, model: nn.Module, optimizer: torch.optim.Optimizer,
         rank: int, device: torch.device) -> str | None:
    """Load model, optimizer and RNG into the (wrapped) model on every rank: DCP reshards the
    saved world size onto this one. Collective. Returns a note for the log, or None."""
    if is_legacy(path):
        from nsa.train.checkpoint_legacy import load_single_file

        load_single_file(path, model, optimizer)
        return f"{path} is a single-file checkpoint of an earlier version: RNG states not restored"
    missing = missing_files(path, meta)
    if missing:
        raise CheckpointError(
            f"{path}: files of this checkpoint are missing: {', '.join(missing)} (written on another node: "
            "gather them into this directory first, or keep checkpoints on a shared filesystem; "
            "docs/multi-node.md)")
    state, groups = _tensor_state(model, optimizer)
    if not state["optim"]["state"]:  # DCP would load none of it, silently: AdamW would start over
        raise CheckpointError(
            f"{path}: cannot restore the optimizer: it has no state to load into (DCP creates it only "
            "while no parameter has a gradient, and one had)")
    old_world = meta.world_size
    src = min(rank, old_world - 1)  # a grown world: the new ranks take the last rank's RNG
    rng = {k.replace(f"rng/rank-{rank}/", f"rng/rank-{src}/", 1): v
           for k, v in rng_tensors(rank, device).items()}
    if device.type == "cuda" and meta.device_type != "cuda":
        rng = {k: v for k, v in rng.items() if not k.endswith("/cuda")}
    state.update(rng)
    try:
        dcp.load(state, storage_reader=SafeReader(str(path)))
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as exc:  # DCP's own error is a BaseException
        raise CheckpointError(f"{path}: cannot load: {type(exc).__name__}: {exc}") from exc
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict={"state": state["optim"]["state"], "param_groups": groups})
    with contextlib.suppress(KeyError):
        _set_rng(state, src, device)
    return None
