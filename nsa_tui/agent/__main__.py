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
    profile = os.environ.get("NSA_AGENT_PROFILE")  # set only by bench.panel_cost --profile-agent
    if profile:
        _profiled(os.path.expanduser(args.runs_root), profile)
    else:
        asyncio.run(_amain(os.path.expanduser(args.runs_root)))
    return 0


def _profiled(runs_root: str, path: str) -> None:
    """Run the agent under cProfile (pstats to ``path`` when it ends), timed in CPU time, as
    the benchmark judges it (a write blocked on a full pipe is no cost). cProfile sees only
    its own thread, so worker-thread calls (``asyncio.to_thread``) run inline on the loop here."""
    import cProfile
    import time
    from collections.abc import Callable
    from typing import Any

    async def inline(fn: Callable[..., Any], /, *a: Any, **kw: Any) -> Any:
        return fn(*a, **kw)

    asyncio.to_thread = inline
    prof = cProfile.Profile(time.process_time)
    try:
        prof.runcall(asyncio.run, _amain(runs_root))
    finally:
        prof.dump_stats(path)


if __name__ == "__main__":
    sys.exit(main())
