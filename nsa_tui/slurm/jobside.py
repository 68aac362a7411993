"""Run by the batch script on the allocation's first node (``python -m nsa_tui.slurm.jobside``).

``resume-arg RUN_DIR [FIRST]`` prints the checkpoint the job starts from: the run's own
newest complete checkpoint (a requeued job continues where it stopped), else FIRST (the
checkpoint a fallback or resume starts from), else nothing (a new run starts at step 0).

``rdzv-port RUN_DIR JOB_ID`` prints the port the job's c10d rendezvous is served on, free on
this node and reserved against the other jobs starting here (rdzvport.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from nsa.contract.rundir import CHECKPOINTS, latest_checkpoint
from nsa_tui.slurm.rdzvport import rdzv_port

USAGE = ("usage: python -m nsa_tui.slurm.jobside resume-arg RUN_DIR [FIRST]\n"
         "       python -m nsa_tui.slurm.jobside rdzv-port RUN_DIR JOB_ID")


def resume_arg(run_dir: str, first: str | None) -> str:
    own = latest_checkpoint(Path(run_dir) / CHECKPOINTS)
    if own is not None:
        return str(own)
    return first or ""


def main(argv: list[str]) -> int:
    if len(argv) in (2, 3) and argv[0] == "resume-arg":
        print(resume_arg(argv[1], argv[2] if len(argv) == 3 else None))
        return 0
    if len(argv) == 3 and argv[0] == "rdzv-port":
        # the run directory's parent is the runs root: where this user's jobs meet
        print(rdzv_port(Path(argv[1]).resolve().parent, argv[2]))
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
