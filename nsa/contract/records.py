"""The files of a run directory as typed records (docs/run-directory.md states the same).

Each class is one file or one kind of JSONL line. Readers validate at the edge (a bad
line is skipped and counted, never fatal); the middle uses attributes, not ``.get``.
Unknown fields are ignored on reading, so an older reader accepts a newer writer's files.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from nsa.contract.status import Phase, RunStatus


class Record(msgspec.Struct, kw_only=True):
    """Base of every record: keyword construction, unknown fields ignored when decoding."""


# -- run.json (rank 0) ------------------------------------------------------------------------
class SelfCheck(Record, kw_only=True):
    """The Triton kernels' check against the reference before training (nsa/ops/self_check.py)."""

    ok: bool
    device: str
    dtype: str
    ops: list[str] = []  # checked, in order
    failures: list[str] = []  # "op: reason" each
    seconds: float = 0.0


class AttentionOps(Record, kw_only=True):
    """Which attention ops a run uses; ``fallback_reason`` says why it is not what was asked."""

    requested: str = "auto"  # model.attention.backend ("sdpa" for dense models)
    backend: str = "reference"  # "triton" | "reference" | "sdpa" (dense)
    fallback_reason: str | None = None
    self_check: SelfCheck | None = None  # None when no check ran (dense: RoPE's kernel alone)
    window: str | None = None  # the window branch in training: "flexattention" | "triton" | "reference"
    window_reason: str | None = None  # why the Triton run's window branch is not FlexAttention's


class PgTimeouts(Record, kw_only=True):
    """The process-group timeouts by phase (docs/training.md, "Timeouts")."""

    start_s: float  # train.pg_timeout_start_s: joining, boot, compile, first step, checkpoints
    steady_s: float  # train.pg_timeout_s: every other collective


class CpuThreads(Record, kw_only=True):
    """The CPU threads each rank uses and why (nsa/train/threads.py): torch's default pool, a
    thread per CPU of the machine, made single-process CPU runs 5-40x slower on shared cores."""

    per_rank: int
    usable_cpus: int
    affinity_cpus: int
    quota_cpus: float | None = None
    local_ranks: int = 1
    source: str = "auto"  # "auto" | "NSA_THREADS"
    wait_policy: str = "PASSIVE"


class CudaGraph(Record, kw_only=True):
    """``train.cuda_graph``: whether the run's micro-steps replay a CUDA graph, and why
    (nsa/train/graphed.py)."""

    replayed: bool
    reason: str


class RunInfo(Record, kw_only=True):
    """run.json: identity, resolved config, trainer status, progress."""

    run_id: str
    name: str = ""
    status: RunStatus = RunStatus.STARTING
    exit_reason: str | None = None
    config_path: str | None = None
    config: dict[str, Any] | None = None
    param_count: int | None = None
    world_size: int = 1
    batch_size: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None
    seq_len: int | None = None
    dtype: str | None = None
    device: str | None = None
    data_source: str | None = None
    strategy: str | None = None
    command: list[str] = []
    versions: dict[str, str | None] = {}
    host: str | None = None
    pid: int | None = None
    started_at: float | None = None
    updated_at: float | None = None
    ended_at: float | None = None
    step: int = 0
    total_steps: int | None = None
    tokens: int = 0
    resumed_from: str | None = None
    resume_note: str | None = None
    parent_run: str | None = None
    telemetry_overhead: float | None = None
    attention_ops: AttentionOps | None = None
    cpu_threads: CpuThreads | None = None
    train_flops_per_token: float | None = None  # model FLOPs of one trained token (nsa.stats)
    pg_timeouts: PgTimeouts | None = None
    nnodes: int = 1  # nodes (hosts) the ranks run on
    cuda_graph: CudaGraph | None = None  # train.cuda_graph asked: replayed or not, and why


# -- files the agent writes -------------------------------------------------------------------
class NodeLayout(Record, kw_only=True):
    """One run over several hosts (docs/multi-node.md): this host's place in it. Every host runs
    one torchrun with the same run id; they meet at ``rdzv_endpoint`` (c10d rendezvous)."""

    nnodes: int
    node_rank: int  # this host's index in ``hosts`` (torchrun's c10d assigns the ranks itself)
    hosts: list[str]  # the destinations, as the launching client named them; the first hosts the rendezvous
    rdzv_endpoint: str  # "addr:port" on hosts[0], reachable from every host
    node_addr: str | None = None  # the address the other hosts reach this one by (torchrun --local-addr)
    # the hosts share one runs root: one run directory, this host's files under nodes/<node>/
    shared_root: bool = False


