"""The agent protocol's messages (docs/agent-protocol.md states the same).

Newline-delimited JSON: the agent's first line is ``{"hello": Hello}``; then the client
sends :class:`Request` lines and the agent answers with :class:`Reply` lines and, for
subscriptions, :class:`EventMsg` lines whose ``data`` type is given by ``event``
(:data:`EVENT_DATA`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from nsa.contract.appended import StreamPos
from nsa.contract.evals import EvalProgress, EvalStart, PasskeyEval
from nsa.contract.records import (
    Alert,
    Beat,
    ExitInfo,
    HostSample,
    LaunchInfo,
    Metric,
    NodeLayout,
    Record,
    RunInfo,
)
from nsa.contract.series import MetricsSummary
from nsa.contract.slurm import SlurmRequest, SlurmState
from nsa.contract.status import RunStatus

PROTOCOL = 3  # the agent's protocol version: client and agent must agree


class Hello(Record, kw_only=True):
    """What a client needs first: versions, host, GPUs, where runs live, what is missing."""

    agent: int
    nsa_tui: str
    nsa_version: str | None = None
    host: str = ""
    python: str = ""
    python_exe: str = ""
    torch: str | None = None
    runs_root: str = ""
    gpus: int = 0
    gpu_names: list[str | None] = []
    gpu_message: str = ""
    boot_id: str = ""
    pid: int = 0
    time: float = 0.0
    problems: list[str] = []


class Request(Record, kw_only=True):
    id: int | str | None = None
    op: str
    args: dict[str, Any] = {}


class ErrorInfo(Record, kw_only=True):
    code: str
    message: str


class Reply(Record, kw_only=True):
    id: int | str | None = None
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None


class Owner(Record, kw_only=True):
    """A host that owns processes of a run, and whether they are alive as this host can tell:
    its own from its process table (``how``: ``proc``), another host's from that host's lease
    and its ranks' heartbeats (``lease``, ``beats``), or ended (``exit``: its exit.json)."""

    node: str
    hostname: str = ""
    mine: bool = False  # the host that answers is this owner
    alive: bool = False
    how: str = "proc"  # proc | lease | beats | exit | expired
    age_s: float | None = None  # seconds since the lease (or the newest beat) was written


class RunView(Record, kw_only=True):
    """What the agent knows of one run: run.json (``info``; synthesised from launch.json before
    the trainer writes it) combined with launch.json, exit.json and process liveness into the
    status a user sees (``status``; the trainer's own is ``info.status``)."""

    run_id: str
    dir: str
    name: str  # the launch name, else the trainer's, else the run id
    status: RunStatus
    info: RunInfo
    launch: LaunchInfo | None = None
    exit: ExitInfo | None = None
    alive: bool = False
    pids: list[int] = []
    stop_requested: bool = False
    parent_run: str | None = None
    created: float = 0.0  # when it was launched (or started, for a run started by hand)
    archived: bool = False  # archived.json exists: hidden from the default run list
    log_tail: list[str] = []  # the end of train.log, for crashed and failed runs
    launcher_alive: bool = False  # the run's supervisor (the parent of torchrun) is alive
    watchdog: bool = False  # the host records its alerts (alerts.jsonl): its watchdog runs or ran to the end
    slurm: SlurmState | None = None  # a run submitted to Slurm: its job's queue state
    owners: list[Owner] = []  # the hosts that own the run's processes (several: a shared runs root)
    shared: bool = False  # its hosts share the runs root: one directory, per-node files under nodes/

    def live_elsewhere(self) -> list[Owner]:
        """Owners other than the answering host whose part is alive (by lease or heartbeats)."""
        return [o for o in self.owners if o.alive and not o.mine]


class RunStatusReport(Record, kw_only=True):
    """The ``status`` op: a run's view, the latest beat of each rank, the last metric lines (the
    recent step times that stall thresholds need), its open alerts. O(ranks), not O(age)."""

    run: RunView
    beats: list[Beat] = []
    recent_metrics: list[Metric] = []
    alerts: list[Alert] = []
    ts: float = 0.0  # the host's clock when the report was made: the ages below are at this time
    heartbeat_age_s: dict[int, float] = {}  # rank -> seconds since its newest beat was written
    slurm: SlurmState | None = None  # a Slurm run: its job (the same as ``run.slurm``)


class LogLines(Record, kw_only=True):
    lines: list[str]


class Gap(Record, kw_only=True):
    """Part of a stream was not sent (too old to be worth sending): ``skipped_bytes`` of it
    before this point. The stream continues after it."""

    stream: str
    skipped_bytes: int
    size: int


class Synced(Record, kw_only=True):
    """The subscription's bounded backlog has been sent; ``bad_lines``: malformed lines skipped
    so far, per stream (never fatal)."""

    ts: float
    offsets: dict[str, StreamPos] = {}
    bad_lines: dict[str, int] = {}


class RunsList(Record, kw_only=True):
    runs: list[RunView]


class RunRemoved(Record, kw_only=True):
    run_id: str


