"""The launcher process of a run: ``python -m nsa_tui.agent.supervise RUN_DIR -- CMD...``.

Why it exists: the agent starts runs detached (own session and process group) and may
exit long before the run does, so nobody would collect torchrun's exit status. This
small parent waits for it and writes ``exit.json`` (exit code, signal, time), which is
what turns "processes gone without a final status" into a crash report with its code.
It survives the group's TERM (it must outlive torchrun to record the code) but not KILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nsa.contract import ExitInfo, write_json_atomic


def _ignore(signum: int, frame: object) -> None:
    """A Python handler, not SIG_IGN: exec resets handlers, so torchrun keeps defaults."""


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m nsa_tui.agent.supervise RUN_DIR -- CMD...", file=sys.stderr)
        return 2
    run_dir, cmd = argv[0], argv[2:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, _ignore)
    started = time.time()
    os.umask(0o077)  # the run's files are private to its user (inherited by torchrun and the ranks)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        code = proc.wait()
    except OSError as exc:
        print(f"nsa-tui supervise: cannot start {cmd[0]!r}: {exc}", file=sys.stderr, flush=True)
        code = 127
    record = ExitInfo(exit_code=code if code >= 0 else None, signal=-code if code < 0 else None,
                      started_at=started, ended_at=time.time())
    write_json_atomic(Path(run_dir) / "exit.json", record)
    print(f"nsa-tui supervise: command exited with {code}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
