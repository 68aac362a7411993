"""The run directory, owned here: its layout and the rules every side applies to it.

The trainer writes a run directory and the agent, watchdog, CLI and panel read it; when each
of them spells a file name or a rule of its own, one change leaves a reader looking at a
file that is never written, or a plan that the trainer then refuses. Here, once:

- every file and subdirectory name, and :class:`RunDir` (the paths of one run directory);
  tests/test_rundir_names.py fails when a module outside nsa/contract spells a name;
- the rule for a complete checkpoint (``step-N`` with its meta.json, written last) and the
  typed reading of meta.json (:class:`~nsa.contract.records.CheckpointMeta`);
- the global-batch rule (``global_batch``, ``grad_accum_for``);
- run ids: the one format of a new id (``new_run_id``) and every id a directory may have.

docs/run-directory.md describes the same.
"""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

from nsa.contract.io import read_json
from nsa.contract.records import CheckpointMeta

# -- files and subdirectories of <run-dir> -----------------------------------------------------
RUN_JSON = "run.json"  # rank 0
LAUNCH_JSON = "launch.json"  # agent
EXIT_JSON = "exit.json"  # agent (the supervisor)
STOP_JSON = "stop.json"  # agent
RELAUNCH_JSON = "relaunch.json"  # agent
ARCHIVED_JSON = "archived.json"  # agent
ALERTS_JSONL = "alerts.jsonl"  # agent (the watchdog, acknowledgements)
CONFIG_YAML = "config.yaml"  # agent: the config as given
LOCK = ".lock"  # agent: flock around every change of the run's state
TRAIN_LOG = "train.log"  # agent: stdout and stderr of torchrun
METRICS_JSONL = "metrics.jsonl"  # rank 0
METRICS_SUMMARY_JSON = "metrics-summary.json"  # rank 0
HEARTBEATS = "heartbeats"  # every rank: rank-R.jsonl
STACKS = "stacks"  # faulthandler and py-spy dumps, watchdog evidence
NCCL = "nccl"  # NCCL flight recorder (CUDA)
CHECKPOINTS = "checkpoints"  # step-N/ directories and ``latest``
DEBUG = "debug"  # debug.record_rank_state (tests)
EVAL = "eval"  # long-context evaluations: passkey.jsonl
EVAL_PASSKEY_JSONL = EVAL + "/passkey.jsonl"  # eval worker, rank 0 (eval.every_steps): PasskeyEval lines
SLURM_JSON = "slurm.json"  # agent: the Slurm job of a run submitted through a login node
SLURM_SCRIPT = "slurm-job.sh"  # agent: that job's batch script (kept)
LEASE_JSON = "lease.json"  # agent (the supervisor): renewed while the run's processes live there
NODES = "nodes"  # a run over several hosts sharing the runs root: nodes/<node>/ per host
# A run directory's per-node files: at the top of the directory for a run of one host (or of
# several hosts with runs roots of their own); under nodes/<node>/ for each host of a run whose
# hosts share the runs root, so that every file has one writer.
NODE_FILES = (LAUNCH_JSON, EXIT_JSON, STOP_JSON, RELAUNCH_JSON, TRAIN_LOG, ALERTS_JSONL, LEASE_JSON)

# The environment variable the agent sets ("1") for the ranks of a run whose hosts share the runs
# root: they all write the one run directory (checkpoints are written once and committed by rank 0).
SHARED_ENV = "NSA_SHARED_RUN_DIR"

# -- in the runs root ----------------------------------------------------------------------------
SHARE_MARKER_PREFIX = ".nsa-share-"  # written through one host, looked for through the others

# -- inside checkpoints/ -----------------------------------------------------------------------
STEP_PREFIX = "step-"
STEP_DIR = re.compile(r"^step-(\d+)$")
CHECKPOINT_TMP_PREFIX = ".tmp-step-"  # a save being written, or one that never finished
LATEST = "latest"  # text: the name of the newest complete checkpoint
META_JSON = "meta.json"  # written last: a step directory with it is complete

# The files whose change of mtime means a run's view may have changed (the run list's poll).
STATE_FILES = (RUN_JSON, LAUNCH_JSON, EXIT_JSON, STOP_JSON, ARCHIVED_JSON, SLURM_JSON)
# The files ``read_log`` may serve (appended text and metric lines).
LOG_FILES = (TRAIN_LOG, METRICS_JSONL)
# Created by the trainer at boot (nccl/ too, on CUDA).
TRAINER_SUBDIRS = (HEARTBEATS, STACKS, CHECKPOINTS)

