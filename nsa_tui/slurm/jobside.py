"""Run by the batch script on the allocation's first node (``python -m nsa_tui.slurm.jobside``).

``resume-arg RUN_DIR [FIRST]`` prints the checkpoint the job starts from: the run's own
newest complete checkpoint (a requeued job continues where it stopped), else FIRST (the
checkpoint a fallback or resume starts from), else nothing (a new run starts at step 0).
"""

from __future__ import annotations

import sys
from pathlib import Path

from nsa.contract.rundir import CHECKPOINTS, latest_checkpoint


def resume_arg(run_dir: str, first: str | None) -> str:
    own = latest_checkpoint(Path(run_dir) / CHECKPOINTS)
    if own is not None:
        return str(own)
    return first or ""


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[0] != "resume-arg":
        print("usage: python -m nsa_tui.slurm.jobside resume-arg RUN_DIR [FIRST]", file=sys.stderr)
        return 2
    print(resume_arg(argv[1], argv[2] if len(argv) == 3 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
