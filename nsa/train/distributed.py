"""Process group, device placement and model wrapping (DDP or FSDP2).

Always a process group, even for one process (a world of 1 through an in-memory store): one
code path for collectives and checkpoints. Explicit timeouts: a peer that stops answering
fails the collective after ``train.pg_timeout_s`` instead of hanging forever.
On CUDA the NCCL flight recorder is switched on and dumps into ``<run>/nccl/``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nsa.config import TrainConfig
from nsa.contract import DeviceInfo
from nsa.contract.rundir import NCCL


@dataclass
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    launched: bool  # under torchrun (or another launcher that sets RANK/WORLD_SIZE)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_ranks() -> tuple[int, int, int, bool]:
    """(rank, local_rank, world_size, launched) from torchrun's environment."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return (int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")),
                int(os.environ["WORLD_SIZE"]), True)
    return 0, 0, 1, False


def pick_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    """``device: auto`` is CUDA when available; the CUDA index is LOCAL_RANK."""
    want = cfg.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("train.device is cuda but no CUDA device is available")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def device_record(device: torch.device) -> DeviceInfo:
    """The heartbeat's ``device`` field: type, index and (CUDA) UUID."""
    if device.type == "cuda":
        uuid: str | None = None
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        except Exception:
            uuid = None
        return DeviceInfo(type="cuda", index=device.index, uuid=uuid)
    return DeviceInfo(type="cpu")


def enable_flight_recorder(run_dir: Path) -> None:
    """NCCL flight recorder: keep a trace of recent collectives and dump it on a timeout
    (and on demand by writing to ``nccl/pipe_<rank>.pipe``). Set before the group exists."""
    nccl = run_dir / NCCL
    nccl.mkdir(exist_ok=True)
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "20000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(nccl / "rank_"))
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", str(nccl / "pipe_"))
    os.environ.setdefault("TORCH_NCCL_ENABLE_MONITORING", "1")


def init(cfg: TrainConfig, run_dir: Path, device: torch.device) -> DistInfo:
    """Join (or create) the process group with the start timeout (Timeouts switches later)."""
    # Before the group exists: torch.distributed.nn.functional binds ``group=group.WORLD`` as
    # default arguments when first imported, and DDP imports it lazily. Imported after
    # init_process_group, it pins the default group for the life of the interpreter:
    # destroy_process_group can no longer free it, and gloo's threads and connections are torn
    # down in the middle of interpreter finalization instead of in close().
    import torch.distributed.nn  # noqa: F401

    rank, local_rank, world, launched = env_ranks()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        enable_flight_recorder(run_dir)
    timeout = timedelta(seconds=cfg.pg_timeout_start_s)
    kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
    if device.type == "cuda":
        kwargs["device_id"] = device
    if launched:
        dist.init_process_group(**kwargs)
    else:
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    return DistInfo(rank, local_rank, world, device, backend, launched)


def set_timeout(seconds: float) -> bool:
    """Change the default group's collective timeout; False where this torch cannot.
    ``_set_pg_timeout`` is torch's own (private since 2.3, present in 2.11 and 2.13)."""
    try:
        from torch.distributed.distributed_c10d import _set_pg_timeout
    except ImportError:
        return False
    _set_pg_timeout(timedelta(seconds=seconds))
    return True


class Timeouts:
    """The default group's timeout by phase: ``start_s`` until :meth:`steady` (after the first
    step), ``steady_s`` afterwards, ``start_s`` again inside :meth:`long` (checkpoint saves,
    the first eval). ``now`` says which is in force."""

    def __init__(self, start_s: float, steady_s: float, log: Any = None) -> None:
        self.start_s, self.steady_s = start_s, steady_s
        self.now = "start"
        self.log = log or (lambda msg: None)
        self.supported = True

    def steady(self) -> None:
        if self.now != "steady" and self.supported:
            self.supported = set_timeout(self.steady_s)
            if self.supported:
                self.now = "steady"
            else:
                self.log(f"process-group timeout stays {self.start_s:.0f} s: this torch cannot change it")

    @contextlib.contextmanager
    def long(self) -> Iterator[None]:
        was = self.now
        if was == "steady":
            set_timeout(self.start_s)
            self.now = "start"
        try:
            yield
        finally:
            if was == "steady":
                set_timeout(self.steady_s)
                self.now = "steady"


def wrap(model: nn.Module, strategy: str, info: DistInfo, bf16: bool = False) -> nn.Module:
    """DDP (replicated) or FSDP2 (each block sharded, then the root). Parameters, gradients
    and optimizer state stay fp32 either way; bf16 compute comes from autocast, and under
    FSDP2 also from its mixed-precision policy (bf16 all-gathers, fp32 gradient reduction).

    DDP on one process is the model itself: its reducer would copy every gradient into
    buckets and all-reduce them over a group of one, which changes nothing and cost 4-9 % of
    a 125M model's step on an H200. Checkpoints name parameters the same either way."""
    if strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        kwargs: dict[str, Any] = {}
        if bf16:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.get_submodule("blocks").children():
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return model
    if not replicates(strategy, info.world_size):
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    # The model's only buffers are per-rank gate statistics: broadcasting them from rank 0
    # before every forward would cost a collective per micro-batch for nothing.
    kwargs = {"device_ids": [info.device.index]} if info.device.type == "cuda" else {}
    kwargs.update(no_buffer_sync_kwargs())
    return DDP(model, **kwargs)


def replicates(strategy: str, world_size: int) -> bool:
    """Whether ``wrap`` puts a DDP wrapper around the model (not on one process)."""
    return strategy == "ddp" and world_size > 1


def no_buffer_sync_kwargs() -> dict[str, bool]:
    """DDP's "do not broadcast buffers before each forward" in this torch's words: torch 2.13
    renamed ``broadcast_buffers`` to ``forward_sync_buffers`` and warns on the old name (the
    first line of every run's log); GPU hosts may run an older torch without the new one. The
    new flag still syncs buffers once at init: ours are NaN placeholders then, equal everywhere."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def unwrap(model: nn.Module) -> nn.Module:
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) and hasattr(model, "no_sync") else model


def all_gather_objects(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def close() -> list[str]:
    """Orderly teardown on the success path: every rank reaches the barrier before any
    rank destroys the group (gloo can abort a rank that tears down while a peer still
    talks to it). Failure paths skip this and exit without handshakes.

    The group is freed here (gloo's worker and I/O threads joined, its connections closed)
    only if nothing else holds it: a DDP wrapper's reducer does, so drop the wrapped model
    first. Returns the gloo threads still alive after it (none when the group was freed):
    left to interpreter shutdown, they can abort the process after its work is done."""
    if not dist.is_initialized():
        return []
    if dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()
    return gloo_threads()


def gloo_threads() -> list[str]:
    """Names of this process's gloo threads (``pt_gloo_runloop`` workers, ``gloo_tcp_loop``);
    empty where /proc is not there to read."""
    names = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # a thread that just ended
            continue
        if "gloo" in name:
            names.append(name)
    return sorted(names)
