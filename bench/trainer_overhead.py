"""nsa-train's steady-state step against bench.run's bare train_step, same shapes, same device.

    python -m bench.trainer_overhead [--config dense-125m] [--set train.batch_size=8 ...]
                                     [--steps 20] [--warmup 3] [--device auto|cuda|cpu]

The bare step is bench.run's ``train_step`` row (forward, fp32 cross-entropy, backward, clip,
AdamW on a model without a wrapper, one random batch already on the device), timed the same
way (median of per-step times, each step synchronised). The trainer's step is what nsa-train
reports: ``step_time_s`` of its metrics lines, from a real ``Trainer`` in this process (a
one-rank group, its wrapper if any: DDP has none on one rank, the prefetching loader,
heartbeats, a metrics line every step), median over ``--steps`` steady steps. It prints both
and their ratio (the goal: <= 1.05), and what tells a gap apart: the bare step back to back
(the device's throughput with its queue kept full) and through the trainer's wrapper; host CPU
per step; the trainer's telemetry time; the loader's CPU per micro-batch (Python that, in a
thread, holds the GIL while the training thread launches kernels: compare ``--set
data.loader=thread`` with the default, a process on CUDA); and per steady step the host syncs
and uploads (``nsa.syncs.HostSyncs``) and aten ops of each side. With ``--set
train.cuda_graph=true`` on CUDA both sides replay their forward and backward from a CUDA graph
(each says whether its proof passed).

Defaults: on CUDA dense-125m at batch 8 x 2048, grad_accum 1 (bench.run's train row); on CPU
tiny-cpu-dense at its own shapes; ``data.source=synthetic`` (no network needed), no
validation batches; the run directory is a temporary one, removed after. CPU numbers say
nothing about a GPU's: there a host sync costs nothing, and syncs are only counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nsa.train import threads  # noqa: E402  (no torch: it must choose the threads before torch loads)

CUDA_SETS = ("train.seq_len=2048", "train.batch_size=8")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="a name under configs/ or a YAML path (default: dense-125m on CUDA, "
                    "tiny-cpu-dense on CPU)")
    ap.add_argument("--set", nargs="+", action="extend", default=[], metavar="SECTION.KEY=VALUE",
                    help="config overrides, applied to both steps (after the defaults)")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--steps", type=int, default=20, help="steady steps timed (each side)")
    ap.add_argument("--warmup", type=int, default=3, help="steps before timing (each side)")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT",
                    help="also write the two steps and their ratio here (bench.targets reads it)")
    return ap.parse_args(argv)


def bare_step(cfg: Any, device: Any, model: Any = None, opt: Any = None) -> Callable[[Any], None]:
    """bench.run's train_step (``bench_train``): a fresh model of ``cfg`` and its AdamW (or
    ``model`` and ``opt``: the trainer's, wrapped), one random batch on the device. With
    ``train.cuda_graph`` on CUDA, its forward and backward replayed from a CUDA graph as the
    trainer's would be (eager when the graph fails its proof; both said)."""
    import torch

    from bench.run import graphed_train_step_fn, train_step_fn
    from nsa.model import build_model
    from nsa.train.trainer import build_optimizer

    torch.manual_seed(0)
    if model is None:
        model = build_model(cfg.model).to(device)
        opt = build_optimizer(model, cfg, device)
    tokens = torch.randint(0, 256, (cfg.train.batch_size, cfg.train.seq_len + 1), device=device)
    if cfg.train.cuda_graph and torch.device(device).type == "cuda":
        step, why = graphed_train_step_fn(model, opt, tokens, cfg.model.vocab_size, cfg.train.grad_clip)
        print(f"bare train_step, train.cuda_graph: {'replayed' if step else 'eager'}: {why}", flush=True)
        if step is not None:
            return step
    return train_step_fn(model, opt, tokens, cfg.model.vocab_size, cfg.train.grad_clip)


def back_to_back_ms(step: Callable[[Any], None], iters: int) -> float:
    """Mean ms per step over ``iters`` steps with one synchronisation at the end."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        step(None)
    sync()
    return (time.perf_counter() - t0) * 1e3 / iters


def host_cpu_ms(step: Callable[[Any], None], iters: int) -> float:
    """Median host CPU ms (this process, all threads) per synchronised step: on a shared CPU
    what the step costs whatever the load; on a GPU host the Python and launch work (plus
    any spinning in a synchronisation)."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    out = []
    for _ in range(iters):
        sync()
        c0 = time.process_time()
        step(None)
        sync()
        out.append((time.process_time() - c0) * 1e3)
    return statistics.median(out)


