"""What each agent operation takes: one struct of arguments per op (docs/agent-protocol.md).

Every struct forbids unknown fields, so a misspelt argument is a bad request, not a default.
The agent validates a request's ``args`` against its op's struct before anything runs.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal

import msgspec

from nsa.contract.appended import StreamPos
from nsa.contract.records import (
    NodeLayout,
    Record,
)
from nsa.contract.slurm import SlurmRequest

# -- request arguments --------------------------------------------------------------------------
# what a ``watch`` can stream: the run's status, its ranks' heartbeats, its metrics, its log
WatchStream = Literal["status", "heartbeats", "metrics", "log"]
WATCH_STREAMS: tuple[WatchStream, ...] = typing.get_args(WatchStream)


class WatchArgs(Record, kw_only=True, forbid_unknown_fields=True):
    """``watch``: what of a run to stream. Bounded: the latest beat of each rank, the metrics as
    a summary plus the ``recent_metrics`` last lines, the log's last ``log_tail_bytes``; then
    live lines. ``offsets`` resumes streams (after a reconnect) when little was missed."""

    run: str
    streams: list[WatchStream] | None = None
    offsets: dict[str, StreamPos] = {}
    summary_points: int = 512
    recent_metrics: int = 512
    log_tail_bytes: int = 256 * 1024


class Args(Record, kw_only=True, forbid_unknown_fields=True):
    """Base of request arguments: an unknown argument is a bad request."""


class NoArgs(Args, kw_only=True, forbid_unknown_fields=True):
    pass


class RunArgs(Args, kw_only=True, forbid_unknown_fields=True):
    run: str


class KillArgs(Args, kw_only=True, forbid_unknown_fields=True):
    run: str
    grace_s: float = 60.0


class ResumeArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``resume``; across hosts the client gives every host the same new ``run_id`` and its
    ``nodes`` layout, and the checkpoint (a ``step-N`` of the run) complete on all of them."""

    run: str
    nproc: int | None = None
    checkpoint: str | None = None
    run_id: str | None = None
    nodes: NodeLayout | None = None


class FallbackArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``fallback``: stop, then relaunch on ``nproc`` processes of this host (1: one GPU) from
    ``checkpoint`` (default: the newest complete one) with the same global batch."""

    run: str
    grace_s: float = 60.0
    nproc: int | None = None
    checkpoint: str | None = None


class ArchiveArgs(Args, kw_only=True, forbid_unknown_fields=True):
    run: str
    archived: bool = True  # False: take it out of the archive


class DeleteArgs(Args, kw_only=True, forbid_unknown_fields=True):
    run: str
    dry_run: bool = False  # only say what deleting would free


class ReadLogArgs(Args, kw_only=True, forbid_unknown_fields=True):
    run: str
    offset: int = 0
    max_bytes: int = 1 << 20
    file: Literal["train.log", "metrics.jsonl"] = "train.log"  # metrics.jsonl: for exports


class WatchHostArgs(Args, kw_only=True, forbid_unknown_fields=True):
    interval_s: float = 1.0


class UnwatchArgs(Args, kw_only=True, forbid_unknown_fields=True):
    sub: int | str


class LaunchArgs(Args, kw_only=True, forbid_unknown_fields=True):
    config_path: str | None = None
    config_text: str | None = None
    nproc: int | None = None
    overrides: list[str] = []
    name: str | None = None
    run_id: str | None = None  # several hosts: the id the client chose for every host
    nodes: NodeLayout | None = None  # several hosts: this host's place among them
    on_failure: str | None = None  # the config's on_failure.action for this run
    force: bool = False  # start even when ``describe`` finds a problem (the probe may be wrong)
    slurm: SlurmRequest | None = None  # submit as a Slurm batch job from this login node


class DescribeArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``describe``: the config as ``launch`` would get it, nothing started."""

    config_path: str | None = None
    config_text: str | None = None
    nproc: int | None = None
    overrides: list[str] = []


class PlanArgs(Args, kw_only=True, forbid_unknown_fields=True):
    run: str
    action: Literal["kill", "fallback", "resume"]


class PreflightArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``preflight``: can this host take part in a run? Starts nothing. ``port``: test that the
    rendezvous port is free here (None: choose a free one); the config is validated as a
    launch would."""

    port: int | None = None
    want_port: bool = False
    nproc: int | None = None  # processes per host (what the config is checked against)
    config_path: str | None = None
    config_text: str | None = None
    overrides: list[str] = []
    # does this host share its runs root with another? one host writes a marker file, the others
    # look for it, the first removes it: sharing is seen, never guessed from paths
    marker_write: str | None = None
    marker_look: str | None = None
    marker_remove: str | None = None


class CheckpointFileArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``read_checkpoint_file``: a chunk of one file of a complete checkpoint of a run."""

    run: str
    checkpoint: str
    file: str
    offset: int = 0
    max_bytes: int = 4 << 20


class WriteCheckpointFileArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``write_checkpoint_file``: append a chunk to a shard file of another host (gathering a
    checkpoint written on several nodes). Only DCP file names, never over an existing file;
    the file appears under its name only with ``final``."""

    run: str
    checkpoint: str
    file: str
    offset: int
    data: bytes
    final: bool = False


class SampleArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``sample``: generate from a run's checkpoint (default: its newest complete one) in a
    process of its own. ``device``: None picks a GPU no process uses, else the CPU;
    ``seed`` None: a random one (reported, to repeat the sample)."""

    run: str
    checkpoint: str | None = None  # "step-N" or "N"
    prompt: str = ""
    max_new_tokens: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 200
    temperature: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    top_k: Annotated[int, msgspec.Meta(ge=1)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    seed: Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)] | None = None
    device: str | None = None  # "cpu", "cuda", "cuda:N"


class EvalArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``eval``: a long-context evaluation of a run's checkpoint (default: its newest) in a
    process of its own, appended to the run's records. Lengths above the run's trained
    context are refused unless ``beyond_context``; ``device`` and ``seed`` as for ``sample``."""

    run: str
    kind: Literal["passkey"] = "passkey"
    checkpoint: str | None = None
    lengths: list[Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]] = []  # []: the trained context's
    depths: list[Annotated[float, msgspec.Meta(ge=0, le=1)]] = []  # []: 0, 0.25, 0.5, 0.75, 1
    trials: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 4
    seed: Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)] | None = None
    digits: Annotated[int, msgspec.Meta(ge=1, le=30)] = 5
    buckets: Annotated[int, msgspec.Meta(ge=1, le=256)] = 8
    loss_sequences: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 4
    beyond_context: bool = False
    device: str | None = None


class AlertsArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``alerts`` and ``watch_alerts``: one run's or every run's; at most ``history`` resolved
    ones per run besides every open one."""

    run: str | None = None
    history: int = 100


class AckArgs(Args, kw_only=True, forbid_unknown_fields=True):
    run: str
    alert: str  # its id, or its kind when one open alert of the run has it
    by: str | None = None


class EvidenceArgs(Args, kw_only=True, forbid_unknown_fields=True):
    run: str
    alert: str