class AlertState(Record, kw_only=True):
    """One alert of a run as its alerts.jsonl tells it (every event of that id folded):
    ``state`` is ``open`` until it is acknowledged or its condition ends (``resolved``)."""

    id: str
    run: str
    state: Literal["open", "acknowledged", "resolved"]
    raised_at: float
    updated_at: float
    resolved_at: float | None = None
    acked_at: float | None = None
    acked_by: str | None = None
    alert: Alert


class AlertList(Record, kw_only=True):
    """Alerts of one run or of every run: every open one and the newest resolved ones, oldest
    first; ``bad_lines``: malformed lines of alerts.jsonl skipped."""

    alerts: list[AlertState]
    bad_lines: int = 0


class SampleStart(Record, kw_only=True):
    """``sample``: the checkpoint is loaded and generation begins (what it runs on, the prompt's
    token ids: end-of-text first, as a document starts in training)."""

    run: str
    checkpoint: str  # step-N
    step: int
    device: str  # "cpu", "cuda:0", ...
    tokenizer: str  # "byte" | "gpt2"
    seed: int
    prompt_tokens: list[int] = []


class SampleText(Record, kw_only=True):
    """``sample``: new tokens and the text they complete (a character cut between two steps
    comes with the step that ends it)."""

    text: str
    tokens: list[int]


class SampleDone(Record, kw_only=True):
    """``sample``: the whole answer; the stream ends after it. ``stop``: ``eot`` (the model
    ended its document) or ``max_new_tokens``."""

    run: str
    checkpoint: str
    step: int
    device: str
    seed: int
    prompt: str
    prompt_tokens: list[int]
    text: str
    tokens: list[int]
    stop: Literal["eot", "max_new_tokens"]
    seconds: float = 0.0  # loading excluded: prefill and decoding


# event name -> the type of its ``data``
EVENT_DATA: dict[str, Any] = {
    "status": RunView,
    "beats": list[Beat],
    "metrics": list[Metric],
    "summary": MetricsSummary,
    "log": LogLines,
    "gap": Gap,
    "synced": Synced,
    "host": HostSample,
    "runs": RunsList,
    "run": RunView,
    "run_removed": RunRemoved,
    "alerts": AlertList,
    "alert": AlertState,
    "error": ErrorInfo,
    "sample_start": SampleStart,
    "sample_text": SampleText,
    "sample_done": SampleDone,
    "eval_start": EvalStart,
    "eval_progress": EvalProgress,
    "eval_done": PasskeyEval,
}
EventKind = Literal["status", "beats", "metrics", "summary", "log", "gap", "synced", "host", "runs", "run",
                    "run_removed", "alerts", "alert", "error", "sample_start", "sample_text", "sample_done",
                    "eval_start", "eval_progress", "eval_done"]


class EventMsg(Record, kw_only=True):
    """One event of a subscription: ``id`` is the subscribing request's id; ``offset`` the
    byte offset after the data in its stream's file generation ``gen`` (file streams: a
    rotated or replaced file is a new generation), else a sequence number."""

    id: int | str | None = None
    event: str
    run: str | None = None
    stream: str = ""
    offset: int = 0
    gen: str = ""
    initial: bool = False  # a status sent while the subscription's backlog is still coming
    data: Any = None


class EventEnvelope(Record, kw_only=True):
    """An incoming line, before its data is validated by its event kind."""

    id: int | str | None = None
    event: str | None = None
    run: str | None = None
    stream: str = ""
    offset: int = 0
    gen: str = ""
    initial: bool = False
    data: msgspec.Raw = msgspec.Raw(b"null")
    ok: bool | None = None
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: ErrorInfo | None = None
    hello: msgspec.Raw = msgspec.Raw(b"null")


# -- request arguments --------------------------------------------------------------------------
class WatchArgs(Record, kw_only=True, forbid_unknown_fields=True):
    """``watch``: what of a run to stream. Bounded: the latest beat of each rank, the metrics as
    a summary plus the ``recent_metrics`` last lines, the log's last ``log_tail_bytes``; then
    live lines. ``offsets`` resumes streams (after a reconnect) when little was missed."""

    run: str
    streams: list[Literal["status", "heartbeats", "metrics", "log"]] | None = None
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


class ConfigSummary(Record, kw_only=True):
    """What a config is and whether it can run on this host (``describe``; ``launch`` refuses
    what has ``problems`` unless forced). Why: a 125M GPU config on FineWeb from the Hub used
    to start on a CPU box without network and fail 45 s later."""

    config: str  # the path as the user gave it
    name: str
    params: int
    attention: str  # "nsa" | "dense"
    seq_len: int
    batch_size: int
    grad_accum: int
    nproc: int
    global_batch: int  # sequences per optimizer step: batch_size x nproc x grad_accum
    steps: int
    device: str  # train.device as configured: "auto" | "cpu" | "cuda"
    dtype: str  # train.dtype as configured
    needs: str  # "CUDA" | "CPU or CUDA" | "CPU"
    runs_on: str  # what it would run on here: "cpu" | "cuda" (N GPUs)
    data: str  # the data source in words
    problems: list[str] = []  # why it cannot run on this host; empty: it can
    notes: list[str] = []  # worth knowing, not in the way