class LaunchInfo(Record, kw_only=True):
    """launch.json: how the agent started the run (absent when nsa-train ran by hand)."""

    run_id: str
    name: str
    created: float
    command: list[str] = []
    nproc: int = 1
    overrides: list[str] = []
    launcher_pid: int | None = None
    launcher_pgid: int | None = None
    boot_id: str = ""
    parent_run: str | None = None
    resume_from: str | None = None
    config_file: str | None = None
    cuda_visible_devices: str | None = None
    nodes: NodeLayout | None = None  # several hosts: this host's place among them (None: one host)
    # the host that owns the processes (rundir.node_name; "" in records before owners were kept):
    # only that host judges them from its process table, every other host by the lease and beats
    node: str = ""
    hostname: str = ""


class Lease(Record, kw_only=True):
    """lease.json: the owning host says its part of the run is alive; the supervisor renews it
    every few seconds. Another host sharing the runs root cannot see the owner's processes: a
    fresh lease (or fresh heartbeats) is what tells it the run lives."""

    node: str
    hostname: str
    ts: float  # the owner's clock when renewed
    ttl_s: float  # stale after this long without renewal: the owner is gone
    pid: int | None = None  # the supervisor


class ExitInfo(Record, kw_only=True):
    """exit.json: how the run's launcher (torchrun) ended, written by its supervisor."""

    exit_code: int | None = None
    signal: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    watchdog: bool = False  # the supervisor's watchdog ran and wrote its final alerts before this file


# how stop.json's ``by`` starts when the run's own watchdog stopped it (its on_failure policy,
# which relaunches after the stop it made), not a person through the agent
WATCHDOG_STOP = "nsa-tui watchdog"


class StopInfo(Record, kw_only=True):
    """stop.json: a stop was requested through the agent."""

    ts: float
    by: str = "nsa-tui agent"

    @property
    def by_watchdog(self) -> bool:
        """The run's watchdog asked (its on_failure policy), not a person."""
        return self.by.startswith(WATCHDOG_STOP)


class Relaunch(Record, kw_only=True):
    """relaunch.json in a parent run's directory: the run that a fallback or resume started
    from it. Why: a second request for the same relaunch returns this run instead of
    starting another from the same checkpoint."""

    op: Literal["fallback", "resume", "restart"]
    child_run: str
    resume_from: str
    ts: float


class Archived(Record, kw_only=True):
    """archived.json: the run is hidden from the default run list (the panel's and ``nsa-tui
    runs``); its files stay. Why: finished runs pile up, and deleting is not always wanted."""

    ts: float
    by: str = "nsa-tui agent"


# -- checkpoints/step-N/meta.json (rank 0, or each node's local rank 0) ----------------------
class CheckpointMeta(Record, kw_only=True):
    """checkpoints/step-N/meta.json, written last by a save (the checkpoint is complete when it is
    there). Why typed: the trainer resumes from it and the agent plans a fallback or resume from
    it; both read the same fields. Every version of the trainer wrote the fields without default."""

    step: int
    tokens: int
    world_size: int
    grad_accum: int
    batch_size: int  # per rank and micro-step
    global_batch: int  # batch_size x world_size x grad_accum: what a resume keeps
    seq_len: int
    n_streams: int  # data streams (one per rank of the saving run)
    data_positions: dict[str, dict[str, int]]  # stream -> {epoch, doc, offset}
    config: dict[str, Any] | None = None  # the resolved config
    run_id: str | None = None
    strategy: str | None = None  # "ddp" | "fsdp"
    device_type: str | None = None  # "cuda" | "cpu" (absent before the DCP format)
    files: list[str] = []  # every file of the checkpoint (absent in the single-file format)
    saved_at: float | None = None


# -- heartbeats/rank-R.jsonl (every rank) -----------------------------------------------------
class DeviceInfo(Record, kw_only=True):
    type: str = "cpu"  # "cpu" | "cuda"
    index: int | None = None
    uuid: str | None = None