def counted(fn: Callable[[], None]) -> tuple[list[Any], Counter[str]]:
    """(host sync events, aten op counts) of one call."""
    from nsa.syncs import HostSyncs, OpCounter

    with HostSyncs() as syncs, OpCounter() as ops:
        fn()
    return syncs.events, ops.ops


def trainer_iterations(trainer: Any, steps: int, count: bool) -> list[tuple[float, float, list[Any], int]]:
    """Run the trainer's loop ``steps`` more steps; per loop iteration (cut at the step
    heartbeats: a step, then its metrics line and checks) its wall ms and host CPU ms, and
    with ``count`` (under HostSyncs and OpCounter, which slow every op) its sync events and
    number of ops."""
    from nsa.syncs import HostSyncs, OpCounter

    trainer.cfg.train.steps = trainer.step + steps
    marks: list[tuple[float, float, int, int]] = []
    beat = trainer.hb.step_beat
    with HostSyncs() if count else contextlib.nullcontext() as syncs, \
            OpCounter() if count else contextlib.nullcontext() as ops:
        def marked(step: int) -> None:
            marks.append((time.perf_counter(), time.process_time(), len(syncs.events) if syncs else 0,
                          ops.total if ops else 0))
            beat(step)

        trainer.hb.step_beat = marked
        try:
            trainer.run()
        finally:
            trainer.hb.step_beat = beat
    return [((b[0] - a[0]) * 1e3, (b[1] - a[1]) * 1e3, syncs.events[a[2]:b[2]] if syncs else [], b[3] - a[3])
            for a, b in zip(marks, marks[1:])]


def packing_ms(trainer: Any, batches: int = 5) -> float:
    """CPU ms of one micro-batch's packing (documents made or tokenized, windows cut): what the
    loader computes per micro-batch, mostly Python, which in a thread holds the GIL the
    training thread needs to launch its kernels."""
    from nsa.train.data import Packer

    t = trainer.cfg.train
    packer = Packer(trainer.source, trainer.tokenizer, 0, trainer.n_streams, "train", t.seq_len + 1)
    start = time.thread_time()
    for _ in range(batches * t.batch_size):
        packer.next_window()
    return (time.thread_time() - start) * 1e3 / batches


