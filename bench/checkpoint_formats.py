"""Checkpoint save and load time: the single-file format of earlier versions vs DCP (sync, async).

    python bench/checkpoint_formats.py [--config configs/nsa-125m.yaml] [--repeat 3] [--dir DIR]
    torchrun --standalone --nproc_per_node=2 bench/checkpoint_formats.py [...]   # 2 ranks, gloo

The model of the config is built on CPU in fp32, wrapped as the trainer wraps it (DDP), with
AdamW state (one step on zero gradients), so a checkpoint holds what a real one holds:
parameters and two moments (~3x the parameter bytes). Each format is saved ``--repeat``
times and loaded as often; the median is printed (and one JSON line per measurement).

- ``single-file``: the earlier format: the full state gathered to rank 0, ``torch.save``
  of one file; every rank reads the whole file back (``weights_only=True``).
- ``dcp-sync``: every rank writes its shard (``dcp.save``) and the commit (meta.json,
  rename, latest); every rank reads what it needs (``dcp.load``).
- ``dcp-async``: ``dcp.async_save``: "blocked" is the time training waits (copying the
  tensors to CPU memory), "total" until the checkpoint is committed.

Loads follow saves, so files come from the page cache: these are CPU and copy costs, not
disk reads. Numbers depend on the machine: print them with its load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from nsa.config import load_config
from nsa.contract import CheckpointMeta
from nsa.model import build_model
from nsa.train import checkpoint as ckpt
from nsa.train import distributed as D
from nsa.train.checkpoint_legacy import load_single_file, save_single_file
from nsa.train.trainer import build_optimizer

ROOT = Path(__file__).resolve().parents[1]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "nsa-125m.yaml"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args()
    torch.set_num_threads(1 if "WORLD_SIZE" in os.environ else max(1, torch.get_num_threads()))
    cfg = load_config(args.config, ["train.device=cpu", "train.dtype=fp32"])
    base = Path(args.dir or tempfile.mkdtemp(prefix="ckpt-bench-"))
    info = D.init(cfg.train, base, torch.device("cpu"))
    rank, world = info.rank, info.world_size
    if rank == 0:
        base.mkdir(parents=True, exist_ok=True)
    root = D.broadcast_object(str(base))
    torch.manual_seed(0)
    model = D.wrap(build_model(cfg.model), "ddp", info)
    opt = build_optimizer(model, cfg, info.device)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # AdamW state exists, as in any checkpoint after step 1
    opt.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in model.parameters())
    meta = {"tokens": 0, "world_size": world, "grad_accum": 1, "batch_size": cfg.train.batch_size,
            "global_batch": cfg.train.batch_size * world, "seq_len": cfg.train.seq_len, "n_streams": world,
            "data_positions": {}, "config": {}, "strategy": "ddp", "device_type": "cpu"}
    results: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}

    def timed(key: str, fn) -> None:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        results.setdefault(key, []).append(time.perf_counter() - t0)

    def one_round(i: int) -> None:
        legacy = Path(root) / "single" / f"step-{i}"
        if rank == 0:
            legacy.parent.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        step_meta = {**meta, "step": i}
        timed("single-file save", lambda: save_single_file(legacy, model, opt, step_meta, rank == 0))
        timed("single-file load", lambda: load_single_file(legacy, model, opt))
        sizes["single-file"] = dir_bytes(legacy)

        sync = ckpt.Checkpointer(Path(root) / "dcp", keep=1, committer=info.local_rank == 0, use_async=False,
                                 timeout_s=600)
        typed = CheckpointMeta(step=i, **meta)
        timed("dcp-sync save", lambda: sync.save(i, model, opt, typed, rank, info.device, block=True))
        path = Path(root) / "dcp" / f"step-{i}"
        m = ckpt.read_meta(path)
        timed("dcp load", lambda: ckpt.load(path, m, model, opt, rank, info.device))
        sizes["dcp"] = dir_bytes(path)

        asy = ckpt.Checkpointer(Path(root) / "dcp-async", keep=1, committer=info.local_rank == 0,
                                use_async=True, timeout_s=600)
        dist.barrier()
        t0 = time.perf_counter()
        asy.save(i, model, opt, typed, rank, info.device)
        results.setdefault("dcp-async save, blocked", []).append(time.perf_counter() - t0)
        asy.wait()
        dist.barrier()
        results.setdefault("dcp-async save, total", []).append(time.perf_counter() - t0)

    for i in range(args.repeat):
        one_round(i)
    if rank == 0:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"{args.config}: {params / 1e6:.1f}M parameters fp32 + AdamW state; {world} rank(s), gloo; "
              f"torch {torch.__version__}; {os.cpu_count()} CPUs, load {load}; median of {args.repeat}")
        for name, size in sizes.items():
            print(f"  {name} on disk: {size / 2**20:,.0f} MiB")
        for key, vals in results.items():
            print(f"  {key:<26} {statistics.median(vals):7.2f} s   ({', '.join(f'{v:.2f}' for v in vals)})")
            print(json.dumps({"bench": "checkpoint_formats", "what": key, "ranks": world,
                              "median_s": statistics.median(vals), "runs_s": vals, "params": params}))
    if args.dir is None:  # every rank made a temporary directory; rank 0's was the one used
        shutil.rmtree(base, ignore_errors=True)
    D.close()


if __name__ == "__main__":
    main()
