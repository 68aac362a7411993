"""torchrun worker (2 ranks, gloo): the process-group timeout follows the phase.

Rank 1 arrives 3 s late at three all-reduces: under the start timeout (10 s) the first one
waits for it; after ``Timeouts.steady()`` (1 s) the second fails on rank 0; inside
``Timeouts.long()`` the third would wait again. Each rank writes ``<out>/rank-R.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from nsa.config import load_config
from nsa.train import distributed as D


def late_all_reduce(rank: int) -> str:
    if rank == 1:
        time.sleep(3)
    t = torch.ones(1)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
    except Exception as exc:  # noqa: BLE001 - the timeout is the point
        return f"failed after {time.monotonic() - t0:.1f} s: {exc}"[:300]
    return f"ok {t.item():.0f}"


def main() -> None:
    config, out = sys.argv[1], Path(sys.argv[2])
    cfg = load_config(config, ["train.device=cpu", "train.pg_timeout_start_s=10", "train.pg_timeout_s=1"])
    info = D.init(cfg.train, out, torch.device("cpu"))
    t = D.Timeouts(cfg.train.pg_timeout_start_s, cfg.train.pg_timeout_s)
    res = {"start": late_all_reduce(info.rank)}
    t.steady()
    with t.long():
        res["long"] = late_all_reduce(info.rank)
    res["now_after_long"] = t.now
    if info.rank == 0:
        res["steady"] = late_all_reduce(info.rank)  # rank 1 stays away: rank 0 gives up
    else:
        time.sleep(6)  # alive, silent: only a timeout ends rank 0's wait before this
    (out / f"rank-{info.rank}.json").write_text(json.dumps(res))
    if info.rank == 0:
        # rank 0's group is broken by the timeout (as in a real run, which then fails): gloo aborts
        # the process at exit, and torchrun would then kill rank 1 before it writes its file. Wait
        # for it, then leave without the group's teardown.
        deadline = time.monotonic() + 60
        while not (out / "rank-1.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
