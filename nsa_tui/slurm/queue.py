"""What the cluster says about a job: squeue while it is queued or running, then scontrol (which
keeps an ended job for MinJobAge, with its exit code), then sacct (where accounting runs).

The parsers are pure. ``SlurmQueue`` runs the commands (argument lists, no shell) with a short
cache: every ``CACHE_S`` at most one squeue call for all of the user's jobs and one scontrol call
per job shown (a job whose end is recorded in slurm.json is not asked about again). ``squeue
--json`` is never needed: many login nodes lack its plugin.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from nsa.contract.slurm import FINAL_STATES, SlurmState

SEP = "|"
# %i job id, %T state, %r reason, %S (expected) start, %N nodes
SQUEUE_FORMAT = SEP.join(["%i", "%T", "%r", "%S", "%N"])
SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Reason,Start"
CACHE_S = 2.0
TIMEOUT_S = 30.0

Runner = Callable[[Sequence[str]], "tuple[int, str, str]"]


def _none(text: str) -> str | None:
    text = text.strip()
    return None if text in ("", "None", "(null)", "N/A", "Unknown", "n/a") else text


def parse_exit(text: str) -> tuple[int | None, int | None]:
    """``ExitCode=2:0`` -> (2, None); ``0:9`` -> (None, 9): killed by signal 9."""
    code, _, sig = text.strip().partition(":")
    try:
        c, s = int(code), int(sig or 0)
    except ValueError:
        return None, None
    return (None, s) if s else (c, None)


def base_state(text: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``; ``RUNNING`` stays."""
    return text.strip().split(" ", 1)[0].rstrip("+").upper()


def parse_squeue(text: str) -> dict[str, SlurmState]:
    """``squeue -h -o SQUEUE_FORMAT`` lines -> job id -> state."""
    out: dict[str, SlurmState] = {}
    for line in text.splitlines():
        parts = line.split(SEP)
        if len(parts) != 5 or not parts[0].strip():
            continue
        jid, state, reason, start, nodes = (p.strip() for p in parts)
        out[jid] = SlurmState(
            job_id=jid,
            state=base_state(state),
            reason=_none(reason),
            start_time=_none(start),
            nodes=_none(nodes),
            source="squeue",
        )
    return out


def parse_scontrol(text: str) -> SlurmState | None:
    """``scontrol show job -o ID``: ``Key=Value`` pairs on one line (values may hold spaces
    only in a few keys we do not read)."""
    fields: dict[str, str] = {}
    for tok in text.split():
        key, eq, value = tok.partition("=")
        if eq and key not in fields:
            fields[key] = value
    if "JobId" not in fields or "JobState" not in fields:
        return None
    state = base_state(fields["JobState"])
    code, sig = parse_exit(fields.get("ExitCode", ""))
    try:
        restarts = int(fields.get("Restarts", "0"))
    except ValueError:
        restarts = 0
    return SlurmState(
        job_id=fields["JobId"],
        state=state,
        reason=_none(fields.get("Reason", "")),
        nodes=_none(fields.get("NodeList", "")),
        start_time=_none(fields.get("StartTime", "")),
        exit_code=code if state in FINAL_STATES else None,
        signal=sig if state in FINAL_STATES else None,
        restarts=restarts,
        source="scontrol",
    )


def parse_sacct(text: str, job_id: str) -> SlurmState | None:
    """``sacct -X -n -P -o SACCT_FIELDS -j ID``: the allocation's line."""
    for line in text.splitlines():
        parts = line.split(SEP)
        if len(parts) != 6 or parts[0].strip() != job_id:
            continue
        state = base_state(parts[1])
        code, sig = parse_exit(parts[2])
        return SlurmState(
            job_id=job_id,
            state=state,
            exit_code=code,
            signal=sig,
            nodes=_none(parts[3]),
            reason=_none(parts[4]),
            start_time=_none(parts[5]),
            source="sacct",
        )
    return None


def parse_steps(text: str, job_id: str) -> list[str]:
    """``squeue -h -s -j ID -o %i`` -> the job's srun steps (``ID.0``, ...), never its batch or
    extern step: what a signal to the training, and not to the batch script, is sent to."""
    out = []
    for line in text.split():
        jid, dot, step = line.strip().partition(".")
        if jid == job_id and dot and step.isdigit():
            out.append(line.strip())
    return out


def run_command(argv: Sequence[str]) -> tuple[int, str, str]:
    """(returncode, stdout, stderr); a missing command is rc 127."""
    try:
        res = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer in {TIMEOUT_S:.0f} s"
    return res.returncode, res.stdout, res.stderr


class SlurmQueue:
    """The user's jobs, read at most every ``CACHE_S`` (thread-safe: views run in threads)."""

    def __init__(self, run: Runner = run_command, cache_s: float = CACHE_S) -> None:
        self.run = run
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._at = -1e9
        self._jobs: dict[str, SlurmState] = {}
        self._ok = False
        self._detail: dict[str, tuple[float, SlurmState | None]] = {}

    def _squeue(self) -> tuple[dict[str, SlurmState], bool]:
        with self._lock:
            if time.monotonic() - self._at > self.cache_s:
                import getpass

                rc, out, _ = self.run(["squeue", "-h", "-u", getpass.getuser(), "-o", SQUEUE_FORMAT])
                self._jobs, self._ok = (parse_squeue(out), True) if rc == 0 else ({}, False)
                self._at = time.monotonic()
            return self._jobs, self._ok

    def invalidate(self) -> None:
        """Forget what was read (after a submit, cancel or requeue: the next read is fresh)."""
        with self._lock:
            self._at = -1e9
            self._detail.clear()

    def state(self, job_id: str) -> SlurmState | None:
        """The job's state now (at most ``cache_s`` old); None when no command knows it (ended
        long ago, no accounting)."""
        with self._lock:
            hit = self._detail.get(job_id)
        if hit is not None and time.monotonic() - hit[0] <= self.cache_s:
            return hit[1]
        st = self._read(job_id)
        with self._lock:
            self._detail[job_id] = (time.monotonic(), st)
        return st

    def _read(self, job_id: str) -> SlurmState | None:
        jobs, ok = self._squeue()
        found = jobs.get(job_id)
        rc, out, _ = self.run(["scontrol", "show", "job", "-o", job_id])
        detail = parse_scontrol(out) if rc == 0 else None
        if detail is not None:
            if found is not None:  # squeue's reason and expected start, scontrol's restarts and exit
                detail.reason = found.reason or detail.reason
                detail.start_time = found.start_time or detail.start_time
                detail.state = found.state
                detail.source = "squeue"
            return detail
        if found is not None:
            return found
        rc, out, _ = self.run(["sacct", "-X", "-n", "-P", "-o", SACCT_FIELDS, "-j", job_id])
        return parse_sacct(out, job_id) if rc == 0 else None
