"""CPU forward+backward time of a model config at its train batch/seq (median of N).

    python bench/cpu_model_timing.py [CONFIG ...] [--iters 5] [--threads 2]

Defaults: configs/tiny-cpu.yaml vs configs/tiny-cpu-dense.yaml, 2 threads, plus the
parameter counts of nsa-125m and dense-125m. Loss is the mean cross-entropy on random
tokens; the time covers forward, loss and backward (no optimizer step).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from nsa import stats
from nsa.config import load_config
from nsa.model import build_model

ROOT = Path(__file__).resolve().parents[1]


def time_config(path: Path, iters: int, warmup: int = 2) -> tuple[float, list[float], float, int, int, int]:
    """(median wall s, all wall timings, median process CPU s, batch, seq, params) for one
    fwd+bwd at the config's shape. CPU time shows how much of the wall time was ours on a
    loaded machine."""
    cfg = load_config(path)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    B, T, V = cfg.train.batch_size, cfg.train.seq_len, cfg.model.vocab_size
    tokens = torch.randint(0, min(V, 256), (B, T + 1))
    times, cpu = [], []
    for i in range(warmup + iters):
        t0, c0 = time.perf_counter(), time.process_time()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return statistics.median(times), times, statistics.median(cpu), B, T, model.param_count()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=[str(ROOT / "configs/tiny-cpu.yaml"),
                                                   str(ROOT / "configs/tiny-cpu-dense.yaml")])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load {load}")
    for path in args.configs:
        med, times, cpu, B, T, n = time_config(Path(path), args.iters)
        runs = ", ".join(f"{t * 1e3:.0f}" for t in times)
        print(f"{Path(path).name}: fwd+bwd median {med * 1e3:.0f} ms wall, {cpu * 1e3:.0f} ms CPU, "
              f"at batch {B} x seq {T} ({B * T / med:,.0f} tok/s; {n:,} params; runs ms: {runs})")
    for name in ("nsa-125m", "dense-125m"):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        print(f"{name}: {stats.param_count(cfg.model):,} parameters")


if __name__ == "__main__":
    main()
