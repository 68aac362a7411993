"""The runs root: one directory per run, and the status a user sees of each.

A :class:`~nsa.contract.RunView` combines what the trainer wrote (run.json), what the
agent wrote (launch.json, stop.json), how the launcher ended (exit.json) and whether
processes of the run are alive (nsa_tui.agent.procs), or, for a run whose processes are
elsewhere (a batch job), what its backend says (backends.job_view). Reading one is O(1) in
the run's age: small JSON files, a /proc scan shared by every caller, and the last lines of
a file.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import msgspec

from nsa.contract import (
    FAILED_STATUSES,
    Beat,
    ExitInfo,
    LaunchInfo,
    RunInfo,
    RunStatus,
    RunView,
    last_record,
    read_json,
)
from nsa.contract.appended import rotated_path
from nsa.contract.io import private_dir, tail_lines
from nsa.contract.replies import Owner
from nsa.contract.rundir import (
    ARCHIVED_JSON,
    CHECKPOINTS,
    EXIT_JSON,
    HEARTBEATS,
    LAUNCH_JSON,
    RUN_ID_RE,
    RUN_JSON,
    STOP_JSON,
    TRAIN_LOG,
    is_complete_checkpoint,
    latest_checkpoint,
    rank_of_file,
    read_checkpoint_meta,
    step_of,
)
from nsa_tui.agent.backends import job_view
from nsa_tui.agent.owners import judge_remote, node_parts, remote_parts, shown_part, this_node
from nsa_tui.agent.procs import GROUPS_MAX_AGE_S, RunProcess, boot_id, run_process, run_processes, settle

LOG_TAIL_LINES = 150


def beat_files(run_dir: Path) -> dict[int, Path]:
    """rank -> its current heartbeat file (``heartbeats/rank-R.jsonl``)."""
    out: dict[int, Path] = {}
    try:
        entries = list(os.scandir(run_dir / HEARTBEATS))
    except OSError:
        return out
    for e in entries:
        rank = rank_of_file(e.name)
        if rank is not None:
            out[rank] = Path(e.path)
    return dict(sorted(out.items()))


def latest_beat(path: Path) -> Beat | None:
    """The newest beat of one rank: its current file, else the rotated one (just rotated)."""
    beat = last_record(path, Beat)
    if beat is None:
        beat = last_record(rotated_path(path), Beat)
    return beat


def latest_beats(run_dir: Path) -> list[Beat]:
    """The newest beat of every rank, by rank: O(ranks), whatever the run's age."""
    beats = [latest_beat(p) for p in beat_files(run_dir).values()]
    return [b for b in beats if b is not None]


def _orphan_ranks(run_dir: Path, run_id: str, mark: str | None = None) -> list[RunProcess]:
    """Ranks that outlived the recorded group, found by the pid in their last heartbeat.

    Why: torchrun starts each rank in a session of its own, so when the launcher and
    torchrun die (KILL) a rank can live on outside the group, checkpointing after its
    PDEATHSIG or hung for good; the run is not dead (crashed) while it holds its GPU.
    """
    found = []
    shared = mark is not None and mark != str(run_dir)
    host = socket.gethostname()
    for beat in latest_beats(run_dir):
        if shared and beat.host != host:
            continue  # another host's rank: its pid means nothing in this process table
        proc = run_process(beat.pid, run_id, mark or str(run_dir))
        if proc is not None:
            found.append(proc)
    return found


def _younger_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


def derive_status(info: RunInfo | None, launch: LaunchInfo | None, alive: bool, same_boot: bool,
                  stop_requested: bool, exited: ExitInfo | None = None) -> RunStatus:
    """The status a user sees (docs/agent-protocol.md, "Run view")."""
    trainer = info.status if info is not None else None
    if (not alive and launch is not None and launch.nodes is not None and exited is not None and exited.signal
            and not stop_requested):
        # one host's torchrun of a run over several hosts was killed (nobody asked): its ranks may
        # have stopped cleanly (they get SIGTERM when it dies), but the run lost a node
        return RunStatus.CRASHED
    if alive:
        if trainer is not None and trainer.is_terminal():
            return RunStatus.STOPPING
        return trainer or RunStatus.STARTING
    if trainer is not None and trainer.is_terminal():
        return trainer
    if launch is None:
        return trainer or RunStatus.UNKNOWN  # started by hand: nothing to check against
    if not same_boot:
        return RunStatus.LOST
    if stop_requested:
        return RunStatus.STOPPED  # killed through the agent before it wrote an end status
    if launch.nodes is not None and info is None and exited is not None and exited.exit_code == 0:
        # a host without rank 0 (run.json is on rank 0's host): its ranks ended cleanly; the
        # run's own end status (finished or stopped) is rank 0's host's
        return RunStatus.FINISHED
    return RunStatus.CRASHED


