"""``python -m nsa_tui.agent [--runs-root DIR]``: the host agent on stdin/stdout."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

DEFAULT_ROOT = "~/nsa-runs"


async def _amain(runs_root: str) -> None:
    from nsa_tui.agent.server import MAX_LINE, Agent

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await Agent(runs_root).serve(reader)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nsa_tui.agent", description=__doc__)
    p.add_argument("--runs-root", default=os.environ.get("NSA_RUNS_ROOT", DEFAULT_ROOT),
                   help="directory holding one directory per run (default ~/nsa-runs)")
    args = p.parse_args(argv)
    asyncio.run(_amain(os.path.expanduser(args.runs_root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
