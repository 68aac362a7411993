"""Worker (one process, or torchrun with gloo): the start-up checkpoint probe against a real
directory. ``probe_worker.py ROOT STRATEGY ASYNC OUT``: proves checkpoints under ROOT and writes
``OUT/rank-R.json`` with the outcome, the log lines, whether the RNG moved and what is left
under ROOT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from nsa.config import load_config
from nsa.train import distributed as D
from nsa.train.checkpoint import Checkpointer, CheckpointError, is_committer
from nsa.train.checkpoint_probe import prove

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke-cpu.yaml"


def main() -> None:
    root, strategy, use_async, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "async", Path(sys.argv[4])
    cfg = load_config(str(SMOKE), ["train.device=cpu", "train.pg_timeout_start_s=60"])
    info = D.init(cfg.train, out, torch.device("cpu"))
    ckpt = Checkpointer(root, keep=3, committer=is_committer(info.rank, info.local_rank), use_async=use_async,
                        timeout_s=60)
    lines: list[str] = []
    rng = torch.get_rng_state()
    try:
        prove(ckpt, strategy, info, bf16=False, log=lines.append)
        error = None
    except CheckpointError as exc:
        error = str(exc)
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.is_dir() else None
    res = {"error": error, "lines": lines, "rng_moved": not torch.equal(rng, torch.get_rng_state()),
           "left": left}
    (out / f"rank-{info.rank}.json").write_text(json.dumps(res))
    D.close()


if __name__ == "__main__":
    main()
