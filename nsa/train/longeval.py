"""Periodic long-context evaluation during training (the config's ``eval`` section).

Rank 0 evaluates the whole model it holds (DDP keeps a full replica on every rank; FSDP
runs are refused by the config, since no rank holds the whole model) and appends a
PasskeyEval record (``origin: train``) to the run directory; the other ranks wait at a
barrier. Every rank is in the ``eval`` phase meanwhile, so its heartbeats say so and the
watchdog measures the time against the eval phase's limit, not the step time. The wait
runs under the long process-group timeout (the start-up one), since a long context takes
longer than a step. A failure of the evaluation is logged and training goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from nsa.config import Config
from nsa.contract.evals import append_eval
from nsa.infer.evaluate import EvalPlan, evaluate, make_record, val_windows
from nsa.model.transformer import Transformer
from nsa.train.tokenizer import Tokenizer


def due(cfg: Config, step: int) -> bool:
    """Whether the evaluation runs after ``step``: every ``eval.every_steps`` and at the last."""
    every = cfg.eval.every_steps
    return every > 0 and (step % every == 0 or step == cfg.train.steps)


def plan_of(cfg: Config) -> EvalPlan:
    """The evaluation the config asks for (no lengths: the trained context)."""
    e = cfg.eval
    return EvalPlan(lengths=sorted(set(e.lengths)) or [cfg.train.seq_len], depths=list(e.depths),
                    trials=e.trials, seed=e.seed, buckets=e.buckets, loss_sequences=e.loss_sequences)


def run(cfg: Config, model: Transformer, tok: Tokenizer, run_dir: Path, run_id: str, step: int, main: bool,
        log: Callable[[str], None]) -> None:
    """Rank 0 evaluates and appends the record; then every rank meets at a barrier."""
    if main:
        plan = plan_of(cfg)
        device = str(next(model.parameters()).device)
        try:
            windows = val_windows(cfg, tok, max(plan.lengths)) if plan.loss_sequences else None
            result = evaluate(model, tok, plan, windows)
            rec = make_record(result, plan, run=run_id, step=step, cfg=cfg, device=device, origin="train")
            append_eval(run_dir, rec)
            cells = [a for row in result.accuracy for a in row]
            log(f"passkey eval step {step}: accuracy {sum(cells) / len(cells):.2f} over lengths "
                f"{', '.join(map(str, plan.lengths))} ({result.seconds:.1f} s)")
        except Exception as exc:  # noqa: BLE001 - an evaluation never ends the training
            log(f"passkey eval step {step} failed: {type(exc).__name__}: {exc}")
    torch.distributed.barrier()