_RANK_FILE = re.compile(r"^rank-(\d+)\.jsonl$")
_STACK_FILE = re.compile(r"^(py-spy-)?rank-(\d+)-\d+\.txt$")


_NODE_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def node_name(hostname: str, boot: str) -> str:
    """``<hostname>-<first 8 of the boot id>``: one host during one boot, as a directory name.
    The hostname says which machine to a person; the boot id tells two machines that share a
    name apart and ends a node's identity when it reboots (its processes are then gone)."""
    host = _NODE_UNSAFE.sub("-", hostname).strip("-.") or "host"
    boot8 = re.sub(r"[^A-Za-z0-9]+", "", boot)[:8] or "noboot"
    return f"{host[:64]}-{boot8}"


def share_marker(token: str) -> str:
    """The name of a sharing probe's marker file in a runs root."""
    return f"{SHARE_MARKER_PREFIX}{_NODE_UNSAFE.sub('', token)[:32]}"


def rank_file(rank: int) -> str:
    """``rank-R.jsonl``: a rank's heartbeat (and debug) file name."""
    return f"rank-{rank}.jsonl"


def rank_of_file(name: str) -> int | None:
    """R of ``rank-R.jsonl``; None for any other name (``rank-R.jsonl.1`` included)."""
    m = _RANK_FILE.match(name)
    return int(m.group(1)) if m else None


def heartbeat_stream(rank: int) -> str:
    """The watch stream name of a rank's heartbeats: its path in the run directory, no suffix."""
    return f"{HEARTBEATS}/rank-{rank}"


def step_name(step: int) -> str:
    """``step-N``: the directory of the checkpoint saved after step N."""
    return f"{STEP_PREFIX}{step}"


def step_of(name: str) -> int | None:
    """N of ``step-N``; None for any other name."""
    m = STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def stack_file(rank: int, ms: int, py_spy: bool = False) -> str:
    """A stack dump's name inside ``stacks/``: ``rank-R-<ms>.txt`` (faulthandler) or
    ``py-spy-rank-R-<ms>.txt``."""
    return f"{'py-spy-' if py_spy else ''}rank-{rank}-{ms}.txt"


def pending_stack_file(rank: int) -> str:
    """``.rank-R.pending``: where the next faulthandler dump of a rank goes before its rename."""
    return f".rank-{rank}.pending"


def rank_of_stack_file(name: str, py_spy: bool | None = None) -> int | None:
    """R of a stack dump's name, or None; ``py_spy``: only that kind (None: either)."""
    m = _STACK_FILE.match(name)
    if m is None or (py_spy is not None and bool(m.group(1)) != py_spy):
        return None
    return int(m.group(2))


def watchdog_stack_file(ms: int) -> str:
    """``watchdog-<ms>.txt``: what the watchdog saw of each rank when it captured evidence."""
    return f"watchdog-{ms}.txt"


class RunDir:
    """The paths of one run directory. Pure: nothing is created or read here."""

    __slots__ = ("path",)

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def run_json(self) -> Path:
        return self.path / RUN_JSON

    @property
    def launch_json(self) -> Path:
        return self.path / LAUNCH_JSON

    @property
    def exit_json(self) -> Path:
        return self.path / EXIT_JSON

    @property
    def stop_json(self) -> Path:
        return self.path / STOP_JSON

    @property
    def relaunch_json(self) -> Path:
        return self.path / RELAUNCH_JSON

    @property
    def archived_json(self) -> Path:
        return self.path / ARCHIVED_JSON

    @property
    def alerts_jsonl(self) -> Path:
        return self.path / ALERTS_JSONL

    @property
    def config_yaml(self) -> Path:
        return self.path / CONFIG_YAML

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    @property
    def train_log(self) -> Path:
        return self.path / TRAIN_LOG

    @property
    def metrics_jsonl(self) -> Path:
        return self.path / METRICS_JSONL

    @property
    def metrics_summary_json(self) -> Path:
        return self.path / METRICS_SUMMARY_JSON

    @property
    def heartbeats(self) -> Path:
        return self.path / HEARTBEATS

    @property
    def stacks(self) -> Path:
        return self.path / STACKS

    @property
    def nccl(self) -> Path:
        return self.path / NCCL

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def lease_json(self) -> Path:
        return self.path / LEASE_JSON

    @property
    def nodes(self) -> Path:
        return self.path / NODES

    def node(self, name: str) -> Path:
        """``nodes/<node>``: one host's per-node files of a run over hosts sharing the runs root."""
        return self.nodes / name

    def heartbeat(self, rank: int) -> Path:
        """``heartbeats/rank-R.jsonl``: a rank's current heartbeat file."""
        return self.heartbeats / rank_file(rank)

    def debug(self, rank: int) -> Path:
        """``debug/rank-R.jsonl``: a rank's recorded state (debug.record_rank_state)."""
        return self.path / DEBUG / rank_file(rank)

    def checkpoint(self, step: int) -> Path:
        """``checkpoints/step-N``."""
        return self.checkpoints / step_name(step)