class PlanArgs(Args, kw_only=True, forbid_unknown_fields=True):
    run: str
    action: Literal["kill", "fallback", "resume"]


class ActionPlan(Record, kw_only=True):
    """``plan``: exactly what a ``kill``, ``fallback`` or ``resume`` of the run would do now,
    nothing done: the confirmation a person reads before pressing k, f or r."""

    op: Literal["kill", "fallback", "resume"]
    run_id: str
    alive: bool  # kill and fallback stop it
    pids: list[int] = []  # every live process of the run (what kill ends)
    rank_pids: list[int] = []  # those that are ranks (they get SIGTERM first)
    world_size: int = 1  # the run's processes now
    nproc: int = 1  # the new run's
    name: str = ""  # the new run's
    checkpoint: str | None = None  # the newest complete checkpoint it would start from
    checkpoint_step: int | None = None
    grad_accum: int | None = None  # the new run's (fallback: keeps the global batch)
    global_batch: int | None = None
    gpu: int | None = None  # fallback: the GPU with the most free memory (None: no NVML)
    again: str | None = None  # done before: the run it started then (nothing new would start)
    problem: str | None = None  # why it cannot be done (the op would refuse with this)


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


class PreflightResult(Record, kw_only=True):
    host: str
    nsa_tui: str
    nsa_version: str | None = None
    torch: str | None = None
    python: str = ""
    runs_root: str = ""
    problems: list[str] = []  # what stops a launch here (nsa or torch missing, ...)
    port: int | None = None  # the rendezvous port tested (or chosen) here
    port_free: bool = False
    port_message: str = ""
    config_name: str | None = None  # the validated config's name
    config_error: str | None = None  # why the config does not validate here
    join_timeout_s: float | None = None  # train.pg_timeout_start_s: torchrun's rendezvous join timeout
    node: str = ""  # this host's node name (hostname and boot id): two hosts of one run differ
    marker_seen: bool | None = None  # ``marker_look``: the marker is in this host's runs root
    marker_error: str = ""  # the marker could not be written or looked for (why)


class CheckpointFile(Record, kw_only=True):
    name: str
    size: int


class CheckpointEntry(Record, kw_only=True):
    """A complete checkpoint of a run on this host: the files here and those it needs."""

    name: str  # step-N
    step: int
    files: list[CheckpointFile] = []  # in this host's directory
    needs: list[str] = []  # every file of the checkpoint (meta.json's ``files``)


class CheckpointList(Record, kw_only=True):
    checkpoints: list[CheckpointEntry]  # oldest first


class CheckpointFileArgs(Args, kw_only=True, forbid_unknown_fields=True):
    """``read_checkpoint_file``: a chunk of one file of a complete checkpoint of a run."""

    run: str
    checkpoint: str
    file: str
    offset: int = 0
    max_bytes: int = 4 << 20


class FileChunk(Record, kw_only=True):
    data: bytes  # base64 in JSON
    offset: int  # where the chunk starts
    size: int  # the whole file's size


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


class LaunchResult(Record, kw_only=True):
    """``launch``, ``fallback`` and ``resume``: the new run (``view``: as the agent sees it now)."""

    run_id: str
    dir: str
    nproc: int
    command: list[str]
    launcher_pid: int | None = None
    view: RunView | None = None
    parent_run: str | None = None
    resume_from: str | None = None
    killed: KillResult | None = None
    again: bool = False  # this relaunch had already been done: the same run, nothing new started
    slurm_job_id: str | None = None  # a Slurm run: the job sbatch created


class KillResult(Record, kw_only=True):
    run_id: str
    was_running: bool
    forced: bool = False
    remaining: list[int] = []


class DeleteResult(Record, kw_only=True):
    """``delete``: what the run's directory held (what deleting frees) and whether it is gone."""

    run_id: str
    bytes: int
    files: int
    deleted: bool
    children: list[str] = []  # runs that continue this one (fallback/resume): they keep their own files


class LogChunk(Record, kw_only=True):
    text: str
    offset: int
    size: int
    gen: str = ""  # the file generation ``offset`` counts in (a watch of the log continues there)


class DumpFile(Record, kw_only=True):
    name: str
    text: str


class MissingRank(Record, kw_only=True):
    rank: int
    reason: str


class Evidence(Record, kw_only=True):
    """``evidence``: the files the watchdog captured for an alert (each at most 1 MiB shown)."""

    run_id: str
    alert: str
    files: list[DumpFile] = []
    notes: list[str] = []


class DumpResult(Record, kw_only=True):
    run_id: str
    ranks: list[int]
    notes: list[str] = []
    files: list[DumpFile] = []
    missing: list[MissingRank] = []  # ranks of the run without a stack here, and why
