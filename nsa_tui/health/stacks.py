"""A stack dump for people: rank by rank, each rank's main thread first, missing ranks named.

faulthandler writes the other threads first and the signalled one last, and a training rank
has several threads (heartbeat, data prefetch, stack watcher): the frame that matters, where
the training loop is, was at the bottom. A rank without a stack was simply absent; now the
agent says why (``DumpResult.missing``) and it is shown in its place.
"""

from __future__ import annotations

import re

from nsa.contract.replies import DumpResult
from nsa.contract.rundir import rank_of_stack_file

_FH_HEAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_SPY_HEAD = re.compile(r"^Thread \d+ \(\w+\)")
_BOOTSTRAP = re.compile(r"in _bootstrap(_inner)?$|threading\.py")


def _blocks(text: str, head: re.Pattern[str]) -> tuple[list[str], list[list[str]]]:
    """(lines before the first thread, one list of lines per thread)."""
    preamble: list[str] = []
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if head.match(line):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        else:
            preamble.append(line)
    return preamble, blocks


def _is_main_faulthandler(block: list[str]) -> bool:
    frames = [ln.strip() for ln in block[1:] if ln.strip().startswith("File ")]
    return bool(frames) and not _BOOTSTRAP.search(frames[-1])


def main_thread_first(text: str) -> str:
    """The same dump with the main thread's block first (marked), the others after it."""
    if re.search(r'^Thread \d+ \(\w+\): "MainThread"', text, re.M):  # py-spy names its threads
        preamble, blocks = _blocks(text, _SPY_HEAD)
        is_main = [('"MainThread"' in b[0]) for b in blocks]
    else:
        preamble, blocks = _blocks(text, _FH_HEAD)
        is_main = [_is_main_faulthandler(b) for b in blocks]
    if not any(is_main):
        return text
    first = is_main.index(True)
    ordered = [blocks[first]] + [b for i, b in enumerate(blocks) if i != first]
    ordered[0] = [ordered[0][0] + "  [main thread]", *ordered[0][1:]]
    body = "\n".join("\n".join(b).rstrip("\n") for b in ordered)
    return "\n".join([*preamble, body]) if preamble else body


def _rank_of(name: str) -> int | None:
    return rank_of_stack_file(name.rpartition("/")[2])


def dump_text(res: DumpResult) -> str:
    """Every rank in order: its stacks (main thread first), or why it has none."""
    by_rank: dict[int, list[str]] = {}
    for f in res.files:
        rank = _rank_of(f.name)
        if rank is not None:
            by_rank.setdefault(rank, []).append(f"===== rank {rank}: {f.name} =====\n"
                                                f"{main_thread_first(f.text).rstrip()}")
    for m in res.missing:
        by_rank.setdefault(m.rank, []).append(f"===== rank {m.rank}: no stack =====\n{m.reason}")
    head = f"{res.run_id}: ranks signalled {res.ranks or 'none'}; each rank's main thread first"
    parts = [head, *[f"note: {n}" for n in res.notes]]
    for rank in sorted(by_rank):
        parts += by_rank[rank]
    return "\n\n".join(parts)
