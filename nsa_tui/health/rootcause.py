"""What ended a run: the rank that failed first and why, from its files. Pure (no I/O).

Why a module of its own: after ``kill -9`` of one rank the survivors fail too (a connection
error in their next collective), and they are the ones that write tracebacks and, for rank
0, run.json's ``exit_reason``. The rank that died first wrote nothing; the evidence of it is
torchrun's failure summary (``exitcode : -9 ... (SIGKILL)``) and its heartbeats stopping
before anyone else's failure. Blaming the loudest rank sent people to the wrong traceback.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from nsa.contract import Beat, ExitInfo, Phase

ENOSPC_RE = re.compile(r"No space left on device|\bENOSPC\b|\[Errno 28\]")


@dataclass(frozen=True)
class RankFailure:
    """One entry of torchrun's failure summary."""

    rank: int
    exitcode: int | None
    pid: int | None = None
    root: bool = False  # torchrun's "Root Cause (first observed failure)"

    @property
    def signal_name(self) -> str | None:
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe(self) -> str:
        if self.signal_name:
            return f"was killed by signal {-(self.exitcode or 0)} ({self.signal_name})"
        return f"exited with code {self.exitcode}"


_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
_ENTRY_RE = re.compile(r"^\s*\[\d+\]:\s*$")


def torchrun_failures(lines: list[str]) -> dict[int, RankFailure]:
    """rank -> its failure, from the summary torchrun prints when a worker fails
    (``Failures:`` and ``Root Cause (first observed failure):`` blocks). {} when absent."""
    out: dict[int, RankFailure] = {}
    section = None
    rank: int | None = None
    for line in lines:
        s = line.strip()
        if s.startswith("Root Cause"):
            section, rank = "root", None
            continue
        if s.startswith("Failures:"):
            section, rank = "other", None
            continue
        if section is None:
            continue
        if s.startswith("=====") and rank is None:
            section = None
            continue
        if _ENTRY_RE.match(line):
            rank = None
            continue
        m = _RANK_RE.match(line)
        if m:
            rank = int(m.group(1))
            continue
        m = _EXIT_RE.match(line)
        if m and rank is not None:
            code = int(m.group(1))
            pid = int(m.group(2)) if m.group(2) else None
            out[rank] = RankFailure(rank, code, pid, root=section == "root")
    return out


@dataclass(frozen=True)
class RootCause:
    rank: int | None
    text: str  # one line for a person: "rank 1 was killed by signal 9 (SIGKILL) at step 30"
    by_signal: bool = False


def root_cause(beats: dict[int, Beat], log_lines: list[str], gone: dict[int, float] | None = None
               ) -> RootCause | None:
    """The rank that failed first and why.

    Candidates: a rank whose last beat is ``failed`` (at that beat's time), and a rank known
    to have died without a final beat (torchrun's summary names it with a non-zero exit, or
    the watchdog saw its process vanish: ``gone``) at the time of its last beat, which is
    before its death. The earliest wins. Without beats, torchrun's own root cause."""
    failures = torchrun_failures(log_lines)
    gone = gone or {}
    cands: list[tuple[float, int, str, bool]] = []
    for rank, b in beats.items():
        if b.phase == Phase.FAILED:
            first = (b.error or "failed").strip().splitlines()[0] if (b.error or "").strip() else "failed"
            text = first if first.startswith(f"rank {rank}") else f"rank {rank}: {first}"
            cands.append((b.ts, rank, text, False))
            continue
        if b.phase == Phase.DONE:
            continue
        f = failures.get(rank)
        if f is not None and f.exitcode not in (None, 0):
            text = (f"rank {rank} {f.describe()} at step {b.step} (phase {b.phase.value}), "
                    "without a final heartbeat")
            cands.append((b.ts, rank, text, f.signal_name is not None))
        elif rank in gone:
            cands.append((b.ts, rank, f"rank {rank}'s process (pid {b.pid}) disappeared at step {b.step} "
                                      f"(phase {b.phase.value}) without a final heartbeat", True))
    if cands:
        ts, rank, text, by_signal = min(cands)
        return RootCause(rank, text, by_signal)
    root = next((f for f in failures.values() if f.root), None)
    if root is not None:
        return RootCause(root.rank, f"rank {root.rank} {root.describe()} (torchrun's first observed failure)",
                         root.signal_name is not None)
    return None


def headline(reason: str, cause: RootCause) -> str | None:
    """``reason`` (run.json's exit_reason, written by rank 0) led by the root cause when rank 0
    blamed another failure (its own knock-on error after a peer was killed); None when it already
    names the root cause's rank first."""
    lines = reason.strip().splitlines()
    first = lines[0] if lines else ""
    if cause.rank is None or re.match(rf"rank {cause.rank}\b", first):
        return None
    return "\n".join([cause.text, f"(then: {first})", *lines[1:]])


def summary_block(lines: list[str], rank: int) -> list[str]:
    """torchrun's summary entry of ``rank`` (the evidence for a rank that wrote no traceback)."""
    for i, line in enumerate(lines):
        m = _RANK_RE.match(line)
        if m and int(m.group(1)) == rank:
            start = i
            while start > 0 and not _ENTRY_RE.match(lines[start]):
                start -= 1
            end = i + 1
            while end < len(lines) and not _ENTRY_RE.match(lines[end]) and not lines[end].strip().startswith(
                    ("=====", "-----")):
                end += 1
            return lines[start:end]
    return []


def _block(lines: list[str], start: int) -> list[str]:
    """One traceback: from its first line to its (unindented) exception line."""
    for j in range(start + 1, len(lines)):
        ln = lines[j]
        if ln and not ln[0].isspace() and not ln.startswith("Traceback"):
            return lines[start : j + 1]
    return lines[start:]


def traceback_tail(lines: list[str], n: int = 15) -> list[str]:
    """The root-cause traceback in ``lines``, else the last ``n`` lines.

    torchrun prints its own traceback (ChildFailedError) after the ranks' ones; the
    first rank traceback is the cause, so torchrun's is skipped when another exists.
    """
    starts = [i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln]
    blocks = [_block(lines, i) for i in starts]
    ours = [b for b in blocks if not any("ChildFailedError" in ln or "distributed/run.py" in ln for ln in b)]
    if not blocks:
        return lines[-n:]
    block = (ours or blocks)[0]
    return block if len(block) <= n else [block[0], "...", *block[-(n - 2):]]


def rank_traceback(lines: list[str], rank: int, n: int = 15) -> list[str]:
    """The traceback printed after ``[rank R] FAILED`` (the trainer's own failure report), else []."""
    for i, ln in enumerate(lines):
        if ln.startswith(f"[rank {rank}] FAILED"):
            return traceback_tail(lines[i + 1:], n)
    return []


# lines nsa-tui itself writes to train.log (nsa_tui/agent/supervise.py): its alerts and the exit code
# it records in exit.json; quoting them in a crash message would quote an earlier alert
OWN_LINE_RE = re.compile(r"^nsa-tui (?:watchdog: |supervise: command exited with )")


def exit_text(exit_info: ExitInfo | None) -> str:
    """How the run's launcher ended, for a person: never a bare None."""
    if exit_info is not None and exit_info.signal:
        try:
            name = signal.Signals(exit_info.signal).name
        except ValueError:
            return f"killed by signal {exit_info.signal}"
        return f"killed by signal {exit_info.signal} ({name})"
    if exit_info is not None and exit_info.exit_code is not None:
        return f"exit code {exit_info.exit_code}"
    return "exit code unknown"