def describe(events: list[Any]) -> str:
    c = Counter((e.kind, e.op, e.where) for e in events)
    return "; ".join(f"{n}x {kind} {op} at {where}" for (kind, op, where), n in c.most_common()) or "none"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cpu = threads.configure()
    import torch
    import torch.distributed as dist

    from bench.run import time_cuda
    from nsa.config import load_config
    from nsa.contract import Metric, TrainMetric, decode_lines
    from nsa.train import distributed as D
    from nsa.train.faults import StopFlag
    from nsa.train.telemetry import Heartbeat, ensure_run_dir
    from nsa.train.trainer import Trainer

    threads.apply(cpu)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    name = args.config or ("dense-125m" if cuda else "tiny-cpu-dense")
    path = Path(name) if name.endswith(".yaml") else ROOT / "configs" / f"{name}.yaml"
    sets = [*(CUDA_SETS if cuda and not args.config else ()), "train.grad_accum=1", "data.source=synthetic",
            "train.eval_batches=0", "train.log_every=1", f"train.device={'cuda' if cuda else 'cpu'}",
            "train.save_every=1000000", "train.eval_every=1000000", *args.set]
    cfg = load_config(path, sets)
    t = cfg.train
    device = D.pick_device(t, 0)
    where = torch.cuda.get_device_name(device) if cuda else f"CPU, {cpu.per_rank} thread(s)"
    print(f"trainer_overhead: {cfg.name} at batch {t.batch_size} x seq {t.seq_len}, "
          f"grad_accum {t.grad_accum}, {device} ({where}), torch {torch.__version__}; "
          f"{args.warmup} warm-up + {args.steps} timed steps", flush=True)

    bare = bare_step(cfg, device)
    for _ in range(args.warmup):
        bare(None)
    bare_events, bare_ops = counted(lambda: bare(None))
    bare_ms, _ = time_cuda(bare, None, 1, args.steps)
    bare_b2b = back_to_back_ms(bare, args.steps)
    bare_cpu = host_cpu_ms(bare, args.steps)

    tmp = Path(tempfile.mkdtemp(prefix="nsa-trainer-overhead-"))
    run_dir = ensure_run_dir(tmp / "run")
    try:
        info = D.init(t, run_dir, device)
        hb = Heartbeat(run_dir, "trainer-overhead", 0, 0, 1, D.device_record(device), t.heartbeat_interval_s)
        hb.start()
        said: list[str] = []  # the trainer's log: its train.cuda_graph line is printed
        trainer = Trainer(cfg, run_dir, info, hb, StopFlag(), None, None, said.append)
        trainer.setup()
        pack_ms = packing_ms(trainer)
        try:
            _, _, events, ops = trainer_iterations(trainer, args.warmup + 3, count=True)[-1]
            first, telemetry_s = trainer.step + 1, trainer.telemetry_s
            timed = trainer_iterations(trainer, args.steps + 1, count=False)
            telemetry_ms = (trainer.telemetry_s - telemetry_s) * 1e3 / (args.steps + 1)
            # bench.run's step through the trainer's wrapper (none for DDP on one rank) and optimizer
            wrapper = "no" if trainer.model is trainer.raw else f"the {t.strategy.upper()}"
            wrapped = bare_step(cfg, device, trainer.model, trainer.optimizer)
            wrapped(None)
            wrapped_ms, _ = time_cuda(wrapped, None, 1, args.steps)
        finally:
            trainer.finish()
            hb.stop("done")
        trainer.release()
        D.close()
        lines = (run_dir / "metrics.jsonl").read_bytes().splitlines()
        times = [m.step_time_s * 1e3 for m in decode_lines(lines, Metric)
                 if isinstance(m, TrainMetric) and m.step >= first and m.step_time_s is not None]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if dist.is_initialized():
            dist.destroy_process_group()
    bare_after, _ = time_cuda(bare, None, 1, args.steps)  # the device (or a shared CPU) may drift

    trainer_ms = statistics.median(times)
    trainer_cpu = statistics.median(c for _, c, _, _ in timed)
    bare_mid = statistics.median([bare_ms, bare_after])
    added = Counter((e.kind, e.op) for e in events) - Counter((e.kind, e.op) for e in bare_events)
    print(f"bare train_step (bench.run: median of synced steps):  {bare_ms:9.2f} ms, after the trainer "
          f"{bare_after:.2f} ms")
    print(f"bare train_step back to back (mean, one sync at end): {bare_b2b:9.2f} ms")
    for line in said:
        if line.startswith("train.cuda_graph"):
            print(line)
    print(f"nsa-train step (median step_time_s of {len(times)} steps):     {trainer_ms:9.2f} ms "
          f"(min {min(times):.2f}, max {max(times):.2f})")
    print(f"ratio nsa-train / bare: {trainer_ms / bare_mid:.3f} (goal <= 1.05)")
    print(f"bare train_step through nsa-train's model ({wrapper} wrapper, one rank): "
          f"{wrapped_ms:.2f} ms (ratio to bare {wrapped_ms / bare_mid:.3f})")
    print(f"host CPU per step, all threads: bare {bare_cpu:.2f} ms, nsa-train loop iteration "
          f"{trainer_cpu:.2f} ms (ratio {trainer_cpu / bare_cpu:.3f})")
    print(f"telemetry per step (heartbeat, metrics and log lines; the trainer's own count): "
          f"{telemetry_ms:.3f} ms")
    print(f"data loader ({trainer.loader_kind}): {pack_ms:.2f} ms CPU per micro-batch ({cfg.data.source}, "
          "measured alone)")
    print(f"aten ops per step: bare {sum(bare_ops.values())}, nsa-train loop iteration {ops}")
    print(f"host syncs and uploads per step: bare {len(bare_events)}, nsa-train {len(events)}; "
          f"added by the trainer: {dict(added) or 'none'}")
    print(f"  nsa-train: {describe(events)}")
    print(f"  bare:      {describe(bare_events)}")
    if not cuda:
        print("(CPU: a host sync costs nothing here; the GPU's ratio must be measured on a GPU)")
    if args.json:
        graph = next((line for line in said if line.startswith("train.cuda_graph")), None)
        args.json.write_text(json.dumps(dict(trainer_overhead=dict(
            config=cfg.name, device=where, torch=torch.__version__,
            batch_size=t.batch_size, seq_len=t.seq_len, grad_accum=t.grad_accum, bare_ms=bare_mid,
            trainer_ms=trainer_ms, ratio=trainer_ms / bare_mid, host_cpu_ratio=trainer_cpu / bare_cpu,
            cuda_graph=graph)), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
