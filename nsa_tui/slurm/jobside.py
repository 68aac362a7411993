"""Run by the batch script on the allocation's first node (``python -m nsa_tui.slurm.jobside``).

``resume-arg RUN_DIR [FIRST]`` prints the checkpoint the job starts from: the run's own
newest complete checkpoint (a requeued job continues where it stopped), else FIRST (the
checkpoint a fallback or resume starts from), else nothing (a new run starts at step 0).

``rdzv-port RUN_DIR JOB_ID`` prints the port the job's c10d rendezvous is served on, free on
this node and reserved against the other jobs starting here (rdzvport.py).

``exit RUN_DIR CODE STARTED`` writes exit.json once srun has ended: srun's exit code as the
batch shell saw it. It is the hand-over to the run's watchdog beside the job
(nsa_tui/agent/slurmwatch.py), which waits for it, writes the run's final alerts, applies the
``on_failure`` policy and rewrites the file with ``watchdog`` true; without a watchdog the file
still says how the job's training ended.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from nsa.contract import ExitInfo, write_json_atomic
from nsa.contract.rundir import CHECKPOINTS, EXIT_JSON, latest_checkpoint
from nsa_tui.slurm.rdzvport import rdzv_port

USAGE = ("usage: python -m nsa_tui.slurm.jobside resume-arg RUN_DIR [FIRST]\n"
         "       python -m nsa_tui.slurm.jobside rdzv-port RUN_DIR JOB_ID\n"
         "       python -m nsa_tui.slurm.jobside exit RUN_DIR CODE STARTED")


def resume_arg(run_dir: str, first: str | None) -> str:
    own = latest_checkpoint(Path(run_dir) / CHECKPOINTS)
    if own is not None:
        return str(own)
    return first or ""


def write_exit(run_dir: str, code: int, started: float | None) -> ExitInfo:
    """exit.json of this attempt of the job (the script removed the one of an attempt before)."""
    rec = ExitInfo(exit_code=code, started_at=started, ended_at=time.time())
    write_json_atomic(Path(run_dir) / EXIT_JSON, rec)
    return rec


def main(argv: list[str]) -> int:
    if len(argv) in (2, 3) and argv[0] == "resume-arg":
        print(resume_arg(argv[1], argv[2] if len(argv) == 3 else None))
        return 0
    if len(argv) == 3 and argv[0] == "rdzv-port":
        # the run directory's parent is the runs root: where this user's jobs meet
        print(rdzv_port(Path(argv[1]).resolve().parent, argv[2]))
        return 0
    if len(argv) == 4 and argv[0] == "exit" and argv[2].lstrip("-").isdigit():
        try:
            started: float | None = float(argv[3])
        except ValueError:
            started = None
        write_exit(argv[1], int(argv[2]), started)
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
