"""What the agent answers: the view of a run, and each operation's result (docs/agent-protocol.md).

The same records travel as replies and as events' data (``nsa.contract.protocol.EVENT_DATA``).
"""

from __future__ import annotations

from typing import Literal

from nsa.contract.records import (
    Alert,
    Beat,
    ExitInfo,
    LaunchInfo,
    Metric,
    Record,
    RunInfo,
)
from nsa.contract.slurm import SlurmState
from nsa.contract.status import RunStatus


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
    started_from: bool = False  # the checkpoint the run started from: it saved none of its own
    grad_accum: int | None = None  # the new run's (fallback: keeps the global batch)
    global_batch: int | None = None
    gpu: int | None = None  # fallback: the GPU with the most free memory (None: no NVML)
    again: str | None = None  # done before: the run it started then (nothing new would start)
    problem: str | None = None  # why it cannot be done (the op would refuse with this)


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


class FileChunk(Record, kw_only=True):
    data: bytes  # base64 in JSON
    offset: int  # where the chunk starts
    size: int  # the whole file's size


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