# -- checkpoints: the one rule for "complete" ----------------------------------------------------
def is_complete_checkpoint(path: Path) -> bool:
    """A ``step-N`` directory with its ``meta.json``: meta.json is written last, so a save that
    was interrupted at any point is never complete."""
    return step_of(path.name) is not None and (path / META_JSON).is_file()


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints under ``root`` (a run's ``checkpoints/``), oldest first."""
    found = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for p in entries:
        step = step_of(p.name)
        if step is not None and p.is_dir() and is_complete_checkpoint(p):
            found.append((step, p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``: the one ``latest`` names when it is complete
    and the newest, else the newest a scan finds (``latest`` is rewritten after a save)."""
    try:
        name = (root / LATEST).read_text().strip()
        p = root / name
        if "/" not in name and is_complete_checkpoint(p):
            newest = complete_checkpoints(root)
            if not newest or newest[-1] == p:
                return p
    except OSError:
        pass
    ckpts = complete_checkpoints(root)
    return ckpts[-1] if ckpts else None


def read_checkpoint_meta(path: Path) -> CheckpointMeta | None:
    """The ``meta.json`` of checkpoint directory ``path``; None when absent, half-written or not
    a :class:`CheckpointMeta`."""
    return read_json(path / META_JSON, CheckpointMeta)


# -- the global batch ----------------------------------------------------------------------------
def global_batch(batch_size: int, world_size: int, grad_accum: int) -> int:
    """Sequences per optimizer step: ``batch_size`` per rank and micro-step, over every rank and
    micro-step."""
    return batch_size * world_size * grad_accum


def grad_accum_for(global_batch: int, batch_size: int, world_size: int) -> int | None:
    """The gradient accumulation that keeps ``global_batch`` on ``world_size`` ranks, or None when
    it cannot (not a multiple of ``batch_size`` x ``world_size``). Why one rule: a resume, a
    fallback and the plan shown before either must agree, or the plan promises a batch the
    trainer then refuses or silently changes."""
    per_step = batch_size * world_size
    if per_step <= 0 or global_batch <= 0 or global_batch % per_step:
        return None
    return global_batch // per_step


# -- run ids -------------------------------------------------------------------------------------
# Every id a run directory may have (new ones and those of earlier versions): it names a
# directory of the runs root, so it cannot hold "/" or start with ".".
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# The one format of a new run id: UTC time first, so ids sort by age; the name, so a listing
# says what ran; a random or derived token, so two runs started in one second never clash.
NEW_RUN_ID_RE = re.compile(r"^\d{8}-\d{6}-[A-Za-z0-9._-]{1,40}-[0-9a-f]{4}$")


def name_slug(name: str) -> str:
    """The part of a run id that names the run: letters, digits, ``._-``, at most 40 characters."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return (s or "run")[:40]


def relaunch_name(name: str, op: str) -> str:
    """``<name>-fallback`` / ``<name>-resume``, without snowballing (``x-fallback-resume-resume``):
    an earlier relaunch suffix is replaced, the lineage is in ``parent_run``."""
    base = re.sub(r"(-(fallback|resume|restart)(-\d+)?)+$", "", name) or name
    return f"{base}-{op}"


def nothing_to_fall_back(name: str, world_size: int) -> str | None:
    """Why a fallback of a run is refused, None where it is not: a run on one process already has
    nothing to fall back from. One rule for the agent's ``fallback`` and ``plan`` ops (the CLI)
    and the panel's ``f``, which says it before asking the host."""
    if world_size > 1:
        return None
    return f"{name} already runs on one process: there is nothing to fall back from"


def new_run_id(name: str, when: float | None = None, token: str | None = None) -> str:
    """``<UTC yyyymmdd-HHMMSS>-<name slug>-<4 hex>``: a new run's id. ``when`` (default now) and
    ``token`` (default random) are given by callers whose processes must agree on one id
    without talking (the ranks of one torchrun)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if when is None else when))
    return f"{stamp}-{name_slug(name)}-{token if token is not None else secrets.token_hex(2)}"