class Beat(Record, kw_only=True):
    """One heartbeat line: after every step (``source: step``), at every phase change and from
    a timer in every phase (``source: timer``)."""

    ts: float
    run_id: str
    rank: int
    local_rank: int = 0
    world_size: int = 1
    pid: int | None = None
    host: str | None = None
    device: DeviceInfo = msgspec.field(default_factory=DeviceInfo)
    phase: Phase = Phase.BOOT
    phase_since: float | None = None
    step: int = 0
    source: Literal["step", "timer"] = "timer"
    error: str | None = None  # phase failed: why


# -- metrics.jsonl (rank 0) -------------------------------------------------------------------
class GateShares(Record, kw_only=True):
    compressed: float
    selected: float
    window: float


class TrainMetric(Record, kw_only=True, tag_field="kind", tag="train"):
    ts: float
    step: int
    loss: float
    lr: float | None = None
    tokens: int | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    grad_norm: float | None = None
    gate_shares: GateShares | None = None
    mem_allocated_bytes: int | None = None
    mem_reserved_bytes: int | None = None


class EvalMetric(Record, kw_only=True, tag_field="kind", tag="eval"):
    ts: float
    step: int
    val_loss: float
    tokens: int | None = None


class EpochMetric(Record, kw_only=True, tag_field="kind", tag="epoch"):
    ts: float
    step: int
    epoch: int = 0
    split: str = "train"
    message: str = ""


Metric = TrainMetric | EvalMetric | EpochMetric


# -- host samples (the agent's sampler) -------------------------------------------------------
class GpuRank(Record, kw_only=True):
    pid: int
    run: str
    rank: int | None = None


class GpuReading(Record, kw_only=True):
    """One GPU; any value the driver cannot give is None (shown as N/A)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    util_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    pids: list[int] = []
    ranks: list[GpuRank] = []


def on_gpu(gpu: GpuReading, beat: Beat) -> bool:
    """Whether ``gpu`` is the device of the rank that wrote ``beat`` (the one rule for the GPU
    table, the alerts and the CLI): the rank's pid among the GPU's processes; else, for a CUDA
    rank, its device UUID (CUDA_VISIBLE_DEVICES renumbers indexes: a fallback's cuda:0 may be
    the host's GPU 3); the index only when no UUID is known."""
    if beat.pid is not None and beat.pid in gpu.pids:
        return True
    if beat.device.type != "cuda":
        return False
    if beat.device.uuid:
        return gpu.uuid == beat.device.uuid
    return beat.device.index is not None and gpu.index == beat.device.index


class Usage(Record, kw_only=True):
    used_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None


class HostSample(Record, kw_only=True):
    ts: float
    gpus: list[GpuReading] | None = None
    gpu_message: str = ""
    cpu_pct: float | None = None
    cpu_count: int | None = None
    load_avg: list[float] = []
    ram: Usage = msgspec.field(default_factory=Usage)
    disk: Usage = msgspec.field(default_factory=Usage)


# -- alerts ---------------------------------------------------------------------------------
class Alert(Record, kw_only=True):
    """One alert with its evidence; ``key`` is stable while the condition lasts."""

    kind: str
    severity: Literal["critical", "warning"]
    host: str
    run: str | None = None
    rank: int | None = None
    gpu: int | None = None
    phase: str | None = None
    last_step: int | None = None
    heartbeat_age_s: float | None = None
    log_tail: list[str] = []
    message: str = ""
    suggested_actions: list[str] = []
    evidence: list[str] = []  # files captured for it, relative to the run directory

    @property
    def key(self) -> str:
        return f"{self.host}|{self.run}|{self.kind}|{self.rank}"


AlertAction = Literal["raised", "updated", "resolved", "acknowledged"]


class AlertEvent(Record, kw_only=True):
    """One line of alerts.jsonl: an alert was raised, updated (new evidence, severity, step),
    resolved (its condition ended) or acknowledged (by a person, through the agent)."""

    ts: float
    action: AlertAction
    id: str  # unique within the run: "<n>-<kind>"
    alert: Alert
    by: str = ""  # who wrote it: "watchdog", or the user who acknowledged it
    note: str = ""  # e.g. what an automatic action did, or why a delivery failed
