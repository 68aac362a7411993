"""What a steady-state nsa-train step costs the host besides the maths, counted on CPU.

On a GPU every host read of a device value (``.item()``, ``float(t)``, ``.tolist()``) waits for
the queued work and leaves the GPU idle until the host has launched the next kernels; a
tensor built from host data inside the step is an upload. ``nsa.syncs.HostSyncs`` records
both on any device. A real trainer (one-rank gloo group, like nsa-train without torchrun)
runs its loop with metrics on every step; each steady-state iteration (the step, its metrics
line, heartbeat and checks) is compared with the bare train_step ``bench.run`` times (forward,
cross-entropy, backward, clip, AdamW) on the same model, optimizer and batch. What the trainer
adds must stay the one read per step that agrees on loss, stop and NaN and brings the loss,
the grad norm and the gate shares to the host together.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from nsa.config import load_config
from nsa.syncs import HostSyncs, SyncEvent
from nsa.train import distributed as D
from nsa.train.faults import StopFlag
from nsa.train.telemetry import Heartbeat, ensure_run_dir
from nsa.train.trainer import Trainer
from tests.train.trainrun import SMOKE, read_jsonl

STEPS = 6
STEADY = range(3, STEPS)  # iterations after steps 3, 4, 5: past the first steps' lazy state
# What the trainer may add to the bare step per steady-state iteration, by (kind, op):
# one read of the agreed flags, loss, grad norm (and gate shares) together.
ALLOWED = Counter({("read", "Tensor.tolist"): 1})


@contextmanager
def trainer_at(tmp_path: Path, sets: list[str], device: str = "cpu") -> Iterator[Trainer]:
    cfg = load_config(SMOKE, [f"train.device={device}", f"train.steps={STEPS}", "train.log_every=1",
                              "train.eval_every=1000", "train.save_every=1000", *sets])
    run_dir = ensure_run_dir(tmp_path / "run")
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device(device)
    hb = Heartbeat(run_dir, "rid", 0, 0, 1, D.device_record(dev), 10.0)
    info = D.init(cfg.train, run_dir, dev)
    try:
        trainer = Trainer(cfg, run_dir, info, hb, StopFlag(), None, None, lambda msg: None)
        trainer.setup()
        try:
            yield trainer
        finally:
            trainer.finish()
            hb.stop("done")
    finally:
        dist.destroy_process_group()


def loop_iterations(trainer: Trainer) -> list[list[SyncEvent]]:
    """Run the trainer's loop; the events of each iteration, cut at the step heartbeats (from
    one step's beat to the next: its metrics and checks, then the next step)."""
    marks: list[int] = []
    beat = trainer.hb.step_beat
    with HostSyncs() as syncs:
        def marked(step: int) -> None:
            marks.append(len(syncs.events))
            beat(step)

        trainer.hb.step_beat = marked  # type: ignore[method-assign]
        try:
            assert trainer.run() == "finished"
        finally:
            trainer.hb.step_beat = beat  # type: ignore[method-assign]
    assert len(marks) == STEPS
    return [syncs.events[a:b] for a, b in zip(marks, marks[1:])]


def bare_step(trainer: Trainer) -> list[SyncEvent]:
    """bench.run's train_step on the trainer's own model, optimizer and batches of its data
    (as many micro-batches as the trainer accumulates: the model's own events scale with them)."""
    model, opt, cfg = trainer.raw, trainer.optimizer, trainer.cfg
    batches = [trainer.loader.next().tokens for _ in range(trainer.grad_accum)]
    with HostSyncs() as syncs:
        for tokens in batches:
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
            (loss / len(batches)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return syncs.events


def kinds(events: list[SyncEvent]) -> Counter[tuple[str, str]]:
    return Counter((e.kind, e.op) for e in events)


def report(events: list[SyncEvent]) -> str:
    """One line per distinct (kind, op, caller), with its count."""
    c = Counter((e.kind, e.op, e.where) for e in events)
    return "\n".join(f"  {n}x {kind} {op} at {where}" for (kind, op, where), n in c.most_common())


@pytest.mark.parametrize("sets", [[], ["model.attention.kind=nsa", "train.grad_accum=2"]],
                         ids=["dense", "nsa-accum2"])
def test_a_steady_step_reads_the_device_once_more_than_the_bare_step(tmp_path: Path, sets: list[str]) -> None:
    with trainer_at(tmp_path, sets) as trainer:
        # one process trains the model itself: a DDP wrapper there all-reduces over a group
        # of one for nothing (4-9 % of a 125M model's step on an H200)
        assert trainer.model is trainer.raw
        iterations = loop_iterations(trainer)
        bare = [bare_step(trainer) for _ in range(3)]
    assert kinds(bare[1]) == kinds(bare[2]), "the bare step itself is not steady"
    for step in STEADY:
        events = iterations[step - 1]
        added = kinds(events) - kinds(bare[-1])
        assert added == ALLOWED, (
            f"iteration after step {step}: the trainer adds {dict(added)} to the bare step's host syncs "
            f"(allowed: {dict(ALLOWED)})\ntrainer iteration:\n{report(events)}\n"
            f"bare step:\n{report(bare[-1])}")
        assert not kinds(bare[-1]) - kinds(events), "the trainer skipped part of the bare step"
        ours = [e for e in events if e.op == "Tensor.tolist"]
        assert len(ours) == 1 and "nsa/train/trainer.py" in ours[0].where, report(ours)
    rows = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r.get("kind", "train") == "train"]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # metrics on every step, as before
    for r in rows:
        assert r["grad_norm"] is not None and r["grad_norm"] > 0 and r["loss"] > 0
        assert r["mem_allocated_bytes"] and r["mem_reserved_bytes"]
        if sets:
            gates = r["gate_shares"]
            assert gates is not None
            assert abs(gates["compressed"] + gates["selected"] + gates["window"] - 1) < 1e-5
        else:
            assert r["gate_shares"] is None
