"""The typed contract from trainer to screen: run-directory records, agent protocol, statuses.

One definition of every record the trainer writes, the agent reads and serves, and the
client, panel and CLI show (docs/run-directory.md and docs/agent-protocol.md describe the
same; tests/test_contract_docs.py checks that they agree). Depends on msgspec only: the
panel imports it without torch.

- ``status``: :class:`RunStatus` (with its order and ``is_terminal``), the status sets
  (``LIVE_STATUSES``, ``TERMINAL_STATUSES``, ``FAILED_STATUSES``, ``UNHEALTHY_STATUSES``), :class:`Phase`;
- ``records``: run.json, launch.json, exit.json, stop.json, relaunch.json, archived.json, heartbeats,
  metrics lines, host samples, alerts;
- ``series``: bounded metric summaries (metrics-summary.json);
- ``evals``: long-context evaluation records (eval/passkey.jsonl), their events and reader;
- ``protocol``: the agent protocol's wire: hello, request and reply envelopes, events;
- ``requests``: what each agent operation takes (its arguments);
- ``replies``: what the agent answers: the view of a run and each operation's result;
- ``io``: the one JSON encoder, atomic writer, JSONL appender and tail reader;
- ``rundir``: the run directory's layout (every file name, :class:`RunDir`) and the rule for a
  complete checkpoint;
- ``appended``: appended files that rotate (``NSA_ROTATE_BYTES``) and the one reader that
  follows them, whose positions (:class:`StreamPos`) name the file's generation.
"""

from nsa.contract.appended import AppendedReader, StreamPos, rotate_bytes
from nsa.contract.io import (
    ContractError,
    JsonlWriter,
    LineStats,
    decode,
    decode_lines,
    encode,
    last_record,
    read_json,
    write_json_atomic,
)
from nsa.contract.protocol import PROTOCOL, Hello
from nsa.contract.records import (
    WATCHDOG_STOP,
    Alert,
    AlertEvent,
    Archived,
    AttentionOps,
    Beat,
    CheckpointMeta,
    CpuThreads,
    CudaGraph,
    DeviceInfo,
    EpochMetric,
    EvalMetric,
    ExitInfo,
    GateShares,
    GpuReading,
    HostSample,
    LaunchInfo,
    Lease,
    Metric,
    NodeLayout,
    PgTimeouts,
    Relaunch,
    RunInfo,
    SelfCheck,
    StopInfo,
    TrainMetric,
    on_gpu,
)
from nsa.contract.replies import RunStatusReport, RunView
from nsa.contract.series import MetricsFolder, MetricsSummary, SeriesSummary
from nsa.contract.status import (
    FAILED_STATUSES,
    LIVE_STATUSES,
    TERMINAL_STATUSES,
    TRAINER_STATUSES,
    UNHEALTHY_STATUSES,
    Phase,
    RunStatus,
)

__all__ = [
    "AppendedReader", "StreamPos", "rotate_bytes",
    "PROTOCOL", "TRAINER_STATUSES", "FAILED_STATUSES", "LIVE_STATUSES", "TERMINAL_STATUSES",
    "UNHEALTHY_STATUSES", "WATCHDOG_STOP", "Alert", "AlertEvent", "Archived", "AttentionOps", "Beat",
    "CheckpointMeta", "CpuThreads", "CudaGraph",
    "ContractError", "DeviceInfo", "EpochMetric", "EvalMetric", "ExitInfo", "GateShares", "GpuReading",
    "Hello", "HostSample", "JsonlWriter", "LaunchInfo", "Lease", "LineStats", "Metric", "MetricsFolder",
    "MetricsSummary", "NodeLayout", "PgTimeouts", "Phase", "Relaunch", "RunInfo", "RunStatus",
    "RunStatusReport", "RunView", "SelfCheck", "SeriesSummary", "StopInfo", "TrainMetric", "decode",
    "decode_lines", "encode", "last_record", "on_gpu", "read_json", "write_json_atomic",
]