class RunStore:
    """The runs root: one directory per run id, private to its user."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.expanduser(str(root))).resolve()
        self._recent: dict[str, tuple[float, RunView]] = {}  # run id -> (when, a view of then)

    def ensure(self) -> None:
        """Create the root (0700) if needed."""
        private_dir(self.root)

    def root_problem(self) -> str | None:
        """Why the root cannot hold runs: a file there (or above it) is said as such, not as the
        empty run list or the first OSError an operation would meet."""
        for path in (self.root, *self.root.parents):
            if path.exists():
                if path.is_dir():
                    return None
                where = "" if path == self.root else f" ({path} is a file)"
                return f"runs root {self.root} is not a directory{where}"
        return None

    def run_dir(self, run_id: str) -> Path:
        """The directory of ``run_id``; KeyError for ids that could escape the root or are absent."""
        if not RUN_ID_RE.match(run_id or ""):
            raise KeyError(run_id)
        path = self.root / run_id
        if not path.is_dir():
            raise KeyError(run_id)
        return path

    def ids(self) -> list[str]:
        """Run ids, newest first (ids start with a UTC time stamp)."""
        try:
            names = [e.name for e in os.scandir(self.root) if e.is_dir() and RUN_ID_RE.match(e.name)]
        except OSError:
            return []
        return sorted(names, reverse=True)

    def launch_info(self, run_id: str) -> LaunchInfo | None:
        return read_json(self.run_dir(run_id) / LAUNCH_JSON, LaunchInfo)

    def view(self, run_id: str, with_tail: bool = True, max_age_s: float = 0.0) -> RunView:
        """The run as a user sees it; ``with_tail``: the end of train.log when it crashed or failed.
        ``max_age_s``: the newest view, if begun at most that long ago, will do. The periodic
        looks (each watch's status, the run list's) pass it and share one view of a live run
        between them; a look that acts on the answer (kill, delete, a relaunch) never does.

        The part of the run this host owns is judged from its process table; parts owned by other
        hosts sharing the runs root from their lease and heartbeats (nsa_tui.agent.owners), never
        from this host's processes: their absence here says nothing."""
        now = time.monotonic()
        recent = self._recent.get(run_id)
        if max_age_s > 0 and recent is not None and now - recent[0] <= max_age_s:
            view = recent[1]
        else:
            view = self._view(run_id)
            if len(self._recent) > 64:  # runs no longer looked at
                self._recent = {k: v for k, v in self._recent.items() if now - v[0] <= 10.0}
            newest = self._recent.get(run_id)
            if newest is None or newest[0] <= now:  # (looks run in worker threads, side by side)
                self._recent[run_id] = (now, view)
        if with_tail and view.status in FAILED_STATUSES:
            part = shown_part(Path(view.dir))
            view = msgspec.structs.replace(view, log_tail=tail_lines(part / TRAIN_LOG, LOG_TAIL_LINES, 65536))
        return view

    def _view(self, run_id: str) -> RunView:
        d = self.run_dir(run_id)
        me = this_node()
        parts = node_parts(d)
        part = shown_part(d)
        info = read_json(d / RUN_JSON, RunInfo)
        launch = read_json(part / LAUNCH_JSON, LaunchInfo)
        exited = read_json(part / EXIT_JSON, ExitInfo)
        stop_requested = (part / STOP_JSON).exists()
        archived = (d / ARCHIVED_JSON).exists()
        mine = launch is None or not launch.node or launch.node == me
        beats = latest_beats(d) if parts or not mine else []
        owners = [judge_remote(p, pl, beats) for p, pl in
                  ([(part, launch)] if not mine and not parts else remote_parts(d, me))]
        procs: list[RunProcess] = []
        launcher_alive = False
        # a batch job: its backend (the queue) says whether it is alive, not this host's processes
        job = job_view(d, info.status if info else None, stop_requested)
        if job is not None:
            same_boot = False
            status, alive = job.status, job.alive
        elif mine:
            same_boot = launch is None or not launch.boot_id or launch.boot_id == boot_id()
            if same_boot and launch is not None:
                procs, launcher_alive = self._own_processes(run_id, d, part, launch, info, exited)
            alive = bool(procs)
            if launch is not None and launch.node:
                owners.insert(0, Owner(node=launch.node, hostname=launch.hostname, mine=True, alive=alive))
        else:  # another host's run (or, with no part here, the parts of others)
            alive = any(o.alive for o in owners)
            launcher_alive = alive
            same_boot = not any(o.how == "expired" for o in owners)
        if job is None:
            status = derive_status(info, launch, alive, same_boot, stop_requested, exited)
            if any(o.how == "expired" for o in owners if not o.mine) and status not in FAILED_STATUSES:
                status = RunStatus.LOST  # a host of the run vanished: its lease and heartbeats expired
        if info is None:
            name = launch.name if launch else run_id
            nodes = launch.nodes if launch else None
            info = RunInfo(run_id=run_id, name=name,
                           status=RunStatus.STARTING if launch else RunStatus.UNKNOWN,
                           started_at=launch.created if launch else None,
                           world_size=(launch.nproc * (nodes.nnodes if nodes else 1)) if launch else 1,
                           nnodes=nodes.nnodes if nodes else 1,
                           parent_run=launch.parent_run if launch else None)
        return RunView(run_id=run_id, dir=str(d), name=(launch.name if launch else "") or info.name or run_id,
                       status=status, info=info, launch=launch, exit=exited, alive=alive,
                       pids=[p.pid for p in procs], stop_requested=stop_requested,
                       parent_run=info.parent_run or (launch.parent_run if launch else None),
                       created=launch.created if launch else (info.started_at or 0.0), archived=archived,
                       launcher_alive=launcher_alive,
                       watchdog=(launcher_alive or (job is not None and job.watchdog)
                                 or (exited is not None and exited.watchdog)),
                       owners=owners, shared=bool(parts), slurm=job.slurm if job else None)

    def _own_processes(self, run_id: str, d: Path, part: Path, launch: LaunchInfo, info: RunInfo | None,
                       exited: ExitInfo | None) -> tuple[list[RunProcess], bool]:
        """(this host's live processes of the run, whether its supervisor is one of them)."""
        pgid = launch.launcher_pgid
        launcher = launch.launcher_pid
        mark = str(part)  # NSA_RUN_DIR: the directory of this host's part
        procs = run_processes(run_id, pgid, run_dir=mark)  # no pgid yet (launching): every group
        if not procs and pgid and _younger_than(part / LAUNCH_JSON, 2 * GROUPS_MAX_AGE_S + 1.0):
            # the shared /proc scan may predate this launch, and a supervisor exec'd a moment
            # ago shows no environment yet: a run started a moment ago would read as crashed
            # (a false crash alert, `logs -f` ending at once)
            if launcher is not None:
                settle(launcher)
            procs = run_processes(run_id, pgid, fresh=True, run_dir=mark)
        launcher_alive = any(p.pid == launcher for p in procs) or (
            launcher is not None and not procs and run_process(launcher, run_id, mark) is not None)
        if exited is not None:
            # torchrun has ended: a supervisor still finishing (its last alerts, deliveries,
            # a policy's backoff) is no process of the run
            procs = [p for p in procs if p.pid != launcher]
        if not procs and not (info is not None and info.status.is_terminal()):
            procs = _orphan_ranks(d, run_id, mark)  # launcher and torchrun gone, ranks still up
        return procs, launcher_alive

    def views(self) -> list[RunView]:
        """Every run's view, newest first; unreadable ones are skipped."""
        out = []
        for run_id in self.ids():
            try:
                out.append(self.view(run_id, with_tail=False))
            except (KeyError, OSError):
                continue
        return out

    def checkpoints(self, run_id: str) -> list[tuple[str, int, list[tuple[str, int]], list[str]]]:
        """Complete checkpoints of the run here, oldest first: (name, step, [(file, size) here],
        files the checkpoint needs (meta.json's ``files``))."""
        root = self.run_dir(run_id) / CHECKPOINTS
        out: list[tuple[str, int, list[tuple[str, int]], list[str]]] = []
        try:
            entries = list(os.scandir(root))
        except OSError:
            return out
        for e in entries:
            step = step_of(e.name)
            if step is None or not e.is_dir() or not is_complete_checkpoint(Path(e.path)):
                continue
            meta = read_checkpoint_meta(Path(e.path))
            if meta is None:
                continue
            needs = meta.files
            here = [(f.name, f.stat(follow_symlinks=False).st_size) for f in os.scandir(e.path)
                    if f.is_file(follow_symlinks=False)]  # a link is never read (agent/ckptfiles.py)
            out.append((e.name, step, sorted(here), needs))
        return sorted(out, key=lambda c: c[1])

    def checkpoint_dir(self, run_id: str, name: str) -> Path:
        """``checkpoints/<name>`` of a run, for a complete ``step-N``; KeyError otherwise."""
        path = self.run_dir(run_id) / CHECKPOINTS / name
        if not name or "/" in name or not is_complete_checkpoint(path):
            raise KeyError(f"{run_id}/{CHECKPOINTS}/{name}")
        return path

    def latest_checkpoint(self, run_id: str) -> str | None:
        """Path of the newest complete checkpoint, or None."""
        path = latest_checkpoint(self.run_dir(run_id) / CHECKPOINTS)
        return str(path) if path is not None else None
