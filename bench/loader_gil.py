"""What the data loader's Python costs a training step bound by the host, thread against process.

    python -m bench.loader_gil [--ops 2600] [--steps 30] [--batch 8] [--seq-len 2048]
                               [--source synthetic] [--json OUT]

A GPU step of a small model is a loop of short host calls (about 25 us of Python and
dispatch per kernel launch; dense-125m's step is about 2,600 of them). Here the loop is
``--ops`` additions of 8-element CPU tensors, which like a launch hold the GIL between short
stretches of C++ (the step's own work, alone, is the first row). Each step takes one
micro-batch (``--batch`` x ``--seq-len + 1`` tokens of ``--source``) from the rank's loader,
made in a thread (``data.loader: thread``) or in a process of its own (``process``), as
nsa-train does. Prints the median step of each, and the loader's CPU per micro-batch measured
alone; ``--json`` writes them. No GPU: the contention is the host's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nsa.config import DataConfig  # noqa: E402
from nsa.train.data import Packer, PrefetchLoader  # noqa: E402
from nsa.train.loader_process import LoaderSpec, ProcessLoader  # noqa: E402
from nsa.train.sources import build_source  # noqa: E402
from nsa.train.tokenizer import build_tokenizer  # noqa: E402


def host_step(ops: int) -> None:
    """``ops`` short host calls, as a step's kernel launches are."""
    a, b = torch.zeros(8), torch.ones(8)
    for _ in range(ops):
        a = a + b


def median_step_ms(ops: int, steps: int, loader: Any = None) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if loader is not None:
            loader.next()
        host_step(ops)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=2600)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--source", default="synthetic", choices=["synthetic", "stdlib"])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    data = DataConfig(source=args.source)
    window = args.seq_len + 1
    source, tok = build_source(data), build_tokenizer(data)

    alone = Packer(source, tok, 0, 1, "train", window)
    t0 = time.process_time()
    for _ in range(4 * args.batch):
        alone.next_window()
    pack_ms = (time.process_time() - t0) * 1e3 / 4

    row: dict[str, Any] = {"ops": args.ops, "batch": args.batch, "seq_len": args.seq_len,
                           "source": args.source, "loader_cpu_ms_per_micro_batch": round(pack_ms, 2),
                           "torch": torch.__version__}
    row["step_alone_ms"] = round(median_step_ms(args.ops, args.steps), 2)
    thread = PrefetchLoader({0: Packer(source, tok, 0, 1, "train", window)}, 1, args.batch, prefetch=4)
    try:
        thread.next()  # started and ahead
        row["step_with_thread_ms"] = round(median_step_ms(args.ops, args.steps, thread), 2)
    finally:
        thread.close()
    process = ProcessLoader(LoaderSpec(data, [0], 1, window, {}, 1, args.batch), prefetch=4)
    try:
        process.next()  # the child is up (spawned: it imports torch) and ahead
        row["step_with_process_ms"] = round(median_step_ms(args.ops, args.steps, process), 2)
    finally:
        process.close()
    print(f"{args.source}, {args.batch} x {window} tokens per micro-batch: the loader's CPU "
          f"{row['loader_cpu_ms_per_micro_batch']} ms per micro-batch, measured alone")
    print(f"host-bound step of {args.ops} ops: alone {row['step_alone_ms']} ms, one micro-batch per step "
          f"from a thread {row['step_with_thread_ms']} ms, from a process {row['step_with_process_ms']} ms")
    if args.json:
        args.json.write_text(json.dumps(row, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
